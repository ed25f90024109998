"""densify_gradients: embedding gradients as dense tensors (TensorFlow's IndexedSlices)."""

import keras
import numpy as np


def densify_gradients(grads, variables=None):
    """Turns TensorFlow's `tf.IndexedSlices` gradients into dense tensors.

    On TensorFlow an embedding lookup's gradient is a `tf.IndexedSlices`
    holding one row per looked-up id, so an id seen ``k`` times in a batch
    appears ``k`` times (and under `tf.distribute`, a row every replica
    touched appears once per replica). Keras 3's Adam and AdamW square such
    a gradient slice by slice (``ops.square`` keeps it sparse), so the second
    moment of a repeated row gets the sum of the squares of its parts
    instead of the square of their sum: with parts of the same sign the row
    moves up to ``sqrt(k)`` times too far (exactly ``sqrt(k)`` for ``k``
    equal parts on a first step), with parts of both signs it can move far
    too little, and a `MirroredStrategy` step differs from the same step on
    one device. Summing the duplicates first (a dense
    tensor) gives the exact Adam update. Adam's moments are dense already,
    so nothing is lost in speed or memory. Other backends' gradients are
    returned as they are.

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
