"""MLM embedding correction: formula, finder, callback, records, tied heads."""

import keras
import keras_hub
import numpy as np
import pytest
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

import keras_masking
from keras_masking.methods import correction_record
from keras_masking.methods import find_token_embedding
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM

MASK = 3
SPECIAL = [0, 1, 2, 3]


def numpy_formula(table, mask_id, r=0.15, p_m=0.8, p_r=0.1, unselectable=None):
    """The blog's formula written out, independently of the package."""
    table = table.astype(np.float64)
    p_k = 1.0 - p_m - p_r
    expected = (1 - r) * table + r * (p_m * table[mask_id] + p_k * table + p_r * table.mean(0))
    if unselectable is not None:
        expected[unselectable] = table[unselectable]
    return expected


def embeddings_of(model):
    return keras.ops.convert_to_numpy(find_token_embedding(model).embeddings).copy()


def test_bert_defaults_match_the_blog_formula_on_transformer_backbone():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = embeddings_of(backbone)
    blog = 0.85 * table + 0.15 * (0.8 * table[MASK] + 0.1 * table + 0.1 * table.mean(0))
    record = keras_masking.correct_mlm_embeddings(backbone, mask_token_id=MASK)
    np.testing.assert_allclose(embeddings_of(backbone), blog, atol=1e-7)
    assert record.corrected_rows == 64 and np.isclose(record.scale, 0.865)


@pytest.mark.parametrize("rates", [(0.15, 0.8, 0.1), (0.3, 1.0, 0.0), (0.4, 0.5, 0.3)])
def test_general_configuration_on_keras_hub_backbone(rates):
    r, p_m, p_r = rates
    hub = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32
    )
    table = embeddings_of(hub)
    keras_masking.correct_mlm_embeddings(
        hub,
        MASK,
        mask_rate=r,
        mask_token_rate=p_m,
        random_token_rate=p_r,
        unselectable_token_ids=SPECIAL,
    )
    expected = numpy_formula(table, MASK, r, p_m, p_r, unselectable=SPECIAL)
    np.testing.assert_allclose(embeddings_of(hub), expected, atol=1e-7)
    np.testing.assert_array_equal(embeddings_of(hub)[SPECIAL], table[SPECIAL])


def test_from_mask_generator_and_preprocessor():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=vocabulary)
    preprocessor = keras_hub.models.BertMaskedLMPreprocessor(
        tokenizer, sequence_length=16, mask_selection_rate=0.2, random_token_rate=0.05
    )
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = embeddings_of(backbone)
    record = keras_masking.correct_mlm_embeddings.from_mask_generator(backbone, preprocessor)
    assert record.mask_token_id == 4 and record.mask_rate == 0.2
    # keras-hub's masker skips the tokenizer's special tokens ([UNK] is not one).
    special = sorted(tokenizer.special_token_ids)
    assert special == [0, 2, 3, 4] and record.unselectable_token_ids == special
    expected = numpy_formula(table, 4, 0.2, 0.8, 0.05, unselectable=special)
    np.testing.assert_allclose(embeddings_of(backbone), expected, atol=1e-7)
    generator = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=64, mask_selection_rate=0.15, mask_token_id=MASK, unselectable_token_ids=[0]
    )
    other = TransformerBackbone(**tiny_backbone_kwargs())
    table = embeddings_of(other)
    keras_masking.correct_mlm_embeddings.from_mask_generator(other, generator)
    np.testing.assert_allclose(
        embeddings_of(other), numpy_formula(table, MASK, unselectable=[0]), atol=1e-7
    )


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
    table = embeddings_of(backbone)
    callback = keras_masking.callbacks.MLMEmbeddingCorrection(
        mask_token_id=MASK, unselectable_token_ids=SPECIAL, when=when
    )
    features, labels = random_features(batch=4), np.array([0, 1, 0, 1])
    model.fit(features, labels, epochs=2, verbose=0, callbacks=[callback])
    expected = numpy_formula(table, MASK, unselectable=SPECIAL)
    np.testing.assert_allclose(embeddings_of(backbone), expected, atol=1e-6)
    assert callback.record is not None
    # A second fit with a fresh callback changes nothing (learning rate 0).
    again = keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=MASK, when=when)
    model.fit(features, labels, epochs=1, verbose=0, callbacks=[again])
    np.testing.assert_allclose(embeddings_of(backbone), expected, atol=1e-6)
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
            seen.setdefault("table", embeddings_of(backbone))

    model.fit(
        random_features(batch=2),
        np.array([0, 1]),
        verbose=0,
        callbacks=[keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=MASK), Capture()],
    )
    np.testing.assert_allclose(seen["table"], embeddings_of(reference), atol=1e-7)


def test_record_survives_save_and_load_and_undo(tmp_path):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = embeddings_of(backbone)
    keras_masking.correct_mlm_embeddings(backbone, MASK, unselectable_token_ids=SPECIAL)
    corrected = embeddings_of(backbone)
    backbone.save(tmp_path / "model.keras")
    backbone.save_to_preset(str(tmp_path / "preset"))
    for restored in (
        keras.saving.load_model(tmp_path / "model.keras"),
        TransformerBackbone.from_preset(str(tmp_path / "preset")),
    ):
        assert correction_record(restored).unselectable_token_ids == SPECIAL
        assert keras_masking.correct_mlm_embeddings(restored, MASK) is None
        np.testing.assert_array_equal(embeddings_of(restored), corrected)
        # After a reload, undo inverts the recorded map (float32 rounding).
        keras_masking.undo_mlm_embedding_correction(restored)
        np.testing.assert_allclose(embeddings_of(restored), table, rtol=1e-6, atol=1e-9)
        assert correction_record(restored) is None
    # In the correcting process, undo is exact.
    assert keras_masking.undo_mlm_embedding_correction(backbone) is not None
    np.testing.assert_array_equal(embeddings_of(backbone), table)
    assert keras_masking.undo_mlm_embedding_correction(backbone) is None


def test_tied_head_keeps_original_output_by_default():
    masked_lm = TransformerMaskedLM(TransformerBackbone(**tiny_backbone_kwargs()))
    randomize_weights(masked_lm, scale=0.1)
    head = masked_lm.masked_lm_head
    hidden = np.random.default_rng(0).normal(size=(2, 10, 32)).astype("float32")
    positions = np.array([[0, 3], [1, 9]], "int32")
    before = np.asarray(head(hidden, positions))
    table = embeddings_of(masked_lm)
    keras_masking.correct_mlm_embeddings(masked_lm, MASK, unselectable_token_ids=SPECIAL)
    np.testing.assert_allclose(head(hidden, positions), before, atol=2e-5)
    assert np.abs(embeddings_of(masked_lm) - table).max() > 1e-3
    keras_masking.undo_mlm_embedding_correction(masked_lm)
    np.testing.assert_array_equal(np.asarray(head(hidden, positions)), before)
    # "correct": the tied output predicts with the corrected rows.
    keras_masking.correct_mlm_embeddings(masked_lm, MASK, tied_output="correct")
    transformed = keras.ops.convert_to_numpy(
        head.transform_layer_norm(
            head.transform_dense(np.take_along_axis(hidden, positions[..., None], 1))
        )
    )
    bias = keras.ops.convert_to_numpy(head.output_bias)
    expected = transformed @ numpy_formula(table, MASK).T + bias
    np.testing.assert_allclose(head(hidden, positions), expected, atol=2e-4)


def test_keras_hub_tied_head_cannot_keep_and_is_left_untouched():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32
    )
    masked_lm = keras_hub.models.BertMaskedLM(backbone)
    table = embeddings_of(masked_lm)
    with pytest.raises(ValueError, match="tied_output='correct'"):
        keras_masking.correct_mlm_embeddings(masked_lm, MASK)
    np.testing.assert_array_equal(embeddings_of(masked_lm), table)
    keras_masking.correct_mlm_embeddings(masked_lm, MASK, tied_output="correct")
    np.testing.assert_allclose(embeddings_of(masked_lm), numpy_formula(table, MASK), atol=1e-7)


def test_finder_on_plain_keras_models():
    inputs = keras.Input((None,), dtype="int32")
    words = keras.layers.Embedding(64, 8, name="words")(inputs)
    tags = keras.layers.Embedding(5, 8, name="tags")(inputs)
    model = keras.Model(inputs, words + tags)
    with pytest.raises(ValueError, match=r"'words' \(64 x 8\).*'tags' \(5 x 8\)"):
        find_token_embedding(model)
    assert find_token_embedding(model, vocabulary_size=64).name == "words"
    assert find_token_embedding(model, embedding="tags").name == "tags"
    with pytest.raises(ValueError, match="named 'nope'"):
        find_token_embedding(model, embedding="nope")
    table = embeddings_of(model.get_layer("words"))
    keras_masking.correct_mlm_embeddings(model, MASK, embedding="words")
    np.testing.assert_allclose(
        embeddings_of(model.get_layer("words")), numpy_formula(table, MASK), atol=1e-7
    )
    dense_only = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="candidates none"):
        find_token_embedding(dense_only)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mask_token_id": 64}, r"mask_token_id` must be an integer in \[0, 64\)"),
        ({"mask_token_id": MASK, "mask_rate": 1.5}, "mask_rate"),
        ({"mask_token_id": MASK, "mask_token_rate": -0.1}, "mask_token_rate"),
        (
            {"mask_token_id": MASK, "mask_token_rate": 0.7, "random_token_rate": 0.4},
            "must not exceed 1",
        ),
        ({"mask_token_id": MASK, "unselectable_token_ids": [0, 99]}, r"\[99\]"),
        ({"mask_token_id": MASK, "tied_output": "both"}, "tied_output"),
    ],
)
def test_bad_input_leaves_model_untouched(kwargs, message):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = embeddings_of(backbone)
    with pytest.raises(ValueError, match=message):
        keras_masking.correct_mlm_embeddings(backbone, **kwargs)
    np.testing.assert_array_equal(embeddings_of(backbone), table)
    assert correction_record(backbone) is None


def test_callback_validates_at_construction():
    with pytest.raises(ValueError, match="mask_token_id"):
        keras_masking.callbacks.MLMEmbeddingCorrection()
    with pytest.raises(ValueError, match="when"):
        keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=3, when="epoch_end")
    with pytest.raises(ValueError, match="mask_rate"):
        keras_masking.callbacks.MLMEmbeddingCorrection(mask_token_id=3, mask_rate=2.0)


def test_tied_head_compensation_survives_save_and_load(tmp_path):
    masked_lm = TransformerMaskedLM(TransformerBackbone(**tiny_backbone_kwargs()))
    randomize_weights(masked_lm, scale=0.1)
    hidden = np.random.default_rng(1).normal(size=(2, 10, 32)).astype("float32")
    positions = np.array([[2, 5], [0, 1]], "int32")
    before = np.asarray(masked_lm.masked_lm_head(hidden, positions))
    keras_masking.correct_mlm_embeddings(masked_lm, MASK)
    masked_lm.save(tmp_path / "mlm.keras")
    restored = keras.saving.load_model(tmp_path / "mlm.keras")
    np.testing.assert_allclose(restored.masked_lm_head(hidden, positions), before, atol=2e-5)
    assert keras_masking.correct_mlm_embeddings(restored, MASK) is None
