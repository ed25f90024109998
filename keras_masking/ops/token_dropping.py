"""Position-preserving token dropping as plain functions (MAE's idiom).

A batch keeps a static number of slots ``keep_length``, so a training step
compiles once. Per example, the real, unprotected tokens are dropped at
``rate`` (stochastic rounding of ``rate x droppable`` so the expected share is
exactly ``rate``; at least one droppable token is kept), padding goes before
any real token, and protected tokens are never dropped. Kept tokens keep
their original order, so rotary and relative attention still see a monotone
sequence.
"""

import math

from keras import ops


def static_keep_length(sequence_length, rate, multiple=1):
    """Slots kept from ``sequence_length``.

    ``L - floor(rate * L)``, rounded up to a multiple of ``multiple`` (matrix
    kernels run faster on such sizes) and capped at ``L``. Rounding up only
    adds masked slots; it never drops more than ``rate``.

    >>> static_keep_length(512, 0.1), static_keep_length(512, 0.1, multiple=8)
    (461, 464)
    """
    length = int(sequence_length)
    kept = length - int(math.floor(rate * length))
    multiple = max(int(multiple), 1)
    return min(-(-kept // multiple) * multiple, length)


def sample_keep_mask(real, droppable, rate, keep_length, noise, rounding):
    """Which tokens to keep.

    Args:
        real: bool ``(batch, sequence)``, non-padding tokens.
        droppable: bool ``(batch, sequence)``, real and not protected.
        rate: float drop rate in [0, 1).
        keep_length: int, static slot count (see `static_keep_length`).
        noise: float ``(batch, sequence)`` uniform in [0, 1): ranks the
            droppable tokens.
        rounding: float ``(batch,)`` uniform in [0, 1): stochastic rounding
            of the per-example drop count.

    Returns:
        A bool ``(batch, sequence)`` keep mask; each row keeps at most
        ``keep_length`` tokens when its protected tokens fit.
    """
    droppable_count = ops.sum(ops.cast(droppable, "float32"), axis=1)
    real_count = ops.sum(ops.cast(real, "float32"), axis=1)
    drop_count = ops.floor(rate * droppable_count + rounding)
    # Fit the static slots, but never drop every droppable token.
    drop_count = ops.maximum(drop_count, real_count - keep_length)
    drop_count = ops.minimum(drop_count, ops.maximum(droppable_count - 1.0, 0.0))
    score = ops.where(droppable, noise, 2.0)
    rank = ops.argsort(ops.argsort(score, axis=1), axis=1)
    dropped = droppable & (ops.cast(rank, "float32") < drop_count[:, None])
    return real & ~dropped


def kept_indices(keep, keep_length):
    """Original indices of the kept tokens, in order, ``(batch, keep_length)``.

    Slots beyond a row's kept count hold (masked) dropped or padding indices.
    """
    length = ops.shape(keep)[1]
    positions = ops.arange(length, dtype="int32")[None, :]
    key = ops.where(keep, positions, positions + length)
    return ops.cast(ops.argsort(key, axis=1)[:, :keep_length], "int32")


def batched_gather(values, indices):
    """``values[b, indices[b, k]]`` as one flat gather.

    Equivalent to ``take_along_axis`` on axis 1, for values of any rank >= 2,
    lowered to a single row gather (with a segment-sum gradient).

    Args:
        values: tensor ``(batch, length, ...)``.
        indices: int tensor ``(batch, count)`` in ``[0, length)``.

    Returns:
        A tensor ``(batch, count, ...)``.
    """
    shape = ops.shape(values)
    batch, length = shape[0], shape[1]
    flat = ops.reshape(values, (-1,) + tuple(values.shape[2:]))
    offsets = ops.arange(batch, dtype="int32")[:, None] * length
    return ops.take(flat, ops.cast(indices, "int32") + offsets, axis=0)


def restore_full_length(kept_values, keep):
    """Scatters ``(batch, keep_length, ...)`` values back to full length.

    Dropped and padding positions get zeros.

    Args:
        kept_values: tensor ``(batch, keep_length, dim)``.
        keep: bool ``(batch, sequence)`` keep mask used for the gather.

    Returns:
        A tensor ``(batch, sequence, dim)``.
    """
    keep_int = ops.cast(keep, "int32")
    # A kept token's slot is the number of kept tokens before it; slots never
    # exceed the kept count, itself at most keep_length.
    slot = ops.maximum(ops.cumsum(keep_int, axis=1) - 1, 0)
    restored = batched_gather(kept_values, slot)
    return restored * ops.cast(keep, restored.dtype)[..., None]
