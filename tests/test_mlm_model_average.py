"""Model averaging over MLM maskings."""

import keras
import numpy as np
import pytest
from conftest import random_features
from conftest import tiny_backbone_kwargs

import keras_masking
from keras_masking.methods import sample_mlm_maskings
from keras_masking.models import TransformerBackbone


def test_maskings_follow_the_pretraining_distribution():
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, 1000, size=(8, 64))
    token_ids[:, 0] = 1  # [CLS]: unselectable
    padding = np.ones_like(token_ids)
    padding[:, 60:] = 0
    masked = sample_mlm_maskings(
        token_ids,
        400,
        mask_token_id=4,
        vocabulary_size=1000,
        unselectable_token_ids=[1],
        padding_mask=padding,
        seed=3,
    )
    assert masked.shape == (400, 8, 64)
    assert (masked[:, :, 0] == 1).all() and (masked[:, :, 60:] == token_ids[:, 60:]).all()
    region = masked[:, :, 1:60]
    original = np.broadcast_to(token_ids[:, 1:60], region.shape)
    mask_share = (region == 4).mean()
    changed = ((region != original) & (region != 4)).mean()
    # Selected 15%: 80% -> [MASK] (12%), 10% -> random (1.5%, almost always a change).
    assert abs(mask_share - 0.12) < 0.004
    assert abs(changed - 0.015) < 0.002


def test_model_average_equals_a_loop_over_the_same_maskings():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    inputs = backbone.input
    logits = keras.layers.Dense(3)(backbone(inputs)["pooled_output"])
    model = keras.Model(inputs, logits)
    features = random_features(batch=3)
    averaged = keras_masking.mlm_model_average(
        model,
        features,
        mask_token_id=3,
        samples=5,
        from_logits=True,
        seed=7,
        unselectable_token_ids=[0],
    )
    masked = sample_mlm_maskings(
        features["token_ids"],
        5,
        3,
        64,
        unselectable_token_ids=[0],
        padding_mask=features["padding_mask"],
        seed=7,
    )
    loop = np.mean(
        [
            keras.ops.convert_to_numpy(keras.ops.softmax(model({**features, "token_ids": m})))
            for m in masked
        ],
        axis=0,
    )
    np.testing.assert_allclose(averaged, loop, atol=1e-5)
    assert averaged.shape == (3, 3) and np.allclose(averaged.sum(-1), 1.0)
    with pytest.raises(ValueError, match="samples"):
        keras_masking.mlm_model_average(model, features, mask_token_id=3, samples=0)
    with pytest.raises(ValueError, match="mask_token_id"):
        keras_masking.mlm_model_average(model, features, mask_token_id=64)
