"""Rotary position embeddings (RoPE) as plain functions.

Two layouts exist and are not weight-compatible:

* interleaved pairs ``(2i, 2i + 1)``: RoFormer v1 (Su et al. 2021) and
  bert4keras checkpoints;
* split halves (rotate-half, ``i`` with ``i + d/2``): keras-hub's
  ``RotaryEmbedding``, GPT-NeoX, ESM and ExLM's 2D RoPE.

Both rotate feature pair ``i`` by the angle ``position * base**(-2i / d)``.
"""

from keras import ops


def rotary_inverse_frequencies(depth, base=10000.0):
    """Inverse frequencies ``base ** (-2i / depth)`` for ``i < depth / 2``.

    Args:
        depth: int. Even number of features that are rotated.
        base: float. The wavelength base, 10000 in RoFormer.

    Returns:
        A float32 tensor of shape ``(depth // 2,)``.
    """
    if depth % 2:
        raise ValueError(f"Expected an even depth for rotary embeddings. Received: depth={depth}.")
    exponents = ops.arange(0, depth, 2, dtype="float32") / float(depth)
    return ops.power(ops.cast(base, "float32"), -exponents)


def _cos_sin(position_ids, depth, base, dtype):
    """cos and sin of ``position * inverse_frequency``, ``[B, S, 1 (heads), depth/2]``."""
    positions = ops.cast(position_ids, "float32")
    angles = positions[..., None] * rotary_inverse_frequencies(depth, base)
    angles = angles[:, :, None, :]
    return ops.cast(ops.cos(angles), dtype), ops.cast(ops.sin(angles), dtype)


def apply_interleaved_rotary(x, position_ids, base=10000.0):
    """Rotates interleaved feature pairs of ``x`` by their positions.

    Pair ``(x[2i], x[2i + 1])`` at position ``p`` is rotated by the angle
    ``p * base**(-2i / d)``: ``x[2i] cos - x[2i+1] sin``,
    ``x[2i+1] cos + x[2i] sin``. This is RoFormer v1's layout.

    Args:
        x: tensor of shape ``(batch, sequence, heads, depth)``.
        position_ids: int tensor of shape ``(batch or 1, sequence)``.
        base: float. The wavelength base.

    Returns:
        A tensor with the shape and dtype of ``x``.

    Example:
    >>> x = np.array([[[[1.0, 0.0]]]], "float32")  # (batch, sequence, heads, depth)
    >>> rotated = apply_interleaved_rotary(x, np.array([[1]]))  # by 1 radian
    >>> keras.ops.convert_to_numpy(rotated).round(4)
    array([[[[0.5403, 0.8415]]]], dtype=float32)
    """
    depth = x.shape[-1]
    cos, sin = _cos_sin(position_ids, depth, base, x.dtype)
    pairs = ops.reshape(x, tuple(ops.shape(x)[:-1]) + (depth // 2, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = ops.stack([even * cos - odd * sin, odd * cos + even * sin], -1)
    return ops.reshape(rotated, ops.shape(x))


def apply_split_rotary(x, position_ids, base=10000.0):
    """Rotates split halves of ``x`` (rotate-half layout) by positions.

    Feature ``i`` pairs with feature ``i + d/2`` and the pair is rotated by
    ``p * base**(-2i / d)``. This is keras-hub's and ExLM's layout.

    Args:
        x, position_ids, base: as `apply_interleaved_rotary`.

    Returns:
        A tensor with the shape and dtype of ``x``.

    Example:
    >>> rotated = apply_split_rotary(np.array([[[[1.0, 0.0]]]], "float32"), np.array([[1]]))
    >>> keras.ops.convert_to_numpy(rotated).round(4)  # the pair (x[0], x[1]) by 1 radian
    array([[[[0.5403, 0.8415]]]], dtype=float32)
    """
    depth = x.shape[-1]
    cos, sin = _cos_sin(position_ids, depth, base, x.dtype)
    first, second = x[..., : depth // 2], x[..., depth // 2 :]
    return ops.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def apply_rotary_2d(x, position_ids, base=10000.0):
    """ExLM's 2D RoPE: the first half of each head by pos1, the second by pos2.

    Each head's features are split into two contiguous halves of ``d/2``.
    The first half is rotated by ``pos1`` (the original token index), the
    second by ``pos2`` (the copy index, 0 for single tokens), each with the
    rotate-half layout and inverse frequencies ``base ** (-2i / (d/2))``.
    With ``pos2 = 0`` the second half is left as is, so the scheme reduces to
    1D RoPE on the first half.

    Args:
        x: tensor ``(batch, sequence, heads, depth)``, ``depth % 4 == 0``.
        position_ids: int tensor ``(batch or 1, sequence, 2)`` holding
            ``(pos1, pos2)``, or ``(batch or 1, sequence)`` for pos1 alone.
        base: float. The wavelength base.

    Returns:
        A tensor with the shape and dtype of ``x``.
    """
    depth = x.shape[-1]
    if depth % 4:
        raise ValueError(
            f"Expected a head size divisible by 4 for 2D rotary embeddings. Received: {depth}."
        )
    half = depth // 2
    if len(position_ids.shape) == 2:  # pos1 alone: the second half is not rotated
        first, second = apply_split_rotary(x[..., :half], position_ids, base), x[..., half:]
    else:
        first = apply_split_rotary(x[..., :half], position_ids[..., 0], base)
        second = apply_split_rotary(x[..., half:], position_ids[..., 1], base)
    return ops.concatenate([first, second], axis=-1)


__all__ = [
    "apply_rotary_2d",
    "apply_interleaved_rotary",
    "apply_split_rotary",
    "rotary_inverse_frequencies",
]
