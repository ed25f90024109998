"""TransformerMaskedLM's own behaviour (its layers, serialization and
checkpoints are tested with them: tests/layers, test_serialization.py,
test_tf_checkpoint.py)."""

import keras
import numpy as np
import pytest

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


def _masked_lm_and_data():
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=2)
    masked_lm = TransformerMaskedLM(backbone)
    masked_lm.compile(optimizer="sgd", jit_compile=True)
    x = {**random_features(), "mask_positions": np.array([[1, 3], [2, 4]], "int32")}
    return masked_lm, x, np.array([[5, 6], [7, 8]], "int32")


def test_labels_and_mask_positions_outside_their_range_are_refused_or_nan():
    """Checked where concrete; in a compiled step (`tf.data`), where values cannot
    raise, NaN: a position -1 was read as the last one, a label 64 on JAX as another id."""
    import tensorflow as tf

    masked_lm, x, y = _masked_lm_and_data()
    with pytest.raises(ValueError, match=r"Expected labels in \[0, 64\) \(vocabulary_size=64\)"):
        masked_lm.evaluate(x, np.array([[5, 64], [7, 8]]), verbose=0)

    def loss(x, y):
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
        return masked_lm.evaluate(data, verbose=0, return_dict=True)["loss"]

    assert np.isfinite(loss(x, y))
    assert np.isnan(loss(x, np.array([[5, 64], [7, 8]], "int32")))
    assert np.isnan(loss(x, np.array([[5, -1], [7, 8]], "int32")))
    bad = {**x, "mask_positions": np.array([[1, -1], [2, 10]], "int32")}
    logits = masked_lm.predict(tf.data.Dataset.from_tensor_slices(bad).batch(2), verbose=0)
    assert np.isnan(logits[0, 1]).all() and np.isnan(logits[1, 1]).all()
    np.testing.assert_allclose(logits[:, 0], masked_lm.predict_on_batch(x)[:, 0], atol=1e-5)
