"""densify_gradients: embedding gradients as dense tensors (TensorFlow's IndexedSlices)."""

import keras
import numpy as np


def densify_gradients(grads, variables=None):
    """Turns TensorFlow's `tf.IndexedSlices` gradients into dense tensors.

    On TensorFlow an embedding lookup's gradient holds one slice per
    looked-up id, and Keras' Adam squares the slices one by one: a row looked
    up ``k`` times gets the sum of the squared parts as its second moment
    instead of the square of their sum (see `AdamW`). Summing the duplicates
    first gives the exact update, at no cost: Adam's moments are dense
    already. Other backends' gradients are returned as they are.

    A slice whose row is outside the variable (negative, or past its first
    dimension) is refused with an error naming the variable: a ValueError
    when called eagerly, TensorFlow's InvalidArgumentError with the same
    message inside a `tf.function` (before the update; under XLA, which
    ignores assertions, the row is dropped).

    Args:
        grads: a list of gradients (tensors, `tf.IndexedSlices` or None).
        variables: None, or the variables of ``grads`` (the same order), to
            name them and bound their rows in an error.

    Returns:
        The list with every `tf.IndexedSlices` made dense.

    Example:

    >>> grads = densify_gradients([np.ones((2, 3), "float32"), None])
    >>> grads[1] is None
    True
    """
    grads = list(grads)
    if keras.config.backend() != "tensorflow":
        return grads
    import tensorflow as tf

    variables = [None] * len(grads) if variables is None else list(variables)
    return [
        _dense(grad, variable) if isinstance(grad, tf.IndexedSlices) else grad
        for grad, variable in zip(grads, variables)
    ]


def _dense(grad, variable):
    import tensorflow as tf

    if variable is not None and variable.shape[0] is not None:
        rows = int(variable.shape[0])
        name = variable.path if hasattr(variable, "path") else variable.name
    else:
        rows = tf.cast(grad.dense_shape[0], grad.indices.dtype)
        name = "a variable"
    indices = grad.indices
    if tf.executing_eagerly():
        values = np.asarray(indices)
        outside = values[(values < 0) | (values >= int(rows))]
        if outside.size:
            raise ValueError(
                f"Expected the rows of the IndexedSlices gradient of {name} in [0, {int(rows)}). "
                f"Received: indices={sorted(set(outside.tolist()))}."
            )
        return tf.convert_to_tensor(grad)
    message = (
        f"Expected the rows of the IndexedSlices gradient of {name} in [0, rows). "
        "Received: indices="
    )
    inside = tf.reduce_all((indices >= 0) & (indices < tf.cast(rows, indices.dtype)))
    check = tf.debugging.Assert(inside, [message, indices, "rows:", rows], summarize=16)
    with tf.control_dependencies([check]):
        return tf.identity(tf.convert_to_tensor(grad))
