"""The public hooks: attention bias, key/value prefixes, FFN extra output,
position ids and stage composition. Checked against direct computations."""

import keras
import numpy as np
import pytest

from keras_masking.layers import SelfAttention
from keras_masking.layers import TransformerBlock
from keras_masking.models import TransformerBackbone
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


def _numpy_attention(layer, hidden, mask=None, prefix=None, bias=None):
    """Plain-formula attention of a SelfAttention layer (absolute scheme)."""
    weights = {
        w.path.split("/")[-2] + "/" + w.path.split("/")[-1]: np.asarray(w) for w in layer.weights
    }
    h, d = layer.num_heads, layer.head_dim

    def project(name):
        return hidden @ weights[f"{name}/kernel"] + weights[f"{name}/bias"]

    b, s, _ = hidden.shape
    q, k, v = (project(n).reshape(b, s, h, d) for n in ("query", "key", "value"))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    if mask is not None:
        logits = logits + (1 - mask[:, None, None, :]) * -1e9
    if bias is not None:
        logits = logits + bias
    values = v
    if prefix is not None:
        pk, pv = prefix
        plog = np.einsum("bqhd,phd->bhqp", q, pk) / np.sqrt(d)
        logits = np.concatenate([plog, logits], axis=-1)
        values = np.concatenate([np.broadcast_to(pv, (b,) + pv.shape), v], axis=1)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", p, values).reshape(b, s, h * d)
    return context @ weights["attention_output/kernel"] + weights["attention_output/bias"]


@pytest.fixture
def attention_inputs():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 6, 16)).astype("float32")
    mask = np.ones((2, 6), "float32")
    mask[1, 4:] = 0
    layer = SelfAttention(num_heads=2, head_dim=8)
    layer(hidden)
    return layer, hidden, mask


def test_attention_matches_formula_with_padding(attention_inputs):
    layer, hidden, mask = attention_inputs
    np.testing.assert_allclose(
        layer(hidden, padding_mask=mask), _numpy_attention(layer, hidden, mask), atol=1e-5
    )


def test_a_padding_mask_of_another_shape_is_refused_not_broadcast(attention_inputs):
    layer, hidden, mask = attention_inputs
    for bad in (mask[:, :1], mask[:1], mask[..., None]):  # each broadcast over the keys
        with pytest.raises(
            ValueError, match=r"padding_mask of shape \(batch, sequence\) = \(2, 6\)"
        ):
            layer(hidden, padding_mask=bad)


def test_attention_bias_is_additive_on_logits(attention_inputs):
    layer, hidden, mask = attention_inputs
    bias = np.random.default_rng(1).normal(size=(2, 2, 6, 6)).astype("float32")
    np.testing.assert_allclose(
        layer(hidden, padding_mask=mask, attention_bias=bias),
        _numpy_attention(layer, hidden, mask, bias=bias),
        atol=1e-5,
    )
    # A bias of -1e9 on the padded columns replaces the padding mask.
    column_bias = ((1 - mask) * -1e9)[:, None, None, :]
    np.testing.assert_allclose(
        layer(hidden, attention_bias=column_bias),
        layer(hidden, padding_mask=mask),
        atol=1e-6,
    )


def test_kv_prefix_matches_formula(attention_inputs):
    layer, hidden, mask = attention_inputs
    rng = np.random.default_rng(2)
    prefix = (
        rng.normal(size=(3, 2, 8)).astype("float32"),
        rng.normal(size=(3, 2, 8)).astype("float32"),
    )
    batched = tuple(p[None] for p in prefix)
    np.testing.assert_allclose(
        layer(hidden, padding_mask=mask, kv_prefix=batched),
        _numpy_attention(layer, hidden, mask, prefix=prefix),
        atol=1e-5,
    )
    empty = (np.zeros((1, 0, 2, 8), "float32"),) * 2
    np.testing.assert_allclose(
        layer(hidden, padding_mask=mask, kv_prefix=empty),
        layer(hidden, padding_mask=mask),
        atol=1e-6,
    )


def test_feed_forward_extra_output_is_added_before_layer_norm():
    block = TransformerBlock(num_heads=2, intermediate_dim=12)
    hidden = np.random.default_rng(3).normal(size=(2, 5, 16)).astype("float32")
    block(hidden)
    extra = np.random.default_rng(4).normal(size=(2, 5, 16)).astype("float32")
    attended = block.attention_sublayer(hidden)
    with_extra = block.feed_forward_sublayer(attended, extra_output=extra)
    expected = block.feed_forward_layer_norm(attended + block.feed_forward(attended) + extra)
    np.testing.assert_allclose(with_extra, expected, atol=1e-6)
    np.testing.assert_allclose(block.feed_forward_sublayer(attended), block(hidden), atol=1e-6)


def test_stage_methods_inherit_the_training_flag_of_an_outer_call():
    """Called from another layer's call, the two halves apply dropout exactly
    when that call trains (an explicit training=None would hide the flag)."""
    block = TransformerBlock(num_heads=2, intermediate_dim=12, dropout=0.5)
    hidden = np.random.default_rng(6).normal(size=(2, 5, 16)).astype("float32")
    block(hidden)

    class Outer(keras.layers.Layer):
        def call(self, x, training=None):
            return block.feed_forward_sublayer(block.attention_sublayer(x))

    outer = Outer()
    inference = np.asarray(outer(hidden, training=False))
    np.testing.assert_allclose(inference, block(hidden, training=False), atol=1e-6)
    assert np.abs(np.asarray(outer(hidden, training=True)) - inference).max() > 1e-2


@pytest.mark.parametrize("position", ["rotary", "relative"])
def test_relative_schemes_depend_only_on_position_differences(position):
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position=position, custom_position_ids=True)
    )
    randomize_weights(backbone)
    features = random_features()
    arange = np.tile(np.arange(10, dtype="int32"), (2, 1))
    base = backbone({**features, "position_ids": arange})["sequence_output"]
    shifted = backbone({**features, "position_ids": arange + 7})["sequence_output"]
    np.testing.assert_allclose(shifted, base, atol=2e-5)
    spread = backbone({**features, "position_ids": arange * 2})["sequence_output"]
    assert np.abs(np.asarray(spread) - np.asarray(base)).max() > 1e-3


@pytest.mark.parametrize("position", ["absolute", "rotary", "relative"])
def test_subsequence_with_original_positions_equals_stage_composition(position):
    """Position ids carry through every scheme: a gathered subsequence run
    with its original position ids through the public stages equals the
    backbone with the position_ids input."""
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position=position, custom_position_ids=True)
    )
    randomize_weights(backbone)
    features = random_features(padded=False)
    keep = np.array([[0, 2, 3, 7], [0, 1, 5, 9]], "int32")
    sub = {k: np.take_along_axis(v, keep, axis=1) for k, v in features.items()}
    direct = backbone({**sub, "position_ids": keep})["sequence_output"]
    hidden = backbone.embed(sub["token_ids"], sub["segment_ids"], keep)
    staged = backbone.encode(hidden, sub["padding_mask"], keep)
    np.testing.assert_allclose(staged, direct, atol=1e-5)
    default = backbone({**sub, "position_ids": np.tile(np.arange(4), (2, 1))})
    assert np.abs(np.asarray(default["sequence_output"]) - np.asarray(direct)).max() > 1e-4


def test_default_positions_equal_explicit_arange():
    kwargs = tiny_backbone_kwargs(position="relative")
    implicit = TransformerBackbone(**kwargs)
    explicit = TransformerBackbone(**kwargs, custom_position_ids=True)
    explicit.set_weights(implicit.get_weights())
    features = random_features()
    arange = np.tile(np.arange(10, dtype="int32"), (2, 1))
    np.testing.assert_allclose(
        explicit({**features, "position_ids": arange})["sequence_output"],
        implicit(features)["sequence_output"],
        atol=1e-6,
    )


def test_per_layer_attention_bias_through_encode():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    features = random_features(padded=False)
    hidden = backbone.embed(features["token_ids"], features["segment_ids"])
    plain = backbone.encode(hidden, features["padding_mask"])
    zero = np.zeros((1, 1, 10, 10), "float32")
    np.testing.assert_allclose(
        backbone.encode(hidden, features["padding_mask"], attention_bias=[zero, zero]),
        plain,
        atol=1e-6,
    )
    block_last = np.zeros((1, 1, 10, 10), "float32")
    block_last[..., -1] = -1e9
    changed = backbone.encode(hidden, features["padding_mask"], attention_bias=[zero, block_last])
    assert np.abs(np.asarray(changed) - np.asarray(plain)).max() > 1e-4
    with pytest.raises(ValueError, match="one entry per layer"):
        backbone.encode(hidden, kv_prefixes=[None])


def test_lora_targets_found_by_keras_hub():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    randomize_weights(backbone)
    features = random_features()
    before = np.asarray(backbone(features)["sequence_output"])
    backbone.enable_lora(2)
    trainable = {w.path for w in backbone.trainable_weights}
    lora = {path for path in trainable if "lora_kernel" in path}
    # Two layers x (query, value) x (kernel a, kernel b); Keras keeps the
    # targets' biases trainable too, and nothing else.
    assert len(lora) == 8
    assert all(path.split("/")[-2] in ("query", "value") for path in trainable)
    # LoRA starts as the identity (kernel b is zero) ...
    np.testing.assert_allclose(backbone(features)["sequence_output"], before, atol=1e-6)
    # ... and then adds x A B to the projection (alpha = rank: scale 1).
    query = backbone.transformer_layers[0].self_attention.query
    kernel, bias = np.asarray(query.kernel), np.asarray(query.bias)
    rng = np.random.default_rng(5)
    a = rng.normal(size=query.lora_kernel_a.shape).astype("float32")
    b = rng.normal(size=query.lora_kernel_b.shape).astype("float32")
    query.lora_kernel_a.assign(a)
    query.lora_kernel_b.assign(b)
    x = rng.normal(size=(2, 3, 32)).astype("float32")
    np.testing.assert_allclose(query(x), x @ (kernel + a @ b) + bias, rtol=1e-5, atol=1e-4)
    assert np.abs(np.asarray(backbone(features)["sequence_output"]) - before).max() > 1e-2


@pytest.mark.parametrize("position", ["rotary", "relative"])
def test_mixed_precision_tracks_float32(position):
    """Under mixed_bfloat16 the weights stay float32, compute is bfloat16
    and the outputs stay within bfloat16's rounding of the float32 model's,
    at positions far from 0 too (angles and distances are float32)."""
    kwargs = tiny_backbone_kwargs(position=position, custom_position_ids=True)
    full = TransformerBackbone(**kwargs)
    randomize_weights(full, scale=0.1)
    mixed = TransformerBackbone(**kwargs, dtype="mixed_bfloat16")
    mixed.set_weights(full.get_weights())
    assert all(w.dtype == "float32" for w in mixed.weights)
    features = {**random_features(), "position_ids": np.tile(np.arange(300, 310), (2, 1))}
    actual = mixed(features)["sequence_output"]
    assert keras.backend.standardize_dtype(actual.dtype) == "bfloat16"
    expected = np.asarray(full(features)["sequence_output"])
    actual = keras.ops.convert_to_numpy(keras.ops.cast(actual, "float32"))
    # LayerNorm outputs (RMS 1): bfloat16 keeps 8 bits, a relative step of
    # 2**-8 = 0.004; a few such steps accumulate through two layers.
    error = actual - expected
    assert np.sqrt(np.mean(error**2)) < 0.012
    assert np.abs(error).max() < 0.08


def _layers_called(model, features, training):
    """The layers a call runs, in order (each ``Layer.__call__``)."""
    called = []
    original = keras.layers.Layer.__call__

    def spy(layer, *args, **kwargs):
        called.append(layer.name)
        return original(layer, *args, **kwargs)

    keras.layers.Layer.__call__ = spy
    try:
        model(features, training=training)
    finally:
        keras.layers.Layer.__call__ = original
    return called


@pytest.mark.parametrize("mode", ["gather", "attention"])
def test_training_and_inference_run_one_graph_with_token_dropping_in_it(mode):
    backbone = TransformerBackbone(**tiny_backbone_kwargs(position="relative"))
    graph = [operation.name for operation in backbone.operations]
    assert {"drop_token", "restore_dropped_tokens"} <= set(graph)
    backbone.enable_drop_token(0.5, seed=1, mode=mode)
    # Turning DropToken on configures the graph's layer; the graph is the same.
    assert [operation.name for operation in backbone.operations] == graph
    features = random_features(batch=2, length=12)
    training = _layers_called(backbone, features, training=True)
    inference = _layers_called(backbone, features, training=False)
    assert training == inference
    assert training.index("drop_token") < training.index("transformer_layer_0")
    assert training.index("restore_dropped_tokens") > training.index("transformer_layer_1")
    # The same graph drops in training and not at inference.
    dropped = backbone(features, training=True)["token_mask"]
    kept = backbone(features, training=False)["token_mask"]
    np.testing.assert_array_equal(kept, features["padding_mask"])
    assert np.asarray(dropped).sum() < features["padding_mask"].sum()
