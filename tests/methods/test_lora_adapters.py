"""LoRA in adapter files, keyed by layer path; the base an adapter needs; merge_lora."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_masking.methods import load_adapter
from keras_masking.methods import read_adapter
from keras_masking.methods import save_adapter
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerTextClassifier
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

# A second process: the base model from its file, the adapter onto it, predictions out.
LOAD = """
import sys
import keras, numpy as np
from keras_masking.methods import load_adapter
model = keras.saving.load_model(sys.argv[1])
name = load_adapter(model, sys.argv[2])
features = dict(np.load(sys.argv[3]))
np.save(sys.argv[4], model.predict(features, verbose=0))
print(name)
"""


def _model(seed=0):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=seed)
    logits = keras.layers.Dense(3, name="head")(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, logits)
    randomize_weights(model.get_layer("head"), seed=seed + 1)
    return model, backbone


def _trained_lora(backbone, names=None, seed=3):
    backbone.enable_lora(2, names)
    rng = np.random.default_rng(seed)
    for layer in backbone.lora_layers():
        for kernel in (layer.lora_kernel_a, layer.lora_kernel_b):
            kernel.assign(rng.normal(size=kernel.shape).astype("float32") * 0.3)


def _weights(model):
    return [keras.ops.convert_to_numpy(v).copy() for v in model.weights]


def test_a_lora_adapter_written_here_loads_in_another_process_onto_a_fresh_base(tmp_path):
    model, backbone = _model()
    model.save(tmp_path / "base.keras")
    features = random_features(batch=3)
    plain = model.predict(features, verbose=0)
    _trained_lora(backbone)
    model.get_layer("head").kernel.assign(model.get_layer("head").kernel * 2.0)
    save_adapter(model, tmp_path / "tnews.npz", name="tnews")
    expected = model.predict(features, verbose=0)
    assert np.abs(expected - plain).max() > 1e-3  # LoRA and the head changed the model
    description, arrays = read_adapter(tmp_path / "tnews.npz")
    assert description["method"]["lora"] == {"rank": 2, "target_layer_names": ["query", "value"]}
    assert description["lora_layers"] == [layer.path for layer in backbone.lora_layers()]
    assert "transformer_layer_1/self_attention/query" in description["lora_layers"]
    np.savez(tmp_path / "features.npz", **features)
    done = subprocess.run(
        [sys.executable, "-c", LOAD]
        + [str(tmp_path / name) for name in ("base.keras", "tnews.npz", "features.npz", "p.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "tnews"
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), expected, atol=1e-5)


def test_an_adapter_on_another_base_is_refused_naming_the_first_weight_and_nothing_changes(
    tmp_path,
):
    model, backbone = _model()
    _trained_lora(backbone)
    save_adapter(model, tmp_path / "a.npz")
    other, other_backbone = _model(seed=7)  # same architecture, other pretrained weights
    before = _weights(other)
    with pytest.raises(
        ValueError,
        match=r"trained on another base model: its base weight "
        r"embeddings/token_embedding/embeddings \(checksum \d+\)",
    ):
        load_adapter(other, tmp_path / "a.npz")
    assert other_backbone.lora is None
    for old, new in zip(before, _weights(other)):
        np.testing.assert_array_equal(old, new)
    # The check can be skipped on purpose.
    load_adapter(other, tmp_path / "a.npz", check_base=False)
    assert other_backbone.lora is not None


def test_lora_layers_are_matched_by_path_before_anything_changes(tmp_path):
    model, backbone = _model()
    _trained_lora(backbone, names=["query"])
    save_adapter(model, tmp_path / "query.npz")
    fresh, fresh_backbone = _model()
    fresh_backbone.enable_lora(2, ["value"])
    before = _weights(fresh)
    with pytest.raises(ValueError, match=r"does not fit this model"):
        load_adapter(fresh, tmp_path / "query.npz")  # the settings differ first
    for old, new in zip(before, _weights(fresh)):
        np.testing.assert_array_equal(old, new)
    # A file whose layer paths are not this model's.
    description, arrays = read_adapter(tmp_path / "query.npz")
    assert description["lora_layers"][1] == "transformer_layer_1/self_attention/query"
    description["lora_layers"][1] = "transformer_layer_1/self_attention/key"
    np.savez(
        tmp_path / "moved.npz",
        __adapter__=np.array(json.dumps(description)),
        **{f"v{i}": a for i, a in enumerate(arrays)},
    )
    other, other_backbone = _model()
    with pytest.raises(
        ValueError, match=r"adapts the layer transformer_layer_1/self_attention/key where"
    ):
        load_adapter(other, tmp_path / "moved.npz")
    assert other_backbone.lora is None  # refused before LoRA went on


def test_merge_lora_predicts_the_same_without_lora_kernels():
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=2)
    classifier = TransformerTextClassifier(backbone, num_classes=2)
    _trained_lora(backbone)
    features = random_features(batch=3)
    merged = classifier.merge_lora()
    assert merged.backbone.lora is None and not merged.backbone.lora_layers()
    assert not [v for v in merged.weights if "lora" in v.path]
    np.testing.assert_allclose(
        merged.predict(features, verbose=0), classifier.predict(features, verbose=0), atol=1e-5
    )
    with pytest.raises(ValueError, match="No LoRA to merge"):
        merged.backbone.merge_lora()


def _fit(model, features, seed):
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # On JAX a step without XLA runs op by op, slower than its compile.
        jit_compile=keras.config.backend() == "jax",
    )
    labels = np.random.default_rng(seed).integers(0, 3, len(features["token_ids"]))
    model.fit(features, labels, batch_size=4, epochs=2, verbose=0)


def test_a_fitted_lora_adapter_carries_the_biases_lora_trains(tmp_path):
    """LoRA's layers train their bias too (as keras-hub's): the adapter file
    and an AdapterSet's snapshot hold them, so a fitted adapter predicts on a
    fresh base, and after switching, exactly as trained."""
    from keras_masking.methods import AdapterSet

    features = random_features(batch=8)
    model, backbone = _model()
    model.save(tmp_path / "base.keras")
    backbone.enable_lora(2)
    biases = [layer.bias for layer in backbone.lora_layers()]
    assert biases and all(bias.trainable for bias in biases)
    adapters = AdapterSet(model)
    predictions = {}
    for name, seed in (("a", 1), ("b", 2)):
        before = [np.array(bias.numpy()) for bias in biases]
        _fit(model, features, seed)
        assert max(np.abs(b.numpy() - a).max() for b, a in zip(biases, before)) > 1e-3
        predictions[name] = model.predict(features, verbose=0)
        adapters.add(name)
        save_adapter(model, tmp_path / f"{name}.npz", name=name)
    adapters.activate("a")
    np.testing.assert_allclose(model.predict(features, verbose=0), predictions["a"], atol=1e-6)
    fresh = keras.saving.load_model(tmp_path / "base.keras")
    load_adapter(fresh, tmp_path / "a.npz")  # base checked: LoRA's biases are the adapter's
    np.testing.assert_allclose(fresh.predict(features, verbose=0), predictions["a"], atol=1e-6)


@pytest.mark.parametrize("then", ["enable_fl_tuning", "enable_prefix_tuning"])
def test_keras_hubs_lora_file_finds_the_adapted_layers_after_a_later_method(then, tmp_path, caplog):
    """keras-hub's ``.lora.h5`` finds layers by position: a method enabled
    after LoRA shifted them (saving raised an AttributeError). The file holds
    no biases, which a warning says."""
    options = {"enable_fl_tuning": {"units": 4}, "enable_prefix_tuning": {"length": 2}}[then]

    def adapted():
        keras.utils.set_random_seed(0)
        backbone = TransformerBackbone(**tiny_backbone_kwargs())
        backbone.enable_lora(2)
        getattr(backbone, then)(**options)
        return backbone

    backbone = adapted()
    rng = np.random.default_rng(0)
    lora_layers = backbone.lora_targets(["query", "value"])
    for layer in lora_layers:
        layer.lora_kernel_b.assign(rng.normal(size=layer.lora_kernel_b.shape).astype("float32"))
    with caplog.at_level("WARNING", logger="keras_masking"):
        backbone.save_lora_weights(str(tmp_path / "task.lora.h5"))
    assert "not the biases LoRA trained" in caplog.text
    fresh = adapted()
    fresh.load_lora_weights(str(tmp_path / "task.lora.h5"))
    for theirs, ours in zip(fresh.lora_targets(["query", "value"]), lora_layers):
        for name in ("lora_kernel_a", "lora_kernel_b"):
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(getattr(theirs, name)),
                keras.ops.convert_to_numpy(getattr(ours, name)),
            )
