"""DropToken on a backbone (enable_drop_token), every position scheme and keras-hub backbones."""

import keras
import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.models import TransformerBackbone
from tests.drop_token_cases import ENCODER_CASES
from tests.drop_token_cases import _backbone
from tests.drop_token_cases import _compiled_model_call
from tests.drop_token_cases import _compute_dtype
from tests.drop_token_cases import _cross_entropy
from tests.drop_token_cases import _dtype
from tests.drop_token_cases import _kept_reference
from tests.drop_token_cases import _numpy
from tests.drop_token_cases import _raises
from tests.drop_token_cases import _tiny_encoder
from tests.drop_token_cases import _with_positions
from tests.drop_token_cases import copied
from tests.drop_token_cases import with_drop_token
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


@pytest.mark.parametrize("position", ["absolute", "rotary", "relative"])
def test_gather_equals_backbone_on_kept_tokens(position):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position=position)))
    plain = copied(backbone)
    encoder = with_drop_token(backbone, 0.4, unselectable_token_ids=(1,), seed=3)
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
    # At inference nothing is dropped: the plain backbone's outputs.
    for training in (None, False):
        outputs = encoder(features, training=training)
        np.testing.assert_array_equal(outputs["token_mask"], features["padding_mask"])
        np.testing.assert_allclose(
            outputs["sequence_output"], plain(features)["sequence_output"], atol=2e-6
        )


@pytest.mark.parametrize("position", ["absolute", "relative"])
def test_attention_mode_equals_gather_on_kept_tokens(position):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position=position)))
    gather = with_drop_token(copied(backbone), 0.3, seed=5)
    attention = with_drop_token(backbone, 0.3, mode="attention", seed=5)
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
    encoder = with_drop_token(hub, 0.5, seed=2)
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


def test_fit_under_xla_and_save_load(tmp_path):
    """Each row's [CLS]/[SEP] fill its 6 slots, so every compiled step runs the
    encoder on exactly them: its loss equals the backbone's on those tokens."""
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    encoder = with_drop_token(backbone, 0.5, unselectable_token_ids=(1, 2), slot_multiple=1, seed=0)
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
    assert restored.drop_token.rate == 0.5
    assert restored.drop_token.unselectable_token_ids == (1, 2)
    np.testing.assert_array_equal(
        restored(features)["sequence_output"], encoder(features)["sequence_output"]
    )


def test_keras_hub_roberta_attention_mode_matches_gather():
    hub = keras_hub.models.RobertaBackbone(**HUB_SIZES)
    randomize_weights(hub, seed=4)
    features = random_features(batch=2, length=12)
    features.pop("segment_ids")
    gather = with_drop_token(hub, 0.3, seed=9)
    attention = with_drop_token(hub, 0.3, mode="attention", seed=9)
    np.testing.assert_allclose(gather(features)["sequence_output"], hub(features), atol=1e-6)
    a, b = gather(features, training=True), attention(features, training=True)
    kept = np.asarray(a["token_mask"]).astype(bool)
    np.testing.assert_array_equal(kept, np.asarray(b["token_mask"]).astype(bool))
    assert kept.sum() < features["padding_mask"].sum()
    np.testing.assert_allclose(
        np.asarray(a["sequence_output"])[kept], np.asarray(b["sequence_output"])[kept], atol=5e-5
    )


def test_encoder_keeps_every_protected_token_when_they_fill_the_slots():
    """A classifier step on rows whose [CLS]/[SEP] fill the slots: eager and
    compiled, the encoder runs on exactly the protected tokens."""
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    encoder = with_drop_token(backbone, 0.5, unselectable_token_ids=(1, 2), slot_multiple=1, seed=0)
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


@pytest.mark.parametrize("mode", ["gather", "attention"])
@pytest.mark.parametrize("mixed_policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_encoder_drops_the_same_tokens(mixed_policy, mode, restore_policy):
    full = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="relative")))
    keras.mixed_precision.set_global_policy(mixed_policy)
    mixed = TransformerBackbone(**tiny_backbone_kwargs(position="relative"))
    mixed.set_weights(full.get_weights())
    features = random_features(batch=3, length=12, seed=2)
    kwargs = dict(unselectable_token_ids=(1,), mode=mode, seed=5)
    expected = with_drop_token(full, 0.4, **kwargs)(features, training=True)
    encoder = with_drop_token(mixed, 0.4, **kwargs)
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


@pytest.mark.parametrize("mode", ["gather", "attention"])
def test_the_setting_round_trips_in_config_and_saving(tmp_path, mode):
    encoder = _tiny_encoder(mode=mode)
    config = encoder.get_config()
    assert config["drop_token"] == {
        "rate": 0.25,
        "unselectable_token_ids": [1, 2],
        "mode": mode,
        "seed": 4,
        "slot_multiple": 4,
    }
    clone = TransformerBackbone.from_config(config)
    assert clone.get_config() == config
    assert clone.restore_dropped_tokens.gathering is (mode == "gather")
    clone.set_weights(encoder.get_weights())
    features = random_features(batch=2, length=12)
    np.testing.assert_array_equal(
        _numpy(clone(features)["sequence_output"]), _numpy(encoder(features)["sequence_output"])
    )
    path = tmp_path / "encoder.keras"
    encoder.save(path)
    restored = keras.saving.load_model(path)  # no custom_objects
    assert restored.get_config() == config
    for name in ("sequence_output", "pooled_output", "token_mask"):
        np.testing.assert_array_equal(
            _numpy(restored(features)[name]), _numpy(encoder(features)[name]), err_msg=name
        )
    # The same draws from the same seed: the same tokens are dropped.
    np.testing.assert_array_equal(
        _numpy(clone(features, training=True)["token_mask"]),
        _numpy(restored(features, training=True)["token_mask"]),
    )


def test_two_dimensional_rotary_positions_are_gathered():
    backbone = randomize_weights(
        TransformerBackbone(**tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True))
    )
    plain = copied(backbone)
    encoder = with_drop_token(backbone, 0.4, seed=1)
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
    reference = _numpy(plain(sub)["sequence_output"])
    sequence = _numpy(outputs["sequence_output"])
    for b in range(2):
        kept = int(keep[b].sum())
        np.testing.assert_allclose(sequence[b, keep[b]], reference[b, :kept], atol=2e-5)


@pytest.mark.parametrize("kwargs, pattern", ENCODER_CASES)
def test_enable_drop_token_bad_input(kwargs, pattern, recwarn):
    backbone = _backbone()
    weights = [np.array(w) for w in backbone.get_weights()]
    config = backbone.get_config()
    _raises(pattern, backbone.enable_drop_token, **{"rate": 0.1, **kwargs})
    assert not [w for w in recwarn if "XLA" in str(w.message)]  # refused before warning
    assert backbone.drop_token is None and backbone.get_config() == config
    assert backbone.token_dropping.rate == 0.0  # the graph's layer is untouched
    for before, after in zip(weights, backbone.get_weights()):
        np.testing.assert_array_equal(before, after)
