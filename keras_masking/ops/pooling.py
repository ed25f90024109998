"""Mean pooling over the real tokens of a padded batch."""

from keras import ops


def masked_mean(hidden, padding_mask=None):
    """The mean of ``hidden`` over the positions ``padding_mask`` marks.

    Args:
        hidden: float tensor ``(batch, sequence, features)``.
        padding_mask: 0/1 or bool tensor ``(batch, sequence)``; None averages
            every position. A row without a marked position gives zeros.

    Returns:
        A float tensor ``(batch, features)`` of ``hidden``'s dtype.

    Example:
    >>> hidden = np.array([[[1.0], [3.0], [100.0]]])
    >>> np.asarray(masked_mean(hidden, np.array([[1, 1, 0]]))).tolist()
    [[2.0]]
    """
    if padding_mask is None:
        return ops.mean(hidden, axis=1)
    weights = ops.cast(ops.cast(padding_mask, "bool"), hidden.dtype)[:, :, None]  # nonzero: real
    total = ops.sum(hidden * weights, axis=1)
    count = ops.maximum(ops.sum(weights, axis=1), 1.0)
    return total / count
