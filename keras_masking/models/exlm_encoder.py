"""ExLMEncoder: an ExLM-pretrained backbone as the official fine-tuning runs it."""

import keras
import numpy as np
from keras import ops

from keras_masking.layers.state_expansion import StateExpansion
from keras_masking.layers.state_expansion import check_integer_tensor
from keras_masking.layers.state_expansion import check_sequence_inputs
from keras_masking.layers.state_expansion import check_token_id_list
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.utils.arguments import check_int
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import concrete_value


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


def check_backbone_inputs(inputs, backbone):
    """Checks a dict of backbone inputs; returns ``(token_ids, padding_mask, segment_ids)``.

    ``token_ids`` and ``padding_mask`` are required, ``segment_ids`` is
    optional (zeros); all are ``(batch, L)`` with a static ``L``, the ids
    integers. In eager calls, token ids must lie in
    ``[0, backbone.vocabulary_size)`` and the mask hold 0s and 1s.

    Args:
        inputs: a dict.
        backbone: the `TransformerBackbone` the ids are for.

    Returns:
        The three tensors (``segment_ids`` None when absent).

    Example:
    >>> check_backbone_inputs({"token_ids": np.array([[1, 5, 2]])}, None)
    Traceback (most recent call last):
    ...
    ValueError: Expected inputs with the keys ... Received keys: ['token_ids'].
    """
    if not isinstance(inputs, dict) or not {"token_ids", "padding_mask"} <= set(inputs):
        keys = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
        raise ValueError(
            "Expected inputs with the keys ['token_ids', 'padding_mask'] (and optionally "
            f"'segment_ids'). Received keys: {keys}."
        )
    token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
    segment_ids = inputs.get("segment_ids")
    check_sequence_inputs(token_ids, padding_mask, (("segment_ids", segment_ids),))
    if segment_ids is not None:
        check_integer_tensor("segment_ids", segment_ids)
    values = concrete_value(token_ids)
    if values is not None and values.size:
        vocabulary = backbone.vocabulary_size
        bad = (values < 0) | (values >= vocabulary)
        if bad.any():
            raise ValueError(
                f"Expected token_ids in [0, {vocabulary}) (the backbone's vocabulary_size). "
                f"Received values {sorted(set(values[bad].tolist()))[:10]}."
            )
    return token_ids, padding_mask, segment_ids


def check_rotary2d_backbone(backbone, who):
    """Raises a ValueError unless ``backbone`` is a ``rotary2d`` TransformerBackbone.

    Args:
        backbone: the object received.
        who: the class name for the message.

    Example:
    >>> check_rotary2d_backbone("bert", "ExLMEncoder")
    Traceback (most recent call last):
    ...
    ValueError: ExLMEncoder needs a TransformerBackbone with position='rotary2d' ...
    """
    if getattr(backbone, "position", None) != "rotary2d" or not getattr(
        backbone, "custom_position_ids", False
    ):
        raise ValueError(
            f"{who} needs a TransformerBackbone with position='rotary2d' and "
            f"custom_position_ids=True. Received: backbone={backbone!r}."
        )


@keras.saving.register_keras_serializable(package="keras_masking")
class ExLMEncoder(ConcreteInputChecks, keras.Model):
    """Runs an ExLM-pretrained backbone on fine-tuning inputs.

    Fine-tuning data has no [MASK], so, as in the official code, only the
    tokens that were always expanded in pretraining ([CLS] and [SEP]) become
    ``k`` copies with 2D positions ``(index, 1..k)``; every other token keeps
    one slot at ``(index, 0)``. The backbone runs on the expanded sequence,
    the transition head is not used, and the outputs come back in the input's
    layout: ``pooled_output`` is the backbone's pooler on the first [CLS]
    copy, and ``sequence_output`` ``(batch, L, hidden)`` holds each input
    token's first slot, so heads written for the backbone work unchanged
    (its values at padding positions have no meaning). ``k = 1`` expands
    nothing and feeds ``(index, 0)`` everywhere: the inputs an
    MLM-pretrained ``rotary2d`` backbone saw.

    Padding may sit anywhere in a row (left, right, inside): ``index`` counts
    real tokens only, so every layout of the same real tokens gives the same
    outputs at those tokens.

    Args:
        backbone: a `TransformerBackbone` with ``position="rotary2d"`` and
            ``custom_position_ids=True``.
        k: int >= 1, copies per expanded token (the pretraining ``k``).
        mask_token_id: int, the [MASK] id (expanded too if the data has it,
            as in cloze-style fine-tuning).
        special_token_ids: ids expanded in pretraining, ``(cls_id, sep_id)``.
        max_expanded_tokens: int >= 0 or None, the most expanded tokens in
            one example (3: [CLS] and two [SEP]s); fixes the static expanded
            length ``L + (k - 1) * max_expanded_tokens``. None sizes it for
            any input (``k * L``). A row with more: eager calls raise and
            name the rows; in compiled calls (where values cannot be read)
            that row's outputs are NaN, never a silently cut sequence.
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
        check_rotary2d_backbone(backbone, "ExLMEncoder")
        vocabulary = backbone.vocabulary_size
        k = check_int("k", k, minimum=1)
        mask_token_id = check_int("mask_token_id", mask_token_id, minimum=0, maximum=vocabulary - 1)
        special_token_ids = check_token_id_list("special_token_ids", special_token_ids, vocabulary)
        if max_expanded_tokens is not None:
            max_expanded_tokens = check_int("max_expanded_tokens", max_expanded_tokens, minimum=0)
        super().__init__(**kwargs)
        self.backbone = backbone
        self.expansion = StateExpansion(
            k=k,
            mask_token_id=mask_token_id,
            expand_token_ids=special_token_ids,
            max_expanded_tokens=max_expanded_tokens,
        )
        self.k = k
        self.mask_token_id = mask_token_id
        self.special_token_ids = special_token_ids
        self.max_expanded_tokens = max_expanded_tokens

    def build(self, input_shape):
        # The backbone is a built functional model; the expansion has no state.
        self.built = True

    def check_inputs(self, inputs):
        """`check_backbone_inputs`: run by ``fit`` / ``evaluate`` / ``predict``
        on numpy data before a step compiles, and by every eager call."""
        check_backbone_inputs(inputs, self.backbone)

    def call(self, inputs, training=False):
        token_ids, padding_mask, segment_ids = check_backbone_inputs(inputs, self.backbone)
        token_ids = ops.cast(token_ids, "int32")
        padding_mask = ops.cast(ops.cast(padding_mask, "bool"), "int32")
        if segment_ids is None:
            segment_ids = ops.zeros_like(token_ids)
        expanded = self._expand(token_ids, padding_mask)
        ids, mask, positions = (
            expanded[key] for key in ("token_ids", "padding_mask", "position_ids")
        )
        if self.k == 1:  # nothing is copied: (index, 0) everywhere
            positions = ops.stack([positions[..., 0], ops.zeros_like(positions[..., 0])], -1)
        segment_ids = ops.take_along_axis(
            ops.cast(segment_ids, "int32"), expanded["source_index"], axis=1
        )
        hidden = self.backbone.embed(ids, segment_ids, positions, training=training)
        hidden = self.backbone.encode(hidden, mask, positions, training=training)
        sequence = batched_gather(hidden, expanded["first_slot"])
        pooled = self.backbone.pool(hidden)
        if self.k > 1 and self.max_expanded_tokens is not None:
            # Compiled calls cannot raise: a cut row shows as NaN.
            overflow = expanded["overflow"]
            sequence = ops.where(overflow[:, None, None], float("nan"), sequence)
            pooled = ops.where(overflow[:, None], float("nan"), pooled)
        return {"sequence_output": sequence, "pooled_output": pooled}

    def _expand(self, token_ids, padding_mask):
        expanded = self.expansion(token_ids, padding_mask)
        overflow = concrete_value(expanded["overflow"])
        if overflow is not None and np.any(overflow):
            rows = np.flatnonzero(overflow).tolist()
            raise ValueError(
                f"Rows {rows} hold more than max_expanded_tokens={self.max_expanded_tokens} "
                f"tokens to expand (ids {list(self.special_token_ids)} and [MASK] "
                f"{self.mask_token_id}); raise `max_expanded_tokens`, or set it to None to "
                "size the expansion for any input."
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
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)
