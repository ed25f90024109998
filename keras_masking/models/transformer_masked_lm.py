"""TransformerMaskedLM: a TransformerBackbone with its tied MLM head."""

import keras
import keras_hub

from keras_masking.layers.initializers import bert_initializer
from keras_masking.layers.masked_lm_head import MaskedLMHead
from keras_masking.models.shuffled_array_fit import ShuffledArrayFit
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.ops.label_range import nan_for_labels_out_of_range
from keras_masking.utils.arguments import check_model_keywords
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import check_ids_in_range
from keras_masking.utils.eager_checks import check_integer_ids
from keras_masking.utils.eager_checks import concrete_value
from keras_masking.utils.eager_checks import static_shape


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerMaskedLM(ConcreteInputChecks, ShuffledArrayFit, keras_hub.models.MaskedLM):
    """Masked language model on a `TransformerBackbone`.

    Adds BERT's MLM head (Google's ``cls/predictions``: dense + activation +
    LayerNorm, output projection tied to the token embedding, output bias) to
    the backbone. Inputs are the backbone's plus ``mask_positions`` (the
    positions to predict); the output is ``(batch, masks, vocabulary)``
    float32 logits, under mixed precision too (see `MaskedLMHead`).

    ``compile()``'s default loss is BERT's: the cross-entropy per masked token
    (``sum(w * CE) / sum(w)`` over the batch's ``sample_weight``, Keras'
    ``reduction="mean_with_sample_weight"``). keras-hub's default divides by
    every prediction slot, padded ones included, so its loss shrinks with the
    share of padded slots and is not comparable with a held-out per-token loss.

    Args:
        backbone: a `keras_masking.models.TransformerBackbone`.
        preprocessor: optional keras-hub masked-LM preprocessor.
        **kwargs: base `keras_hub.models.MaskedLM` arguments.

    Example:
    ```python
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=100, num_layers=1, num_heads=4, hidden_dim=32, intermediate_dim=64,
    )
    masked_lm = keras_masking.models.TransformerMaskedLM(backbone)
    logits = masked_lm({
        "token_ids": np.array([[1, 7, 3, 2]]),
        "segment_ids": np.zeros((1, 4), "int32"),
        "padding_mask": np.ones((1, 4), "int32"),
        "mask_positions": np.array([[1, 2]]),
    })
    logits.shape  # (1, 2, 100)
    ```
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = None

    def __init__(self, backbone, preprocessor=None, **kwargs):
        check_model_keywords(type(self), kwargs)
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.masked_lm_head = MaskedLMHead(
            backbone.token_embedding,
            activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            kernel_initializer=bert_initializer(),
            dtype=backbone.dtype_policy,
            name="mlm_head",
        )
        inputs = {
            **backbone.input,
            "mask_positions": keras.Input(shape=(None,), dtype="int32", name="mask_positions"),
        }
        sequence_output = backbone(backbone.input)["sequence_output"]
        outputs = self.masked_lm_head(sequence_output, inputs["mask_positions"])
        # A functional model given `trainable` sets it on every sublayer:
        # `trainable=True` from a config would unfreeze a tuned backbone.
        trainable = kwargs.pop("trainable", True)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        if not trainable:
            self.trainable = False

    def compile(self, optimizer="auto", loss="auto", **kwargs):
        """keras-hub's `MaskedLM.compile`, with BERT's per-masked-token loss
        for ``loss="auto"`` (see the class docstring)."""
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"
            )
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    def check_labels(self, labels):
        """Labels are token ids in ``[0, vocabulary_size)`` (checked when
        concrete; a compiled step's loss is NaN for one outside)."""
        values = None if labels is None or isinstance(labels, dict) else concrete_value(labels)
        if values is not None and values.size:
            check_integer_ids("labels", values)
            check_ids_in_range(values, self.backbone.vocabulary_size, "labels", "vocabulary_size")

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return nan_for_labels_out_of_range(loss, y, self.backbone.vocabulary_size)

    def check_inputs(self, inputs):
        """The backbone's `check_inputs`, and ``mask_positions``: integers
        ``(batch, masks)`` in ``[0, sequence)``; see
        `TransformerBackbone.check_inputs` for when each check runs."""
        self.backbone.check_inputs(inputs, allowed=tuple(self.input))
        positions = inputs.get("mask_positions") if isinstance(inputs, dict) else None
        if positions is None:
            raise ValueError(
                f"Expected a dict of inputs with the keys {sorted(self.input)}. Received: the "
                f"keys {sorted(inputs)} (missing ['mask_positions'])."
            )
        check_integer_ids("mask_positions", positions)
        shape, length = static_shape(positions), static_shape(inputs["token_ids"])[1]
        batch = static_shape(inputs["token_ids"])[0]
        if len(shape) != 2 or None not in (shape[0], batch) and shape[0] != batch:
            raise ValueError(
                f"Expected mask_positions of shape (batch, masks) with batch = {batch}. "
                f"Received: mask_positions.shape={shape}."
            )
        if length is not None:
            check_ids_in_range(positions, length, "mask_positions", "sequence length")

    def get_config(self):
        # keras-hub's Task config holds the backbone, the preprocessor and the
        # name; the compute dtype follows the backbone's.
        config = super().get_config()
        config["trainable"] = self.trainable
        return config

    @classmethod
    def from_config(cls, config):
        # keras-hub's Task.from_config writes the deserialized backbone into
        # the dict it is given; keep the caller's config as it was.
        return super().from_config(dict(config))
