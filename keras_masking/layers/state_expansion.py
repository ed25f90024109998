"""ExLM's state expansion: every [MASK] (and [CLS]/[SEP]) becomes k slots."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_masking")
class StateExpansion(keras.layers.Layer):
    """Expands chosen tokens into ``k`` consecutive copies, with 2D positions.

    Every [MASK] and every id in ``expand_token_ids`` (the official code
    expands [CLS]/<s> and [SEP]/</s>) becomes ``k`` slots; other tokens keep
    one. ``pos1`` is the original index (shared by the copies) and ``pos2``
    the copy index ``1..k`` (0 for single tokens). For
    ``[CLS] a M M b [SEP]`` and ``k = 4``:
    ``pos1 = 0000 1 2222 3333 4 5555``, ``pos2 = 1234 0 1234 1234 0 1234``.

    The output length is static, ``L + (k - 1) * max_expanded_tokens``, so a
    step compiles once. ``max_expanded_tokens`` is given, or derived from a
    masking rate as ``ceil(mask_rate * L) + 3`` ([CLS] and two [SEP]s). An
    example that needs more slots is cut at the static length and flagged in
    ``overflow``.

    Args:
        k: int >= 1, copies per expanded token (4 in ExLM).
        mask_token_id: int, the [MASK] id.
        expand_token_ids: other ids to expand, e.g. ``(cls_id, sep_id)``.
        max_expanded_tokens: int or None, the most expanded tokens an example
            may hold.
        mask_rate: float or None, used when ``max_expanded_tokens`` is None.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        token_ids: int ``(batch, L)``.
        padding_mask: 0/1 ``(batch, L)``.
        expand_mask: optional bool ``(batch, L)``, more positions to expand
            (prediction targets that are not [MASK], as with 80/10/10).

    Returns:
        A dict: ``token_ids``, ``padding_mask`` and ``source_index`` (slot ->
        original index; 0 on padding), each ``(batch, L_out)``,
        ``position_ids`` ``(batch, L_out, 2)`` = (pos1, pos2),
        ``expanded_mask`` (slot belongs to an expanded token),
        ``first_slot`` ``(batch, L)`` (each original token's first slot,
        clipped to ``L_out - 1``; the way back to the input positions) and
        ``overflow`` ``(batch,)``.

    Example:
    >>> expand = StateExpansion(k=4, mask_token_id=103, expand_token_ids=(101, 102),
    ...                         max_expanded_tokens=4)
    >>> out = expand(keras.ops.array([[101, 7, 103, 103, 8, 102]]), keras.ops.ones((1, 6)))
    >>> keras.ops.convert_to_numpy(out["position_ids"][0, :, 1]).tolist()
    [1, 2, 3, 4, 0, 1, 2, 3, 4, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        k=4,
        mask_token_id=103,
        expand_token_ids=(),
        max_expanded_tokens=None,
        mask_rate=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be a positive integer. Received: k={k!r}")
        if max_expanded_tokens is None and mask_rate is None:
            raise ValueError("Give `max_expanded_tokens` or `mask_rate` to fix the output length.")
        if mask_rate is not None and not 0 < mask_rate <= 1:
            raise ValueError(f"`mask_rate` must be in (0, 1]. Received: {mask_rate}")
        self.k = k
        self.mask_token_id = int(mask_token_id)
        self.expand_token_ids = tuple(int(i) for i in expand_token_ids)
        self.max_expanded_tokens = max_expanded_tokens
        self.mask_rate = mask_rate

    def output_length(self, length):
        """The static expanded length for input length ``length``."""
        most = self.max_expanded_tokens
        if most is None:
            most = math.ceil(self.mask_rate * length) + 3
        return int(length) + (self.k - 1) * min(int(most), int(length))

    def expands(self, token_ids):
        """bool ``(batch, L)``: which tokens are expanded."""
        expanded = ops.equal(token_ids, self.mask_token_id)
        for token_id in self.expand_token_ids:
            expanded = expanded | ops.equal(token_ids, token_id)
        return expanded

    def call(self, token_ids, padding_mask, expand_mask=None):
        token_ids = ops.cast(token_ids, "int32")
        real = ops.cast(padding_mask, "bool")
        length = token_ids.shape[1]
        out_length = self.output_length(length)
        expanded = self.expands(token_ids)
        if expand_mask is not None:
            expanded = expanded | ops.cast(expand_mask, "bool")
        expanded = expanded & real
        copies = ops.where(expanded, self.k, ops.where(real, 1, 0))
        ends = ops.cumsum(copies, axis=1)
        starts = ends - copies
        total = ends[:, -1]
        slots = ops.arange(out_length, dtype="int32")
        # Slot t belongs to the last real token whose first slot is <= t.
        counted = ops.where(real, starts, out_length + length)
        source = ops.sum(ops.cast(counted[:, None, :] <= slots[None, :, None], "int32"), -1) - 1
        source = ops.maximum(source, 0)
        valid = slots[None, :] < ops.minimum(total, out_length)[:, None]
        source = ops.where(valid, source, 0)
        slot_start = ops.take_along_axis(starts, source, axis=1)
        slot_expanded = ops.take_along_axis(expanded, source, axis=1) & valid
        copy = ops.where(slot_expanded, slots[None, :] - slot_start + 1, 0)
        ids = ops.where(valid, ops.take_along_axis(token_ids, source, axis=1), 0)
        position_ids = ops.stack([ops.where(valid, source, 0), copy], axis=-1)
        return {
            "token_ids": ids,
            "padding_mask": ops.cast(valid, "int32"),
            "position_ids": ops.cast(position_ids, "int32"),
            "source_index": source,
            "expanded_mask": slot_expanded,
            "first_slot": ops.cast(ops.minimum(starts, out_length - 1), "int32"),
            "overflow": total > out_length,
        }

    def compute_output_spec(self, token_ids, padding_mask, expand_mask=None):
        batch, length = token_ids.shape[0], token_ids.shape[1]
        out = self.output_length(length) if length is not None else None
        return {
            "token_ids": keras.KerasTensor((batch, out), "int32"),
            "padding_mask": keras.KerasTensor((batch, out), "int32"),
            "position_ids": keras.KerasTensor((batch, out, 2), "int32"),
            "source_index": keras.KerasTensor((batch, out), "int32"),
            "expanded_mask": keras.KerasTensor((batch, out), "bool"),
            "first_slot": keras.KerasTensor((batch, length), "int32"),
            "overflow": keras.KerasTensor((batch,), "bool"),
        }

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "k": self.k,
                "mask_token_id": self.mask_token_id,
                "expand_token_ids": list(self.expand_token_ids),
                "max_expanded_tokens": self.max_expanded_tokens,
                "mask_rate": self.mask_rate,
            }
        )
        return config
