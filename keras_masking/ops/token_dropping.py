"""Position-preserving token dropping as plain functions (MAE's idiom).

A batch keeps a static number of slots ``keep_length``, so a training step
compiles once. Per example, the real, unprotected tokens are dropped at
``rate`` (stochastic rounding of ``rate x droppable`` so the expected share is
exactly ``rate``; one droppable token is kept when the slots have room for
it), padding goes before any real token, and protected tokens are never
dropped. Kept tokens keep their original order, so rotary and relative
attention still see a monotone sequence.
"""

import math

import numpy as np
from keras import ops

from keras_masking.ops.token_selection import select_tokens
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.eager_checks import check_ids_in_range
from keras_masking.utils.eager_checks import check_integer_ids
from keras_masking.utils.eager_checks import concrete_value


def check_drop_rate(rate, name="rate"):
    """A drop rate in [0, 1) as a Python float (`check_float`), or a ValueError.

    Args:
        rate: the value received.
        name: the argument's name in the message.

    Returns:
        ``float(rate)``.

    Example:

    >>> check_drop_rate(0.25)
    0.25
    """
    return check_float(name, rate, 0.0, 1.0, open_maximum=True)


def static_keep_length(sequence_length, rate, multiple=1, minimum=0):
    """Slots kept from ``sequence_length``.

    ``L - floor(rate * L)``, rounded up to a multiple of ``multiple`` (matrix
    kernels run faster on such sizes), raised to at least ``minimum`` (room
    for tokens that are never dropped) and capped at ``L``. Rounding up only
    adds masked slots; it never drops more than ``rate``.

    Args:
        sequence_length: int >= 0, the static sequence length ``L``.
        rate: float in [0, 1), the drop rate.
        multiple: int >= 1.
        minimum: int >= 0, the fewest slots to keep.

    Returns:
        A Python int in ``[0, L]``.

    Example:

    >>> static_keep_length(512, 0.1), static_keep_length(512, 0.1, multiple=8)
    (461, 464)
    """
    length = check_int("sequence_length", sequence_length, minimum=0)
    rate = check_drop_rate(rate)
    multiple = check_int("multiple", multiple, minimum=1)
    minimum = check_int("minimum", minimum, minimum=0)
    kept = length - int(math.floor(rate * length))
    kept = max(-(-kept // multiple) * multiple, minimum)
    return min(kept, length)


def _static_shape(name, tensor, rank=None, min_rank=None):
    shape = tuple(getattr(tensor, "shape", np.shape(tensor)))
    if rank is not None and len(shape) != rank:
        raise ValueError(f"Expected {name} of rank {rank}. Received: {name} with shape {shape}.")
    if min_rank is not None and len(shape) < min_rank:
        raise ValueError(
            f"Expected {name} of rank >= {min_rank}. Received: {name} with shape {shape}."
        )
    return shape


def _same_dims(names, shapes):
    """Raises unless the known sizes of ``shapes`` agree, axis by axis."""
    for sizes in zip(*shapes):
        if len({size for size in sizes if size is not None}) > 1:
            listed = ", ".join(f"{n} {s}" for n, s in zip(names, shapes))
            raise ValueError(f"Expected matching (batch, sequence) shapes. Received: {listed}.")


def check_gather_slots(keep, slots, name, described):
    """Refuses a concrete ``keep`` whose row keeps more than ``slots`` (None: unknown) tokens."""
    values = concrete_value(keep)
    if values is not None and slots is not None and values.size:
        most = int(values.astype(bool).sum(axis=1).max())
        if most > slots:
            raise ValueError(
                f"Expected the {described} of the gather that produced kept_values. Received: "
                f"a {name} row that keeps {most} tokens, kept_values with {slots} slots."
            )


def sample_keep_mask(real, droppable, rate, keep_length, noise, rounding):
    """Which tokens to keep.

    Per row, ``floor(rate * droppable + rounding)`` droppable tokens are
    dropped (those of lowest ``noise``, by `select_tokens`), more if the row
    must fit ``keep_length`` slots, and one droppable token is kept when the
    slots have room for it. Real tokens that are not droppable are always
    kept, even beyond ``keep_length`` (callers that gather into
    ``keep_length`` slots must refuse or flag such rows).

    Args:
        real: bool ``(batch, sequence)``, non-padding tokens.
        droppable: bool ``(batch, sequence)``, real and not protected.
        rate: float drop rate in [0, 1).
        keep_length: int >= 0, static slot count (see `static_keep_length`).
        noise: float ``(batch, sequence)`` uniform in [0, 1), the ranks.
        rounding: float ``(batch,)`` uniform in [0, 1), the stochastic
            rounding of the per-example drop count.

    Returns:
        A bool ``(batch, sequence)`` keep mask.

    Example:

    >>> import numpy as np
    >>> real = np.array([[True, True, True, True]])
    >>> droppable = np.array([[False, True, True, True]])
    >>> keep = sample_keep_mask(
    ...     real, droppable, 0.5, 2, np.array([[0.0, 0.9, 0.1, 0.5]]), np.array([0.0]))
    >>> np.asarray(keep).tolist()
    [[True, True, False, False]]
    """
    rate = check_drop_rate(rate)
    keep_length = check_int("keep_length", keep_length, minimum=0)
    names = ("real", "droppable", "noise")
    shapes = [_static_shape(n, t, rank=2) for n, t in zip(names, (real, droppable, noise))]
    rounding_shape = _static_shape("rounding", rounding, rank=1)
    _same_dims(names, shapes)
    _same_dims(("real", "rounding"), (shapes[0][:1], rounding_shape))
    real = ops.cast(real, "bool")
    droppable = ops.cast(droppable, "bool") & real
    droppable_count = ops.sum(ops.cast(droppable, "float32"), axis=1)
    real_count = ops.sum(ops.cast(real, "float32"), axis=1)
    # Keep one droppable token, unless the slots have no room for it; fit the
    # slots by dropping more; never drop a protected token.
    dropped = select_tokens(
        droppable,
        rate,
        noise,
        rounding,
        min_count=real_count - float(keep_length),
        max_count=ops.maximum(droppable_count - 1.0, 0.0),
    )
    return real & ~dropped


def kept_indices(keep, keep_length):
    """Original indices of the kept tokens, in order, ``(batch, keep_length)``.

    Slots beyond a row's kept count hold (masked) dropped or padding indices;
    a row that keeps more than ``keep_length`` tokens gets its first
    ``keep_length`` ones.

    Args:
        keep: bool ``(batch, sequence)`` keep mask.
        keep_length: int in ``[0, sequence]``.

    Returns:
        An int32 tensor ``(batch, keep_length)``.

    Example:

    >>> import numpy as np
    >>> np.asarray(kept_indices(np.array([[True, False, True, False]]), 3)).tolist()
    [[0, 2, 1]]
    """
    shape = _static_shape("keep", keep, rank=2)
    keep_length = check_int("keep_length", keep_length, minimum=0, maximum=shape[1])
    keep = ops.cast(keep, "bool")
    length = ops.shape(keep)[1]
    positions = ops.arange(length, dtype="int32")[None, :]
    key = ops.where(keep, positions, positions + length)
    return ops.cast(ops.argsort(key, axis=1)[:, :keep_length], "int32")


def batched_gather(values, indices):
    """``values[b, indices[b, k]]`` as one flat gather.

    Equivalent to ``take_along_axis`` on axis 1, for values of any rank >= 2,
    lowered to a single row gather (with a segment-sum gradient). Eager calls
    refuse indices outside ``[0, length)``; compiled calls cannot check them.

    Args:
        values: tensor ``(batch, length, ...)``.
        indices: int tensor ``(batch, count)`` in ``[0, length)``.

    Returns:
        A tensor ``(batch, count, ...)``.

    Example:

    >>> import numpy as np
    >>> values = np.arange(6.0).reshape(2, 3)
    >>> np.asarray(batched_gather(values, np.array([[2, 0], [1, 1]]))).tolist()
    [[2.0, 0.0], [4.0, 4.0]]
    """
    values_shape = _static_shape("values", values, min_rank=2)
    indices_shape = _static_shape("indices", indices, rank=2)
    _same_dims(("values", "indices"), (values_shape[:1], indices_shape[:1]))
    check_integer_ids("indices", indices)
    if values_shape[1] is not None:
        check_ids_in_range(indices, values_shape[1], "indices", "the length of values")
    shape = ops.shape(values)
    batch, length = shape[0], shape[1]
    flat = ops.reshape(values, (-1,) + tuple(values_shape[2:]))
    offsets = ops.arange(batch, dtype="int32")[:, None] * length
    return ops.take(flat, ops.cast(indices, "int32") + offsets, axis=0)


def restore_full_length(kept_values, keep):
    """Scatters ``(batch, keep_length, ...)`` values back to full length.

    Dropped and padding positions get zeros. ``keep`` must be the keep mask
    of the gather (each row keeping at most ``keep_length`` tokens): eager
    calls refuse a row that keeps more.

    Args:
        kept_values: tensor ``(batch, keep_length, ...)``.
        keep: bool ``(batch, sequence)`` keep mask used for the gather.

    Returns:
        A tensor ``(batch, sequence, ...)``.

    Example:

    >>> import numpy as np
    >>> kept = np.array([[[1.0], [2.0]]])
    >>> np.asarray(restore_full_length(kept, np.array([[False, True, True]]))).tolist()
    [[[0.0], [1.0], [2.0]]]
    """
    values_shape = _static_shape("kept_values", kept_values, min_rank=2)
    keep_shape = _static_shape("keep", keep, rank=2)
    _same_dims(("kept_values", "keep"), (values_shape[:1], keep_shape[:1]))
    slots = values_shape[1]
    check_gather_slots(keep, slots, "keep", "keep mask")
    keep = ops.cast(keep, "bool")
    keep_int = ops.cast(keep, "int32")
    # A kept token's slot is the number of kept tokens before it.
    slot = ops.maximum(ops.cumsum(keep_int, axis=1) - 1, 0)
    if slots is not None and slots > 0:
        slot = ops.minimum(slot, slots - 1)
    restored = batched_gather(kept_values, slot)
    mask = ops.cast(keep, restored.dtype)
    for _ in values_shape[2:]:
        mask = mask[..., None]
    return restored * mask
