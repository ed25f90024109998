"""densify_gradients: embedding gradients as dense tensors (TensorFlow's IndexedSlices)."""

import keras


def densify_gradients(grads):
    """Turns TensorFlow's `tf.IndexedSlices` gradients into dense tensors.

    On TensorFlow an embedding lookup's gradient is a `tf.IndexedSlices`
    holding one row per looked-up id, so an id seen twice in a batch appears
    twice (and under `tf.distribute`, a row every replica touched appears
    once per replica). Keras 3's Adam and AdamW square such a gradient slice
    by slice (``ops.square`` keeps it sparse), so the second moment of a
    repeated row gets the sum of the squares of its parts instead of the
    square of its sum: the update of that row differs from JAX's, and a
    `MirroredStrategy` step differs from the same step on one device.
    Summing the duplicates first (a dense tensor) gives the exact Adam
    update. Adam's moments are dense already, so nothing is lost in speed or
    memory. Other backends' gradients are returned as they are.

    Args:
        grads: a list of gradients (tensors, `tf.IndexedSlices` or None).

    Returns:
        The list with every `tf.IndexedSlices` made dense.

    Example:

    >>> import numpy as np
    >>> grads = densify_gradients([np.ones((2, 3), "float32"), None])
    >>> grads[1] is None
    True
    """
    if keras.config.backend() != "tensorflow":
        return list(grads)
    import tensorflow as tf

    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
