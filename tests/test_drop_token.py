"""DropToken: position-preserving token dropping, checked against the
backbone run on just the kept tokens with their original positions."""

import keras
import keras_hub
import numpy as np
import pytest
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

import keras_masking
from keras_masking.layers import DropToken
from keras_masking.models import TransformerBackbone


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


@pytest.mark.parametrize("position", ["absolute", "rotary", "relative"])
def test_gather_equals_backbone_on_kept_tokens(position):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position=position)))
    encoder = keras_masking.with_drop_token(backbone, 0.4, protected_token_ids=(1,), seed=3)
    features = random_features(batch=3, length=12)
    outputs = encoder(features, training=True)
    token_mask = np.asarray(outputs["token_mask"]).astype(bool)
    assert token_mask[:, 0].all() and (token_mask.sum(1) < features["padding_mask"].sum(1)).all()
    reference, pooled, _ = _kept_reference(_with_positions(backbone), features, token_mask)
    sequence = np.asarray(outputs["sequence_output"])
    for b in range(3):
        kept = np.flatnonzero(token_mask[b])
        np.testing.assert_allclose(sequence[b, kept], reference[b, : len(kept)], atol=2e-5)
        assert np.abs(sequence[b, ~token_mask[b]]).max() == 0.0
    np.testing.assert_allclose(outputs["pooled_output"], pooled, atol=2e-5)
    # At inference nothing is dropped.
    np.testing.assert_allclose(
        encoder(features)["sequence_output"], backbone(features)["sequence_output"], atol=2e-6
    )


@pytest.mark.parametrize("position", ["absolute", "relative"])
def test_attention_mode_equals_gather_on_kept_tokens(position):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position=position)))
    gather = keras_masking.with_drop_token(backbone, 0.3, seed=5)
    attention = keras_masking.with_drop_token(backbone, 0.3, mode="attention", seed=5)
    features = random_features(batch=2, length=12)
    a, b = gather(features, training=True), attention(features, training=True)
    np.testing.assert_array_equal(a["token_mask"], b["token_mask"])
    kept = np.asarray(a["token_mask"]).astype(bool)
    np.testing.assert_allclose(
        np.asarray(a["sequence_output"])[kept], np.asarray(b["sequence_output"])[kept], atol=2e-5
    )
    np.testing.assert_allclose(a["pooled_output"], b["pooled_output"], atol=2e-5)


def test_keras_hub_bert_keeps_original_positions():
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    randomize_weights(hub)
    encoder = keras_masking.with_drop_token(hub, 0.5, seed=2)
    features = random_features(batch=2, length=12)
    np.testing.assert_allclose(
        encoder(features)["sequence_output"], hub(features)["sequence_output"], atol=1e-6
    )
    outputs = encoder(features, training=True)
    token_mask = np.asarray(outputs["token_mask"]).astype(bool)
    ours = keras_masking.models.from_keras_hub(hub, custom_position_ids=True)
    reference, pooled, _ = _kept_reference(ours, features, token_mask)
    sequence = np.asarray(outputs["sequence_output"])
    for b in range(2):
        kept = np.flatnonzero(token_mask[b])
        np.testing.assert_allclose(sequence[b, kept], reference[b, : len(kept)], atol=5e-5)
    np.testing.assert_allclose(outputs["pooled_output"], pooled, atol=5e-5)


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
    layer = DropToken(rate, protected_token_ids=(1, 2), seed=11)
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
    again = DropToken(rate, protected_token_ids=(1, 2), seed=11)(
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
    layer = DropToken(0.5, protected_token_ids=(1,), slot_multiple=1)
    ids = np.ones((1, 8), "int32")
    with pytest.raises(
        ValueError, match="Row 0 has 8 protected tokens but gather mode keeps only 4"
    ):
        layer(np.ones((1, 8, 2), "float32"), np.ones((1, 8)), token_ids=ids, training=True)
    with pytest.raises(ValueError, match=r"Expected padding_mask of shape .*\(1, 7\)"):
        DropToken(0.5)(np.ones((1, 8, 2), "float32"), np.ones((1, 7)), training=True)
    with pytest.raises(ValueError, match="needs token_ids"):
        DropToken(0.5, protected_token_ids=(1,))(
            np.ones((1, 8, 2), "float32"), np.ones((1, 8)), training=True
        )


def _cross_entropy(logits, labels):
    logits = logits - logits.max(-1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-log_probabilities[np.arange(len(labels)), labels].mean())


def test_fit_under_xla_and_save_load(tmp_path):
    """Each row's [CLS]/[SEP] fill its 6 slots, so every compiled step runs the
    encoder on exactly them: its loss equals the backbone's on those tokens."""
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    encoder = keras_masking.with_drop_token(
        backbone, 0.5, protected_token_ids=(1, 2), slot_multiple=1, seed=0
    )
    assert encoder.drop_token.keep_length(12) == 6
    features = random_features(batch=8, length=12, seed=3)
    features["token_ids"] = np.maximum(features["token_ids"], 3) * features["padding_mask"]
    rng = np.random.default_rng(4)
    keep = np.zeros((8, 12), bool)
    for b in range(8):
        real = int(features["padding_mask"][b].sum())
        seps = np.sort(rng.choice(np.arange(1, real), 5, replace=False))
        features["token_ids"][b, 0], features["token_ids"][b, seps] = 1, 2
        keep[b, 0] = keep[b, seps] = True
    labels = np.arange(8) % 2
    inputs = encoder.input
    dense = keras.layers.Dense(2)
    model = keras.Model(inputs, dense(encoder(inputs)["pooled_output"]))
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    twin = _with_positions(backbone)
    losses, references = [], []
    for _ in range(2):
        twin.set_weights(backbone.get_weights())
        _, pooled, _ = _kept_reference(twin, features, keep)
        kernel, bias = (np.asarray(w) for w in dense.weights)
        references.append(_cross_entropy(pooled @ kernel + bias, labels))
        history = model.fit(features, labels, batch_size=8, epochs=1, verbose=0, shuffle=False)
        losses.append(history.history["loss"][0])
    np.testing.assert_allclose(losses, references, rtol=1e-4)
    assert references[1] < references[0]  # the step trained the model
    encoder.save(tmp_path / "encoder.keras")
    restored = keras.saving.load_model(tmp_path / "encoder.keras")
    assert restored.rate == 0.5 and restored.protected_token_ids == (1, 2)
    np.testing.assert_array_equal(
        restored(features)["sequence_output"], encoder(features)["sequence_output"]
    )


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


def test_rate_schedule_changes_rates_in_fit():
    """A one-layer model whose loss is the square of the kept-token count: each
    compiled step's loss shows the rate that step used."""
    length = 12
    model, drop = _kept_count_model(length)
    schedule = keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=6, levels=3
    )
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((drop.rate, model.train_function))

    x = [np.ones((4, length, 1), "float32"), np.ones((4, length), "int32")]
    history = model.fit(
        x, np.zeros((4, 1)), batch_size=4, epochs=8, verbose=0, callbacks=[schedule, Spy()]
    )

    def formula(step):  # initial + (final - initial) * quantised progress
        return 0.5 - 0.5 * round(min(step / 6, 1.0) * 2) / 2

    rates = [formula(step) for step in range(8)]
    assert rates == [0.5, 0.5, 0.25, 0.25, 0.25, 0.0, 0.0, 0.0]
    assert [rate for rate, _ in seen] == rates
    assert schedule.history == [(0, 0.5), (2, 0.25), (5, 0.0)]
    # Full rows of 12 keep 12 - 12 * rate tokens: 6, 9, then all 12.
    expected = [float(length - length * rate) ** 2 for rate in rates]
    np.testing.assert_array_equal(history.history["loss"], expected)
    assert len({id(function) for _, function in seen}) == 3  # one trace per rate
    with pytest.raises(ValueError, match="final_rate"):
        keras_masking.callbacks.DropTokenRateSchedule(final_rate=1.0, ramp_steps=5)


@pytest.mark.parametrize("steps_per_execution", [2, 3])
def test_rate_schedule_counts_optimizer_steps_with_steps_per_execution(steps_per_execution):
    """8 steps an epoch, 2 or 3 a call: the schedule counts optimizer steps, not
    executions, and each execution runs at the rate of its first step (the
    last execution of 3 is cut short at step 8)."""
    length = 12
    model, drop = _kept_count_model(length, steps_per_execution)
    schedule = keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=6, levels=3
    )
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((batch, drop.rate, float(logs["loss"])))

    x = [np.ones((8, length, 1), "float32"), np.ones((8, length), "int32")]
    model.fit(x, np.zeros((8, 1)), batch_size=1, epochs=2, verbose=0, callbacks=[schedule, Spy()])
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 16
    assert schedule.step == 16
    if steps_per_execution == 2:  # executions start at steps 0, 2, 4, 6 | 8, ...
        assert [rate for _, rate, _ in seen[:4]] == [0.5, 0.25, 0.25, 0.0]
        assert schedule.history == [(0, 0.5), (2, 0.25), (6, 0.0)]
    else:  # 0, 3, 6 (two steps) | 8, 11, 14 (two steps)
        assert [rate for _, rate, _ in seen[:3]] == [0.5, 0.25, 0.0]
        assert schedule.history == [(0, 0.5), (3, 0.25), (6, 0.0)]
    assert all(rate == 0.0 for _, rate, _ in seen[len(seen) // 2 :])
    # The first epoch's running mean loss: each step kept 12 - 12 * rate tokens.
    steps, total = 0, 0.0
    for end, rate, mean in seen[: len(seen) // 2]:
        done = min(end + 1, 8)  # the last execution of 3 runs 2 steps
        total += (done - steps) * (length - length * rate) ** 2
        steps = done
        np.testing.assert_allclose(mean, total / steps, rtol=1e-6)
    # A new schedule on the trained model continues from the optimizer's count.
    later = keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=32, levels=3
    )
    model.fit(x, np.zeros((8, 1)), batch_size=4, epochs=1, verbose=0, callbacks=[later])
    assert later.history == [(16, 0.25)] and later.step == 18


def test_keras_hub_roberta_attention_mode_matches_gather():
    hub = keras_hub.models.RobertaBackbone(**HUB_SIZES)
    randomize_weights(hub, seed=4)
    features = random_features(batch=2, length=12)
    features.pop("segment_ids")
    gather = keras_masking.with_drop_token(hub, 0.3, seed=9)
    attention = keras_masking.with_drop_token(hub, 0.3, mode="attention", seed=9)
    np.testing.assert_allclose(gather(features)["sequence_output"], hub(features), atol=1e-6)
    a, b = gather(features, training=True), attention(features, training=True)
    kept = np.asarray(a["token_mask"]).astype(bool)
    np.testing.assert_array_equal(kept, np.asarray(b["token_mask"]).astype(bool))
    assert kept.sum() < features["padding_mask"].sum()
    np.testing.assert_allclose(
        np.asarray(a["sequence_output"])[kept], np.asarray(b["sequence_output"])[kept], atol=5e-5
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
