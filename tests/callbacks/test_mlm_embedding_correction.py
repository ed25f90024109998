"""The `MLMEmbeddingCorrection` callback: the correction inside `fit`.

It finds the token embedding of every model shape, corrects once, and fails
before the first training step on any bad setting.
"""

import keras
import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.callbacks import MLMEmbeddingCorrection
from keras_masking.methods import correction_record
from keras_masking.methods import find_token_embedding
from keras_masking.models import TransformerBackbone
from tests.methods.mlm_correction_helpers import MASK
from tests.methods.mlm_correction_helpers import SPECIAL
from tests.methods.mlm_correction_helpers import assert_same_weights
from tests.methods.mlm_correction_helpers import numpy_formula
from tests.methods.mlm_correction_helpers import table_of
from tests.methods.mlm_correction_helpers import tiny_hub
from tests.methods.mlm_correction_helpers import tiny_ours
from tests.methods.mlm_correction_helpers import weights_of
from tests.testing import random_features
from tests.testing import tiny_backbone_kwargs


def _classifier(backbone):
    inputs = backbone.input
    logits = keras.layers.Dense(2, name="classifier")(backbone(inputs)["pooled_output"])
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model


@pytest.mark.parametrize("when", ["train_begin", "train_end"])
def test_callback_in_fit_applies_once(when):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    model = _classifier(backbone)
    table = table_of(backbone)
    callback = keras_masking.callbacks.MLMEmbeddingCorrection(
        mask_token_id=MASK, unselectable_token_ids=SPECIAL, when=when
    )
    features, labels = random_features(batch=4), np.array([0, 1, 0, 1])
    model.fit(features, labels, epochs=2, verbose=0, callbacks=[callback])
    expected = numpy_formula(table, MASK, unselectable=SPECIAL)
    np.testing.assert_allclose(table_of(backbone), expected, atol=1e-6)
    assert callback.record is not None
    # A second fit with a fresh callback changes nothing (learning rate 0).
    again = keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=MASK, when=when)
    model.fit(features, labels, epochs=1, verbose=0, callbacks=[again])
    np.testing.assert_allclose(table_of(backbone), expected, atol=1e-6)
    assert again.record is None


def test_train_begin_correction_is_what_training_sees():
    """Inputs of the first step already use the corrected rows."""
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    model = _classifier(backbone)
    reference = TransformerBackbone(**tiny_backbone_kwargs())
    reference.set_weights(backbone.get_weights())
    keras_masking.correct_mlm_embeddings(reference, MASK)
    seen = {}

    class Capture(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.setdefault("table", table_of(backbone))

    model.fit(
        random_features(batch=2),
        np.array([0, 1]),
        verbose=0,
        callbacks=[keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=MASK), Capture()],
    )
    np.testing.assert_allclose(seen["table"], table_of(reference), atol=1e-7)


def _pooled(backbone, outputs):
    if isinstance(outputs, dict):
        return outputs["pooled_output"]
    return outputs[:, 0, :]  # RoBERTa: the <s> state


def _shape(name):
    """``(model, backbone)`` for one way of putting a backbone in a classifier."""
    kind, how = name.split("-")
    backbone = {
        "ours": tiny_ours,
        "bert": lambda: tiny_hub(keras_hub.models.BertBackbone),
        "roberta": lambda: tiny_hub(keras_hub.models.RobertaBackbone),
    }[kind]()
    inputs = backbone.input
    if how == "inlined":
        features = _pooled(backbone, backbone.output)
    else:
        features = _pooled(backbone, backbone(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="classifier")(features))
    if how == "twice":  # a model nested inside a model
        outer_inputs = {
            key: keras.Input((None,), dtype="int32", name=key) for key in backbone.input
        }
        outer = keras.layers.Dense(3, name="outer")(model(outer_inputs))
        model = keras.Model(outer_inputs, outer)
    return model, backbone


SHAPES = [
    "ours-nested",
    "ours-inlined",
    "ours-twice",
    "bert-nested",
    "bert-inlined",
    "bert-twice",
    "roberta-nested",
    "roberta-inlined",
]


@pytest.mark.parametrize("shape", SHAPES)
def test_callback_corrects_the_token_embedding_of_every_model_shape(shape):
    model, backbone = _shape(shape)
    inputs = {key: value for key, value in random_features(length=8).items()}
    if "roberta" in shape:
        inputs.pop("segment_ids")
    table = table_of(backbone)
    others = [
        (layer, table_of(layer))
        for layer in model.layers + backbone.layers
        if isinstance(layer, keras.layers.Embedding) and layer is not backbone.token_embedding
    ]
    assert find_token_embedding(model) is backbone.token_embedding
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", run_eagerly=True)
    callback = MLMEmbeddingCorrection(mask_token_id=MASK, unselectable_token_ids=SPECIAL)
    labels = np.zeros((2, 3 if shape.endswith("twice") else 2), "float32")
    model.fit(inputs, labels, epochs=1, batch_size=2, verbose=0, callbacks=[callback])
    corrected = table_of(backbone)
    np.testing.assert_allclose(corrected, numpy_formula(table, unselectable=SPECIAL), atol=1e-6)
    # The BERT defaults as the blog writes them, on a selectable row.
    row = 10
    blog = 0.85 * table[row] + 0.15 * (0.8 * table[MASK] + 0.1 * table[row] + 0.1 * table.mean(0))
    np.testing.assert_allclose(corrected[row], blog, atol=1e-6)
    np.testing.assert_array_equal(corrected[SPECIAL], table[SPECIAL])
    assert callback.record.corrected_rows == 60
    for layer, before in others:  # segment and position tables untouched
        np.testing.assert_array_equal(table_of(layer), before)
    # A second fit does not correct twice.
    again = MLMEmbeddingCorrection(mask_token_id=MASK, unselectable_token_ids=SPECIAL)
    model.fit(inputs, labels, epochs=1, batch_size=2, verbose=0, callbacks=[again])
    np.testing.assert_array_equal(table_of(backbone), corrected)
    assert again.record is None


def _compiled_classifier():
    backbone = tiny_ours()
    logits = keras.layers.Dense(2)(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, logits)
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, backbone


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mask_token_id": 64}, r"Expected mask_token_id in \[0, 64\)"),
        ({"mask_token_id": 64, "when": "train_end"}, r"in \[0, 64\)"),
        (
            {"mask_token_id": 3, "unselectable_token_ids": [0, 64]},
            r"unselectable_token_ids in \[0, 63\]",
        ),
        ({"mask_token_id": 3, "embedding": "nope", "when": "train_end"}, "named 'nope'"),
        (
            # mean E over the table's 64 rows is not the mean of draws over 80 ids.
            {
                "mask_generator": keras_hub.layers.MaskedLMMaskGenerator(
                    vocabulary_size=80, mask_selection_rate=0.15, mask_token_id=4
                ),
                "when": "train_end",
            },
            "The masker drew random tokens from 80 ids, and 'token_embedding' has 64 rows",
        ),
    ],
)
def test_callback_errors_come_before_the_first_step(kwargs, message):
    model, backbone = _compiled_classifier()
    # Built (the first `fit` would build it), so that "unchanged" covers everything.
    model(random_features(batch=2, length=8))
    before = weights_of(model)
    callback = MLMEmbeddingCorrection(**kwargs)
    steps = []

    class CountSteps(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            steps.append(batch)

    with pytest.raises(ValueError, match=message):
        model.fit(
            random_features(batch=2, length=8),
            np.array([0, 1]),
            verbose=0,
            callbacks=[callback, CountSteps()],
        )
    assert steps == [] and int(model.optimizer.iterations) == 0
    assert_same_weights(model, before)
    assert correction_record(backbone) is None


def test_keras_hub_tied_head_with_keep_fails_at_train_begin_even_for_train_end():
    masked_lm = keras_hub.models.BertMaskedLM(tiny_hub(keras_hub.models.BertBackbone))
    masked_lm.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    features = random_features(batch=2, length=8)
    features["mask_positions"] = np.array([[1, 2], [3, 4]], "int32")
    labels = np.array([[5, 6], [7, 8]], "int32")
    masked_lm(features)
    before = weights_of(masked_lm)
    callback = MLMEmbeddingCorrection(mask_token_id=MASK, when="train_end")
    with pytest.raises(ValueError, match="tied_output='correct'"):
        masked_lm.fit(features, labels, verbose=0, shuffle=False, callbacks=[callback])
    assert int(masked_lm.optimizer.iterations) == 0
    assert_same_weights(masked_lm, before)


CALLBACK_BAD = [
    ({}, "Expected a mask_token_id"),
    (
        {"mask_token_id": -1},
        r"Expected an integer >= 0 for mask_token_id. Received: mask_token_id=-1",
    ),
    (
        {"mask_token_id": 2.5},
        r"Expected an integer for mask_token_id. Received: mask_token_id=2\.5",
    ),
    ({"mask_token_id": True}, "Expected an integer for mask_token_id"),
    ({"mask_token_id": "103"}, "Expected an integer for mask_token_id"),
    ({"mask_token_id": 3, "mask_rate": 2.0}, r"Expected mask_rate in \[0.0, 1.0\]"),
    ({"mask_token_id": 3, "mask_token_rate": False}, "Expected a number for mask_token_rate"),
    (
        {"mask_token_id": 3, "mask_token_rate": 0.9, "random_token_rate": 0.2},
        "random_token_rate <= 1",
    ),
    (
        {"mask_token_id": 3, "mask_rate": 1, "mask_token_rate": 0.9, "random_token_rate": 0.1},
        "replaces every token",
    ),
    ({"mask_token_id": 3, "unselectable_token_ids": [0, -2]}, r"in \[0, inf\).*\[0, -2\]"),
    ({"mask_token_id": 3, "unselectable_token_ids": [0.0]}, "Expected a list of integers"),
    ({"mask_token_id": 3, "tied_output": "both"}, "Expected one of 'keep', 'correct' for tied"),
    ({"mask_token_id": 3, "embedding": 0}, "Expected a keras.layers.Embedding, a layer name"),
    ({"mask_token_id": 3, "when": "epoch_end"}, "Expected one of 'train_begin', 'train_end'"),
    ({"mask_token_id": 3, "when": None}, "Expected one of 'train_begin', 'train_end'"),
]


@pytest.mark.parametrize("kwargs, message", CALLBACK_BAD)
def test_callback_constructor_bad_input(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        MLMEmbeddingCorrection(**kwargs)


def _generator():
    return keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=64, mask_selection_rate=0.2, mask_token_id=4, unselectable_token_ids=[0]
    )


def test_callback_mask_generator_bad_input():
    with pytest.raises(ValueError, match="mask_token_id=3 contradicts.*mask_token_id=4"):
        MLMEmbeddingCorrection(mask_token_id=3, mask_generator=_generator())
    with pytest.raises(ValueError, match="mask_rate=0.3 contradicts.*mask_rate=0.2"):
        MLMEmbeddingCorrection(mask_rate=0.3, mask_generator=_generator())
    with pytest.raises(ValueError, match="unselectable_token_ids=.*contradicts"):
        MLMEmbeddingCorrection(unselectable_token_ids=[0, 1], mask_generator=_generator())
    with pytest.raises(TypeError, match="Expected a keras_hub MaskedLMMaskGenerator.*str"):
        MLMEmbeddingCorrection(mask_generator="masker")
    # Agreeing values (numpy ones included) are accepted.
    callback = MLMEmbeddingCorrection(
        mask_token_id=np.int64(4), mask_rate=np.float32(0.2), mask_generator=_generator()
    )
    assert callback.settings["mask_token_id"] == 4 and callback.settings["mask_rate"] == 0.2


def test_callback_checks_the_table_at_train_begin_even_for_train_end():
    backbone = tiny_ours()
    table = table_of(backbone)
    table[7, 2] = np.nan
    backbone.token_embedding.embeddings.assign(table)
    callback = MLMEmbeddingCorrection(mask_token_id=MASK, when="train_end")
    callback.set_model(backbone)
    with pytest.raises(ValueError, match=r"NaN or inf values in 1 of 64 rows \(first: row 7\)"):
        callback.on_train_begin()
    assert correction_record(backbone) is None


def test_callback_accepts_numpy_scalars():
    callback = MLMEmbeddingCorrection(
        mask_token_id=np.int32(MASK), mask_rate=np.float32(0.2), unselectable_token_ids=(0, 1)
    )
    assert callback.settings["mask_rate"] == pytest.approx(0.2)
    assert callback.settings["unselectable_token_ids"] == [0, 1]


def test_a_train_begin_correction_under_stepped_moving_averages_is_refused(caplog):
    """Keras writes use_ema's averages into the weights when fit ends: averages of the
    uncorrected table would undo the correction (all but 1 - 0.99**steps of it)."""
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    model = _classifier(backbone)
    model.compile(
        optimizer=keras.optimizers.SGD(0.0, use_ema=True, ema_momentum=0.99),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    features, labels = random_features(batch=4), np.array([0, 1, 0, 1])
    model.fit(features, labels, batch_size=2, verbose=0)  # two steps: averages of this table
    table = table_of(backbone)
    callback = MLMEmbeddingCorrection(mask_token_id=MASK, unselectable_token_ids=SPECIAL)
    with pytest.raises(ValueError, match=r"use_ema=True after 2 steps"):
        model.fit(features, labels, verbose=0, callbacks=[callback])
    np.testing.assert_array_equal(table_of(backbone), table)
    assert correction_record(backbone) is None and int(model.optimizer.iterations) == 2
    # Called directly, it corrects and warns (a further fit would undo it).
    with caplog.at_level("WARNING", logger="keras_masking"):
        keras_masking.correct_mlm_embeddings(model, MASK, unselectable_token_ids=SPECIAL)
    assert "keeps moving averages of the weights (use_ema) from 2 steps" in caplog.text
    keras_masking.methods.undo_mlm_embedding_correction(model)
    # A fresh optimizer: its averages start from the corrected table, which fit keeps.
    model.compile(
        optimizer=keras.optimizers.SGD(0.0, use_ema=True, ema_momentum=0.99),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(features, labels, batch_size=2, verbose=0, callbacks=[callback])
    expected = numpy_formula(table, MASK, unselectable=SPECIAL)
    np.testing.assert_allclose(table_of(backbone), expected, atol=1e-6)
