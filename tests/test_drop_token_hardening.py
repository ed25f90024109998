"""DropToken hardening: protected tokens that fill the slots, mixed precision,
DropTokenEncoder's config and saving, and a clear error for each bad input.

Bad-input cases tried here, per entry point (each asserts the clear error):

* ``DropToken(...)``: 26
* ``DropToken.set_rate``: 5
* ``DropToken.keep_length``: 4
* ``DropToken.__call__``: 12
* ``RestoreDroppedTokens.__call__``: 3
* ``static_keep_length``: 8
* ``sample_keep_mask``: 6
* ``kept_indices``: 3
* ``batched_gather``: 5
* ``restore_full_length``: 4
* ``DropTokenEncoder(...)``: 8
* ``with_drop_token``: 9
* ``encoder_stages``: 2
* ``DropTokenRateSchedule(...)``: 9, ``.rate_at``: 3, in ``fit``: 1
"""

import re

import keras
import keras_hub
import numpy as np
import pytest
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

import keras_masking
from keras_masking.callbacks import DropTokenRateSchedule
from keras_masking.layers import DropToken
from keras_masking.layers import RestoreDroppedTokens
from keras_masking.methods import DropTokenEncoder
from keras_masking.methods.encoder_stages import encoder_stages
from keras_masking.models import TransformerBackbone
from keras_masking.ops.attention_masks import large_negative
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.ops.token_dropping import kept_indices
from keras_masking.ops.token_dropping import restore_full_length
from keras_masking.ops.token_dropping import sample_keep_mask
from keras_masking.ops.token_dropping import static_keep_length


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def compiled_call(layer, *args, **kwargs):
    """``layer(*args, training=True, **kwargs)`` as one XLA-compiled function.

    On JAX the layer runs statelessly under ``jax.jit`` and its seed state is
    written back, as Keras' trainers do.
    """
    if keras.config.backend() == "jax":
        import jax

        variables = list(layer.non_trainable_variables)

        @jax.jit
        def run(values, args, kwargs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
                outputs = layer(*args, training=True, **kwargs)
            updated = [scope.get_current_value(v) for v in variables]
            return outputs, [old if new is None else new for old, new in zip(values, updated)]

        outputs, values = run([v.value for v in variables], args, kwargs)
        for variable, value in zip(variables, values):
            variable.assign(value)
        return outputs
    import tensorflow as tf

    run = tf.function(lambda a, k: layer(*a, training=True, **k), jit_compile=True)
    return run(args, kwargs)


def call(layer, compiled, *args, **kwargs):
    if compiled:
        return compiled_call(layer, *args, **kwargs)
    return layer(*args, training=True, **kwargs)


# === Item 6: protected tokens that fill the slots ===
# L = 8, rate 0.5, slot_multiple 1: four slots. [CLS] = 1, [SEP] = 2.
OVERFLOW_IDS = np.array(
    [
        [1, 2, 2, 2, 7, 0, 0, 0],  # 4 protected fill the slots: the 7 goes
        [1, 5, 2, 6, 2, 2, 0, 0],  # 4 protected, 2 droppable: both go
        [1, 3, 2, 4, 2, 5, 2, 6],  # full row, 4 protected: every other goes
        [0, 0, 0, 0, 0, 0, 0, 0],  # all padding
        [1, 5, 6, 2, 0, 0, 0, 0],  # 2 protected, 2 droppable: drop exactly 1
    ],
    "int32",
)
OVERFLOW_MASK = np.array(
    [[1] * 5 + [0] * 3, [1] * 6 + [0] * 2, [1] * 8, [0] * 8, [1] * 4 + [0] * 4], "int32"
)
FORCED_KEEP = np.array(
    [
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 1, 1, 0, 0],
        [1, 0, 1, 0, 1, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ],
    bool,
)


def _hidden(batch, length, dim=3):
    return (np.arange(batch * length * dim, dtype="float32").reshape(batch, length, dim) + 1) / 7


def _expected_gather(hidden, keep, slots):
    """The numpy construction of gather mode from a keep mask."""
    batch = keep.shape[0]
    indices = np.stack(
        [
            np.concatenate([np.flatnonzero(keep[b]), np.flatnonzero(~keep[b])])[:slots]
            for b in range(batch)
        ]
    )
    return {
        "hidden": np.stack([hidden[b, indices[b]] for b in range(batch)]),
        "padding_mask": np.stack([keep[b, indices[b]] for b in range(batch)]).astype("int32"),
        "position_ids": indices,
        "kept_indices": indices,
    }


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit_compile"])
def test_protected_tokens_that_fill_the_slots_all_survive(compiled):
    layer = DropToken(0.5, protected_token_ids=(1, 2), slot_multiple=1, seed=3)
    assert layer.keep_length(8) == 4
    hidden = _hidden(5, 8)
    out = call(layer, compiled, hidden, OVERFLOW_MASK, token_ids=OVERFLOW_IDS)
    keep = _numpy(out["keep_mask"]).astype(bool)
    np.testing.assert_array_equal(keep[:4], FORCED_KEEP)
    # The last row keeps both protected tokens and exactly one of 5, 6.
    assert keep[4, 0] and keep[4, 3] and keep[4, 1] != keep[4, 2] and not keep[4, 4:].any()
    expected = _expected_gather(hidden, keep, 4)
    for key, value in expected.items():
        np.testing.assert_array_equal(_numpy(out[key]), value, err_msg=key)
    protected = np.isin(OVERFLOW_IDS, (1, 2)) & OVERFLOW_MASK.astype(bool)
    assert keep[protected].all()
    # Restoring puts every kept token back and zeros elsewhere (no gather
    # error on TensorFlow, no clamping on JAX).
    restored = _numpy(RestoreDroppedTokens()(out["hidden"], out["keep_mask"]))
    np.testing.assert_array_equal(restored, hidden * keep[..., None])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit_compile"])
def test_attention_mode_keeps_the_same_protected_tokens(compiled):
    layer = DropToken(0.5, protected_token_ids=(1, 2), slot_multiple=1, mode="attention", seed=3)
    out = call(layer, compiled, _hidden(5, 8), OVERFLOW_MASK, token_ids=OVERFLOW_IDS)
    keep = _numpy(out["keep_mask"]).astype(bool)
    np.testing.assert_array_equal(keep[:4], FORCED_KEEP)
    bias = _numpy(out["attention_bias"])[:, 0, 0, :]
    np.testing.assert_array_equal(bias, np.where(keep, 0.0, -1e9).astype("float32"))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit_compile"])
def test_protected_positions_size_the_slots(compiled):
    layer = DropToken(0.5, protected_positions=tuple(range(6)), slot_multiple=1, seed=0)
    assert layer.keep_length(8) == 6 and layer.keep_length(4) == 4
    hidden = _hidden(2, 8)
    mask = np.array([[1] * 8, [1] * 7 + [0]], "int32")
    out = call(layer, compiled, hidden, mask)
    keep = np.zeros((2, 8), bool)
    keep[:, :6] = True
    np.testing.assert_array_equal(_numpy(out["keep_mask"]), keep)
    for key, value in _expected_gather(hidden, keep, 6).items():
        np.testing.assert_array_equal(_numpy(out[key]), value, err_msg=key)


def test_protected_tokens_that_outnumber_the_slots():
    ids = np.array([[1, 2, 2, 2, 2, 7, 0, 0], [1, 5, 6, 2, 0, 0, 0, 0]], "int32")
    mask = (ids > 0).astype("int32")
    hidden = _hidden(2, 8)
    layer = DropToken(0.5, protected_token_ids=(1, 2), slot_multiple=1, seed=3)
    state = _numpy(layer.seed_generator.state)
    with pytest.raises(
        ValueError, match=r"Row 0 has 5 protected tokens but gather mode keeps only 4 of its 8"
    ):
        layer(hidden, mask, token_ids=ids, training=True)
    np.testing.assert_array_equal(_numpy(layer.seed_generator.state), state)
    # A compiled call cannot raise: the row's hidden states are NaN, so the
    # loss shows it, and its keep mask holds only the tokens gathered.
    out = compiled_call(layer, hidden, mask, token_ids=ids)
    assert np.isnan(_numpy(out["hidden"])[0]).all()
    np.testing.assert_array_equal(_numpy(out["keep_mask"])[0], [1, 1, 1, 1, 0, 0, 0, 0])
    keep = _numpy(out["keep_mask"]).astype(bool)
    assert keep[1, 0] and keep[1, 3] and keep[1].sum() == 3
    np.testing.assert_array_equal(
        _numpy(out["hidden"])[1], _expected_gather(hidden, keep, 4)["hidden"][1]
    )
    restored = _numpy(RestoreDroppedTokens()(out["hidden"], out["keep_mask"]))
    assert np.isnan(restored[0, :4]).all()
    np.testing.assert_array_equal(restored[1], hidden[1] * keep[1][:, None])
    # Attention mode has no slots: every protected token is kept.
    attention = DropToken(0.5, protected_token_ids=(1, 2), slot_multiple=1, mode="attention")
    kept = _numpy(attention(hidden, mask, token_ids=ids, training=True)["keep_mask"])
    np.testing.assert_array_equal(kept[0], [1, 1, 1, 1, 1, 0, 0, 0])


def test_encoder_keeps_every_protected_token_when_they_fill_the_slots():
    """A classifier step on rows whose [CLS]/[SEP] fill the slots: eager and
    compiled, the encoder runs on exactly the protected tokens."""
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    encoder = keras_masking.with_drop_token(
        backbone, 0.5, protected_token_ids=(1, 2), slot_multiple=1, seed=0
    )
    features = random_features(batch=2, length=8, seed=1)
    features["token_ids"] = np.maximum(features["token_ids"], 3)
    features["token_ids"][0, [0, 2, 4, 6]] = [1, 2, 2, 2]
    features["token_ids"][1, [0, 1, 2, 3]] = [1, 2, 2, 2]
    features["token_ids"][1, 5:] = 0
    keep = np.zeros((2, 8), bool)
    keep[0, [0, 2, 4, 6]] = keep[1, :4] = True
    twin = TransformerBackbone(**tiny_backbone_kwargs(position="rotary", custom_position_ids=True))
    twin.set_weights(backbone.get_weights())
    sub = {
        key: np.stack([features[key][b][keep[b]] for b in range(2)])
        for key in ("token_ids", "segment_ids", "padding_mask")
    }
    positions = np.stack([np.flatnonzero(keep[b]) for b in range(2)]).astype("int32")
    reference = twin({**sub, "position_ids": positions})
    for compiled in (False, True):
        if compiled:
            outputs = _compiled_model_call(encoder, features)
        else:
            outputs = encoder(features, training=True)
        np.testing.assert_array_equal(_numpy(outputs["token_mask"]), keep.astype("int32"))
        sequence = _numpy(outputs["sequence_output"])
        for b in range(2):
            np.testing.assert_allclose(
                sequence[b, keep[b]], _numpy(reference["sequence_output"])[b], atol=2e-5
            )
            assert not sequence[b, ~keep[b]].any()
        np.testing.assert_allclose(
            _numpy(outputs["pooled_output"]), _numpy(reference["pooled_output"]), atol=2e-5
        )


def _compiled_model_call(model, features):
    if keras.config.backend() == "jax":
        return compiled_call(model, features)
    import tensorflow as tf

    return tf.function(lambda x: model(x, training=True), jit_compile=True)(features)


# === Item 5: mixed precision ===
@pytest.fixture(params=["mixed_bfloat16", "mixed_float16"])
def mixed_policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    try:
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _compute_dtype(policy):
    return keras.DTypePolicy(policy).compute_dtype


def _random_batch(seed=0, batch=6, length=16, dim=8):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 60, (batch, length)).astype("int32")
    lengths = rng.integers(5, length + 1, batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype("int32")
    ids[:, 0] = 1
    ids[np.arange(batch), lengths - 1] = 2
    ids = ids * mask
    return rng.normal(size=(batch, length, dim)).astype("float32"), mask, ids


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


@pytest.mark.parametrize("mode", ["gather", "attention"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit_compile"])
def test_mixed_precision_scores_are_float32_and_keep_the_same_tokens(
    mixed_policy, mode, compiled, monkeypatch
):
    from keras_masking.layers import drop_token as module

    seen = []

    def spy(real, droppable, rate, keep_length, noise, rounding):
        seen.append((_dtype(noise), _dtype(rounding)))
        return sample_keep_mask(real, droppable, rate, keep_length, noise, rounding)

    monkeypatch.setattr(module, "sample_keep_mask", spy)
    compute = _compute_dtype(mixed_policy)
    hidden, mask, ids = _random_batch()
    kwargs = dict(protected_token_ids=(1, 2), mode=mode, seed=7, slot_multiple=1)
    reference = DropToken(0.3, dtype="float32", **kwargs)
    mixed = DropToken(0.3, **kwargs)
    assert mixed.compute_dtype == compute
    expected = call(reference, compiled, hidden, mask, token_ids=ids)
    actual = call(mixed, compiled, hidden, mask, token_ids=ids)
    # The random scores that rank the tokens, and the rounding, are float32.
    assert seen == [("float32", "float32")] * 2
    keep = _numpy(actual["keep_mask"])
    np.testing.assert_array_equal(keep, _numpy(expected["keep_mask"]))
    assert 0 < keep.sum() < mask.sum()
    # The hidden states follow the policy.
    assert _dtype(actual["hidden"]) == compute
    np.testing.assert_array_equal(
        _numpy(actual["hidden"]).astype("float32"),
        _numpy(keras.ops.cast(expected["hidden"], compute)).astype("float32"),
    )
    if mode == "attention":
        assert _dtype(actual["attention_bias"]) == compute
        bias = _numpy(actual["attention_bias"]).astype("float32")[:, 0, 0, :]
        expected_bias = np.where(keep, 0.0, large_negative(compute)).astype("float32")
        expected_bias = _numpy(keras.ops.cast(expected_bias, compute)).astype("float32")
        assert np.isfinite(bias).all() and (bias[~keep.astype(bool)] < -1e4).all()
        np.testing.assert_array_equal(bias, expected_bias)
    else:
        np.testing.assert_array_equal(
            _numpy(actual["kept_indices"]), _numpy(expected["kept_indices"])
        )


@pytest.fixture
def restore_policy():
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("mode", ["gather", "attention"])
@pytest.mark.parametrize("mixed_policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_encoder_drops_the_same_tokens(mixed_policy, mode, restore_policy):
    full = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="relative")))
    keras.mixed_precision.set_global_policy(mixed_policy)
    mixed = TransformerBackbone(**tiny_backbone_kwargs(position="relative"))
    mixed.set_weights(full.get_weights())
    features = random_features(batch=3, length=12, seed=2)
    kwargs = dict(protected_token_ids=(1,), mode=mode, seed=5)
    expected = DropTokenEncoder(full, 0.4, **kwargs)(features, training=True)
    encoder = DropTokenEncoder(mixed, 0.4, **kwargs)
    assert encoder.dtype_policy.name == mixed_policy  # the backbone's
    assert encoder.drop_token.dtype_policy.name == mixed_policy
    actual = encoder(features, training=True)
    token_mask = _numpy(actual["token_mask"])
    np.testing.assert_array_equal(token_mask, _numpy(expected["token_mask"]))
    assert 0 < token_mask.sum() < features["padding_mask"].sum()
    assert _dtype(actual["sequence_output"]) == _compute_dtype(mixed_policy)
    kept = token_mask.astype(bool)
    np.testing.assert_allclose(
        _numpy(actual["sequence_output"]).astype("float32")[kept],
        _numpy(expected["sequence_output"])[kept],
        atol=0.1,
        rtol=0.05,
    )


# === Item 8: DropTokenEncoder's config, saving and loading ===
def _tiny_encoder(**kwargs):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    arguments = dict(rate=0.25, protected_token_ids=(1, 2), seed=4, slot_multiple=4)
    arguments.update(kwargs)
    return DropTokenEncoder(backbone, **arguments)


ENCODER_KEYS = {
    "backbone",
    "rate",
    "protected_token_ids",
    "mode",
    "seed",
    "slot_multiple",
    "dtype",
    "name",
    "trainable",
}


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"trainable": False}, {"dtype": "mixed_bfloat16", "mode": "attention", "name": "enc"}],
)
def test_encoder_config_round_trip(kwargs):
    encoder = _tiny_encoder(**kwargs)
    config = encoder.get_config()
    assert set(config) == ENCODER_KEYS
    assert config["trainable"] is kwargs.get("trainable", True)
    assert keras.dtype_policies.deserialize(config["dtype"]).name == kwargs.get("dtype", "float32")
    assert (config["rate"], config["protected_token_ids"], config["seed"]) == (0.25, [1, 2], 4)
    clone = DropTokenEncoder.from_config(config)
    assert clone.get_config() == config
    assert clone.trainable is encoder.trainable
    assert len(clone.trainable_weights) == len(encoder.trainable_weights)
    assert clone.drop_token.dtype_policy.name == kwargs.get("dtype", "float32")
    clone.set_weights(encoder.get_weights())
    features = random_features(batch=2, length=12)
    np.testing.assert_array_equal(
        _numpy(clone(features)["sequence_output"]), _numpy(encoder(features)["sequence_output"])
    )


@pytest.mark.parametrize("hub", [False, True], ids=["transformer_backbone", "keras_hub_bert"])
@pytest.mark.parametrize("kwargs", [{}, {"trainable": False, "dtype": "mixed_bfloat16"}])
def test_encoder_save_and_load(tmp_path, hub, kwargs):
    if hub:
        backbone = randomize_weights(keras_hub.models.BertBackbone(**HUB_SIZES), seed=3)
        encoder = DropTokenEncoder(backbone, 0.25, protected_token_ids=(1, 2), seed=4, **kwargs)
    else:
        encoder = _tiny_encoder(**kwargs)
    features = random_features(batch=2, length=12)
    path = tmp_path / "encoder.keras"
    encoder.save(path)
    restored = keras.saving.load_model(path)  # no custom_objects
    assert type(restored) is DropTokenEncoder
    assert restored.get_config() == encoder.get_config()
    assert restored.trainable is encoder.trainable
    for name in ("sequence_output", "pooled_output", "token_mask"):
        np.testing.assert_array_equal(
            _numpy(restored(features)[name]), _numpy(encoder(features)[name]), err_msg=name
        )


def test_layer_configs_round_trip():
    layer = DropToken(
        np.float32(0.25),
        protected_token_ids=np.array([101, 102]),
        protected_positions=(0,),
        mode="attention",
        seed=np.int64(3),
        slot_multiple=np.int64(4),
        dtype="mixed_float16",
        trainable=False,
        name="drop",
    )
    config = layer.get_config()
    assert {k: config[k] for k in ("protected_token_ids", "seed", "slot_multiple", "mode")} == {
        "protected_token_ids": [101, 102],
        "seed": 3,
        "slot_multiple": 4,
        "mode": "attention",
    }
    assert config["rate"] == float(np.float32(0.25)) and config["trainable"] is False
    assert type(config["seed"]) is int and type(config["slot_multiple"]) is int
    clone = DropToken.from_config(config)
    assert clone.get_config() == config
    assert clone.dtype_policy.name == "mixed_float16"
    restore = RestoreDroppedTokens(name="restore", dtype="bfloat16")
    assert RestoreDroppedTokens.from_config(restore.get_config()).get_config() == (
        restore.get_config()
    )


def test_two_dimensional_rotary_positions_are_gathered():
    backbone = randomize_weights(
        TransformerBackbone(**tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True))
    )
    encoder = keras_masking.with_drop_token(backbone, 0.4, seed=1)
    features = random_features(batch=2, length=12)
    positions = np.stack([np.arange(12), np.arange(12) % 3], -1)[None].repeat(2, 0)
    features["position_ids"] = positions.astype("int32")
    outputs = encoder(features, training=True)
    keep = _numpy(outputs["token_mask"]).astype(bool)
    assert 0 < keep.sum() < features["padding_mask"].sum()
    # The backbone on each row's kept tokens, padded to one width, in one call.
    width = int(keep.sum(1).max())
    sub = {key: np.zeros((2, width) + features[key].shape[2:], "int32") for key in features}
    for b in range(2):
        index = np.flatnonzero(keep[b])
        for key in ("token_ids", "segment_ids", "position_ids"):
            sub[key][b, : len(index)] = features[key][b, index]
        sub["padding_mask"][b, : len(index)] = 1
    reference = _numpy(backbone(sub)["sequence_output"])
    sequence = _numpy(outputs["sequence_output"])
    for b in range(2):
        kept = int(keep[b].sum())
        np.testing.assert_allclose(sequence[b, keep[b]], reference[b, :kept], atol=2e-5)


# === Bad input: a clear error for each, naming the argument ===
def _raises(pattern, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)


RATE_CASES = [
    (1.0, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.0"),
    (-0.1, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=-0\.1"),
    (1.5, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.5"),
    (True, r"Expected a number for rate\. Received: rate=True"),
    ("0.1", r"Expected a number for rate\. Received: rate='0\.1'"),
    (float("nan"), r"Expected a number for rate\. Received: rate=nan"),
    (None, r"Expected a number for rate\. Received: rate=None"),
]

DROP_TOKEN_CASES = [({"rate": rate}, pattern) for rate, pattern in RATE_CASES] + [
    ({"slot_multiple": 0}, r"integer >= 1 for slot_multiple\. Received: slot_multiple=0"),
    ({"slot_multiple": -8}, r"integer >= 1 for slot_multiple\. Received: slot_multiple=-8"),
    (
        {"slot_multiple": 2.0},
        r"Expected an integer for slot_multiple\. Received: slot_multiple=2\.0",
    ),
    (
        {"slot_multiple": True},
        r"Expected an integer for slot_multiple\. Received: slot_multiple=Tr",
    ),
    (
        {"slot_multiple": "8"},
        r"Expected an integer for slot_multiple\. Received: slot_multiple='8'",
    ),
    ({"mode": "mask"}, r"Expected mode in \('gather', 'attention'\)\. Received: mode='mask'"),
    ({"mode": None}, r"Expected mode in .*Received: mode=None"),
    ({"protected_token_ids": 101}, r"list or tuple of integers >= 0 for protected_token_ids\. "),
    ({"protected_token_ids": "101"}, r"for protected_token_ids\. Received: protected_token_ids='1"),
    ({"protected_token_ids": (1.5,)}, r"integers >= 0 in protected_token_ids\. .*\[1\.5\]"),
    ({"protected_token_ids": (True,)}, r"integers >= 0 in protected_token_ids\. .*\[True\]"),
    ({"protected_token_ids": (1, -1)}, r"integers >= 0 in protected_token_ids\. .*\[-1\]"),
    ({"protected_positions": (0.0,)}, r"integers >= 0 in protected_positions\. .*\[0\.0\]"),
    ({"protected_positions": (-1,)}, r"integers >= 0 in protected_positions\. .*\[-1\]"),
    ({"protected_positions": 0}, r"for protected_positions\. Received: protected_positions=0"),
    ({"seed": 1.5}, r"Expected an integer for seed\. Received: seed=1\.5"),
    ({"seed": -1}, r"Expected an integer >= 0 for seed\. Received: seed=-1"),
    ({"seed": True}, r"Expected an integer for seed\. Received: seed=True"),
    ({"seed": "7"}, r"Expected an integer for seed\. Received: seed='7'"),
]


@pytest.mark.parametrize("kwargs, pattern", DROP_TOKEN_CASES)
def test_drop_token_constructor_bad_input(kwargs, pattern):
    _raises(pattern, DropToken, **{"rate": 0.1, **kwargs})


def test_bad_input_counts():
    assert len(DROP_TOKEN_CASES) == 26
    assert len(CALL_CASES) == 12
    assert len(ENCODER_CASES) == 8
    assert len(SCHEDULE_CASES) == 9


def test_numpy_numbers_are_accepted_and_made_plain():
    layer = DropToken(np.float32(0.5), slot_multiple=np.int64(1), seed=np.int32(2))
    assert layer.rate == 0.5 and type(layer.rate) is float
    assert layer.slot_multiple == 1 and type(layer.slot_multiple) is int
    assert layer.keep_length(np.int64(9)) == 5
    layer.set_rate(np.float64(0.25))
    assert layer.rate == 0.25 and type(layer.rate) is float
    assert static_keep_length(np.int32(512), np.float32(0.5), np.int64(8)) == 256
    schedule = DropTokenRateSchedule(
        np.float32(0.0), np.int64(4), initial_rate=np.float32(0.5), levels=np.int64(3)
    )
    assert schedule.rate_at(np.int64(2)) == pytest.approx(0.25)


@pytest.mark.parametrize("rate, pattern", RATE_CASES[:5])
def test_set_rate_bad_input_leaves_the_rate(rate, pattern):
    layer = DropToken(0.25)
    _raises(pattern, layer.set_rate, rate)
    assert layer.rate == 0.25


@pytest.mark.parametrize(
    "length, pattern",
    [
        (8.0, r"Expected an integer for sequence_length\. Received: sequence_length=8\.0"),
        (-1, r"integer >= 0 for sequence_length\. Received: sequence_length=-1"),
        (True, r"Expected an integer for sequence_length\. Received: sequence_length=True"),
        ("8", r"Expected an integer for sequence_length\. Received: sequence_length='8'"),
    ],
)
def test_keep_length_bad_input(length, pattern):
    _raises(pattern, DropToken(0.5).keep_length, length)


HIDDEN = np.ones((2, 8, 3), "float32")
MASK = np.ones((2, 8), "int32")
IDS = np.full((2, 8), 3, "int32")

CALL_CASES = [
    ((np.ones((2, 8), "float32"), MASK), {}, r"Expected hidden of shape \(batch, sequence, dim\)"),
    ((HIDDEN, np.ones((2, 7))), {}, r"Expected padding_mask of shape .*\(2, 7\)"),
    ((HIDDEN, np.ones((2, 8, 1))), {}, r"Expected padding_mask of shape .*\(2, 8, 1\)"),
    ((HIDDEN, MASK), {"token_ids": np.ones((2, 7), "int32")}, r"Expected token_ids of shape"),
    ((HIDDEN, MASK), {"token_ids": np.ones((2, 8), "float32")}, r"Expected integer token_ids"),
    ((HIDDEN, MASK), {"token_ids": None}, r"needs token_ids to protect protected_token_ids=\(1,\)"),
    ((HIDDEN, MASK), {"position_ids": np.ones((1, 7), "int32")}, r"Expected position_ids of"),
    ((HIDDEN, MASK), {"position_ids": np.ones((1, 8, 2, 1), "int32")}, r"Expected position_ids"),
    (
        (HIDDEN, MASK),
        {"position_ids": np.ones((2, 8), "float32")},
        r"Expected integer position_ids",
    ),
    ((HIDDEN, MASK * 2), {}, r"Expected a padding_mask of 0s and 1s\. Received: .*\[2\]"),
    ((HIDDEN, MASK), {"token_ids": np.full((2, 8), 1, "int32")}, r"Row 0 has 8 protected tokens"),
    ("symbolic", {}, r"needs a static sequence length in training"),
]


@pytest.mark.parametrize("args, kwargs, pattern", CALL_CASES)
def test_drop_token_call_bad_input(args, kwargs, pattern):
    layer = DropToken(0.5, protected_token_ids=(1,), slot_multiple=1, seed=1)
    if args == "symbolic":
        hidden = keras.Input((None, 3))
        mask = keras.Input((None,), dtype="int32")
        ids = keras.Input((None,), dtype="int32")
        _raises(pattern, layer, hidden, mask, token_ids=ids, training=True)
        return
    state = _numpy(layer.seed_generator.state)
    _raises(pattern, layer, *args, training=True, **{"token_ids": IDS, **kwargs})
    np.testing.assert_array_equal(_numpy(layer.seed_generator.state), state)  # nothing drawn


@pytest.mark.parametrize(
    "args, pattern",
    [
        (
            (np.ones((2, 3, 1)), np.ones((2, 5), bool)),
            r"Received: a keep_mask row that keeps 5 tokens, kept_values with 3 slots",
        ),
        ((np.ones((2,)), np.ones((2, 5), bool)), r"Expected kept_values"),
        ((np.ones((2, 3, 1)), np.ones((2, 5, 1), bool)), r"keep_mask \(batch, sequence\)"),
    ],
)
def test_restore_layer_bad_input(args, pattern):
    _raises(pattern, RestoreDroppedTokens(), *args)


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((-1, 0.1), r"integer >= 0 for sequence_length\. Received: sequence_length=-1"),
        ((8.5, 0.1), r"Expected an integer for sequence_length\. Received: sequence_length=8\.5"),
        ((True, 0.1), r"Expected an integer for sequence_length\. Received: sequence_length=True"),
        ((8, 1.0), r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.0"),
        ((8, float("nan")), r"Expected a number for rate\. Received: rate=nan"),
        ((8, 0.1, 0), r"integer >= 1 for multiple\. Received: multiple=0"),
        ((8, 0.1, 2.5), r"Expected an integer for multiple\. Received: multiple=2\.5"),
        ((8, 0.1, 1, -1), r"integer >= 0 for minimum\. Received: minimum=-1"),
    ],
)
def test_static_keep_length_bad_input(args, pattern):
    _raises(pattern, static_keep_length, *args)


def test_static_keep_length_values():
    # L - floor(rate L), rounded up to the multiple, at least the minimum, at most L.
    for length, rate, multiple, minimum in [(512, 0.1, 1, 0), (512, 0.1, 8, 0), (12, 0.1, 8, 0)]:
        kept = length - int(np.floor(rate * length))
        expected = min(max(-(-kept // multiple) * multiple, minimum), length)
        assert static_keep_length(length, rate, multiple, minimum) == expected
    assert static_keep_length(10, 0.9, 1, 6) == 6
    assert static_keep_length(10, 0.9, 1, 60) == 10
    assert static_keep_length(0, 0.5) == 0


REAL = np.ones((2, 4), bool)
NOISE = np.zeros((2, 4), "float32")
ROUNDING = np.zeros((2,), "float32")


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((REAL, REAL, 1.0, 2, NOISE, ROUNDING), r"Expected rate in \[0\.0, 1\.0\)"),
        ((REAL, REAL, 0.5, 2.5, NOISE, ROUNDING), r"integer for keep_length\. .*=2\.5"),
        ((REAL, REAL, 0.5, -1, NOISE, ROUNDING), r"integer >= 0 for keep_length\. .*=-1"),
        ((REAL[0], REAL, 0.5, 2, NOISE, ROUNDING), r"Expected real of rank 2\. .*\(4,\)"),
        ((REAL, REAL, 0.5, 2, NOISE[:, :3], ROUNDING), r"Expected matching \(batch, sequence\)"),
        ((REAL, REAL, 0.5, 2, NOISE, ROUNDING[:1]), r"Expected matching \(batch, sequence\)"),
    ],
)
def test_sample_keep_mask_bad_input(args, pattern):
    _raises(pattern, sample_keep_mask, *args)


def test_sample_keep_mask_values():
    """A hand example of the rule, row by row."""
    real = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    protected = np.array([[1, 0, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]], bool)
    noise = np.array([[0.0, 0.5, 0.1, 0.9, 0.3, 0.0]] * 3, "float32")
    rounding = np.array([0.6, 0.0, 0.0], "float32")
    keep = _numpy(sample_keep_mask(real, real & ~protected, 0.5, 4, noise, rounding))
    # Row 0: 4 droppable, floor(2 + 0.6) = 2 dropped, lowest noise first (2, 4).
    # Row 1: 1 droppable, kept (one is kept and the 4 slots have room).
    # Row 2: 4 protected fill the 4 slots: both droppable tokens go.
    np.testing.assert_array_equal(
        keep, [[1, 1, 0, 1, 0, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]]
    )


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((np.ones((2, 4, 1), bool), 2), r"Expected keep of rank 2\. .*\(2, 4, 1\)"),
        ((np.ones((2, 4), bool), 5), r"integer <= 4 for keep_length\. Received: keep_length=5"),
        ((np.ones((2, 4), bool), 2.0), r"Expected an integer for keep_length\. .*=2\.0"),
    ],
)
def test_kept_indices_bad_input(args, pattern):
    _raises(pattern, kept_indices, *args)


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((np.ones((4,)), np.zeros((2, 2), "int32")), r"Expected values of rank >= 2\. .*\(4,\)"),
        ((np.ones((2, 4)), np.zeros((2,), "int32")), r"Expected indices of rank 2\. .*\(2,\)"),
        ((np.ones((2, 4)), np.zeros((3, 2), "int32")), r"Expected matching \(batch, sequence\)"),
        ((np.ones((2, 4)), np.array([[0, 4], [1, 2]], "int32")), r"indices in \[0, 4\) .*0 to 4"),
        ((np.ones((2, 4)), np.zeros((2, 2), "float32")), r"Expected integer indices\. .*float32"),
    ],
)
def test_batched_gather_bad_input(args, pattern):
    _raises(pattern, batched_gather, *args)


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((np.ones((2,)), np.ones((2, 4), bool)), r"Expected kept_values of rank >= 2"),
        ((np.ones((2, 2, 1)), np.ones((4,), bool)), r"Expected keep of rank 2"),
        ((np.ones((2, 2, 1)), np.ones((3, 4), bool)), r"Expected matching \(batch, sequence\)"),
        (
            (np.ones((2, 2, 1)), np.ones((2, 4), bool)),
            r"Received: a keep row that keeps 4 tokens, kept_values with 2 slots",
        ),
    ],
)
def test_restore_full_length_bad_input(args, pattern):
    _raises(pattern, restore_full_length, *args)


def _backbone():
    return TransformerBackbone(**tiny_backbone_kwargs())


ENCODER_CASES = [
    ({"rate": 1.0}, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.0"),
    ({"rate": True}, r"Expected a number for rate\. Received: rate=True"),
    ({"rate": "0.1"}, r"Expected a number for rate\. Received: rate='0\.1'"),
    ({"mode": "mask"}, r"Expected mode in .*Received: mode='mask'"),
    ({"protected_token_ids": "101"}, r"for protected_token_ids\. Received"),
    ({"protected_token_ids": (101.0,)}, r"integers >= 0 in protected_token_ids\."),
    ({"slot_multiple": 0}, r"integer >= 1 for slot_multiple\. Received: slot_multiple=0"),
    ({"seed": 2.5}, r"Expected an integer for seed\. Received: seed=2\.5"),
]


@pytest.mark.parametrize("kwargs, pattern", ENCODER_CASES)
@pytest.mark.parametrize("entry", ["DropTokenEncoder", "with_drop_token"])
def test_encoder_bad_input(entry, kwargs, pattern, recwarn):
    build = DropTokenEncoder if entry == "DropTokenEncoder" else keras_masking.with_drop_token
    backbone = _backbone()
    weights = [np.array(w) for w in backbone.get_weights()]
    _raises(pattern, build, backbone, **{"rate": 0.1, **kwargs})
    assert not [w for w in recwarn if "XLA" in str(w.message)]  # refused before warning
    for before, after in zip(weights, backbone.get_weights()):
        np.testing.assert_array_equal(before, after)


def test_encoder_refuses_what_is_not_a_backbone():
    with pytest.raises(TypeError, match=r"Expected a keras_masking TransformerBackbone .* Dense"):
        keras_masking.with_drop_token(keras.layers.Dense(2), 0.1)
    with pytest.raises(TypeError, match=r"Received: Dense"):
        encoder_stages(keras.layers.Dense(2))
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    with pytest.raises(ValueError, match=r"Expected position_ids=None for a keras-hub backbone"):
        encoder_stages(hub).embed(random_features(2, 6), np.zeros((1, 6), "int32"))


SCHEDULE_CASES = [
    ({"final_rate": 1.0}, r"Expected final_rate in \[0\.0, 1\.0\)\. Received: final_rate=1\.0"),
    ({"initial_rate": -0.1}, r"Expected initial_rate in \[0\.0, 1\.0\)\. .*=-0\.1"),
    ({"final_rate": True}, r"Expected a number for final_rate\. Received: final_rate=True"),
    ({"initial_rate": "0"}, r"Expected a number for initial_rate\. Received: initial_rate='0'"),
    ({"ramp_steps": 0}, r"integer >= 1 for ramp_steps\. Received: ramp_steps=0"),
    ({"ramp_steps": 2.5}, r"Expected an integer for ramp_steps\. Received: ramp_steps=2\.5"),
    ({"ramp_steps": True}, r"Expected an integer for ramp_steps\. Received: ramp_steps=True"),
    ({"levels": 1}, r"integer >= 2 for levels\. Received: levels=1"),
    ({"levels": 3.0}, r"Expected an integer for levels\. Received: levels=3\.0"),
]


@pytest.mark.parametrize("kwargs, pattern", SCHEDULE_CASES)
def test_schedule_bad_input(kwargs, pattern):
    _raises(pattern, DropTokenRateSchedule, **{"final_rate": 0.1, "ramp_steps": 4, **kwargs})


@pytest.mark.parametrize(
    "step, pattern",
    [
        (-1, r"integer >= 0 for step\. Received: step=-1"),
        (1.5, r"Expected an integer for step\. Received: step=1\.5"),
        (True, r"Expected an integer for step\. Received: step=True"),
    ],
)
def test_schedule_rate_at_bad_input(step, pattern):
    _raises(pattern, DropTokenRateSchedule(0.1, 4).rate_at, step)


def test_schedule_on_a_model_without_drop_token_fails_before_training():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs), name="plain")
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x, y = np.ones((4, 3), "float32"), np.ones((4, 1), "float32")
    weights = [np.array(w) for w in model.get_weights()]
    schedule = DropTokenRateSchedule(0.1, 4)
    with pytest.raises(ValueError, match=re.escape("Received: a model 'plain' with none")):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[schedule])
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    assert schedule.history == [] and schedule.step == 0
