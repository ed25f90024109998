"""A compiled loss that shows labels outside the classes, where no error can be raised."""

import keras
from keras import ops


def nan_for_labels_out_of_range(loss, labels, count, float_ids=False):
    """``loss``, or NaN when an integer label lies outside ``[0, count)``.

    A compiled step cannot raise on values, and a sparse cross-entropy reads
    such a label as another class (JAX clamps it; TensorFlow's CPU kernels
    raise, XLA clamps): the step's loss becomes NaN instead, as a row with an
    out-of-range token id does. Float labels are returned as they are
    (one-hot, multi-hot, regression targets), unless ``float_ids``: then they
    are class ids too, and one outside the range or not whole (1.5, read as
    class 1) makes the loss NaN.

    Args:
        loss: the step's loss, a scalar.
        labels: the step's labels ``y``, or None.
        count: int, the number of classes.
        float_ids: whether float labels are class ids (a sparse loss's).

    Returns:
        The loss, or NaN of its dtype.

    Example:

    >>> float(nan_for_labels_out_of_range(np.float32(0.5), np.array([0, 2]), 2))
    nan
    """
    if labels is None or isinstance(labels, dict):
        return loss
    dtype = keras.backend.standardize_dtype(labels.dtype)
    if "int" in dtype:
        outside = ops.any((labels < 0) | (labels >= count))
    elif float_ids and "float" in dtype:
        outside = ops.any((labels < 0) | (labels >= count) | (labels != ops.floor(labels)))
    else:
        return loss
    return ops.where(outside, ops.cast(float("nan"), ops.dtype(loss)), loss)
