"""keras-hub BertBackbone / RobertaBackbone <-> TransformerBackbone."""

import keras
import keras_hub
import numpy as np
import pytest
from conftest import HUB_SIZES
from conftest import random_features
from conftest import randomize_weights
from conftest import tiny_backbone_kwargs

import keras_masking
from keras_masking.models import TransformerBackbone


def _hub_bert():
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    randomize_weights(hub)
    return hub


def test_from_keras_hub_bert_matches_outputs():
    hub = _hub_bert()
    ours = keras_masking.models.from_keras_hub(hub)
    assert isinstance(ours, TransformerBackbone)
    features = random_features()
    expected, actual = hub(features), ours(features)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(actual[key], expected[key], atol=1e-5)


def test_from_keras_hub_with_exact_gelu_differs():
    """Matching needs keras-hub's tanh GELU: the test above can fail."""
    hub = _hub_bert()
    ours = keras_masking.models.from_keras_hub(hub, activation="gelu")
    features = random_features()
    difference = np.abs(
        np.asarray(ours(features)["sequence_output"]) - np.asarray(hub(features)["sequence_output"])
    ).max()
    assert difference > 1e-5


def test_to_keras_hub_round_trip_bert():
    ours = TransformerBackbone(**tiny_backbone_kwargs(activation="gelu_approximate"))
    randomize_weights(ours, seed=1)
    hub = ours.to_keras_hub()
    assert isinstance(hub, keras_hub.models.BertBackbone)
    features = random_features()
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(hub(features)[key], ours(features)[key], atol=1e-5)
    back = keras_masking.models.from_keras_hub(hub)
    for a, b in zip(back.get_weights(), ours.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_roberta_both_ways():
    hub = keras_hub.models.RobertaBackbone(**HUB_SIZES)
    randomize_weights(hub, seed=2)
    ours = keras_masking.models.from_keras_hub(hub)
    assert ours.num_segments == 0 and not ours.use_pooler
    assert "segment_ids" not in ours.input
    features = random_features()
    features.pop("segment_ids")
    sequence = ours(features)["sequence_output"]
    np.testing.assert_allclose(sequence, hub(features), atol=1e-5)
    np.testing.assert_allclose(ours(features)["pooled_output"], sequence[:, 0], atol=0)
    again = ours.to_keras_hub()
    assert isinstance(again, keras_hub.models.RobertaBackbone)
    np.testing.assert_allclose(again(features), hub(features), atol=1e-5)


def test_to_keras_hub_rejects_rotary_and_warns_on_activation(caplog):
    rotary = TransformerBackbone(**tiny_backbone_kwargs(position="rotary"))
    with pytest.raises(ValueError, match="absolute positions only"):
        rotary.to_keras_hub()
    exact = TransformerBackbone(**tiny_backbone_kwargs(activation="gelu"))
    with caplog.at_level("WARNING", logger="keras_masking"):
        exact.to_keras_hub()
    assert "gelu_approximate" in caplog.text


def test_from_keras_hub_rejects_other_models():
    with pytest.raises(TypeError, match="BertBackbone"):
        keras_masking.models.from_keras_hub(keras.Sequential())
