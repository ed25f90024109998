"""Turning masks into additive attention biases."""

from keras import ops


def large_negative(dtype):
    """A finite number that ``exp`` sends to zero in ``dtype``.

    Args:
        dtype: the logits' dtype name.

    Returns:
        ``-1e9`` for float32/float64 and ``-3e4`` for 16-bit floats (the
        largest magnitude float16 can hold safely).
    """
    if str(dtype) in ("float16", "bfloat16"):
        return -3.0e4
    return -1.0e9


def padding_mask_to_bias(padding_mask, dtype="float32"):
    """Converts a ``(batch, keys)`` 0/1 mask into a broadcastable bias.

    Args:
        padding_mask: bool or int tensor ``(batch, keys)``; 1 marks real
            tokens.
        dtype: dtype of the returned bias.

    Returns:
        A tensor ``(batch, 1, 1, keys)``: 0 for real keys, a large negative
        number for padding, ready to add to ``(batch, heads, query, key)``
        logits.

    Example:
    >>> padding_mask_to_bias(keras.ops.array([[1, 0]]))[0, 0, 0]
    array([ 0.e+00, -1.e+09], dtype=float32)
    """
    keep = ops.cast(padding_mask, dtype)
    return ((1.0 - keep) * large_negative(dtype))[:, None, None, :]
