"""The DropToken and RestoreDroppedTokens layers."""

import keras
import numpy as np
import pytest

from keras_masking.callbacks import DropTokenRateSchedule
from keras_masking.layers import DropToken
from keras_masking.layers import RestoreDroppedTokens
from keras_masking.methods import DropTokenEncoder
from keras_masking.models import TransformerBackbone
from keras_masking.ops.attention_masks import large_negative
from keras_masking.ops.token_dropping import sample_keep_mask
from keras_masking.ops.token_dropping import static_keep_length
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


def _kept_reference(backbone, features, token_mask):
    """The backbone on each example's kept tokens, original positions."""
    token_mask = np.asarray(token_mask).astype(bool)
    batch, length = token_mask.shape
    kept = token_mask.sum(1)
    width = int(kept.max())
    sub = {
        k: np.zeros((batch, width), "int32") for k in ("token_ids", "segment_ids", "padding_mask")
    }
    positions = np.zeros((batch, width), "int32")
    for b in range(batch):
        index = np.flatnonzero(token_mask[b])
        for key in ("token_ids", "segment_ids"):
            sub[key][b, : len(index)] = features[key][b, index]
        sub["padding_mask"][b, : len(index)] = 1
        positions[b, : len(index)] = index
    output = backbone({**sub, "position_ids": positions})
    return np.asarray(output["sequence_output"]), np.asarray(output["pooled_output"]), sub


def _with_positions(backbone):
    twin = TransformerBackbone(**{**_arguments(backbone), "custom_position_ids": True})
    twin.set_weights(backbone.get_weights())
    return twin


def _arguments(backbone):
    config = backbone.get_config()
    for key in ("name", "trainable", "dtype"):
        config.pop(key)
    return config


def _cross_entropy(logits, labels):
    logits = logits - logits.max(-1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-log_probabilities[np.arange(len(labels)), labels].mean())


def _kept_count_model(length, steps_per_execution=1):
    """A one-layer model whose output is the kept-token count of a DropToken:
    with a zero target, each compiled step's loss shows the rate it used."""
    hidden = keras.Input((length, 1))
    mask = keras.Input((length,), dtype="int32")
    drop = DropToken(0.5, slot_multiple=1, seed=0)
    kept = keras.ops.sum(keras.ops.cast(drop(hidden, mask)["padding_mask"], "float32"), axis=1)
    dense = keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")
    model = keras.Model([hidden, mask], dense(kept[:, None]))
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss="mse",
        jit_compile=True,
        steps_per_execution=steps_per_execution,
    )
    return model, drop


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


@pytest.fixture
def restore_policy():
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


# === Item 8: DropTokenEncoder's config, saving and loading ===
def _tiny_encoder(**kwargs):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    arguments = dict(rate=0.25, unselectable_token_ids=(1, 2), seed=4, slot_multiple=4)
    arguments.update(kwargs)
    return DropTokenEncoder(backbone, **arguments)


ENCODER_KEYS = {
    "backbone",
    "rate",
    "unselectable_token_ids",
    "mode",
    "seed",
    "slot_multiple",
    "dtype",
    "name",
    "trainable",
}


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
    ({"mode": "mask"}, r"Expected one of 'gather', 'attention' for mode\. Received: mode='mask'"),
    ({"mode": None}, r"for mode\. Received: mode=None"),
    ({"unselectable_token_ids": 101}, r"list of integers for unselectable_token_ids\. "),
    (
        {"unselectable_token_ids": "101"},
        r"for unselectable_token_ids\. Received: unselectable_token_ids='1",
    ),
    ({"unselectable_token_ids": (1.5,)}, r"for unselectable_token_ids\. .*\(1\.5,\)"),
    ({"unselectable_token_ids": (True,)}, r"for unselectable_token_ids\. .*\(True,\)"),
    (
        {"unselectable_token_ids": (1, -1)},
        r"entry of unselectable_token_ids in \[0, inf\]\. .*-1\)",
    ),
    ({"protected_positions": (0.0,)}, r"for protected_positions\. .*\(0\.0,\)"),
    ({"protected_positions": (-1,)}, r"entry of protected_positions in \[0, inf\]\. .*\(-1,\)"),
    ({"protected_positions": 0}, r"for protected_positions\. Received: protected_positions=0"),
    ({"seed": 1.5}, r"Expected an integer for seed\. Received: seed=1\.5"),
    ({"seed": -1}, r"Expected an integer >= 0 for seed\. Received: seed=-1"),
    ({"seed": True}, r"Expected an integer for seed\. Received: seed=True"),
    ({"seed": "7"}, r"Expected an integer for seed\. Received: seed='7'"),
]

HIDDEN = np.ones((2, 8, 3), "float32")

MASK = np.ones((2, 8), "int32")

IDS = np.full((2, 8), 3, "int32")

CALL_CASES = [
    ((np.ones((2, 8), "float32"), MASK), {}, r"Expected hidden of shape \(batch, sequence, dim\)"),
    ((HIDDEN, np.ones((2, 7))), {}, r"Expected padding_mask of shape .*\(2, 7\)"),
    ((HIDDEN, np.ones((2, 8, 1))), {}, r"Expected padding_mask of shape .*\(2, 8, 1\)"),
    ((HIDDEN, MASK), {"token_ids": np.ones((2, 7), "int32")}, r"Expected token_ids of shape"),
    ((HIDDEN, MASK), {"token_ids": np.ones((2, 8), "float32")}, r"Expected integer token_ids"),
    (
        (HIDDEN, MASK),
        {"token_ids": None},
        r"needs token_ids to protect unselectable_token_ids=\(1,\)",
    ),
    ((HIDDEN, MASK), {"position_ids": np.ones((1, 7), "int32")}, r"Expected position_ids of"),
    ((HIDDEN, MASK), {"position_ids": np.ones((1, 8, 2, 1), "int32")}, r"Expected position_ids"),
    (
        (HIDDEN, MASK),
        {"position_ids": np.ones((2, 8), "float32")},
        r"Expected integer position_ids",
    ),
    ((HIDDEN, MASK * 2), {}, r"Expected padding_mask of 0s and 1s\. Received: .*\[2\]"),
    ((HIDDEN, MASK), {"token_ids": np.full((2, 8), 1, "int32")}, r"Row 0 has 8 protected tokens"),
    ("symbolic", {}, r"needs a static sequence length in training"),
]

REAL = np.ones((2, 4), bool)

NOISE = np.zeros((2, 4), "float32")

ROUNDING = np.zeros((2,), "float32")


def _backbone():
    return TransformerBackbone(**tiny_backbone_kwargs())


ENCODER_CASES = [
    ({"rate": 1.0}, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.0"),
    ({"rate": True}, r"Expected a number for rate\. Received: rate=True"),
    ({"rate": "0.1"}, r"Expected a number for rate\. Received: rate='0\.1'"),
    ({"mode": "mask"}, r"for mode\. Received: mode='mask'"),
    ({"unselectable_token_ids": "101"}, r"for unselectable_token_ids\. Received"),
    ({"unselectable_token_ids": (101.0,)}, r"for unselectable_token_ids\."),
    ({"slot_multiple": 0}, r"integer >= 1 for slot_multiple\. Received: slot_multiple=0"),
    ({"seed": 2.5}, r"Expected an integer for seed\. Received: seed=2\.5"),
]

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


def test_rates_protection_padding_and_seeds_on_random_batches():
    rng = np.random.default_rng(0)
    batch, length, rate = 400, 32, 0.25
    token_ids = rng.integers(3, 50, (batch, length)).astype("int32")
    token_ids[:, 0] = 1
    lengths = rng.integers(4, length + 1, batch)
    padding_mask = (np.arange(length)[None] < lengths[:, None]).astype("int32")
    token_ids[np.arange(batch), lengths - 1] = 2  # [SEP] at the end
    token_ids = token_ids * padding_mask
    hidden = rng.normal(size=(batch, length, 4)).astype("float32")
    layer = DropToken(rate, unselectable_token_ids=(1, 2), seed=11)
    out = layer(hidden, padding_mask, token_ids=token_ids, training=True)
    keep = np.asarray(out["keep_mask"]).astype(bool)
    real = padding_mask.astype(bool)
    protected = real & np.isin(token_ids, [1, 2])
    assert out["hidden"].shape == (batch, layer.keep_length(length), 4) == (batch, 24, 4)
    assert (keep[protected]).all() and not keep[~real].any()
    droppable = (real & ~protected).sum(1)
    dropped = (real & ~protected & ~keep).sum(1)
    assert (dropped <= np.maximum(droppable - 1, 0)).all()  # at least one kept
    assert abs(dropped.sum() / droppable.sum() - rate) < 0.02
    # Each kept slot holds its original embedding and position, in order.
    indices = np.asarray(out["kept_indices"])
    slot_mask = np.asarray(out["padding_mask"]).astype(bool)
    np.testing.assert_array_equal(slot_mask.sum(1), keep.sum(1))
    for b in range(0, batch, 37):
        assert (np.diff(indices[b][slot_mask[b]]) > 0).all()
        np.testing.assert_array_equal(np.asarray(out["position_ids"])[b], indices[b])
        np.testing.assert_array_equal(np.asarray(out["hidden"])[b], hidden[b, indices[b]])
    again = DropToken(rate, unselectable_token_ids=(1, 2), seed=11)(
        hidden, padding_mask, token_ids=token_ids, training=True
    )
    np.testing.assert_array_equal(np.asarray(again["keep_mask"]), keep)
    identity = layer(hidden, padding_mask, token_ids=token_ids, training=False)
    np.testing.assert_array_equal(np.asarray(identity["hidden"]), hidden)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rate": 1.0}, "rate"),
        ({"rate": -0.1}, "rate"),
        ({"rate": 0.1, "mode": "mask"}, "mode"),
        ({"rate": 0.1, "slot_multiple": 0}, "slot_multiple"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DropToken(**kwargs)


def test_protected_tokens_that_do_not_fit_and_shape_mismatch():
    layer = DropToken(0.5, unselectable_token_ids=(1,), slot_multiple=1)
    ids = np.ones((1, 8), "int32")
    with pytest.raises(
        ValueError, match="Row 0 has 8 protected tokens but gather mode keeps only 4"
    ):
        layer(np.ones((1, 8, 2), "float32"), np.ones((1, 8)), token_ids=ids, training=True)
    with pytest.raises(ValueError, match=r"Expected padding_mask of shape .*\(1, 7\)"):
        DropToken(0.5)(np.ones((1, 8, 2), "float32"), np.ones((1, 7)), training=True)
    with pytest.raises(ValueError, match="needs token_ids"):
        DropToken(0.5, unselectable_token_ids=(1,))(
            np.ones((1, 8, 2), "float32"), np.ones((1, 8)), training=True
        )


def test_slots_round_up_to_a_multiple_without_dropping_more():
    from keras_masking.ops.token_dropping import static_keep_length

    assert static_keep_length(512, 0.1) == 461
    assert static_keep_length(512, 0.1, multiple=8) == 464
    assert static_keep_length(512, 0.5, multiple=8) == 256
    assert static_keep_length(12, 0.1, multiple=8) == 12  # capped at the length
    rng = np.random.default_rng(3)
    batch, length, rate = 300, 40, 0.3
    hidden = rng.normal(size=(batch, length, 4)).astype("float32")
    padding_mask = np.ones((batch, length), "int32")
    shares = {}
    for multiple in (1, 8):
        layer = DropToken(rate, protected_positions=(0,), seed=5, slot_multiple=multiple)
        out = layer(hidden, padding_mask, training=True)
        assert out["hidden"].shape[1] == {1: 28, 8: 32}[multiple]
        keep = np.asarray(out["keep_mask"]).astype(bool)
        shares[multiple] = 1 - keep[:, 1:].mean()
        # Spare slots are masked: the kept count per row equals the mask's sum.
        np.testing.assert_array_equal(np.asarray(out["padding_mask"]).sum(1), keep.sum(1))
    assert abs(shares[1] - rate) < 0.02 and abs(shares[8] - rate) < 0.02


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit_compile"])
def test_protected_tokens_that_fill_the_slots_all_survive(compiled):
    layer = DropToken(0.5, unselectable_token_ids=(1, 2), slot_multiple=1, seed=3)
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
    layer = DropToken(0.5, unselectable_token_ids=(1, 2), slot_multiple=1, mode="attention", seed=3)
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
    layer = DropToken(0.5, unselectable_token_ids=(1, 2), slot_multiple=1, seed=3)
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
    attention = DropToken(0.5, unselectable_token_ids=(1, 2), slot_multiple=1, mode="attention")
    kept = _numpy(attention(hidden, mask, token_ids=ids, training=True)["keep_mask"])
    np.testing.assert_array_equal(kept[0], [1, 1, 1, 1, 1, 0, 0, 0])


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
    kwargs = dict(unselectable_token_ids=(1, 2), mode=mode, seed=7, slot_multiple=1)
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


def test_layer_configs_round_trip():
    layer = DropToken(
        np.float32(0.25),
        unselectable_token_ids=np.array([101, 102]),
        protected_positions=(0,),
        mode="attention",
        seed=np.int64(3),
        slot_multiple=np.int64(4),
        dtype="mixed_float16",
        trainable=False,
        name="drop",
    )
    config = layer.get_config()
    assert {k: config[k] for k in ("unselectable_token_ids", "seed", "slot_multiple", "mode")} == {
        "unselectable_token_ids": [101, 102],
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


@pytest.mark.parametrize("args, kwargs, pattern", CALL_CASES)
def test_drop_token_call_bad_input(args, kwargs, pattern):
    layer = DropToken(0.5, unselectable_token_ids=(1,), slot_multiple=1, seed=1)
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
