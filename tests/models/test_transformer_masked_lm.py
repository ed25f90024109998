"""TransformerMaskedLM's own behaviour (its layers, serialization and
checkpoints are tested with them: tests/layers, test_serialization.py,
test_tf_checkpoint.py)."""

import keras
import numpy as np

from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


def test_the_default_loss_is_the_cross_entropy_per_masked_token():
    """BERT's normalisation: keras-hub's default divided by every prediction
    slot, padded ones too (1.79 where the loss per masked token was 4.18)."""
    masked_lm = TransformerMaskedLM(TransformerBackbone(**tiny_backbone_kwargs(num_layers=1)))
    randomize_weights(masked_lm, scale=0.3)
    masked_lm.compile()
    features = random_features(batch=2, length=10)
    features["mask_positions"] = np.array([[1, 2, 3], [4, 0, 0]], "int32")
    labels = np.array([[5, 6, 7], [8, 0, 0]], "int32")
    weights = np.array([[1, 1, 1], [1, 0, 0]], "float32")
    logits = keras.ops.convert_to_numpy(masked_lm(features)).astype("float64")
    top = logits.max(-1, keepdims=True)
    log_p = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    cross_entropy = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
    expected = (cross_entropy * weights).sum() / weights.sum()
    loss = masked_lm.compute_loss(
        x=features, y=labels, y_pred=keras.ops.convert_to_tensor(logits, "float32"),
        sample_weight=weights,
    )  # fmt: skip
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(loss)), expected, rtol=1e-5)
