"""ExLMEncoder: an ExLM-pretrained backbone as the official fine-tuning runs it."""

import keras
import numpy as np
from keras import ops

from keras_masking.layers.state_expansion import StateExpansion
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import concrete_value
from keras_masking.utils.training_state import outermost_caller


def plain_position_ids(token_ids, padding_mask=None):
    """2D positions of an unexpanded sequence: ``(index, 0)`` per token.

    What an MLM-pretrained ``rotary2d`` backbone saw in pretraining (every
    token in one slot). An ExLM-pretrained backbone saw [CLS] and [SEP] as
    ``k`` copies; fine-tune it through `ExLMEncoder` instead.

    Args:
        token_ids: int ``(batch, L)``.
        padding_mask: optional 0/1 ``(batch, L)``. When given, ``index`` is
            each token's position among the real tokens, so a row padded on
            the left (or inside) gets the positions of its right-padded twin.

    Returns:
        int32 ``(batch, L, 2)``.

    Example:
    >>> ids = np.array([[0, 0, 101, 7, 102]])
    >>> positions = plain_position_ids(ids, padding_mask=ids > 0)
    >>> keras.ops.convert_to_numpy(positions)[0, :, 0].tolist()
    [0, 0, 0, 1, 2]
    """
    length = ops.shape(token_ids)[1]
    if padding_mask is None:
        index = ops.broadcast_to(ops.arange(length, dtype="int32")[None], ops.shape(token_ids))
    else:
        real = ops.cast(ops.cast(padding_mask, "bool"), "int32")
        index = ops.maximum(ops.cumsum(real, axis=1) - 1, 0) * real
    return ops.stack([index, ops.zeros_like(index)], axis=-1)


class ExLMModel(ConcreteInputChecks, keras.Model):
    """What `ExLMEncoder` and `ExLMPretrainer` share: the backbone, ``k``,
    the ids, the input checks and the config.

    Args:
        backbone: a `TransformerBackbone` with ``position="rotary2d"`` and
            ``custom_position_ids=True``.
        k: int >= 1, states (copies) per expanded token.
        mask_token_id: int in ``[0, vocabulary_size)``, the [MASK] id.
        unselectable_token_ids: ids in ``[0, vocabulary_size)``, e.g.
            ``(cls_id, sep_id)``.
        **kwargs: `keras.Model` arguments.
    """

    def __init__(self, backbone, k, mask_token_id, unselectable_token_ids, **kwargs):
        if getattr(backbone, "position", None) != "rotary2d" or not getattr(
            backbone, "custom_position_ids", False
        ):
            raise ValueError(
                f"{type(self).__name__} needs a TransformerBackbone with position='rotary2d' and "
                f"custom_position_ids=True. Received: backbone={backbone!r}."
            )
        super().__init__(**kwargs)
        top = backbone.vocabulary_size - 1
        self.backbone = backbone
        self.k = check_int("k", k, minimum=1)
        self.mask_token_id = check_int("mask_token_id", mask_token_id, minimum=0, maximum=top)
        self.unselectable_token_ids = check_int_list(
            "unselectable_token_ids", unselectable_token_ids, minimum=0, maximum=top
        )
        self.check_backbone_methods()

    def check_backbone_methods(self):
        """Raises if the backbone has a method this model would not apply.

        The expanded sequence runs through the backbone's stages (`embed`,
        `encode`), not its graph: DropToken (`enable_drop_token`) and ASA
        (`enable_asa`, or an `ASATrainer`) would be skipped without a word.
        Checked when the model is built and at every call, so a method
        enabled later is refused too.

        Example:
        ```python
        encoder = keras_masking.models.ExLMEncoder(backbone, k=2)
        encoder.check_backbone_methods()  # after backbone.enable_drop_token(...): ValueError
        ```
        """
        backbone = self.backbone
        skipped = [
            name
            for name, on in (
                ("DropToken (enable_drop_token)", backbone.drop_token is not None),
                ("ASA (enable_asa)", backbone.asa is not None),
                ("an ASATrainer's adversaries", bool(backbone.attacking_trainers())),
            )
            if on
        ]
        if skipped:
            raise ValueError(
                f"{type(self).__name__} runs the backbone's stages on its expanded sequence, "
                f"which leaves out {' and '.join(skipped)}: that method would not be applied. "
                "Use a backbone without it (ExLM's states carry 2D positions that DropToken's "
                "shortened sequence and ASA's masks do not)."
            )

    def check_inputs(self, inputs):
        """`TransformerBackbone.check_inputs` with a static length: run by
        ``fit`` / ``evaluate`` / ``predict`` on numpy data before a step
        compiles, and by every call."""
        self.backbone.check_inputs(
            inputs,
            required=("token_ids", "padding_mask"),
            allowed=("token_ids", "segment_ids", "padding_mask"),  # positions are its own
        )
        shape = tuple(inputs["token_ids"].shape)
        if shape[1] is None:
            raise ValueError(
                "Expected token_ids with a static sequence length (the expanded length is "
                f"static). Received: token_ids.shape={shape}."
            )

    def checked_inputs(self, inputs):
        """Checks ``inputs`` and the backbone's methods; returns int32
        ``(token_ids, padding_mask, segment_ids)``. Records the model this call
        runs in with the backbone (its ``callers``), as the backbone's own call
        would: a method enabled on the backbone later refreshes that model's
        steps and optimizer (`refresh_training`)."""
        self.backbone.callers.add(outermost_caller(default=self))
        self.check_backbone_methods()
        self.check_inputs(inputs)
        token_ids = ops.cast(inputs["token_ids"], "int32")
        segment_ids = inputs.get("segment_ids")
        if segment_ids is None:
            segment_ids = ops.zeros_like(token_ids)
        padding_mask = ops.cast(ops.cast(inputs["padding_mask"], "bool"), "int32")
        return token_ids, padding_mask, ops.cast(segment_ids, "int32")

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "k": self.k,
            "mask_token_id": self.mask_token_id,
            "unselectable_token_ids": list(self.unselectable_token_ids),
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        if "special_token_ids" in config:  # saved before the rename
            config["unselectable_token_ids"] = config.pop("special_token_ids")
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_masking")
class ExLMEncoder(ExLMModel):
    """Runs an ExLM-pretrained backbone on fine-tuning inputs.

    As in the official code, only the tokens always expanded in pretraining
    ([CLS] and [SEP]) become ``k`` copies with 2D positions ``(index,
    1..k)``; every other token keeps one slot at ``(index, 0)``, ``index``
    counting real tokens only. The outputs come back in the input's layout:
    ``pooled_output`` is the backbone's pooler on the first [CLS] copy (a
    ``pooling="mean"`` backbone's: on the mean of ``sequence_output`` over
    the input's tokens, each once), and
    ``sequence_output`` ``(batch, L, hidden)`` holds each input token's
    first slot, so heads written for the backbone work unchanged.
    ``objective="mlm"`` feeds ``(index, 0)`` everywhere: the inputs an
    MLM-pretrained ``rotary2d`` backbone saw.

    Args:
        backbone: a `TransformerBackbone` with ``position="rotary2d"`` and
            ``custom_position_ids=True``.
        k: int >= 1, copies per expanded token (the pretraining ``k``).
        mask_token_id: int, the [MASK] id (expanded too if the data has it,
            as in cloze-style fine-tuning).
        unselectable_token_ids: ids expanded in pretraining, ``(cls_id,
            sep_id)``.
        max_expanded_tokens: int >= 0 or None, the most expanded tokens in
            one example (3: [CLS] and two [SEP]s): the expansion has
            ``L + (k - 1) * max_expanded_tokens`` slots; None sizes it for any
            input. A row whose expansion needs more slots (padding frees
            some): eager calls raise; in compiled calls that row's outputs
            are NaN, never a silently cut sequence.
        objective: how the backbone was pretrained, ``"exlm"`` (expanded
            tokens at ``(index, 1..k)``, even for ``k = 1``) or ``"mlm"``
            (``k = 1``, ``(index, 0)`` everywhere); None: ``"mlm"`` for
            ``k = 1``, else ``"exlm"``.
        **kwargs: `keras.Model` arguments.

    Example:
    ```python
    encoder = keras_masking.models.ExLMEncoder(backbone, k=4, unselectable_token_ids=(101, 102))
    logits = keras.layers.Dense(num_labels)(encoder(inputs)["pooled_output"])
    ```
    """

    def __init__(
        self,
        backbone,
        k=4,
        mask_token_id=103,
        unselectable_token_ids=(101, 102),
        max_expanded_tokens=3,
        objective=None,
        **kwargs,
    ):
        super().__init__(backbone, k, mask_token_id, unselectable_token_ids, **kwargs)
        if objective is None:
            objective = "mlm" if self.k == 1 else "exlm"
        self.objective = check_choice("objective", objective, ("exlm", "mlm"))
        if self.objective == "mlm" and self.k != 1:
            raise ValueError(
                "Expected k=1 with objective='mlm' (an MLM-pretrained backbone saw no copies). "
                f"Received: k={self.k}."
            )
        if max_expanded_tokens is not None:
            max_expanded_tokens = check_int("max_expanded_tokens", max_expanded_tokens, minimum=0)
        self.max_expanded_tokens = max_expanded_tokens
        self.expansion = StateExpansion(
            k=self.k,
            mask_token_id=self.mask_token_id,
            expand_token_ids=self.unselectable_token_ids,
            max_expanded_tokens=max_expanded_tokens,
        )

    def build(self, input_shape):
        # The backbone is a built functional model; the expansion has no state.
        self.built = True

    def call(self, inputs, training=False):
        token_ids, padding_mask, segment_ids = self.checked_inputs(inputs)
        expanded = self.expansion(token_ids, padding_mask)
        overflow = concrete_value(expanded["overflow"])
        if overflow is not None and np.any(overflow):
            raise ValueError(
                f"Rows {np.flatnonzero(overflow).tolist()} hold more than max_expanded_tokens="
                f"{self.max_expanded_tokens} tokens to expand (ids "
                f"{list(self.unselectable_token_ids)} and [MASK] {self.mask_token_id}); raise "
                "`max_expanded_tokens`, or set it to None to size the expansion for any input."
            )
        ids, mask, positions = (
            expanded[key] for key in ("token_ids", "padding_mask", "position_ids")
        )
        if self.objective == "mlm":  # as in MLM pretraining: (index, 0) everywhere
            positions = ops.stack([positions[..., 0], ops.zeros_like(positions[..., 0])], -1)
        segment_ids = ops.take_along_axis(segment_ids, expanded["source_index"], axis=1)
        hidden = self.backbone.embed(ids, segment_ids, positions, training=training)
        hidden = self.backbone.encode(hidden, mask, positions, training=training)
        sequence = batched_gather(hidden, expanded["first_slot"])
        if self.backbone.pooling == "mean":  # each input token once, not its k copies
            pooled = self.backbone.pool(sequence, padding_mask)
        else:
            pooled = self.backbone.pool(hidden, mask)
        if self.k > 1 and self.max_expanded_tokens is not None:
            # Compiled calls cannot raise: a cut row shows as NaN.
            overflow = expanded["overflow"]
            sequence = ops.where(overflow[:, None, None], float("nan"), sequence)
            pooled = ops.where(overflow[:, None], float("nan"), pooled)
        return {"sequence_output": sequence, "pooled_output": pooled}

    def compute_output_spec(self, inputs, training=False):
        batch, length = inputs["token_ids"].shape[:2]
        hidden, dtype = self.backbone.hidden_dim, self.backbone.compute_dtype
        return {
            "sequence_output": keras.KerasTensor((batch, length, hidden), dtype),
            "pooled_output": keras.KerasTensor((batch, hidden), dtype),
        }

    def get_config(self):
        return {
            **super().get_config(),
            "max_expanded_tokens": self.max_expanded_tokens,
            "objective": self.objective,
        }
