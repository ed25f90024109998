"""ExLMEncoder: fine-tuning an ExLM-pretrained backbone as the official code does."""

import keras
import numpy as np
import pytest

from keras_masking.layers import DAGTransition
from keras_masking.models import ExLMEncoder
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone
from keras_masking.models import plain_position_ids
from tests.models.exlm_testing import LENGTH
from tests.models.exlm_testing import PACKED
from tests.models.exlm_testing import SHORT
from tests.models.exlm_testing import backbone_on
from tests.models.exlm_testing import exlm_inputs
from tests.models.exlm_testing import make_encoder
from tests.models.exlm_testing import pad_rows
from tests.models.exlm_testing import padding_layouts
from tests.models.exlm_testing import reference_expansion
from tests.models.exlm_testing import refused_without_change
from tests.models.exlm_testing import rotary2d_backbone
from tests.models.exlm_testing import shared_backbone
from tests.models.exlm_testing import to_numpy
from tests.models.exlm_testing import traced_call
from tests.testing import tiny_backbone_kwargs

CLS, SEP, MASK = 1, 2, 3


def _features():
    ids = np.array(
        [[CLS, 7, 8, SEP, 9, SEP, 0], [CLS, 10, 11, 12, SEP, 0, 0]],
        "int32",
    )
    return {
        "token_ids": ids,
        "segment_ids": np.array([[0, 0, 0, 0, 1, 1, 0], [0] * 7], "int32"),
        "padding_mask": (ids > 0).astype("int32"),
    }


def test_outputs_equal_the_backbone_on_hand_expanded_inputs():
    backbone = rotary2d_backbone()
    encoder = ExLMEncoder(backbone, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP))
    out = encoder(_features())
    # Both rows expanded by hand, k = 2, padded to the encoder's 7 + (2 - 1) * 3 = 10 slots.
    # Row 0: [CLS] [CLS] 7 8 [SEP] [SEP] 9 [SEP] [SEP]; row 1: [CLS] [CLS] 10 11 12 [SEP] [SEP].
    ids = [[CLS, CLS, 7, 8, SEP, SEP, 9, SEP, SEP, 0], [CLS, CLS, 10, 11, 12, SEP, SEP, 0, 0, 0]]
    pos1 = [[0, 0, 1, 2, 3, 3, 4, 5, 5, 0], [0, 0, 1, 2, 3, 4, 4, 0, 0, 0]]
    pos2 = [[1, 2, 0, 0, 1, 2, 0, 1, 2, 0], [1, 2, 0, 0, 0, 1, 2, 0, 0, 0]]
    segments = [[0, 0, 0, 0, 0, 0, 1, 1, 1, 0], [0] * 10]
    reference = backbone(
        {
            "token_ids": np.array(ids),
            "segment_ids": np.array(segments),
            "padding_mask": np.array([[1] * 9 + [0], [1] * 7 + [0] * 3]),
            "position_ids": np.stack([pos1, pos2], -1),
        }
    )
    for row, first_slots in enumerate(([0, 2, 3, 4, 6, 7], [0, 2, 3, 4, 5])):
        count = len(first_slots)
        np.testing.assert_allclose(
            to_numpy(out["sequence_output"])[row, :count],
            to_numpy(reference["sequence_output"])[row, first_slots],
            atol=1e-5,
        )
    np.testing.assert_allclose(
        to_numpy(out["pooled_output"]), to_numpy(reference["pooled_output"]), atol=1e-5
    )
    # The expanded [CLS] sees other inputs than an unexpanded one would.
    plain = backbone(
        {**_features(), "position_ids": to_numpy(plain_position_ids(_features()["token_ids"]))}
    )
    gap = to_numpy(plain["sequence_output"])[:, 0] - to_numpy(out["sequence_output"])[:, 0]
    assert np.abs(gap).max() > 1e-3  # equal inputs would agree to ~1e-7


def test_k_one_is_the_backbone_on_plain_positions():
    backbone = rotary2d_backbone()
    features = _features()
    encoder = ExLMEncoder(backbone, k=1, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP))
    reference = backbone(
        {**features, "position_ids": to_numpy(plain_position_ids(features["token_ids"]))}
    )
    out = encoder(features)
    real = features["padding_mask"].astype(bool)  # padding positions carry no meaning
    np.testing.assert_allclose(
        to_numpy(out["sequence_output"])[real],
        to_numpy(reference["sequence_output"])[real],
        atol=1e-6,
    )
    np.testing.assert_allclose(
        to_numpy(out["pooled_output"]), to_numpy(reference["pooled_output"]), atol=1e-6
    )


def _sharpened(backbone):
    """Query/key kernels x30: at initial weights positions barely move the outputs."""
    for variable in backbone.weights:
        if "kernel" in variable.path and ("query" in variable.path or "key" in variable.path):
            variable.assign(to_numpy(variable) * 30.0)
    return backbone


def test_an_exlm_pretrained_k_one_encoder_keeps_its_pretraining_positions():
    backbone = _sharpened(rotary2d_backbone())
    features = _features()
    plain = to_numpy(plain_position_ids(features["token_ids"], features["padding_mask"]))
    special = np.isin(features["token_ids"], (CLS, SEP))
    copied = np.stack([plain[..., 0], special.astype("int32")], -1)  # (index, 1): k = 1 copies
    real = features["padding_mask"].astype(bool)
    outputs = {}
    for objective, positions in (("exlm", copied), ("mlm", plain)):
        pretrainer = ExLMPretrainer(
            backbone, k=1, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP),
            objective=objective,
        )  # fmt: skip
        encoder = pretrainer.fine_tuning_encoder()
        assert encoder.objective == objective
        out = to_numpy(encoder(features)["sequence_output"])[real]
        reference = to_numpy(backbone({**features, "position_ids": positions})["sequence_output"])
        np.testing.assert_allclose(out, reference[real], atol=1e-5)
        outputs[objective] = out
        restored = ExLMEncoder.from_config(encoder.get_config())
        assert restored.objective == objective
    assert np.abs(outputs["exlm"] - outputs["mlm"]).max() > 1e-3  # the positions matter
    with pytest.raises(ValueError, match="Expected k=1 with objective='mlm'"):
        ExLMEncoder(backbone, 2, MASK, (CLS, SEP), objective="mlm")


@pytest.mark.parametrize("model", ["encoder", "pretrainer"])
def test_a_method_its_stages_would_skip_is_refused_when_built_and_when_called(model):
    build = {
        "encoder": lambda b: ExLMEncoder(
            b, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP)
        ),
        "pretrainer": lambda b: ExLMPretrainer(
            b, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP)
        ),
    }[model]  # fmt: skip
    for enable, named in (
        (lambda b: b.enable_drop_token(0.5, mode="attention"), "DropToken"),
        (lambda b: b.enable_asa(tau=0.5), "ASA"),
    ):
        backbone = rotary2d_backbone()
        built = build(backbone)
        enable(backbone)  # after the model: refused at its call
        with pytest.raises(ValueError, match=f"leaves out {named}"):
            built(_features(), training=True)
        with pytest.raises(ValueError, match=f"leaves out {named}"):
            build(backbone)  # before: refused when built


def _one_step_options():
    """Compile options for a single step: eager on TensorFlow (tracing costs more than
    the step), XLA on JAX (eager JAX compiles every operation); both assert values."""
    if keras.config.backend() == "tensorflow":
        return {"run_eagerly": True}
    return {"jit_compile": True}


def test_pretrainer_hands_over_the_encoder_and_a_classifier_fine_tunes(tmp_path):
    backbone = rotary2d_backbone()
    pretrainer = ExLMPretrainer(
        backbone, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP), seed=0
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 64, (4, 8)).astype("int32")
    ids[:, 0], ids[:, -1] = CLS, SEP
    features = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": np.ones_like(ids),
    }
    # What pretraining changes in the backbone, the encoder runs (the compiled
    # pretraining step itself is tested in test_layer_contracts.py).
    for variable in pretrainer.backbone.trainable_weights:
        variable.assign(rng.normal(0, 0.2, variable.shape).astype("float32"))

    encoder = pretrainer.fine_tuning_encoder()
    assert (encoder.k, encoder.unselectable_token_ids) == (2, (CLS, SEP))
    assert encoder.backbone is backbone
    mlm = ExLMPretrainer(
        backbone, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP), objective="mlm"
    )
    assert mlm.fine_tuning_encoder().k == 1
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    dense = keras.layers.Dense(2)
    classifier = keras.Model(inputs, dense(encoder(inputs)["pooled_output"]))
    assert not any(isinstance(layer, DAGTransition) for layer in classifier._flatten_layers())

    # The classifier is the pooler of the hand-expanded row, then the dense layer.
    row = [CLS, CLS] + ids[0, 1:-1].tolist() + [SEP, SEP]
    positions = [[0, 1], [0, 2]] + [[i, 0] for i in range(1, 7)] + [[7, 1], [7, 2]]
    hand = backbone(
        {
            "token_ids": np.array([row]),
            "segment_ids": np.zeros((1, 10), "int32"),
            "padding_mask": np.ones((1, 10), "int32"),
            "position_ids": np.array([positions], "int32"),
        }
    )["pooled_output"]
    logits = to_numpy(classifier(features))
    np.testing.assert_allclose(logits[0], to_numpy(dense(hand))[0], atol=1e-5)

    # One fine-tuning step: its loss is the cross-entropy of those logits.
    labels = np.array([0, 1, 1, 0], "int32")
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    classifier.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **_one_step_options(),
    )
    loss = classifier.train_on_batch(features, labels)
    np.testing.assert_allclose(loss, -log_p[np.arange(4), labels].mean(), rtol=1e-5)
    assert np.abs(to_numpy(classifier(features)) - logits).max() > 1e-4

    path = str(tmp_path / "classifier.keras")
    classifier.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(
        to_numpy(restored(features)), to_numpy(classifier(features)), atol=1e-5
    )


def test_bad_configurations_and_overflow_are_refused():
    with pytest.raises(ValueError, match="rotary2d"):
        ExLMEncoder(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    backbone = rotary2d_backbone()
    with pytest.raises(ValueError, match="max_expanded_tokens"):
        ExLMEncoder(
            backbone, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP), max_expanded_tokens=-1
        )
    encoder = ExLMEncoder(
        backbone, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP), max_expanded_tokens=1
    )
    with pytest.raises(ValueError, match=r"Rows \[0\].*max_expanded_tokens=1"):
        encoder(_features())


def test_encoder_rows_that_do_not_fit_raise_eagerly_and_are_nan_when_compiled():
    backbone = rotary2d_backbone()
    x = exlm_inputs([PACKED, SHORT])
    encoder = make_encoder(backbone, k=2)  # max_expanded_tokens=3
    with pytest.raises(ValueError, match=r"Rows \[0\] hold more than max_expanded_tokens=3"):
        encoder(x)
    y = traced_call(encoder, x)
    assert np.isnan(y["pooled_output"][0]).all() and np.isnan(y["sequence_output"][0]).all()
    assert np.isfinite(y["pooled_output"][1]).all()
    # Sized for any input: each row is the backbone on its hand-expanded row.
    out = make_encoder(backbone, k=2, max_expanded_tokens=None)(x)
    np.testing.assert_allclose(to_numpy(out["pooled_output"])[1], y["pooled_output"][1], atol=1e-5)
    references = [
        reference_expansion(x["token_ids"][b], x["padding_mask"][b], [0] * LENGTH, 2, 2 * LENGTH)
        for b in range(2)
    ]
    hand = backbone_on(backbone, references)
    for b, reference in enumerate(references):
        real, slots = zip(*sorted(reference["first_slot"].items()))
        np.testing.assert_allclose(
            to_numpy(out["sequence_output"])[b, list(real)],
            to_numpy(hand["sequence_output"])[b, list(slots)],
            atol=1e-5,
        )
    np.testing.assert_allclose(
        to_numpy(out["pooled_output"]), to_numpy(hand["pooled_output"]), atol=1e-5
    )


@pytest.mark.parametrize("k", [1, 2])
def test_encoder_gives_the_same_outputs_for_every_padding_layout(k):
    encoder = make_encoder(rotary2d_backbone(), k=k)
    layouts = padding_layouts([[CLS, 5, 6, 7, SEP], [CLS, 10, SEP, 11, 12, 13, SEP]])
    results = {}
    for name, ids in layouts.items():
        x = exlm_inputs(ids)
        out = encoder(x)
        real = x["padding_mask"].astype(bool)
        results[name] = (
            [to_numpy(out["sequence_output"])[b][real[b]] for b in range(2)],
            to_numpy(out["pooled_output"]),
        )
    for name in ("left", "inside"):
        for b in range(2):
            np.testing.assert_allclose(results[name][0][b], results["right"][0][b], atol=1e-5)
        np.testing.assert_allclose(results[name][1], results["right"][1], atol=1e-5)


def test_a_mean_pooling_backbone_pools_each_input_token_once():
    """The mean over ``sequence_output`` (each token's first slot), not over
    the expanded row, where [CLS] and [SEP] counted k times (0.003-0.006 off)."""
    backbone = rotary2d_backbone(pooling="mean")
    encoder = make_encoder(backbone, k=3)
    x = exlm_inputs(pad_rows([[CLS, 5, 6, 7, SEP], [CLS, 10, SEP, 11, 12, 13, SEP]]).tolist())
    out = encoder(x)
    expected = backbone.pool(out["sequence_output"], x["padding_mask"])
    np.testing.assert_allclose(to_numpy(out["pooled_output"]), to_numpy(expected), atol=1e-6)


# === Item 6: configs and saved files ===
def test_encoder_config_and_saved_file_round_trip(tmp_path):
    encoder = make_encoder(rotary2d_backbone(), k=2, max_expanded_tokens=None, name="exlm_encoder")
    x = exlm_inputs([PACKED, [0] * 7 + SHORT[:5]])
    expected = {key: to_numpy(value) for key, value in encoder(x).items()}
    config = encoder.get_config()
    assert config["trainable"] is True and config["dtype"]["config"]["name"] == "float32"
    assert config["max_expanded_tokens"] is None and config["name"] == "exlm_encoder"
    clone = ExLMEncoder.from_config(config)
    assert clone.get_config() == config
    encoder.trainable = False
    assert ExLMEncoder.from_config(encoder.get_config()).trainable is False
    encoder.trainable = True
    path = str(tmp_path / "encoder.keras")
    encoder.save(path)
    restored = keras.saving.load_model(path)  # no custom_objects
    assert type(restored) is ExLMEncoder and restored.max_expanded_tokens is None
    for key, value in restored(x).items():
        np.testing.assert_allclose(to_numpy(value), expected[key], atol=1e-6)
    mixed = ExLMEncoder(
        shared_backbone(),
        k=2,
        mask_token_id=MASK,
        unselectable_token_ids=(CLS, SEP),
        dtype="mixed_bfloat16",
    )
    assert ExLMEncoder.from_config(mixed.get_config()).dtype_policy.name == "mixed_bfloat16"


PRETRAINER_X = exlm_inputs([[CLS, 5, 6, SEP]])


BAD_ARGUMENTS = [
    (
        lambda: ExLMEncoder(TransformerBackbone(**tiny_backbone_kwargs(position="rotary"))),
        r"position='rotary2d'",
    ),
    (lambda: ExLMEncoder(shared_backbone(), k=2.5, mask_token_id=MASK), r"Received: k=2\.5"),
    (lambda: ExLMEncoder(shared_backbone(), k=0, mask_token_id=MASK), r"Received: k=0"),
    (lambda: ExLMEncoder(shared_backbone(), mask_token_id=103), r"<= 63 for mask_token_id"),
    (
        lambda: ExLMEncoder(shared_backbone(), mask_token_id=MASK, unselectable_token_ids="12"),
        r"list of integers for unselectable_token_ids",
    ),
    (
        lambda: ExLMEncoder(shared_backbone(), mask_token_id=MASK, unselectable_token_ids=(1, 99)),
        r"unselectable_token_ids in \[0, 63\]",
    ),
    (
        lambda: ExLMEncoder(
            shared_backbone(),
            mask_token_id=MASK,
            unselectable_token_ids=(1, 2),
            max_expanded_tokens=-1,
        ),
        r"max_expanded_tokens=-1",
    ),
    (
        lambda: ExLMEncoder(
            shared_backbone(),
            mask_token_id=MASK,
            unselectable_token_ids=(1, 2),
            max_expanded_tokens=2.5,
        ),
        r"integer for max_expanded_tokens",
    ),
]


@pytest.mark.parametrize("make, match", BAD_ARGUMENTS)
def test_bad_arguments_are_refused_with_a_clear_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


BAD_CALLS = [
    (lambda e: e({"token_ids": PRETRAINER_X["token_ids"]}), r"keys \['token_ids', 'pad"),
    (
        lambda e: e({**PRETRAINER_X, "token_ids": PRETRAINER_X["token_ids"] * 1.0}),
        r"Expected integer token_ids",
    ),
    (
        lambda e: e({**PRETRAINER_X, "token_ids": np.array([[CLS, 5, 70, SEP]])}),
        r"token_ids in \[0, 64\).*\[70\]",
    ),
    (
        lambda e: e({**PRETRAINER_X, "padding_mask": np.ones((1, 5), "int32")}),
        r"padding_mask of the shape of token_ids",
    ),
    (
        lambda e: e({**PRETRAINER_X, "padding_mask": np.array([[1, 1, 0.5, 1]])}),
        r"padding_mask of 0s and 1s",
    ),
    (
        lambda e: e(exlm_inputs([[CLS, 5, SEP, 6, SEP, 7, SEP]])),
        r"Rows \[0\] hold more than max_expanded_tokens=3",
    ),
]


@pytest.mark.parametrize("call, match", BAD_CALLS)
def test_bad_call_inputs_are_refused_before_anything_changes(call, match):
    instance = ExLMEncoder(
        shared_backbone(), k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP)
    )
    refused_without_change(instance, call, match)
