"""ExLMEncoder: fine-tuning an ExLM-pretrained backbone as the official code does."""

import keras
import numpy as np
import pytest
from conftest import tiny_backbone_kwargs

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
    # Row 0 expanded by hand, k = 2: [CLS] [CLS] 7 8 [SEP] [SEP] 9 [SEP] [SEP].
    ids = [CLS, CLS, 7, 8, SEP, SEP, 9, SEP, SEP]
    pos1 = [0, 0, 1, 2, 3, 3, 4, 5, 5]
    pos2 = [1, 2, 0, 0, 1, 2, 0, 1, 2]
    segments = [0, 0, 0, 0, 0, 0, 1, 1, 1]
    reference = backbone(
        {
            "token_ids": np.array([ids]),
            "segment_ids": np.array([segments]),
            "padding_mask": np.ones((1, 9), "int32"),
            "position_ids": np.stack([pos1, pos2], -1)[None],
        }
    )
    first_slots = [0, 2, 3, 4, 6, 7]
    np.testing.assert_allclose(
        _numpy(out["sequence_output"])[0, :6],
        _numpy(reference["sequence_output"])[0, first_slots],
        atol=1e-5,
    )
    np.testing.assert_allclose(
        _numpy(out["pooled_output"])[0], _numpy(reference["pooled_output"])[0], atol=1e-5
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
    encoder = ExLMEncoder(backbone, k=1, special_token_ids=(CLS, SEP))
    reference = backbone(
        {**features, "position_ids": _numpy(plain_position_ids(features["token_ids"]))}
    )
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(
            _numpy(encoder(features)[key]), _numpy(reference[key]), atol=1e-6
        )


def test_pretrainer_hands_over_the_encoder_and_a_classifier_fine_tunes(tmp_path):
    backbone = _backbone()
    pretrainer = ExLMPretrainer(
        backbone, k=2, mask_token_id=MASK, special_token_ids=(CLS, SEP), seed=0
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 64, (8, 12)).astype("int32")
    ids[:, 0], ids[:, -1] = CLS, SEP
    features = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": np.ones_like(ids),
    }
    pretrainer.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True)
    pretrainer.fit(features, epochs=1, verbose=0)

    encoder = pretrainer.fine_tuning_encoder()
    assert (encoder.k, encoder.special_token_ids, encoder.backbone) == (2, (CLS, SEP), backbone)
    assert ExLMPretrainer(backbone, k=2, objective="mlm").fine_tuning_encoder().k == 1
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    logits = keras.layers.Dense(2)(encoder(inputs)["pooled_output"])
    classifier = keras.Model(inputs, logits)
    assert not any(isinstance(layer, DAGTransition) for layer in classifier._flatten_layers())
    classifier.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    labels = (ids[:, 1] % 2).astype("int32")
    history = classifier.fit(features, labels, epochs=15, batch_size=8, verbose=0).history
    assert history["loss"][-1] < history["loss"][0] - 0.1

    path = str(tmp_path / "classifier.keras")
    classifier.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(
        _numpy(restored.predict(features, verbose=0)),
        _numpy(classifier.predict(features, verbose=0)),
        atol=1e-5,
    )


def test_bad_configurations_and_overflow_are_refused():
    with pytest.raises(ValueError, match="rotary2d"):
        ExLMEncoder(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    backbone = _backbone()
    with pytest.raises(ValueError, match="max_expanded_tokens"):
        ExLMEncoder(backbone, max_expanded_tokens=-1)
    encoder = ExLMEncoder(backbone, k=2, special_token_ids=(CLS, SEP), max_expanded_tokens=1)
    with pytest.raises(ValueError, match=r"Rows \[0\].*max_expanded_tokens=1"):
        encoder(_features())
