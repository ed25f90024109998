"""FL-tuning (addFFN), its merge, adapter files and the P-tuning v2 baseline."""

import math
import os

import keras
import keras_hub
import numpy as np
import pytest

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
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

UNITS = 8


def _classifier(position="absolute", seed=0, **overrides):
    backbone = TransformerBackbone(**tiny_backbone_kwargs(position, **overrides))
    randomize_weights(backbone, seed=seed)
    inputs = backbone.input
    logits = keras.layers.Dense(3, name="head")(backbone(inputs)["pooled_output"])
    return keras.Model(inputs, logits), backbone


def _with_head(backbone, classifier):
    """A classifier on ``backbone`` with a copy of ``classifier``'s head (a merged model)."""
    logits = keras.layers.Dense(3, name="head")(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, logits)
    model.get_layer("head").set_weights(classifier.get_layer("head").get_weights())
    return model


def _branches(backbone):
    return [b.feed_forward_branch for b in backbone.transformer_layers if b.feed_forward_branch]


def _randomize_branches(backbone, seed=1):
    rng = np.random.default_rng(seed)
    for branch in _branches(backbone):
        for variable in branch.weights:
            variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))


def _gelu(x):
    """The exact (erf) GELU, the backbones' default activation."""
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / np.sqrt(2.0)))


def _ffn(weights, x):
    w1, b1, w2, b2 = weights
    return _gelu(x @ w1 + b1) @ w2 + b2


def _layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def _concatenated_ffn(base, branch, at):
    """The merged FFN's weights, built here from the two FFNs' weights."""
    w1, b1, w2, b2 = base
    a1, c1, a2, c2 = branch
    return [
        np.concatenate([w1[:, :at], a1, w1[:, at:]], axis=1),
        np.concatenate([b1[:at], c1, b1[at:]]),
        np.concatenate([w2[:at], a2, w2[at:]], axis=0),
        b2 + c2,
    ]


def test_add_ffn_output_matches_the_formula():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 32)).astype("float32")
    branch = AddFFN(units=np.int64(6), activation="gelu")
    branch.build(x.shape)
    randomize_weights(branch, seed=3, scale=0.3)
    weights = branch.get_weights()
    assert [w.shape for w in weights] == [(32, 6), (6,), (6, 32), (32,)]
    np.testing.assert_allclose(np.asarray(branch(x)), _ffn(weights, x), atol=1e-5)


def test_the_branch_is_added_before_dropout_residual_and_layer_norm():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    randomize_weights(backbone, seed=1)
    backbone.enable_fl_tuning(units=UNITS)
    _randomize_branches(backbone, seed=2)
    block = backbone.transformer_layers[1]
    hidden = np.random.default_rng(4).normal(size=(2, 5, 32)).astype("float32")
    got = np.asarray(block.feed_forward_sublayer(hidden))
    gamma, beta = block.feed_forward_layer_norm.get_weights()
    summed = (
        hidden
        + _ffn(block.feed_forward.get_weights(), hidden)
        + _ffn(block.feed_forward_branch.get_weights(), hidden)
    )
    np.testing.assert_allclose(got, _layer_norm(summed, gamma, beta, 1e-12), atol=1e-4)


@pytest.mark.parametrize("position", ["absolute", "rotary", "relative"])
def test_tuned_and_merged_models_equal_an_independently_widened_model(position, features):
    classifier, backbone = _classifier(position)
    base = np.asarray(classifier(features))
    backbone.enable_fl_tuning(units=UNITS)
    _randomize_branches(backbone)
    tuned = np.asarray(classifier(features))
    assert np.abs(tuned - base).max() > 1e-3

    # The reference: a plain backbone with 48 + UNITS FFN units, filled here.
    wide, wide_backbone = _classifier(position, seed=9, intermediate_dim=48 + UNITS)
    for old, new in zip(backbone.base_layers(), wide_backbone.base_layers()):
        if not isinstance(old, keras_masking.layers.FeedForward):
            new.set_weights(old.get_weights())
    for old, new in zip(backbone.transformer_layers, wide_backbone.transformer_layers):
        new.feed_forward.set_weights(
            _concatenated_ffn(
                old.feed_forward.get_weights(), old.feed_forward_branch.get_weights(), 48
            )
        )
    wide.get_layer("head").set_weights(classifier.get_layer("head").get_weights())
    expected = np.asarray(wide(features))
    np.testing.assert_allclose(tuned, expected, atol=1e-5)

    for placement, at in (("suffix", 48), ("prefix", 0), (np.int64(5), 5)):
        merged_backbone = backbone.merge_fl(placement=placement)
        merged = _with_head(merged_backbone, classifier)
        assert merged_backbone.intermediate_dim == 48 + UNITS
        assert merged_backbone.add_ffn is None
        assert merged_backbone.merged_add_ffn["placement"] == (
            placement if isinstance(placement, str) else int(placement)
        )
        assert not [layer for layer in walk_layers(merged_backbone) if isinstance(layer, AddFFN)]
        assert len(merged.trainable_weights) == len(merged.weights)
        for old, new in zip(backbone.transformer_layers, merged_backbone.transformer_layers):
            reference = _concatenated_ffn(
                old.feed_forward.get_weights(), old.feed_forward_branch.get_weights(), at
            )
            for got, want in zip(new.feed_forward.get_weights(), reference):
                np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(np.asarray(merged(features)), expected, atol=1e-5)
        # The tuned model itself is untouched by merging.
        assert backbone.add_ffn == {"units": UNITS, "layers": [0, 1]}

    unmerged_backbone = merged_backbone.unmerge_fl()
    unmerged = _with_head(unmerged_backbone, classifier)
    np.testing.assert_allclose(np.asarray(unmerged(features)), expected, atol=1e-5)
    for old, new in zip(_branches(backbone), _branches(unmerged_backbone)):
        for i in range(3):  # W1', b1', W2' come back exactly; b2' is folded into b2
            np.testing.assert_array_equal(new.get_weights()[i], old.get_weights()[i])


def test_untuned_layers_get_zero_units_and_a_masked_lm_on_the_merged_backbone_agrees(features):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    randomize_weights(backbone)
    masked_lm = TransformerMaskedLM(backbone)
    backbone.enable_fl_tuning(units=UNITS, layers=[1])
    assert [bool(b.feed_forward_branch) for b in backbone.transformer_layers] == [False, True]
    _randomize_branches(backbone)
    inputs = {**features, "mask_positions": np.array([[1, 2], [3, 4]], "int32")}

    def on(other):
        """A masked LM on ``other`` with ``masked_lm``'s head."""
        task = TransformerMaskedLM(other)
        task.masked_lm_head.set_weights(masked_lm.masked_lm_head.get_weights())
        return task

    merged = on(backbone.merge_fl())
    np.testing.assert_allclose(np.asarray(merged(inputs)), np.asarray(masked_lm(inputs)), atol=1e-5)
    kernel = merged.backbone.transformer_layers[0].feed_forward.output_dense.kernel
    assert np.all(np.asarray(kernel)[48:] == 0)
    split = on(merged.backbone.unmerge_fl())
    np.testing.assert_allclose(np.asarray(split(inputs)), np.asarray(masked_lm(inputs)), atol=1e-5)


def test_trainable_counts_match_the_formula():
    assert add_ffn_parameter_count(768, 160, 12) == 2_960_256
    classifier, backbone = _classifier()
    frozen = parameter_report(backbone).total
    backbone.enable_fl_tuning(units=UNITS)
    report = parameter_report(backbone)
    assert report.trainable == add_ffn_parameter_count(32, UNITS, 2) == 2 * (2 * 32 * 8 + 8 + 32)
    assert report.total == frozen + report.trainable
    head = 32 * 3 + 3
    assert parameter_report(classifier).trainable == report.trainable + head

    classifier, backbone = _classifier()
    backbone.enable_prefix_tuning(length=5)
    # Keys and values of (P, heads, head_dim) per layer: 2 * layers * P * d.
    assert parameter_report(backbone).trainable == 2 * 2 * 5 * 32


@pytest.mark.parametrize("method", ["fl", "prefix", "ma"])
def test_a_training_step_changes_only_the_intended_weights(method):
    classifier, backbone = _classifier(dropout=0.1)
    if method == "fl":
        backbone.enable_fl_tuning(units=UNITS)
        tuned = [v for b in _branches(backbone) for v in b.weights]
    elif method == "ma":
        backbone.enable_fl_tuning(units=0, attention_units=2)
        tuned = [v for b in backbone.transformer_layers for v in b.attention_units.weights]
    else:
        backbone.enable_prefix_tuning(length=4)
        tuned = [v for b in backbone.transformer_layers for v in b.key_value_prefix.weights]
    head = classifier.get_layer("head").weights
    before = {id(v): keras.ops.convert_to_numpy(v) for v in classifier.weights}
    classifier.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    features = random_features(batch=4, length=10)
    keras_masking.utils.build_optimizer(classifier, features)  # TensorFlow: one trace
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
        tuned = TransformerBackbone.from_keras_hub(hub)
        tuned.enable_fl_tuning(units=UNITS)
        _randomize_branches(tuned)
        expected = np.asarray(tuned(inputs)["sequence_output"])
        back = tuned.merge_fl().to_keras_hub()
        assert isinstance(back, cls)
        assert back.intermediate_dim == HUB_SIZES["intermediate_dim"] + UNITS
        output = back(inputs)
        output = output["sequence_output"] if isinstance(output, dict) else output
        np.testing.assert_allclose(np.asarray(output), expected, atol=1e-5)
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
        backbone.enable_fl_tuning(units=UNITS)
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
    backbone.enable_fl_tuning(units=UNITS)
    path = save_adapter(model, tmp_path / "adapter")
    units = change.pop("units", UNITS)
    other, other_backbone = _classifier(seed=5, **change)
    other_backbone.enable_fl_tuning(units=units)
    before = [keras.ops.convert_to_numpy(v) for v in other.weights]
    with pytest.raises(ValueError, match=message):
        load_adapter(other, path)
    assert all(
        np.array_equal(a, keras.ops.convert_to_numpy(v)) for a, v in zip(before, other.weights)
    )


def test_prefix_tuning_with_zero_length_equals_the_base_model(features):
    classifier, backbone = _classifier()
    base = np.asarray(classifier(features))
    backbone.enable_prefix_tuning(length=0)
    np.testing.assert_allclose(np.asarray(classifier(features)), base, atol=1e-6)


@pytest.mark.parametrize("reparameterize", [False, True])
def test_prefix_dropout_draws_a_mask_per_example(reparameterize):
    """P-tuning v2 expands the prefixes over the batch before its dropout: one
    mask was drawn for the whole batch (identical rows stayed identical)."""
    backbone = TransformerBackbone(**tiny_backbone_kwargs(dropout=0.0))
    backbone.enable_prefix_tuning(length=4, dropout=0.5, reparameterize=reparameterize)
    row = random_features(batch=1, length=10, padded=False)
    batch = {name: np.repeat(np.asarray(value), 6, axis=0) for name, value in row.items()}
    trained = np.asarray(backbone(batch, training=True)["sequence_output"])
    assert all(np.abs(trained[i] - trained[0]).max() > 1e-5 for i in range(1, 6))  # 0.0 before
    served = np.asarray(backbone(batch)["sequence_output"])  # no dropout: the rows agree
    np.testing.assert_allclose(served, np.repeat(served[:1], 6, axis=0), atol=1e-6)


def _prefix_mlp(encoder, num_layers, heads=4):
    """P-tuning v2's PrefixEncoder in numpy: Embedding -> Linear -> tanh -> Linear,
    viewed as (P, layers * 2, heads, head_dim); layer l's key is entry 2 l, its
    value 2 l + 1."""
    table, hidden_kernel, hidden_bias, output_kernel, output_bias = encoder.get_weights()
    out = np.tanh(table @ hidden_kernel + hidden_bias) @ output_kernel + output_bias
    length, width = table.shape
    out = out.reshape(length, num_layers * 2, heads, width // heads)
    return [(out[:, 2 * i], out[:, 2 * i + 1]) for i in range(num_layers)]


@pytest.mark.parametrize("layers", [None, [1]])
def test_reparameterised_prefixes_come_from_one_shared_mlp(layers, features):
    classifier, backbone = _classifier()
    base = np.asarray(classifier(features))
    backbone.enable_prefix_tuning(length=4, reparameterize=True, hidden_units=16, layers=layers)
    tuned = [b for b in backbone.transformer_layers if b.key_value_prefix is not None]
    assert len(tuned) == (2 if layers is None else 1)
    encoders = {id(b.key_value_prefix.encoder) for b in tuned}
    assert len(encoders) == 1  # one MLP for every layer, as in P-tuning v2
    encoder = tuned[0].key_value_prefix.encoder
    randomize_weights(encoder, seed=6, scale=0.3)
    num = len(tuned)
    # Embedding (P, d) + Linear (d, 16) + Linear (16, layers * 2 * d), counted once.
    expected_count = 4 * 32 + (32 * 16 + 16) + (16 * num * 64 + num * 64)
    assert parameter_report(backbone).trainable == expected_count
    reference = _prefix_mlp(encoder, num)
    for block, (keys, values) in zip(tuned, reference):
        got_keys, got_values = block.key_value_prefix(training=False)
        np.testing.assert_allclose(np.asarray(got_keys)[0], keys, atol=1e-5)
        np.testing.assert_allclose(np.asarray(got_values)[0], values, atol=1e-5)

    # The same keys and values as free tables, in a model built separately,
    # give the same outputs.
    free, free_backbone = _classifier()
    free_backbone.enable_prefix_tuning(length=4, layers=layers)
    free_tuned = [b for b in free_backbone.transformer_layers if b.key_value_prefix is not None]
    for block, (keys, values) in zip(free_tuned, reference):
        block.key_value_prefix.set_weights([keys, values])
    free.get_layer("head").set_weights(classifier.get_layer("head").get_weights())
    expected = np.asarray(free(features))
    assert np.abs(expected - base).max() > 1e-3
    np.testing.assert_allclose(np.asarray(classifier(features)), expected, atol=1e-5)


def test_shared_prefix_mlp_survives_saving_and_adapter_files(tmp_path, features):
    classifier, backbone = _classifier()
    backbone.enable_prefix_tuning(length=3, reparameterize=True, hidden_units=8)
    encoder = backbone.transformer_layers[0].key_value_prefix.encoder
    randomize_weights(encoder, seed=7, scale=0.3)
    randomize_weights(classifier.get_layer("head"), seed=8)
    expected = np.asarray(classifier(features))
    path = str(tmp_path / "prefix.keras")
    classifier.save(path)
    loaded = keras.saving.load_model(path)
    loaded_backbone = [b for b in walk_layers(loaded) if isinstance(b, TransformerBackbone)][0]
    blocks = loaded_backbone.transformer_layers
    assert blocks[0].key_value_prefix.encoder is blocks[1].key_value_prefix.encoder
    np.testing.assert_allclose(np.asarray(loaded(features)), expected, atol=1e-6)

    adapter = save_adapter(classifier, tmp_path / "prefix")
    fresh, fresh_backbone = _classifier()
    load_adapter(fresh, adapter)
    blocks = fresh_backbone.transformer_layers
    assert blocks[0].key_value_prefix.encoder is blocks[1].key_value_prefix.encoder
    np.testing.assert_allclose(np.asarray(fresh(features)), expected, atol=1e-6)


def test_saving_keeps_attachments_and_frozen_flags(tmp_path, features):
    classifier, backbone = _classifier()
    backbone.enable_fl_tuning(units=UNITS)
    _randomize_branches(backbone)
    backbone.enable_prefix_tuning(length=3)
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
        backbone.enable_fl_tuning(units=0)
    with pytest.raises(ValueError, match="layers"):
        backbone.enable_fl_tuning(layers=[2])
    with pytest.raises(ValueError, match=r"enable_fl_tuning\(\) first"):
        backbone.merge_fl()
    backbone.enable_fl_tuning(units=UNITS)
    with pytest.raises(ValueError, match="already has addFFN"):
        backbone.enable_fl_tuning(units=UNITS)
    with pytest.raises(ValueError, match="placement"):
        backbone.merge_fl(placement="middle")
    with pytest.raises(ValueError, match="length"):
        backbone.enable_prefix_tuning(length=-1)


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
    backbone.enable_fl_tuning(units=UNITS, attention_units=2)
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
        backbone.merge_fl()
