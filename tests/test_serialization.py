"""model.save / keras.saving.load_model and keras-hub presets round-trip."""

import keras
import numpy as np
import pytest
from conftest import random_features
from conftest import tiny_backbone_kwargs

from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM


@pytest.mark.parametrize("position", ["absolute", "rotary", "relative"])
def test_backbone_save_and_load_model(position, tmp_path):
    backbone = TransformerBackbone(**tiny_backbone_kwargs(position=position))
    features = random_features()
    expected = backbone(features)
    path = tmp_path / "backbone.keras"
    backbone.save(path)
    restored = keras.saving.load_model(path)  # no custom_objects
    assert isinstance(restored, TransformerBackbone)
    assert restored.get_config() == backbone.get_config()
    actual = restored(features)
    for key in expected:
        np.testing.assert_array_equal(actual[key], expected[key])


def test_masked_lm_save_and_load_model_keeps_tying(tmp_path):
    masked_lm = TransformerMaskedLM(
        TransformerBackbone(**tiny_backbone_kwargs(position="relative"))
    )
    inputs = {**random_features(), "mask_positions": np.array([[1, 2], [0, 3]])}
    expected = masked_lm(inputs)
    path = tmp_path / "mlm.keras"
    masked_lm.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(restored(inputs), expected)
    head = restored.masked_lm_head
    assert head.token_embedding is restored.backbone.token_embedding


def test_preset_round_trip_with_custom_positions(tmp_path):
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary", custom_position_ids=True)
    )
    features = {**random_features(), "position_ids": np.tile(np.arange(3, 13), (2, 1))}
    expected = backbone(features)
    preset = tmp_path / "preset"
    backbone.save_to_preset(str(preset))
    restored = TransformerBackbone.from_preset(str(preset))
    actual = restored(features)
    for key in expected:
        np.testing.assert_array_equal(actual[key], expected[key])
    import keras_hub

    generic = keras_hub.models.Backbone.from_preset(str(preset))
    assert isinstance(generic, TransformerBackbone)


def test_compiled_training_step_runs_under_xla():
    backbone = TransformerBackbone(**tiny_backbone_kwargs(position="relative", dropout=0.1))
    masked_lm = TransformerMaskedLM(backbone)
    masked_lm.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True)
    features = random_features(batch=4)
    positions = np.tile(np.array([1, 2, 3]), (4, 1)).astype("int32")
    labels = np.take_along_axis(features["token_ids"], positions, axis=1)
    data = {**features, "mask_positions": positions}
    first = masked_lm.evaluate(data, labels, verbose=0, return_dict=True)["loss"]
    masked_lm.fit(data, labels, epochs=15, verbose=0)
    last = masked_lm.evaluate(data, labels, verbose=0, return_dict=True)["loss"]
    assert last < first
