"""The DropToken and RestoreDroppedTokens layers."""

import keras
import numpy as np
import pytest

from keras_masking.callbacks import DropTokenRateSchedule
from keras_masking.layers import DropToken
from keras_masking.layers import RestoreDroppedTokens
from keras_masking.ops.token_dropping import sample_keep_mask
from keras_masking.ops.token_dropping import static_keep_length
from tests.drop_token_cases import CALL_CASES
from tests.drop_token_cases import DROP_TOKEN_CASES
from tests.drop_token_cases import ENCODER_CASES
from tests.drop_token_cases import FORCED_KEEP
from tests.drop_token_cases import IDS
from tests.drop_token_cases import OVERFLOW_IDS
from tests.drop_token_cases import OVERFLOW_MASK
from tests.drop_token_cases import RATE_CASES
from tests.drop_token_cases import SCHEDULE_CASES
from tests.drop_token_cases import _compute_dtype
from tests.drop_token_cases import _dtype
from tests.drop_token_cases import _expected_gather
from tests.drop_token_cases import _hidden
from tests.drop_token_cases import _numpy
from tests.drop_token_cases import _raises
from tests.drop_token_cases import _random_batch
from tests.drop_token_cases import call
from tests.drop_token_cases import compiled_call


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
    # Full length: the dropped tokens' keys are hidden as padding is.
    np.testing.assert_array_equal(_numpy(out["padding_mask"]), OVERFLOW_MASK * keep)
    np.testing.assert_array_equal(_numpy(out["hidden"]), _hidden(5, 8))
    np.testing.assert_array_equal(_numpy(out["kept_indices"]), np.tile(np.arange(8), (5, 1)))
    # The gather-mode slots' restore would zero the dropped tokens; a backbone
    # in attention mode keeps its restore off (gathering=False): the identity.
    restored = RestoreDroppedTokens(gathering=False)(out["hidden"], out["keep_mask"])
    np.testing.assert_array_equal(_numpy(restored), _hidden(5, 8))


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
    np.testing.assert_array_equal(_numpy(actual["kept_indices"]), _numpy(expected["kept_indices"]))
    np.testing.assert_array_equal(_numpy(actual["padding_mask"]), _numpy(expected["padding_mask"]))


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
    assert len(ENCODER_CASES) == 9
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


def test_every_mode_returns_the_same_entries_and_the_identity_keeps_positions_as_given():
    hidden, mask = _hidden(2, 8), np.ones((2, 8), "int32")
    positions = np.arange(8, dtype="int32")[None] + 3
    for layer, training in ((DropToken(0.0), True), (DropToken(0.5, seed=1), False)):
        out = layer(hidden, mask, position_ids=positions, training=training)
        assert set(out) == {"hidden", "padding_mask", "position_ids", "keep_mask", "kept_indices"}
        np.testing.assert_array_equal(_numpy(out["hidden"]), hidden)
        # Unbroadcast: relative positions then cost no more than without the layer.
        np.testing.assert_array_equal(_numpy(out["position_ids"]), positions)
        assert _numpy(out["keep_mask"]).all()
    for mode in ("gather", "attention"):
        out = DropToken(0.5, mode=mode, seed=1)(hidden, mask, training=True)
        assert set(out) == {"hidden", "padding_mask", "position_ids", "keep_mask", "kept_indices"}


def test_reconfigure_checks_everything_first_and_reseeds():
    layer = DropToken(0.0)
    with pytest.raises(ValueError, match="mode"):
        layer.reconfigure(0.5, mode="mask")
    assert (layer.rate, layer.mode) == (0.0, "gather")  # nothing changed
    layer.reconfigure(0.5, unselectable_token_ids=(1,), mode="attention", seed=7)
    fresh = DropToken(0.5, unselectable_token_ids=(1,), mode="attention", seed=7)
    assert layer.get_config() | {"name": None} == fresh.get_config() | {"name": None}
    hidden, mask, ids = _hidden(3, 16), np.ones((3, 16), "int32"), np.full((3, 16), 5, "int32")
    np.testing.assert_array_equal(
        _numpy(layer(hidden, mask, token_ids=ids, training=True)["keep_mask"]),
        _numpy(fresh(hidden, mask, token_ids=ids, training=True)["keep_mask"]),
    )


def test_restore_is_the_identity_when_off_or_at_inference():
    kept, keep = np.array([[[1.0], [2.0]]], "float32"), np.array([[True, False, True]])
    assert RestoreDroppedTokens(gathering=False).get_config()["gathering"] is False
    np.testing.assert_array_equal(_numpy(RestoreDroppedTokens(gathering=False)(kept, keep)), kept)
    np.testing.assert_array_equal(_numpy(RestoreDroppedTokens()(kept, keep, training=False)), kept)
    restored = _numpy(RestoreDroppedTokens()(kept, keep, training=True))
    np.testing.assert_array_equal(restored[0, :, 0], [1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="gathering"):
        RestoreDroppedTokens(gathering="yes")


def test_a_backbones_idle_drop_token_draws_no_seed_until_turned_on():
    # Building a backbone must leave later seeded draws as they were before
    # DropToken joined its graph: the idle layer takes a fixed seed, and
    # turning it on without a seed draws one then, as a new layer would.
    import random

    random.seed(3)
    layer = DropToken(0.0, seed=0)
    drawn = random.random()
    random.seed(3)
    assert random.random() == drawn  # the constructor drew nothing
    random.seed(3)
    layer.reconfigure(0.5)
    expected = random.Random(3).randint(1, 10**9)
    np.testing.assert_array_equal(_numpy(layer.seed_generator.state), [expected, 0])
    assert layer.seed is None
