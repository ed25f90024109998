"""DropTokenEncoder: a functional encoder with DropToken's ``token_mask`` output.

The one way to turn DropToken on is ``backbone.enable_drop_token(rate, ...)``
(or ``classifier.enable_drop_token``). `DropTokenEncoder` is the same graph
as a separate functional model that also outputs ``token_mask``; the CLUE
runner's heads use it.
"""

import keras

from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.models.transformer_backbone import encoder_drop_token
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import check_backbone_features


@keras.saving.register_keras_serializable(package="keras_masking")
class DropTokenEncoder(ConcreteInputChecks, keras.Model):
    """A backbone that drops tokens after its embedding stage in training.

    The graph of `TransformerBackbone.forward_stages` with a `DropToken`
    (weights shared with the backbone); at inference nothing is dropped.
    Outputs: ``sequence_output`` at full length, ``pooled_output``, and
    ``token_mask`` (1 for real tokens that were kept). A keras-hub backbone
    is converted at the door (`TransformerBackbone.from_keras_hub`).

    Args:
        backbone: `TransformerBackbone`, or keras-hub `BertBackbone` /
            `RobertaBackbone`.
        rate: float in [0, 1).
        unselectable_token_ids: ids never dropped, e.g. ``(101, 102)``.
        mode: ``"gather"`` or ``"attention"`` (see `DropToken`).
        seed: int >= 0 or None.
        slot_multiple: int >= 1, see `DropToken`.
        dtype: dtype policy of the dropping layer; None takes the backbone's.
        **kwargs: `keras.Model` arguments (``name``, ``trainable``).

    Example:
    ```python
    encoder = DropTokenEncoder(backbone, 0.15, unselectable_token_ids=(101, 102))
    outputs = encoder(features, training=True)  # drops 15% of the tokens
    ```
    """

    def __init__(
        self,
        backbone,
        rate,
        unselectable_token_ids=(),
        mode="gather",
        seed=None,
        slot_multiple=8,
        dtype=None,
        **kwargs,
    ):
        if not isinstance(backbone, TransformerBackbone):
            backbone = TransformerBackbone.from_keras_hub(backbone)
        policy = backbone.dtype_policy if dtype is None else keras.dtype_policies.get(dtype)
        options = dict(unselectable_token_ids=unselectable_token_ids, mode=mode, seed=seed)
        drop = encoder_drop_token(
            rate, policy, backbone.vocabulary_size, slot_multiple=slot_multiple, **options
        )
        inputs = dict(backbone.input)
        outputs = backbone.forward_stages(inputs, drop_token=drop)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.dtype_policy = policy
        self.backbone = backbone
        self.drop_token = drop
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

    @property
    def unselectable_token_ids(self):
        """The ids never dropped."""
        return self.drop_token.unselectable_token_ids

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "rate": self.rate,
            "unselectable_token_ids": list(self.unselectable_token_ids),
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
