"""with_drop_token: an encoder that drops tokens in training, keeping positions."""

import keras

from keras_masking.layers.drop_token import DropToken
from keras_masking.layers.drop_token import RestoreDroppedTokens
from keras_masking.methods.encoder_stages import encoder_stages
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import check_backbone_features
from keras_masking.utils.xla_cpu import warn_if_slow_token_dropping_under_xla


@keras.saving.register_keras_serializable(package="keras_masking")
class DropTokenEncoder(ConcreteInputChecks, keras.Model):
    """A backbone that drops tokens after its embedding stage in training.

    ``embed -> DropToken -> layers(kept tokens, their mask, their original
    position ids) -> pool``, built from the backbone's own layers (weights
    shared). Positions stay right in every scheme: absolute embeddings are
    added before dropping, rotary and relative attention read the kept
    tokens' original position ids. [CLS] (position 0) is always kept, so
    classifiers on ``pooled_output`` work unchanged. At inference nothing is
    dropped and the outputs equal the backbone's.

    Outputs: ``sequence_output`` at full length (zeros where a token was
    dropped), ``pooled_output``, and ``token_mask`` (1 for real tokens that
    were kept: a token-level loss can weight by it).

    Args:
        backbone: `TransformerBackbone`, keras-hub `BertBackbone` or
            `RobertaBackbone`.
        rate: float in [0, 1) (numpy scalars accepted).
        protected_token_ids: list or tuple of ids never dropped, e.g.
            ``(101, 102)``.
        mode: ``"gather"`` (shorter sequence, faster) or ``"attention"``
            (full length; dropped keys hidden in every layer).
        seed: int >= 0 or None.
        slot_multiple: int >= 1, see `DropToken`.
        dtype: dtype policy of the dropping layers; None takes the
            backbone's (the backbone keeps its own policy).
        **kwargs: `keras.Model` arguments (``name``, ``trainable``).

    Example:

    ```python
    encoder = DropTokenEncoder(backbone, 0.15, protected_token_ids=(101, 102))
    outputs = encoder(features, training=True)  # drops 15% of the tokens
    ```
    """

    def __init__(
        self,
        backbone,
        rate,
        protected_token_ids=(),
        mode="gather",
        seed=None,
        slot_multiple=8,
        dtype=None,
        **kwargs,
    ):
        stages = encoder_stages(backbone)
        policy = backbone.dtype_policy if dtype is None else keras.dtype_policies.get(dtype)
        drop = DropToken(
            rate,
            protected_token_ids=protected_token_ids,
            protected_positions=(0,),
            mode=mode,
            seed=seed,
            slot_multiple=slot_multiple,
            dtype=policy,
            name="drop_token",
        )
        inputs = dict(backbone.input)
        restore = None
        if drop.mode == "gather":
            restore = RestoreDroppedTokens(dtype=policy, name="restore_dropped_tokens")
        super().__init__(
            inputs=inputs,
            outputs=drop_token_stages(stages, drop, inputs, restore),
            **kwargs,
        )
        self.dtype_policy = policy
        self.backbone = backbone
        self.drop_token = drop
        self.protected_token_ids = drop.protected_token_ids
        self.mode = drop.mode
        self.seed = drop.seed
        self.slot_multiple = drop.slot_multiple

    def check_inputs(self, inputs):
        """The backbone's input checks, at every entry point (see
        `TransformerBackbone.check_inputs`)."""
        check_backbone_features(self.backbone, inputs)

    @property
    def rate(self):
        """The drop rate now (a `DropTokenRateSchedule` changes it in `fit`)."""
        return self.drop_token.rate

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "rate": self.rate,
            "protected_token_ids": list(self.protected_token_ids),
            "mode": self.mode,
            "seed": self.seed,
            "slot_multiple": self.slot_multiple,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)


def drop_token_stages(stages, drop, inputs, restore=None, **mask_hooks):
    """``embed -> DropToken -> encode -> pool``: a `DropTokenEncoder`'s graph.

    Args:
        stages: the backbone's `encoder_stages`.
        drop: the `DropToken` layer.
        inputs: the backbone's input dict.
        restore: the `RestoreDroppedTokens` layer (gather mode), else None.
        **mask_hooks: ``attention_mask_fn`` and ``mask_semantics`` for
            `TransformerBackbone.encode` (attention mode only; ASA).

    Returns:
        ``{"sequence_output", "pooled_output", "token_mask"}``.
    """
    position_ids = inputs.get("position_ids")
    hidden = stages.embed(inputs, position_ids)
    dropped = drop(
        hidden,
        inputs["padding_mask"],
        token_ids=inputs["token_ids"],
        position_ids=position_ids,
    )
    positions = dropped["position_ids"] if stages.reads_positions_in_attention else None
    if drop.mode == "gather":
        sequence = stages.encode(dropped["hidden"], dropped["padding_mask"], positions)
        pooled = stages.pool(sequence)
        sequence = restore(sequence, dropped["keep_mask"])
    else:
        sequence = stages.encode(
            hidden, inputs["padding_mask"], positions, dropped["attention_bias"], **mask_hooks
        )
        pooled = stages.pool(sequence)
    token_mask = keras.ops.cast(dropped["keep_mask"], "int32") * keras.ops.cast(
        inputs["padding_mask"], "int32"
    )
    return {"sequence_output": sequence, "pooled_output": pooled, "token_mask": token_mask}


def with_drop_token(
    backbone, rate, protected_token_ids=None, mode="gather", seed=None, slot_multiple=8
):
    """Wraps a backbone so it drops tokens during training.

    Args:
        backbone: `TransformerBackbone` (absolute, rotary or relative
            positions), keras-hub `BertBackbone` or `RobertaBackbone`.
        rate: float in [0, 1) (numpy scalars accepted); 0.10-0.15 did best
            on CLUE.
        protected_token_ids: list or tuple of ids never dropped, or None
            (``()``: only position 0, [CLS], is kept). Pass ``(101, 102)``
            for BERT's [CLS] and [SEP].
        mode: ``"gather"`` or ``"attention"`` (see `DropToken`).
        seed: int >= 0 or None.
        slot_multiple: int >= 1, gather mode rounds the kept slots up to a
            multiple of it (see `DropToken`).

    Returns:
        A `DropTokenEncoder` with the backbone's inputs and outputs
        ``sequence_output``, ``pooled_output``, ``token_mask``.

    Example:
    ```python
    encoder = keras_masking.with_drop_token(backbone, 0.15, protected_token_ids=(101, 102))
    logits = keras.layers.Dense(15)(encoder(encoder.input)["pooled_output"])
    ```

    On TensorFlow's XLA CPU backend, gather mode needs the XLA CPU fusion
    emitters off to be fast (see `keras_masking.utils.xla_cpu`); a warning
    says so once.
    """
    encoder = DropTokenEncoder(
        backbone,
        rate,
        protected_token_ids=() if protected_token_ids is None else protected_token_ids,
        mode=mode,
        seed=seed,
        slot_multiple=slot_multiple,
    )
    if encoder.mode == "gather" and encoder.rate:
        warn_if_slow_token_dropping_under_xla()
    return encoder
