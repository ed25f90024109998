"""ExLM's state expansion: every [MASK] (and [CLS]/[SEP]) becomes k slots."""

import math

import keras
from keras import ops

from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.eager_checks import check_integer_ids
from keras_masking.utils.eager_checks import check_zero_one
from keras_masking.utils.eager_checks import dims_match
from keras_masking.utils.eager_checks import static_shape


def _check_inputs(token_ids, padding_mask, expand_mask):
    """Integer ``(batch, L)`` ids with a static ``L``; masks of their shape."""
    check_integer_ids("token_ids", token_ids)
    shape = static_shape(token_ids)
    if len(shape) != 2 or shape[1] is None:
        raise ValueError(
            "Expected token_ids of shape (batch, sequence) with a static sequence length (the "
            f"expanded length is static). Received: token_ids.shape={shape}."
        )
    for name, value in (("padding_mask", padding_mask), ("expand_mask", expand_mask)):
        other = None if value is None else static_shape(value)
        if other is not None and (len(other) != 2 or not dims_match(other, shape)):
            raise ValueError(
                f"Expected {name} of the shape of token_ids {shape}. "
                f"Received: {name}.shape={other}."
            )
    check_zero_one("padding_mask", padding_mask)


@keras.saving.register_keras_serializable(package="keras_masking")
class StateExpansion(keras.layers.Layer):
    """Expands chosen tokens into ``k`` consecutive copies, with 2D positions.

    Every [MASK] and every id in ``expand_token_ids`` (the official code
    expands [CLS]/<s> and [SEP]/</s>) becomes ``k`` slots; other tokens keep
    one; padding gets none. ``pos1`` is the token's position among the real
    tokens (shared by the copies), ``pos2`` the copy index ``1..k`` (0 for
    single tokens). For ``[CLS] a M M b [SEP]`` and ``k = 4``:
    ``pos1 = 0000 1 2222 3333 4 5555``, ``pos2 = 1234 0 1234 1234 0 1234``.

    Padding may sit anywhere in the row: the expanded sequence holds the
    real tokens' slots first, then padding, whatever the layout.

    The output length is static, ``L + (k - 1) * max_expanded``
    (`output_length`), so a step compiles once. An example that needs more
    slots is cut at that length and flagged in ``overflow``; read it
    (`ExLMPretrainer` and `ExLMEncoder` do).

    Args:
        k: int >= 1, copies per expanded token (4 in ExLM).
        mask_token_id: int, the [MASK] id.
        expand_token_ids: other ids to expand, e.g. ``(cls_id, sep_id)``.
        max_expanded_tokens: int >= 0 or None, the most expanded tokens an
            example may hold.
        mask_rate: float in (0, 1] or None. Give at most one of the two:
            ``max_expanded`` is ``max_expanded_tokens``, else ``ceil(mask_rate
            * L) + 3`` ([CLS] and two [SEP]s), else ``L`` (every input fits).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        token_ids: int ``(batch, L)``, ``L`` static.
        padding_mask: 0/1 ``(batch, L)``.
        expand_mask: optional bool ``(batch, L)``, more positions to expand
            (prediction targets that are not [MASK], as with 80/10/10).

    Returns:
        A dict: ``token_ids``, ``padding_mask`` and ``source_index`` (slot ->
        input index; 0 on padding), each ``(batch, L_out)``,
        ``position_ids`` ``(batch, L_out, 2)`` = (pos1, pos2),
        ``expanded_mask`` (slot belongs to an expanded token),
        ``first_slot`` ``(batch, L)`` (each input token's first slot,
        clipped to ``L_out - 1``; the way back to the input positions; no
        meaning at padding) and ``overflow`` ``(batch,)``.

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
        if max_expanded_tokens is not None and mask_rate is not None:
            raise ValueError(
                "Expected at most one of max_expanded_tokens and mask_rate. Received: "
                f"max_expanded_tokens={max_expanded_tokens}, mask_rate={mask_rate}."
            )
        self.k = check_int("k", k, minimum=1)
        self.mask_token_id = check_int("mask_token_id", mask_token_id, minimum=0)
        self.expand_token_ids = check_int_list("expand_token_ids", expand_token_ids, minimum=0)
        if max_expanded_tokens is not None:
            max_expanded_tokens = check_int("max_expanded_tokens", max_expanded_tokens, minimum=0)
        self.max_expanded_tokens = max_expanded_tokens
        if mask_rate is not None:
            mask_rate = check_float("mask_rate", mask_rate, 0.0, 1.0, open_minimum=True)
        self.mask_rate = mask_rate

    def max_expanded(self, length):
        """The most expanded tokens a row of ``length`` tokens may hold."""
        length = check_int("length", length, minimum=0)
        if self.max_expanded_tokens is not None:
            most = self.max_expanded_tokens
        elif self.mask_rate is not None:
            most = math.ceil(self.mask_rate * length) + 3
        else:
            most = length
        return min(most, length)

    def output_length(self, length):
        """The static expanded length for input length ``length``."""
        return int(length) + (self.k - 1) * self.max_expanded(length)

    def expands(self, token_ids):
        """bool ``(batch, L)``: which tokens are expanded."""
        expanded = ops.equal(token_ids, self.mask_token_id)
        for token_id in self.expand_token_ids:
            expanded = expanded | ops.equal(token_ids, token_id)
        return expanded

    def call(self, token_ids, padding_mask, expand_mask=None):
        _check_inputs(token_ids, padding_mask, expand_mask)
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
        # Slot t belongs to the input token j with starts[j] <= t < ends[j]:
        # j = the number of tokens (padding included, which has no slots)
        # that end at or before t. Any padding layout works.
        source = ops.sum(ops.cast(ends[:, None, :] <= slots[None, :, None], "int32"), -1)
        valid = slots[None, :] < ops.minimum(total, out_length)[:, None]
        source = ops.where(valid, source, 0)
        # pos1: the token's position among the real tokens.
        rank = ops.maximum(ops.cumsum(ops.cast(real, "int32"), axis=1) - 1, 0)
        slot_start = ops.take_along_axis(starts, source, axis=1)
        slot_expanded = ops.take_along_axis(expanded, source, axis=1) & valid
        copy = ops.where(slot_expanded, slots[None, :] - slot_start + 1, 0)
        ids = ops.where(valid, ops.take_along_axis(token_ids, source, axis=1), 0)
        pos1 = ops.where(valid, ops.take_along_axis(rank, source, axis=1), 0)
        position_ids = ops.stack([pos1, copy], axis=-1)
        return {
            "token_ids": ids,
            "padding_mask": ops.cast(valid, "int32"),
            "position_ids": ops.cast(position_ids, "int32"),
            "source_index": ops.cast(source, "int32"),
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
        return {
            **super().get_config(),
            "k": self.k,
            "mask_token_id": self.mask_token_id,
            "expand_token_ids": list(self.expand_token_ids),
            "max_expanded_tokens": self.max_expanded_tokens,
            "mask_rate": self.mask_rate,
        }
