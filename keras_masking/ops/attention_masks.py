"""Turning masks into additive attention biases."""

import keras
from keras import ops

from keras_masking.utils.arguments import check_choice


def large_negative(dtype):
    """A finite number that ``exp`` sends to zero in ``dtype``.

    Args:
        dtype: the logits' dtype, as a name or a backend dtype object.

    Returns:
        ``-1e9`` for float32/float64 and ``-3e4`` for 16-bit floats (the
        largest magnitude float16 can hold safely).

    Example:
    >>> large_negative("float32"), large_negative(np.float16)
    (-1000000000.0, -30000.0)
    """
    if keras.backend.standardize_dtype(dtype) in ("float16", "bfloat16"):
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
    >>> bias = padding_mask_to_bias(np.array([[1, 0]]))
    >>> keras.ops.convert_to_numpy(bias).tolist()
    [[[[0.0, -1000000000.0]]]]
    """
    keep = ops.cast(ops.cast(padding_mask, "bool"), dtype)  # any nonzero value: a real key
    # (keep - 1) * |large|: +0.0 for real keys (not -0.0), large negative else.
    return ((keep - 1.0) * -large_negative(dtype))[:, None, None, :]


MASK_SEMANTICS = ("replace", "additive", "guarded")


def validate_mask_semantics(semantics):
    """Raises a ValueError unless ``semantics`` is one of `MASK_SEMANTICS`."""
    check_choice("mask_semantics", semantics, MASK_SEMANTICS)


def apply_replacing_mask(logits, mask_bias, padding_mask=None, semantics="replace"):
    """Applies a mask bias that takes the place of the padding mask.

    ``mask_bias`` holds 0 where a query may attend to a key and a negative
    number (ASA: exactly -10000) where it may not. Three semantics, each the
    behaviour of one code base:

    * ``"replace"`` (BERT's ``logits * 1[bias >= 0] + bias``, the official
      ASA ``bert.py``): a masked logit becomes exactly the bias, whatever its
      score; a query row masked everywhere attends uniformly to all keys,
      padding included. The padding mask is not applied.
    * ``"additive"`` (ASA's ``roberta.py``): ``logits + bias``; a row masked
      everywhere keeps the softmax of its raw scores over all keys. The
      padding mask is not applied.
    * ``"guarded"``: ``"replace"`` plus the padding mask, so a row masked
      everywhere attends uniformly to the real keys only (not in the official
      code).

    The arithmetic is float32 whatever the logits' dtype (-10000 is not
    exact in bfloat16).

    Args:
        logits: float tensor ``(batch, heads, query, key)``.
        mask_bias: float tensor broadcastable to ``logits``.
        padding_mask: optional 0/1 tensor ``(batch, key)``; read only by
            ``"guarded"``.
        semantics: ``"replace"``, ``"additive"`` or ``"guarded"``.

    Returns:
        float32 logits of the same shape.

    Example:
    >>> logits = np.array([[[[3.0, 5.0]]]], "float32")
    >>> masked = apply_replacing_mask(logits, np.array([[[[0.0, -10000.0]]]], "float32"))
    >>> keras.ops.convert_to_numpy(masked).tolist()
    [[[[3.0, -10000.0]]]]
    """
    validate_mask_semantics(semantics)
    logits = ops.cast(logits, "float32")
    mask_bias = ops.cast(mask_bias, "float32")
    if semantics == "additive":
        return logits + mask_bias
    logits = logits * ops.cast(mask_bias >= 0, "float32") + mask_bias
    if semantics == "guarded" and padding_mask is not None:
        logits = logits + padding_mask_to_bias(padding_mask, "float32")
    return logits
