"""FL-tuning (addFFN), its merge, adapter files and the P-tuning v2 baseline."""

import os

import keras
import keras_hub
import numpy as np
import pytest
from conftest import HUB_SIZES
from conftest import random_features
from conftest import randomize_weights
from conftest import tiny_backbone_kwargs

import keras_masking
from keras_masking.layers import AddFFN
from keras_masking.methods import AdapterSet
from keras_masking.methods import add_ffn_parameter_count
from keras_masking.methods import load_adapter
from keras_masking.methods import parameter_report
from keras_masking.methods import save_adapter
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from keras_masking.utils.layer_walk import walk_layers

UNITS = 8


def _classifier(position="absolute", seed=0, **overrides):
    backbone = TransformerBackbone(**tiny_backbone_kwargs(position, **overrides))
    randomize_weights(backbone, seed=seed)
    inputs = backbone.input
    logits = keras.layers.Dense(3, name="head")(backbone(inputs)["pooled_output"])
    return keras.Model(inputs, logits), backbone


def _branches(backbone):
    return [b.feed_forward_branch for b in backbone.transformer_layers if b.feed_forward_branch]


def _randomize_branches(backbone, seed=1):
    rng = np.random.default_rng(seed)
    for branch in _branches(backbone):
        for variable in branch.weights:
            variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))


@pytest.mark.parametrize("position", ["absolute", "rotary", "relative"])
def test_merge_is_exact_for_every_family_and_placement(position, features):
    classifier, backbone = _classifier(position)
    keras_masking.fl_tune(classifier, units=UNITS, verbose=False)
    _randomize_branches(backbone)
    tuned = np.asarray(classifier(features))
    assert (
        np.abs(
            tuned - np.asarray(classifier.get_layer("head")(backbone(features)["pooled_output"]))
        ).max()
        == 0
    )
    merged_outputs = []
    for placement in ("suffix", "prefix", 5):
        merged = keras_masking.merge_fl(classifier, placement=placement)
        merged_backbone = [
            layer for layer in walk_layers(merged) if isinstance(layer, TransformerBackbone)
        ][0]
        assert merged_backbone.intermediate_dim == 48 + UNITS
        assert merged_backbone.add_ffn is None
        assert not [layer for layer in walk_layers(merged_backbone) if isinstance(layer, AddFFN)]
        assert not any(b.feed_forward_branch for b in merged_backbone.transformer_layers)
        assert len(merged.trainable_weights) == len(merged.weights)
        merged_outputs.append(np.asarray(merged(features)))
        np.testing.assert_allclose(merged_outputs[-1], tuned, atol=1e-5)
    # Placement does not change the function: the merged models agree.
    np.testing.assert_allclose(merged_outputs[0], merged_outputs[1], atol=1e-5)
    np.testing.assert_allclose(merged_outputs[0], merged_outputs[2], atol=1e-5)

    unmerged = keras_masking.unmerge_fl(merged)
    np.testing.assert_allclose(np.asarray(unmerged(features)), tuned, atol=1e-5)
    unmerged_backbone = [
        layer for layer in walk_layers(unmerged) if isinstance(layer, TransformerBackbone)
    ][0]
    for old, new in zip(_branches(backbone), _branches(unmerged_backbone)):
        for i in range(3):  # W1', b1', W2' come back exactly; b2' is folded into b2
            np.testing.assert_array_equal(new.get_weights()[i], old.get_weights()[i])


def test_untuned_layers_get_zero_units_and_a_masked_lm_task_merges(features):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    randomize_weights(backbone)
    masked_lm = TransformerMaskedLM(backbone)
    keras_masking.fl_tune(masked_lm, units=UNITS, layers=[1], verbose=False)
    assert [bool(b.feed_forward_branch) for b in backbone.transformer_layers] == [False, True]
    _randomize_branches(backbone)
    inputs = {**features, "mask_positions": np.array([[1, 2], [3, 4]], "int32")}
    merged = keras_masking.merge_fl(masked_lm)
    assert isinstance(merged, TransformerMaskedLM)
    np.testing.assert_allclose(np.asarray(merged(inputs)), np.asarray(masked_lm(inputs)), atol=1e-5)
    kernel = merged.backbone.transformer_layers[0].feed_forward.output_dense.kernel
    assert np.all(np.asarray(kernel)[48:] == 0)
    split = keras_masking.unmerge_fl(merged)
    np.testing.assert_allclose(np.asarray(split(inputs)), np.asarray(masked_lm(inputs)), atol=1e-5)


def test_trainable_counts_match_the_formula():
    assert add_ffn_parameter_count(768, 160, 12) == 2_960_256
    classifier, backbone = _classifier()
    frozen = parameter_report(backbone).total
    keras_masking.fl_tune(classifier, units=UNITS, verbose=False)
    report = parameter_report(backbone)
    assert report.trainable == add_ffn_parameter_count(32, UNITS, 2) == 2 * (2 * 32 * 8 + 8 + 32)
    assert report.total == frozen + report.trainable
    head = 32 * 3 + 3
    assert parameter_report(classifier).trainable == report.trainable + head

    classifier, backbone = _classifier()
    keras_masking.prefix_tune(classifier, length=5, verbose=False)
    # Keys and values of (P, heads, head_dim) per layer: 2 * layers * P * d.
    assert parameter_report(backbone).trainable == 2 * 2 * 5 * 32


@pytest.mark.parametrize("method", ["fl", "prefix", "ma"])
def test_a_training_step_changes_only_the_intended_weights(method):
    classifier, backbone = _classifier(dropout=0.1)
    if method == "fl":
        keras_masking.fl_tune(classifier, units=UNITS, verbose=False)
        tuned = [v for b in _branches(backbone) for v in b.weights]
    elif method == "ma":
        keras_masking.fl_tune(classifier, units=0, attention_units=2, verbose=False)
        tuned = [v for b in backbone.transformer_layers for v in b.attention_units.weights]
    else:
        keras_masking.prefix_tune(classifier, length=4, verbose=False)
        tuned = [v for b in backbone.transformer_layers for v in b.key_value_prefix.weights]
    head = classifier.get_layer("head").weights
    before = {id(v): keras.ops.convert_to_numpy(v) for v in classifier.weights}
    classifier.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    features = random_features(batch=4, length=10)
    classifier.fit(features, np.array([0, 1, 2, 1]), epochs=1, batch_size=4, verbose=0)
    changed = {
        id(v)
        for v in classifier.weights
        if not np.array_equal(keras.ops.convert_to_numpy(v), before[id(v)])
    }
    assert changed == {id(v) for v in tuned + head}
    # LayerNorms and embeddings are among the frozen, bit-identical weights.
    assert backbone.embeddings.trainable is False
    assert backbone.transformer_layers[0].feed_forward_layer_norm.trainable is False


def test_keras_hub_backbones_are_converted_and_merge_back(features):
    for cls, inputs in (
        (keras_hub.models.BertBackbone, features),
        (keras_hub.models.RobertaBackbone, {k: features[k] for k in ("token_ids", "padding_mask")}),
    ):
        hub = cls(**HUB_SIZES)
        randomize_weights(hub)
        tuned = keras_masking.fl_tune(hub, units=UNITS, verbose=False)
        assert isinstance(tuned, TransformerBackbone)
        _randomize_branches(tuned)
        expected = np.asarray(tuned(inputs)["sequence_output"])
        back = keras_masking.merge_fl(tuned).to_keras_hub()
        assert isinstance(back, cls)
        assert back.intermediate_dim == HUB_SIZES["intermediate_dim"] + UNITS
        output = back(inputs)
        output = output["sequence_output"] if isinstance(output, dict) else output
        np.testing.assert_allclose(np.asarray(output), expected, atol=1e-5)
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    inputs = hub.input
    task = keras.Model(inputs, keras.layers.Dense(2)(hub(inputs)["pooled_output"]))
    with pytest.raises(TypeError, match="from_keras_hub"):
        keras_masking.fl_tune(task, verbose=False)
    with pytest.raises(ValueError, match="merge_fl"):
        tuned.to_keras_hub()


def test_adapter_files_round_trip_and_switch(tmp_path, features):
    base, _ = _classifier(seed=3)
    base_weights = base.get_weights()

    def fresh():
        model, backbone = _classifier(seed=3)
        model.set_weights(base_weights)
        return model, backbone

    paths, outputs = {}, {}
    for name, seed in (("a", 11), ("b", 12)):
        model, backbone = fresh()
        keras_masking.fl_tune(model, units=UNITS, verbose=False)
        _randomize_branches(backbone, seed=seed)
        randomize_weights(model.get_layer("head"), seed=seed)
        outputs[name] = np.asarray(model(features))
        paths[name] = save_adapter(model, tmp_path / name, name=name)
    assert outputs["a"].tolist() != outputs["b"].tolist()
    full_size = sum(np.asarray(w).nbytes for w in base_weights)
    for path in paths.values():
        assert os.path.getsize(path) < full_size

    model, backbone = fresh()
    assert load_adapter(model, paths["a"]) == "a"
    assert backbone.add_ffn == {"units": UNITS, "layers": [0, 1]}
    np.testing.assert_array_equal(np.asarray(model(features)), outputs["a"])

    adapters = AdapterSet(model)
    adapters.add("a")
    adapters.add("b", paths["b"])
    assert adapters.names == ["a", "b"]
    for name in ("b", "a", "b"):
        adapters.activate(name)
        np.testing.assert_array_equal(np.asarray(model(features)), outputs[name])
    with pytest.raises(KeyError, match="Known"):
        adapters.activate("c")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_layers=3), "num_layers"),
        (dict(hidden_dim=64), "hidden_dim"),
        (dict(units=4), "add_ffn"),
    ],
)
def test_an_adapter_that_does_not_fit_is_refused_and_nothing_changes(tmp_path, change, message):
    model, backbone = _classifier()
    keras_masking.fl_tune(model, units=UNITS, verbose=False)
    path = save_adapter(model, tmp_path / "adapter")
    units = change.pop("units", UNITS)
    other, other_backbone = _classifier(seed=5, **change)
    keras_masking.fl_tune(other, units=units, verbose=False)
    before = [keras.ops.convert_to_numpy(v) for v in other.weights]
    with pytest.raises(ValueError, match=message):
        load_adapter(other, path)
    assert all(
        np.array_equal(a, keras.ops.convert_to_numpy(v)) for a, v in zip(before, other.weights)
    )


def test_prefix_tuning_with_zero_length_equals_the_base_model(features):
    classifier, backbone = _classifier()
    base = np.asarray(classifier(features))
    keras_masking.prefix_tune(classifier, length=0, verbose=False)
    np.testing.assert_allclose(np.asarray(classifier(features)), base, atol=1e-6)
    classifier, backbone = _classifier()
    keras_masking.prefix_tune(
        classifier, length=4, reparameterize=True, hidden_units=16, verbose=False
    )
    assert np.abs(np.asarray(classifier(features)) - base).max() > 1e-4


def test_saving_keeps_attachments_and_frozen_flags(tmp_path, features):
    classifier, backbone = _classifier()
    keras_masking.fl_tune(classifier, units=UNITS, verbose=False)
    _randomize_branches(backbone)
    keras_masking.prefix_tune(classifier, length=3, verbose=False)
    expected = np.asarray(classifier(features))
    path = str(tmp_path / "tuned.keras")
    classifier.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(np.asarray(loaded(features)), expected, atol=1e-6)
    assert parameter_report(loaded).trainable == parameter_report(classifier).trainable
    preset = str(tmp_path / "preset")
    backbone.save_to_preset(preset)
    restored = TransformerBackbone.from_preset(preset)
    assert restored.add_ffn == backbone.add_ffn and restored.frozen_base


def test_bad_arguments_are_refused():
    classifier, backbone = _classifier()
    with pytest.raises(ValueError, match="units"):
        keras_masking.fl_tune(classifier, units=0, verbose=False)
    with pytest.raises(ValueError, match="layers"):
        keras_masking.fl_tune(classifier, layers=[2], verbose=False)
    with pytest.raises(ValueError, match="fl_tune first"):
        keras_masking.merge_fl(classifier)
    keras_masking.fl_tune(classifier, units=UNITS, verbose=False)
    with pytest.raises(ValueError, match="already has addFFN"):
        keras_masking.fl_tune(classifier, units=UNITS, verbose=False)
    with pytest.raises(ValueError, match="placement"):
        keras_masking.merge_fl(classifier, placement="middle")
    with pytest.raises(ValueError, match="length"):
        keras_masking.prefix_tune(classifier, length=-1, verbose=False)
    with pytest.raises(TypeError, match="TransformerBackbone"):
        keras_masking.fl_tune(keras.layers.Dense(3), verbose=False)


def test_ma_tuning_attention_units_match_the_formula():
    from keras_masking.layers import AttentionUnits
    from keras_masking.layers import SelfAttention

    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 5, 32)).astype("float32")
    attention = SelfAttention(num_heads=4, head_dim=8)
    attention.build(hidden.shape)
    units = AttentionUnits(units_per_head=3, num_heads=4)
    units.build(hidden.shape)
    for layer in (attention, units):
        randomize_weights(layer, seed=2, scale=0.3)
    got = np.asarray(attention(hidden, extra_units=units))

    def dense(layer, x):
        kernel, bias = layer.get_weights()
        return x @ kernel + bias

    def heads(x, size):
        return x.reshape(2, 5, 4, size)

    q, k, v = (heads(dense(getattr(attention, n), hidden), 8) for n in ("query", "key", "value"))
    q2, k2, v2 = (heads(dense(getattr(units, n), hidden), 3) for n in ("query", "key", "value"))
    logits = (np.einsum("bqhd,bkhd->bhqk", q, k) + np.einsum("bqhd,bkhd->bhqk", q2, k2)) / np.sqrt(
        8
    )
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(2, 5, 32)
    extra = np.einsum("bhqk,bkhd->bqhd", p, v2).reshape(2, 5, 12)
    expected = dense(attention.attention_output, context) + dense(units.attention_output, extra)
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_ma_tuning_saves_loads_and_refuses_to_merge(tmp_path, features):
    classifier, backbone = _classifier()
    keras_masking.fl_tune(classifier, units=UNITS, attention_units=2, verbose=False)
    for block in backbone.transformer_layers:
        randomize_weights(block.attention_units, seed=4)
    expected = np.asarray(classifier(features))
    path = str(tmp_path / "ma.keras")
    classifier.save(path)
    np.testing.assert_allclose(
        np.asarray(keras.saving.load_model(path)(features)), expected, atol=1e-6
    )
    adapter = save_adapter(classifier, tmp_path / "ma")
    fresh, _ = _classifier()
    load_adapter(fresh, adapter)
    np.testing.assert_allclose(np.asarray(fresh(features)), expected, atol=1e-6)
    with pytest.raises(ValueError, match="do not merge"):
        keras_masking.merge_fl(classifier)
