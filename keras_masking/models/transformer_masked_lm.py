"""TransformerMaskedLM: a TransformerBackbone with its tied MLM head."""

import keras
import keras_hub

from keras_masking.layers.initializers import bert_initializer
from keras_masking.layers.masked_lm_head import MaskedLMHead
from keras_masking.models.transformer_backbone import TransformerBackbone


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerMaskedLM(keras_hub.models.MaskedLM):
    """Masked language model on a `TransformerBackbone`.

    Adds BERT's MLM head (Google's ``cls/predictions``: dense + activation +
    LayerNorm, output projection tied to the token embedding, output bias) to
    the backbone. Inputs are the backbone's plus ``mask_positions`` (the
    positions to predict); the output is ``(batch, masks, vocabulary)``
    logits. Compiles with keras-hub's MaskedLM defaults (sparse categorical
    cross-entropy from logits).

    Args:
        backbone: a `keras_masking.models.TransformerBackbone`.
        preprocessor: optional keras-hub masked-LM preprocessor.
        **kwargs: base `keras_hub.models.MaskedLM` arguments.

    Example:
    ```python
    masked_lm = keras_masking.models.TransformerMaskedLM(backbone)
    logits = masked_lm({**features, "mask_positions": np.array([[1, 2]])})
    ```
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = None

    def __init__(self, backbone, preprocessor=None, **kwargs):
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
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
