"""ExLMEncoder: an ExLM-pretrained backbone as the official fine-tuning runs it."""

import keras
import numpy as np
from keras import ops

from keras_masking.layers.state_expansion import StateExpansion
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.utils.eager_checks import concrete_value


def plain_position_ids(token_ids):
    """2D positions of an unexpanded sequence: ``(index, 0)`` per token.

    What an MLM-pretrained ``rotary2d`` backbone saw in pretraining (every
    token in one slot). An ExLM-pretrained backbone saw [CLS] and [SEP] as
    ``k`` copies; fine-tune it through `ExLMEncoder` instead.

    Args:
        token_ids: int ``(batch, L)``.

    Returns:
        int32 ``(batch, L, 2)``.
    """
    length = ops.shape(token_ids)[1]
    index = ops.broadcast_to(ops.arange(length, dtype="int32")[None], ops.shape(token_ids))
    return ops.stack([index, ops.zeros_like(index)], axis=-1)


@keras.saving.register_keras_serializable(package="keras_masking")
class ExLMEncoder(keras.Model):
    """Runs an ExLM-pretrained backbone on fine-tuning inputs.

    Fine-tuning data has no [MASK], so, as in the official code, only the
    tokens that were always expanded in pretraining ([CLS] and [SEP]) become
    ``k`` copies with 2D positions ``(index, 1..k)``; every other token keeps
    one slot at ``(index, 0)``. The backbone runs on the expanded sequence,
    the transition head is not used, and the outputs come back in the input's
    layout: ``pooled_output`` is the backbone's pooler on the first [CLS]
    copy, and ``sequence_output`` ``(batch, L, hidden)`` holds each input
    token's first slot, so heads written for the backbone work unchanged.
    ``k = 1`` expands nothing and feeds ``(index, 0)`` everywhere: the
    inputs an MLM-pretrained ``rotary2d`` backbone saw.

    Args:
        backbone: a `TransformerBackbone` with ``position="rotary2d"`` and
            ``custom_position_ids=True``.
        k: int, copies per expanded token (the pretraining ``k``).
        mask_token_id: int, the [MASK] id (expanded too if the data has it,
            as in cloze-style fine-tuning).
        special_token_ids: ids expanded in pretraining, ``(cls_id, sep_id)``.
        max_expanded_tokens: int, the most expanded tokens in one example
            (3: [CLS] and two [SEP]s); fixes the static expanded length
            ``L + (k - 1) * max_expanded_tokens``. Eager calls with more
            raise; compiled calls would cut the sequence's end.
        **kwargs: `keras.Model` arguments.

    Example:
    ```python
    encoder = keras_masking.models.ExLMEncoder(backbone, k=4, special_token_ids=(101, 102))
    logits = keras.layers.Dense(num_labels)(encoder(inputs)["pooled_output"])
    ```
    """

    def __init__(
        self,
        backbone,
        k=4,
        mask_token_id=103,
        special_token_ids=(101, 102),
        max_expanded_tokens=3,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if getattr(backbone, "position", None) != "rotary2d" or not backbone.custom_position_ids:
            raise ValueError(
                "ExLMEncoder needs a TransformerBackbone with position='rotary2d' and "
                "custom_position_ids=True."
            )
        if not isinstance(max_expanded_tokens, int) or max_expanded_tokens < 0:
            raise ValueError(
                "`max_expanded_tokens` must be a non-negative integer. "
                f"Received: {max_expanded_tokens!r}"
            )
        self.backbone = backbone
        self.expansion = StateExpansion(
            k=k,
            mask_token_id=mask_token_id,
            expand_token_ids=special_token_ids,
            max_expanded_tokens=max_expanded_tokens,
        )
        self.k = self.expansion.k
        self.mask_token_id = self.expansion.mask_token_id
        self.special_token_ids = self.expansion.expand_token_ids
        self.max_expanded_tokens = max_expanded_tokens

    def build(self, input_shape):
        # The backbone is a built functional model; the expansion has no state.
        self.built = True

    def call(self, inputs, training=False):
        token_ids = ops.cast(inputs["token_ids"], "int32")
        padding_mask = ops.cast(inputs["padding_mask"], "int32")
        segment_ids = inputs.get("segment_ids")
        if segment_ids is None:
            segment_ids = ops.zeros_like(token_ids)
        if self.k == 1:
            ids, mask, positions = token_ids, padding_mask, plain_position_ids(token_ids)
            first_slot = None
        else:
            expanded = self._expand(token_ids, padding_mask)
            ids, mask, positions = (
                expanded[key] for key in ("token_ids", "padding_mask", "position_ids")
            )
            segment_ids = ops.take_along_axis(
                ops.cast(segment_ids, "int32"), expanded["source_index"], axis=1
            )
            first_slot = expanded["first_slot"]
        hidden = self.backbone.embed(ids, segment_ids, positions, training=training)
        hidden = self.backbone.encode(hidden, mask, positions, training=training)
        sequence = hidden if first_slot is None else batched_gather(hidden, first_slot)
        return {"sequence_output": sequence, "pooled_output": self.backbone.pool(hidden)}

    def _expand(self, token_ids, padding_mask):
        expanded = self.expansion(token_ids, padding_mask)
        overflow = concrete_value(expanded["overflow"])
        if overflow is not None and np.any(overflow):
            rows = np.flatnonzero(overflow).tolist()
            raise ValueError(
                f"Rows {rows} hold more than max_expanded_tokens={self.max_expanded_tokens} "
                f"tokens to expand (ids {list(self.special_token_ids)} and [MASK]); raise "
                "`max_expanded_tokens`."
            )
        return expanded

    def compute_output_spec(self, inputs, training=False):
        batch, length = inputs["token_ids"].shape[:2]
        hidden, dtype = self.backbone.hidden_dim, self.backbone.compute_dtype
        return {
            "sequence_output": keras.KerasTensor((batch, length, hidden), dtype),
            "pooled_output": keras.KerasTensor((batch, hidden), dtype),
        }

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "k": self.k,
            "mask_token_id": self.mask_token_id,
            "special_token_ids": list(self.special_token_ids),
            "max_expanded_tokens": self.max_expanded_tokens,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)
