"""ExLMEncoder: fine-tuning an ExLM-pretrained backbone as the official code does."""

import keras
import numpy as np
import pytest
from tests.testing import tiny_backbone_kwargs

from keras_masking.layers import DAGTransition
from keras_masking.models import ExLMEncoder
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone
from keras_masking.models import plain_position_ids

CLS, SEP, MASK = 1, 2, 3


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _backbone():
    keras.utils.set_random_seed(0)
    return TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )


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
    backbone = _backbone()
    encoder = ExLMEncoder(backbone, k=2, mask_token_id=MASK, special_token_ids=(CLS, SEP))
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
            _numpy(out["sequence_output"])[row, :count],
            _numpy(reference["sequence_output"])[row, first_slots],
            atol=1e-5,
        )
    np.testing.assert_allclose(
        _numpy(out["pooled_output"]), _numpy(reference["pooled_output"]), atol=1e-5
    )
    # The expanded [CLS] sees other inputs than an unexpanded one would.
    plain = backbone(
        {**_features(), "position_ids": _numpy(plain_position_ids(_features()["token_ids"]))}
    )
    gap = _numpy(plain["sequence_output"])[:, 0] - _numpy(out["sequence_output"])[:, 0]
    assert np.abs(gap).max() > 1e-3  # equal inputs would agree to ~1e-7


def test_k_one_is_the_backbone_on_plain_positions():
    backbone = _backbone()
    features = _features()
    encoder = ExLMEncoder(backbone, k=1, mask_token_id=MASK, special_token_ids=(CLS, SEP))
    reference = backbone(
        {**features, "position_ids": _numpy(plain_position_ids(features["token_ids"]))}
    )
    out = encoder(features)
    real = features["padding_mask"].astype(bool)  # padding positions carry no meaning
    np.testing.assert_allclose(
        _numpy(out["sequence_output"])[real],
        _numpy(reference["sequence_output"])[real],
        atol=1e-6,
    )
    np.testing.assert_allclose(
        _numpy(out["pooled_output"]), _numpy(reference["pooled_output"]), atol=1e-6
    )


def _one_step_options():
    """Compile options for a single step: eager on TensorFlow (tracing costs more than
    the step), XLA on JAX (eager JAX compiles every operation); both assert values."""
    if keras.config.backend() == "tensorflow":
        return {"run_eagerly": True}
    return {"jit_compile": True}


def test_pretrainer_hands_over_the_encoder_and_a_classifier_fine_tunes(tmp_path):
    backbone = _backbone()
    pretrainer = ExLMPretrainer(
        backbone, k=2, mask_token_id=MASK, special_token_ids=(CLS, SEP), seed=0
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
    assert (encoder.k, encoder.special_token_ids, encoder.backbone) == (2, (CLS, SEP), backbone)
    mlm = ExLMPretrainer(
        backbone, k=2, mask_token_id=MASK, special_token_ids=(CLS, SEP), objective="mlm"
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
    logits = _numpy(classifier(features))
    np.testing.assert_allclose(logits[0], _numpy(dense(hand))[0], atol=1e-5)

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
    assert np.abs(_numpy(classifier(features)) - logits).max() > 1e-4

    path = str(tmp_path / "classifier.keras")
    classifier.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(_numpy(restored(features)), _numpy(classifier(features)), atol=1e-5)


def test_bad_configurations_and_overflow_are_refused():
    with pytest.raises(ValueError, match="rotary2d"):
        ExLMEncoder(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    backbone = _backbone()
    with pytest.raises(ValueError, match="max_expanded_tokens"):
        ExLMEncoder(
            backbone, mask_token_id=MASK, special_token_ids=(CLS, SEP), max_expanded_tokens=-1
        )
    encoder = ExLMEncoder(
        backbone, k=2, mask_token_id=MASK, special_token_ids=(CLS, SEP), max_expanded_tokens=1
    )
    with pytest.raises(ValueError, match=r"Rows \[0\].*max_expanded_tokens=1"):
        encoder(_features())
