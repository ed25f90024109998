"""model.save / keras.saving.load_model and keras-hub presets round-trip."""

import json
import re
import shutil

import keras
import numpy as np
import pytest

from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from keras_masking.models import TransformerTextClassifier
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

# Every position scheme, with and without a position_ids input, and the
# RoBERTa shape (no segments, no pooler).
SHAPES = [
    dict(position="absolute"),
    dict(position="absolute", custom_position_ids=True),
    dict(position="absolute", num_segments=0, use_pooler=False),
    dict(position="rotary"),
    dict(position="rotary", custom_position_ids=True),
    dict(position="relative"),
    dict(position="relative", custom_position_ids=True),
    dict(position="rotary2d"),
    dict(position="rotary2d", custom_position_ids=True),
]
SHAPE_IDS = [
    "absolute",
    "absolute-position_ids",
    "absolute-roberta",
    "rotary",
    "rotary-position_ids",
    "relative",
    "relative-position_ids",
    "rotary2d",
    "rotary2d-position_ids",
]


def _backbone_and_features(shape, seed=0):
    backbone = TransformerBackbone(**tiny_backbone_kwargs(**shape))
    randomize_weights(backbone, seed=seed)
    features = random_features()
    if not backbone.num_segments:
        features.pop("segment_ids")
    if backbone.custom_position_ids:
        positions = np.tile(np.arange(3, 13), (2, 1)).astype("int32")
        if backbone.position == "rotary2d":
            copies = np.tile(np.array([0, 0, 1, 0, 1, 2, 0, 0, 1, 0]), (2, 1)).astype("int32")
            positions = np.stack([positions, copies], axis=-1)
        features["position_ids"] = positions
    assert set(features) == set(backbone.input)
    return backbone, features


def _assert_same_outputs(restored, backbone, features):
    expected = backbone(features)
    actual = restored(features)
    assert set(actual) == {"sequence_output", "pooled_output", "token_mask"}
    for key in expected:
        np.testing.assert_array_equal(actual[key], expected[key])


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_backbone_round_trips(shape, tmp_path):
    """Config, ``.keras`` file and preset folder, without custom_objects."""
    import keras_hub

    backbone, features = _backbone_and_features(shape)
    config = backbone.get_config()
    json.dumps(config)  # plain JSON
    restored = TransformerBackbone.from_config(config)
    assert restored.get_config() == config
    assert [tuple(w.shape) for w in restored.weights] == [tuple(w.shape) for w in backbone.weights]
    restored.set_weights(backbone.get_weights())
    _assert_same_outputs(restored, backbone, features)
    generic = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(backbone))
    assert type(generic) is TransformerBackbone and generic.get_config() == config

    path = tmp_path / "backbone.keras"
    backbone.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects
    assert type(loaded) is TransformerBackbone and loaded.get_config() == config
    _assert_same_outputs(loaded, backbone, features)

    preset = tmp_path / "preset"
    backbone.save_to_preset(str(preset))
    from_preset = TransformerBackbone.from_preset(str(preset))
    assert type(from_preset) is TransformerBackbone and from_preset.get_config() == config
    _assert_same_outputs(from_preset, backbone, features)
    generic = keras_hub.models.Backbone.from_preset(str(preset))
    assert type(generic) is TransformerBackbone
    _assert_same_outputs(generic, backbone, features)


def test_round_trip_would_show_a_wrong_weight(tmp_path):
    """The comparisons above are exact: one changed weight shows."""
    backbone, features = _backbone_and_features(dict(position="rotary"), seed=3)
    path = tmp_path / "backbone.keras"
    backbone.save(path)
    restored = keras.saving.load_model(path)
    value = np.array(restored.transformer_layers[1].self_attention.key.kernel)
    restored.transformer_layers[1].self_attention.key.kernel.assign(value * 1.001)
    with pytest.raises(AssertionError):
        _assert_same_outputs(restored, backbone, features)


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


def test_compiled_training_step_runs_under_xla():
    backbone = TransformerBackbone(**tiny_backbone_kwargs(position="relative", dropout=0.1))
    masked_lm = TransformerMaskedLM(backbone)
    masked_lm.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True)
    features = random_features(batch=4)
    positions = np.tile(np.array([1, 2, 3]), (4, 1)).astype("int32")
    labels = np.take_along_axis(features["token_ids"], positions, axis=1)
    data = {**features, "mask_positions": positions}
    losses = masked_lm.fit(data, labels, epochs=15, verbose=0).history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


# === A damaged preset folder is refused, naming the file ===
def _damaged_preset(tmp_path, name, keep):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    preset = tmp_path / "preset"
    backbone.save_to_preset(str(preset))
    path = preset / name
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return preset, path


def test_a_preset_is_saved_whole_or_the_old_one_stays(tmp_path, monkeypatch):
    """A failure while writing the weights (a full disk) leaves the preset that was there."""
    preset = tmp_path / "preset"
    old = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=1)
    old.save_to_preset(str(preset))
    (preset / "notes.txt").write_text("mine")
    new = TransformerBackbone(**tiny_backbone_kwargs(hidden_dim=16, intermediate_dim=32))

    def full_disk(self, path, *args, **kwargs):
        open(path, "wb").write(b"half")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(keras.Model, "save_weights", full_disk)
        with pytest.raises(OSError, match="No space"):
            new.save_to_preset(str(preset))
    loaded = TransformerBackbone.from_preset(str(preset))
    features = random_features()
    np.testing.assert_array_equal(loaded.predict(features, verbose=0)["sequence_output"],
                                  old.predict(features, verbose=0)["sequence_output"])  # fmt: skip
    assert sorted(path.name for path in tmp_path.iterdir()) == ["preset"]
    new.save_to_preset(str(preset))  # written whole: the new model, the other file kept
    assert TransformerBackbone.from_preset(str(preset)).hidden_dim == 16
    assert (preset / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("model_kind", ["backbone", "classifier"])
def test_a_sharded_preset_saved_over_a_whole_one_loads_the_new_weights(model_kind, tmp_path):
    """The weights files are one set: the old model.weights.h5 stayed beside the new
    shards, and keras-hub loads it first (the old model came back, 1.8 apart)."""
    preset = str(tmp_path / "preset")

    def model(seed):
        backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=seed)
        if model_kind == "backbone":
            return backbone
        return randomize_weights(TransformerTextClassifier(backbone, num_classes=3), seed=seed)

    model(1).save_to_preset(preset)
    new = model(2)
    new.save_to_preset(preset, max_shard_size=0.00002)
    loaded = type(new).from_preset(preset)
    assert not (tmp_path / "preset" / "model.weights.h5").exists()
    assert (tmp_path / "preset" / "model_00001.weights.h5").exists()
    for got, want in zip(loaded.weights, new.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want)
        )
    model(3).save_to_preset(preset)  # and back: the old shards go
    assert not list((tmp_path / "preset").glob("model_*.weights.h5"))


@pytest.mark.parametrize("keep", [0.6, 0.01])
def test_truncated_preset_weights_name_the_file(keep, tmp_path):
    preset, path = _damaged_preset(tmp_path, "model.weights.h5", keep)
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(path))}: cannot read the preset's weights; the file is "
        r"truncated or corrupt \(OSError: .*truncated file",
    ):
        TransformerBackbone.from_preset(str(preset))
    # Without the weights, the architecture still loads.
    assert TransformerBackbone.from_preset(str(preset), load_weights=False).num_layers == 2


@pytest.mark.parametrize("name", ["config.json", "metadata.json"])
def test_corrupt_preset_json_names_the_file(name, tmp_path):
    preset, path = _damaged_preset(tmp_path, name, 0.5)
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))}: not valid JSON \(.*\); the file is truncated"
    ):
        TransformerBackbone.from_preset(str(preset))
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"expected a JSON object\. Received: a JSON list\."):
        TransformerBackbone.from_preset(str(preset))


@pytest.mark.parametrize("name", ["model.weights.h5", "config.json"])
def test_correcting_a_damaged_preset_names_the_file(name, tmp_path):
    # `correct_preset_embeddings` (and `keras-masking correct-embeddings`) read
    # presets through the same checks as `from_preset`.
    from keras_masking.methods.mlm_embedding_correction_files import correct_preset_embeddings

    preset, path = _damaged_preset(tmp_path, name, 0.5)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: .*truncated"):
        correct_preset_embeddings(str(preset), str(tmp_path / "out"), mask_token_id=4)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def classifier_preset(tmp_path_factory):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=1)
    preset = tmp_path_factory.mktemp("classifier") / "preset"
    TransformerTextClassifier(backbone, num_classes=3).save_to_preset(str(preset))
    return preset


def _nan_in_head(path):
    import h5py

    with h5py.File(path, "r+") as file:
        kernels = []
        file.visititems(
            lambda name, item: kernels.append(name) if isinstance(item, h5py.Dataset) else None
        )
        kernel = file[kernels[0]]
        kernel[...] = np.full(kernel.shape, np.nan, kernel.dtype)


def _truncated(path):
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: (p / "task.weights.h5").unlink(), r"task.weights.h5: not found, so the trained"),
        (lambda p: _nan_in_head(p / "task.weights.h5"), r"NaN or infinite value"),
        (lambda p: _truncated(p / "task.weights.h5"), r"task.weights.h5: cannot read"),
        (lambda p: (p / "task.json").write_text("{x"), r"task.json: not valid JSON"),
        (lambda p: (p / "task.json").unlink(), r"holds no task.json .* Expected num_classes="),
    ],
    ids=["head missing", "head NaN", "head truncated", "task.json corrupt", "no task.json"],
)
def test_a_damaged_classifier_preset_is_refused_by_its_file(
    classifier_preset, damage, message, tmp_path
):
    """keras-hub built a random head without a word for a missing task.weights.h5,
    loaded NaN heads, and named no file (h5py, JSON) or another (tokenizer.json)."""
    preset = tmp_path / "preset"
    shutil.copytree(classifier_preset, preset)
    TransformerTextClassifier.from_preset(str(preset))  # whole, it loads
    damage(preset)
    with pytest.raises(ValueError, match=message):
        TransformerTextClassifier.from_preset(str(preset))


def test_preset_with_nan_weights_is_refused(tmp_path):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings).copy()
    table[5, 2] = np.nan
    backbone.token_embedding.embeddings.assign(table)
    backbone.save_to_preset(str(tmp_path / "preset"))
    with pytest.raises(
        ValueError,
        match=r"model.weights.h5: weight '.*token_embedding/embeddings' holds 1 NaN or infinite",
    ):
        TransformerBackbone.from_preset(str(tmp_path / "preset"))


def test_weights_of_another_method_layout_are_refused_not_loaded_by_position(tmp_path):
    # Keras loads a weights file by the order of the layers: adversaries saved
    # on layer 0 would load into the adversary of layer 1, silently.
    def classifier(asa_layers):
        keras.utils.set_random_seed(0)
        backbone = TransformerBackbone(**tiny_backbone_kwargs())
        model = TransformerTextClassifier(backbone, num_classes=2)
        model.enable_asa(tau=0.5, layers=asa_layers)
        return model

    saved = classifier([0])
    saved.save_weights(tmp_path / "asa.weights.h5")
    with pytest.raises(ValueError, match=r"asa_layers: file \[0\], model \[1\]"):
        classifier([1]).load_weights(tmp_path / "asa.weights.h5")
    same = classifier([0])
    same.load_weights(tmp_path / "asa.weights.h5")  # the same layout loads
    for a, b in zip(same.weights, saved.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_a_classifier_preset_saved_under_a_mixed_policy_loads(policy, tmp_path, restore_policy):
    """keras-hub's task loader refused the saved policy's name: "Invalid dtype"."""
    keras.mixed_precision.set_global_policy(policy)
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=1)
    classifier = TransformerTextClassifier(backbone, num_classes=3)
    classifier.save_to_preset(str(tmp_path / "preset"))
    for load_policy in (policy, "float32"):
        keras.mixed_precision.set_global_policy(load_policy)
        loaded = TransformerTextClassifier.from_preset(str(tmp_path / "preset"))
        assert loaded.dtype_policy.name == load_policy
        for got, want in zip(loaded.weights, classifier.weights):
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want)
            )
