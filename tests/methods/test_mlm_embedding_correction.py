"""MLM embedding correction on a model: the formula, the finder, records, tied heads.

Each bad-input case asserts the clear message and that nothing was changed.
"""

import json

import keras
import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.methods import correction_record
from keras_masking.methods import find_token_embedding
from keras_masking.methods import masking_configuration
from keras_masking.methods.mlm_embedding_correction import check_mlm_correction
from keras_masking.methods.mlm_embedding_correction import correct_embedding_table
from keras_masking.methods.token_embedding_lookup import find_tied_heads
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from tests.methods.mlm_correction_helpers import MASK
from tests.methods.mlm_correction_helpers import SPECIAL
from tests.methods.mlm_correction_helpers import assert_same_weights
from tests.methods.mlm_correction_helpers import numpy_formula
from tests.methods.mlm_correction_helpers import table_of
from tests.methods.mlm_correction_helpers import tiny_hub
from tests.methods.mlm_correction_helpers import tiny_ours
from tests.methods.mlm_correction_helpers import weights_of
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


def test_bert_defaults_match_the_blog_formula_on_transformer_backbone():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = table_of(backbone)
    blog = 0.85 * table + 0.15 * (0.8 * table[MASK] + 0.1 * table + 0.1 * table.mean(0))
    record = keras_masking.correct_mlm_embeddings(backbone, mask_token_id=MASK)
    np.testing.assert_allclose(table_of(backbone), blog, atol=1e-7)
    assert record.corrected_rows == 64 and np.isclose(record.scale, 0.865)


@pytest.mark.parametrize("rates", [(0.15, 0.8, 0.1), (0.3, 1.0, 0.0), (0.4, 0.5, 0.3)])
def test_general_configuration_on_keras_hub_backbone(rates):
    r, p_m, p_r = rates
    hub = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32
    )
    table = table_of(hub)
    keras_masking.correct_mlm_embeddings(
        hub,
        MASK,
        mask_rate=r,
        mask_token_rate=p_m,
        random_token_rate=p_r,
        unselectable_token_ids=SPECIAL,
    )
    expected = numpy_formula(table, MASK, r, p_m, p_r, unselectable=SPECIAL)
    np.testing.assert_allclose(table_of(hub), expected, atol=1e-7)
    np.testing.assert_array_equal(table_of(hub)[SPECIAL], table[SPECIAL])


def test_from_mask_generator_and_preprocessor():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=vocabulary)
    preprocessor = keras_hub.models.BertMaskedLMPreprocessor(
        tokenizer, sequence_length=16, mask_selection_rate=0.2, random_token_rate=0.05
    )
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = table_of(backbone)
    record = keras_masking.correct_mlm_embeddings.from_mask_generator(backbone, preprocessor)
    assert record.mask_token_id == 4 and record.mask_rate == 0.2
    # keras-hub's masker skips the tokenizer's special tokens ([UNK] is not one).
    special = sorted(tokenizer.special_token_ids)
    assert special == [0, 2, 3, 4] and record.unselectable_token_ids == special
    expected = numpy_formula(table, 4, 0.2, 0.8, 0.05, unselectable=special)
    np.testing.assert_allclose(table_of(backbone), expected, atol=1e-7)
    generator = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=64, mask_selection_rate=0.15, mask_token_id=MASK, unselectable_token_ids=[0]
    )
    other = TransformerBackbone(**tiny_backbone_kwargs())
    table = table_of(other)
    keras_masking.correct_mlm_embeddings.from_mask_generator(other, generator)
    np.testing.assert_allclose(
        table_of(other), numpy_formula(table, MASK, unselectable=[0]), atol=1e-7
    )


def test_record_survives_save_and_load_and_undo(tmp_path):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    table = table_of(backbone)
    keras_masking.correct_mlm_embeddings(backbone, MASK, unselectable_token_ids=SPECIAL)
    corrected = table_of(backbone)
    backbone.save(tmp_path / "model.keras")
    backbone.save_to_preset(str(tmp_path / "preset"))
    for restored in (
        keras.saving.load_model(tmp_path / "model.keras"),
        TransformerBackbone.from_preset(str(tmp_path / "preset")),
    ):
        assert correction_record(restored).unselectable_token_ids == SPECIAL
        assert keras_masking.correct_mlm_embeddings(restored, MASK) is None
        np.testing.assert_array_equal(table_of(restored), corrected)
        # After a reload, undo inverts the recorded map (float32 rounding).
        keras_masking.undo_mlm_embedding_correction(restored)
        np.testing.assert_allclose(table_of(restored), table, rtol=1e-6, atol=1e-9)
        assert correction_record(restored) is None
    # In the correcting process, undo is exact.
    assert keras_masking.undo_mlm_embedding_correction(backbone) is not None
    np.testing.assert_array_equal(table_of(backbone), table)
    assert keras_masking.undo_mlm_embedding_correction(backbone) is None


def test_tied_head_keeps_original_output_by_default():
    masked_lm = TransformerMaskedLM(TransformerBackbone(**tiny_backbone_kwargs()))
    randomize_weights(masked_lm, scale=0.1)
    head = masked_lm.masked_lm_head
    hidden = np.random.default_rng(0).normal(size=(2, 10, 32)).astype("float32")
    positions = np.array([[0, 3], [1, 9]], "int32")
    before = np.asarray(head(hidden, positions))
    table = table_of(masked_lm)
    keras_masking.correct_mlm_embeddings(masked_lm, MASK, unselectable_token_ids=SPECIAL)
    np.testing.assert_allclose(head(hidden, positions), before, atol=2e-5)
    assert np.abs(table_of(masked_lm) - table).max() > 1e-3
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


def test_a_correction_through_a_model_on_the_backbones_layers_is_the_backbones():
    """A classifier built with ``backbone.output`` holds the backbone's layers,
    not the backbone: its correction was recorded on the layer only, so the
    backbone (and its config, and a preset) looked uncorrected and a second
    call corrected again (0.11 off the formula)."""
    backbone = tiny_ours()
    randomize_weights(backbone, scale=0.1)
    table = table_of(backbone)
    logits = keras.layers.Dense(2)(backbone.output["pooled_output"])
    classifier = keras.Model(backbone.input, logits)
    assert keras_masking.correct_mlm_embeddings(classifier, MASK) is not None
    assert keras_masking.correct_mlm_embeddings(backbone, MASK) is None
    np.testing.assert_allclose(table_of(backbone), numpy_formula(table), atol=1e-6)
    assert backbone.get_config()["mlm_embedding_correction"]["mask_token_id"] == MASK
    keras_masking.undo_mlm_embedding_correction(backbone)
    assert correction_record(classifier) is None
    np.testing.assert_array_equal(table_of(backbone), table)


def test_keep_holds_for_a_masked_lm_on_the_backbone_corrected_elsewhere():
    """The head of a `TransformerMaskedLM` sharing the corrected backbone keeps
    the original rows (it predicted with the corrected ones, 0.20 off)."""
    backbone = tiny_ours()
    masked_lm = TransformerMaskedLM(backbone)
    randomize_weights(masked_lm, scale=0.1)
    head = masked_lm.masked_lm_head
    hidden = np.random.default_rng(0).normal(size=(2, 10, 32)).astype("float32")
    positions = np.array([[0, 3], [1, 9]], "int32")
    before = np.asarray(head(hidden, positions))
    keras_masking.correct_mlm_embeddings(backbone, MASK)
    np.testing.assert_allclose(head(hidden, positions), before, atol=2e-5)
    keras_masking.undo_mlm_embedding_correction(backbone)
    np.testing.assert_array_equal(np.asarray(head(hidden, positions)), before)


def test_a_head_on_untied_output_rows_is_left_as_it_is():
    """`ReversibleEmbedding(tie_weights=False)`: the correction does not touch
    the output rows, so no compensation (it moved the logits by 0.19)."""
    embedding = keras.layers.ReversibleEmbedding(64, 16, tie_weights=False)
    head = keras_masking.layers.MaskedLMHead(embedding)
    token_ids = keras.Input((None,), dtype="int32")
    model = keras.Model(token_ids, head(embedding(token_ids)))
    randomize_weights(model, scale=0.1)
    hidden = np.random.default_rng(0).normal(size=(2, 4, 16)).astype("float32")
    before = np.asarray(head(hidden))
    keras_masking.correct_mlm_embeddings(model, MASK)
    assert find_tied_heads(model, embedding) == []
    np.testing.assert_array_equal(np.asarray(head(hidden)), before)


def test_keras_hub_tied_head_cannot_keep_and_is_left_untouched():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32
    )
    masked_lm = keras_hub.models.BertMaskedLM(backbone)
    table = table_of(masked_lm)
    with pytest.raises(ValueError, match="tied_output='correct'"):
        keras_masking.correct_mlm_embeddings(masked_lm, MASK)
    np.testing.assert_array_equal(table_of(masked_lm), table)
    keras_masking.correct_mlm_embeddings(masked_lm, MASK, tied_output="correct")
    np.testing.assert_allclose(table_of(masked_lm), numpy_formula(table, MASK), atol=1e-7)


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
    table = table_of(model.get_layer("words"))
    keras_masking.correct_mlm_embeddings(model, MASK, embedding="words")
    np.testing.assert_allclose(
        table_of(model.get_layer("words")), numpy_formula(table, MASK), atol=1e-7
    )
    dense_only = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="candidates none"):
        find_token_embedding(dense_only)


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


def test_a_model_with_two_backbones_asks_which():
    first, second = tiny_ours(), tiny_hub(keras_hub.models.BertBackbone)
    inputs = {key: keras.Input((None,), dtype="int32", name=key) for key in first.input}
    joined = keras.layers.Concatenate()(
        [first(inputs)["pooled_output"], second(inputs)["pooled_output"]]
    )
    model = keras.Model(inputs, keras.layers.Dense(2)(joined))
    with pytest.raises(
        ValueError, match="candidates.*token_embedding.*token_embedding.*embedding="
    ):
        find_token_embedding(model)
    chosen = find_token_embedding(model, embedding=second.token_embedding)
    assert chosen is second.token_embedding


def test_non_finite_table_is_refused_before_anything_changes():
    backbone = tiny_ours()
    table = table_of(backbone)
    table[7, 2] = np.nan
    table[9, 0] = np.inf
    backbone.token_embedding.embeddings.assign(table)
    with pytest.raises(ValueError, match=r"NaN or inf values in 2 of 64 rows \(first: row 7\)"):
        keras_masking.correct_mlm_embeddings(backbone, mask_token_id=MASK)
    np.testing.assert_array_equal(table_of(backbone), table)
    assert correction_record(backbone) is None


def test_undo_is_exact_in_process_and_inverts_after_the_table_changed():
    backbone = tiny_ours()
    table = table_of(backbone)
    keras_masking.correct_mlm_embeddings(backbone, MASK)
    keras_masking.undo_mlm_embedding_correction(backbone)
    np.testing.assert_array_equal(table_of(backbone), table)
    # The table changed after the correction (a step of training, a load):
    # undo inverts the recorded map on the table as it is now.
    record = keras_masking.correct_mlm_embeddings(backbone, MASK)
    trained = table_of(backbone) + 0.5
    backbone.token_embedding.embeddings.assign(trained)
    keras_masking.undo_mlm_embedding_correction(backbone)
    expected = (trained - np.asarray(record.shift)) / record.scale
    np.testing.assert_allclose(table_of(backbone), expected, rtol=1e-5, atol=1e-6)


def test_correct_embedding_table_is_the_formula_on_a_bare_table():
    table = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")
    corrected, record = correct_embedding_table(table, "words", mask_token_id=1)
    np.testing.assert_allclose(corrected, numpy_formula(table, 1), atol=1e-6)
    assert corrected.dtype == np.float32 and record.embedding == "words"
    assert record.corrected_rows == 6 and record.vocabulary_size == 6


@pytest.fixture(scope="module")
def backbone():
    return tiny_ours()


@pytest.fixture
def unchanged(backbone):
    """Checks after the test that the shared backbone was not changed."""
    before = weights_of(backbone)
    yield backbone
    assert_same_weights(backbone, before)
    assert correction_record(backbone) is None


CORRECT_BAD = [
    (
        {"mask_token_id": -1},
        r"Expected an integer >= 0 for mask_token_id. Received: mask_token_id=-1",
    ),
    ({"mask_token_id": 2.5}, r"Expected an integer for mask_token_id.*=2\.5"),
    ({"mask_token_id": 3.0}, r"Expected an integer for mask_token_id.*=3\.0"),
    ({"mask_token_id": True}, r"Expected an integer for mask_token_id.*=True"),
    ({"mask_token_id": "3"}, r"Expected an integer for mask_token_id.*='3'"),
    ({"mask_token_id": None}, r"Expected an integer for mask_token_id.*=None"),
    ({"mask_token_id": np.int64(64)}, r"Expected mask_token_id in \[0, 64\) \(an id of the vocab"),
    ({"mask_rate": "0.15"}, r"Expected a number for mask_rate"),
    ({"mask_rate": True}, r"Expected a number for mask_rate. Received: mask_rate=True"),
    ({"mask_rate": float("nan")}, r"Expected a number for mask_rate"),
    ({"mask_rate": np.float32(1.5)}, r"Expected mask_rate in \[0.0, 1.0\]"),
    ({"mask_token_rate": -0.1}, r"Expected mask_token_rate in \[0.0, 1.0\]"),
    ({"random_token_rate": -0.1}, r"Expected random_token_rate in \[0.0, 1.0\]"),
    ({"mask_token_rate": 0.7, "random_token_rate": 0.4}, r"random_token_rate <= 1"),
    ({"mask_rate": 1.0, "mask_token_rate": 1.0, "random_token_rate": 0.0}, "replaces every"),
    ({"unselectable_token_ids": 5}, "Expected a list of integers for unselectable_token_ids"),
    ({"unselectable_token_ids": "0,1"}, "Expected a list of integers for unselectable_token_ids"),
    ({"unselectable_token_ids": [0, 1.5]}, r"list of integers.*\[0, 1\.5\]"),
    ({"unselectable_token_ids": [True]}, r"list of integers.*\[True\]"),
    ({"unselectable_token_ids": [-1, 2]}, r"in \[0, 63\].*\[-1, 2\]"),
    ({"unselectable_token_ids": [0, 99]}, r"in \[0, 63\].*\[0, 99\]"),
    ({"tied_output": None}, "Expected one of 'keep', 'correct' for tied_output"),
    ({"tied_output": "KEEP"}, "Expected one of 'keep', 'correct' for tied_output"),
    ({"embedding": 5}, "Expected a keras.layers.Embedding, a layer name or None for embedding"),
    ({"embedding": keras.layers.Dense(2)}, "embedding=<Dense.*of type Dense"),
    ({"embedding": "nope"}, "Found 0 embedding layers named 'nope'"),
]


@pytest.mark.parametrize("kwargs, message", CORRECT_BAD)
def test_correct_mlm_embeddings_bad_input(unchanged, kwargs, message):
    kwargs = {"mask_token_id": MASK, **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        keras_masking.correct_mlm_embeddings(unchanged, **kwargs)
    with pytest.raises((ValueError, TypeError), match=message):
        check_mlm_correction(unchanged, **kwargs)


def test_correct_mlm_embeddings_bad_model():
    for model, message in ((None, "NoneType"), ("bert", "str"), (np.eye(3), "ndarray")):
        with pytest.raises(
            TypeError, match=f"Expected a Keras model or layer for model.*{message}"
        ):
            keras_masking.correct_mlm_embeddings(model, mask_token_id=MASK)


def test_numpy_scalars_are_accepted_where_numbers_are():
    backbone = tiny_ours()
    table = table_of(backbone)
    record = keras_masking.correct_mlm_embeddings(
        backbone,
        mask_token_id=np.int64(MASK),
        mask_rate=np.float32(0.2),
        mask_token_rate=np.float64(0.7),
        random_token_rate=np.float32(0.1),
        unselectable_token_ids=np.array([0, 1, 2, 3], "int32"),
    )
    assert record.mask_token_id == MASK and type(record.mask_token_id) is int
    assert json.dumps(record.to_config())  # plain Python values
    expected = numpy_formula(
        table, MASK, float(np.float32(0.2)), 0.7, float(np.float32(0.1)), SPECIAL
    )
    np.testing.assert_allclose(table_of(backbone), expected, atol=1e-6)


def test_masking_configuration_bad_input():
    for value in (None, 3, keras.layers.Dense(2)):
        with pytest.raises(TypeError, match="Expected a keras_hub MaskedLMMaskGenerator"):
            masking_configuration(value)
    with pytest.raises(TypeError, match="Expected a keras_hub MaskedLMMaskGenerator"):
        keras_masking.correct_mlm_embeddings.from_mask_generator(tiny_ours(), "masker")


@pytest.mark.parametrize("drawn", [48, 80])
def test_a_masker_over_other_ids_than_the_table_rows_is_refused(drawn):
    """mean E is the mean of the table's rows: the random tokens' mean only
    when the masker drew from those rows."""
    backbone = tiny_ours()
    table = table_of(backbone)
    generator = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=drawn, mask_selection_rate=0.15, mask_token_id=MASK
    )
    with pytest.raises(ValueError, match=f"drew random tokens from {drawn} ids.*has 64 rows"):
        keras_masking.correct_mlm_embeddings.from_mask_generator(backbone, generator)
    np.testing.assert_array_equal(table_of(backbone), table)
    assert correction_record(backbone) is None


def test_a_pruned_table_is_corrected_with_the_mean_of_the_table_it_was_cut_from():
    """A masker over the full vocabulary is the pruned table's; its mean E is the
    full table's (kept in ``pruned_from`` by prune_token_embeddings)."""
    full_mean = np.linspace(-1.0, 1.0, 32)
    config = tiny_ours().get_config()
    pruned_from = {"vocabulary_size": 80, "token_embedding_mean": full_mean.tolist()}
    backbone = TransformerBackbone.from_config(config | {"pruned_from": pruned_from})
    table = table_of(backbone).astype("float64")
    generator = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=80, mask_selection_rate=0.15, mask_token_id=MASK
    )
    keras_masking.correct_mlm_embeddings.from_mask_generator(backbone, generator)
    expected = 0.85 * table + 0.15 * (0.8 * table[MASK] + 0.1 * table + 0.1 * full_mean)
    expected[0] = table[0]  # keras-hub's masker never selects id 0
    np.testing.assert_allclose(table_of(backbone), expected, atol=1e-6)


def test_find_token_embedding_bad_input(unchanged):
    with pytest.raises(TypeError, match="Expected a Keras model or layer for model.*list"):
        find_token_embedding([unchanged])
    with pytest.raises(TypeError, match="Expected a keras.layers.Embedding, a layer name or None"):
        find_token_embedding(unchanged, embedding=1.5)
    with pytest.raises(TypeError, match="Expected a keras.layers.Embedding.*of type Dense"):
        find_token_embedding(unchanged, embedding=keras.layers.Dense(2))
    for size in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="Expected an integer( >= 1)? for vocabulary_size"):
            find_token_embedding(unchanged, vocabulary_size=size)
    with pytest.raises(ValueError, match="candidates none"):
        find_token_embedding(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    with pytest.raises(TypeError, match="Expected a keras.layers.Embedding for token_embedding"):
        find_tied_heads(unchanged, "token_embedding")
    assert find_token_embedding(unchanged, vocabulary_size=np.int64(64)).input_dim == 64


def test_record_functions_bad_input(unchanged):
    with pytest.raises(TypeError, match="Expected a Keras model or layer for model"):
        correction_record("model")
    with pytest.raises(TypeError, match="Expected a Keras model or layer for model"):
        keras_masking.undo_mlm_embedding_correction(None)
    record = keras_masking.correct_mlm_embeddings(tiny_ours(), MASK).to_config()
    # A record that does not fit the table: undo refuses, nothing changes.
    other = tiny_ours()
    other.mlm_embedding_correction = {**record, "vocabulary_size": 65}
    table = table_of(other)
    with pytest.raises(ValueError, match="65 x 32 table, but the layer is 64 x 32"):
        keras_masking.undo_mlm_embedding_correction(other)
    np.testing.assert_array_equal(table_of(other), table)


class _EntityMixer(keras.layers.Layer):
    """Adds an entity table of its own (not the token embedding) to the hidden states."""

    def __init__(self, hub=False, **kwargs):
        super().__init__(**kwargs)
        if hub:  # with a `token_embedding` attribute of its own
            self.entities = keras_hub.layers.TokenAndPositionEmbedding(50, 16, 16)
        else:
            self.entities = keras.layers.Embedding(50, 16, name="entity_embedding")

    def call(self, hidden, entity_ids):
        return hidden + self.entities(entity_ids)


@pytest.mark.parametrize(
    ("input_name", "hub"),
    (("token_ids", True), ("input_ids", True), ("token_ids", False), ("input_ids", False)),
)
def test_a_table_a_layer_of_your_own_holds_is_not_taken_for_the_token_embedding(input_name, hub):
    """Followed into every attribute, the walk found the entity table of a layer
    of your own: a keras-hub `TokenAndPositionEmbedding` there won over the word
    embedding applied to ``token_ids`` (the correction edited the entity
    table). The embedding the graph applies to the token ids is the token
    embedding."""
    tokens = keras.Input((16,), dtype="int32", name=input_name)
    entities = keras.Input((16,), dtype="int32", name="entity_ids")
    hidden = keras.layers.Embedding(120, 16, name="word_embedding")(tokens)
    hidden = _EntityMixer(hub=hub)(hidden, entities)
    model = keras.Model({input_name: tokens, "entity_ids": entities}, keras.layers.Dense(8)(hidden))
    word = model.get_layer("word_embedding")
    assert find_token_embedding(model) is word
    table = keras.ops.convert_to_numpy(word.embeddings)
    keras_masking.correct_mlm_embeddings(model, mask_token_id=3)
    corrected = keras.ops.convert_to_numpy(word.embeddings)
    np.testing.assert_allclose(corrected, numpy_formula(table, 3), atol=1e-6)


@pytest.mark.parametrize("hub", (True, False))
def test_an_input_embedding_beside_a_table_a_layer_of_yours_holds_is_refused(hub):
    """The graph's embedding on an input (``input_ids`` then) and a keras-hub
    table inside a layer of yours: the layer's table was corrected (the
    50-row entity table, not the 120-row word table). Where the input's name
    does not tell, which one is meant is not known (the mirror image, a word
    table in a layer of yours beside a position table on an input, is as
    common): both are named, and ``embedding=`` chooses."""
    tokens = keras.Input((16,), dtype="int32", name="words")
    entities = keras.Input((16,), dtype="int32", name="entity_ids")
    hidden = keras.layers.Embedding(120, 16, name="word_embedding")(tokens)
    mixer = _EntityMixer(hub=hub)
    hidden = mixer(hidden, entities)
    model = keras.Model({"words": tokens, "entity_ids": entities}, keras.layers.Dense(8)(hidden))
    entity_table = mixer.entities.token_embedding if hub else mixer.entities
    tables = [table_of(layer) for layer in (model.get_layer("word_embedding"), entity_table)]
    with pytest.raises(ValueError, match=r"'word_embedding' \(120 x 16\).*\(50 x 16\).*embedding="):
        keras_masking.correct_mlm_embeddings(model, mask_token_id=3)
    np.testing.assert_array_equal(table_of(model.get_layer("word_embedding")), tables[0])
    np.testing.assert_array_equal(table_of(entity_table), tables[1])
    keras_masking.correct_mlm_embeddings(model, mask_token_id=3, embedding="word_embedding")
    np.testing.assert_allclose(
        table_of(model.get_layer("word_embedding")), numpy_formula(tables[0], 3), atol=1e-6
    )


def _entity_model():
    """A functional model of entity ids holding a keras-hub table of its own."""
    entity_ids = keras.Input((16,), dtype="int32", name="inner_entity_ids")
    table = keras_hub.layers.TokenAndPositionEmbedding(30, 16, 16)
    pooled = keras.layers.GlobalAveragePooling1D()(table(entity_ids))
    return keras.Model(entity_ids, pooled)


@pytest.mark.parametrize(
    "layout", ("inlined_backbone", "token_and_position", "entity_model", "entity_beside_words")
)
def test_a_functional_model_nested_in_yours_is_read_as_part_of_the_graph(layout):
    """A functional model nested in yours that takes the token ids (a
    backbone's layers inlined, a keras-hub `TokenAndPositionEmbedding`)
    beside an embedding of your own on another input was refused in an
    earlier build of this release; one that encodes entity ids beside the
    word embedding on ``input_ids`` had its entity table corrected. Where no
    input name tells, the two are named in the error."""
    if layout == "inlined_backbone":
        backbone = TransformerBackbone(**tiny_backbone_kwargs(num_layers=1))
        inner = keras.Model(backbone.input, backbone.output["pooled_output"])
        inputs = {
            k: keras.Input(v.shape[1:], dtype=v.dtype, name=k) for k, v in inner.input.items()
        }
        pooled, expected = inner(inputs), backbone.token_embedding
        inputs["feature_ids"] = keras.Input((1,), dtype="int32", name="feature_ids")
        table = keras.layers.Embedding(5, 2, name="feature_table")
        other = keras.layers.Flatten()(table(inputs["feature_ids"]))
    elif layout == "token_and_position":
        tokens = keras.Input((16,), dtype="int32", name="input_ids")
        table = keras_hub.layers.TokenAndPositionEmbedding(100, 16, 16)
        inner = keras.Model(tokens, keras.layers.GlobalAveragePooling1D()(table(tokens)))
        inputs = {"input_ids": keras.Input((16,), dtype="int32", name="input_ids")}
        pooled, expected = inner(inputs["input_ids"]), table.token_embedding
        inputs["segment_ids"] = keras.Input((16,), dtype="int32", name="segment_ids")
        segments = keras.layers.Embedding(2, 16)(inputs["segment_ids"])
        other = keras.layers.GlobalAveragePooling1D()(segments)
    else:
        name = "input_ids" if layout == "entity_model" else "words"
        inputs = {name: keras.Input((16,), dtype="int32", name=name)}
        inputs["entity_ids"] = keras.Input((16,), dtype="int32", name="entity_ids")
        expected = keras.layers.Embedding(100, 16, name="word_embedding")
        pooled = keras.layers.GlobalAveragePooling1D()(expected(inputs[name]))
        other = _entity_model()(inputs["entity_ids"])
    model = keras.Model(inputs, keras.layers.Concatenate()([pooled, other]))
    if layout == "entity_beside_words":
        with pytest.raises(ValueError, match=r"'word_embedding' \(100 x 16\).*\(30 x 16\)"):
            find_token_embedding(model)
        return
    assert find_token_embedding(model) is expected
    table = table_of(expected)
    keras_masking.correct_mlm_embeddings(model, mask_token_id=3)
    np.testing.assert_allclose(table_of(expected), numpy_formula(table, 3), atol=1e-6)


class _WordEncoder(keras.layers.Layer):
    """A layer of your own holding the word table (not as ``token_embedding``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.words = keras.layers.Embedding(100, 16, name="word_embedding")

    def call(self, token_ids):
        return self.words(token_ids)


@pytest.mark.parametrize(
    ("layout", "found"),
    (
        ("nested_encoder", True),
        ("reshape_first", True),
        ("layer_of_yours", False),
        ("layer_of_yours_no_name", False),
        ("positions_from_the_ids", False),
        ("word_layer_called_first_on_a_pair", False),
        ("two_input_encoder_called_with_a_dict", False),
        ("a_second_table_on_the_ids", False),
    ),
)
def test_an_embedding_on_another_input_is_not_taken_for_the_token_embedding(layout, found):
    """With the token ids on ``input_ids`` and a position table applied to a
    ``position_ids`` input (or to position ids computed from the token ids),
    the position table was corrected by the formula and the word table left
    as it was, where the word embedding sat in an encoder model of yours
    (its input named otherwise), behind a reshape, in a layer of yours, behind
    an operation of two inputs, in a layer first called on another input, or
    in an encoder of two inputs called with a dict; so it was where no input
    was named as the token ids. The embedding that looks up the token ids as
    they are (behind a cast or a reshape, in a functional model of one input)
    is the token embedding; where the graph does not show it, the tables are
    named in the error."""
    name = "words" if layout == "layer_of_yours_no_name" else "input_ids"
    ids = keras.Input((16,), dtype="int32", name=name)
    positions = keras.Input((16,), dtype="int32", name="position_ids")
    pair = keras.Input((16,), dtype="int32", name="pair_ids")
    inputs = {name: ids, "position_ids": positions}
    word = keras.layers.Embedding(100, 16, name="word_embedding")
    position = keras.layers.Embedding(17, 16, name="position_embedding")
    if layout == "nested_encoder":
        tokens = keras.Input((16,), dtype="int32", name="tokens")
        hidden = keras.Model(tokens, word(tokens))(ids)
    elif layout == "reshape_first":
        hidden = word(keras.layers.Reshape((16,))(ids))
    elif layout in ("layer_of_yours", "layer_of_yours_no_name"):
        encoder = _WordEncoder()
        hidden, word = encoder(ids), encoder.words
    elif layout == "positions_from_the_ids":  # RoBERTa's: a cumsum of the padding mask
        real = keras.ops.cast(keras.ops.not_equal(ids, 0), "int32")
        inputs = {name: ids}
        positions = keras.layers.Lambda(lambda x: keras.ops.cumsum(x, axis=1))(real)
        hidden = word(ids * real)
    elif layout == "a_second_table_on_the_ids":  # a token type from its id, beside the words
        tokens = keras_hub.layers.TokenAndPositionEmbedding(100, 16, 16)
        word, inputs = tokens.token_embedding, {name: ids}
        hidden = tokens(ids)
        positions = keras.layers.Reshape((16,))(ids)
    elif layout == "word_layer_called_first_on_a_pair":
        inputs["pair_ids"] = pair
        hidden = word(pair) + word(ids)
    else:  # an encoder built on a list of inputs, called with a dict
        tokens = keras.Input((16,), dtype="int32", name="tokens")
        places = keras.Input((16,), dtype="int32", name="places")
        encoder = keras.Model([tokens, places], word(tokens) + position(places))
        hidden = encoder({"tokens": ids, "places": positions})
    if layout != "two_input_encoder_called_with_a_dict":
        hidden = hidden + position(positions)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    tables = [table_of(word), table_of(position)]
    if not found:
        with pytest.raises(ValueError, match=rf"token embedding: candidates \[.*'{word.name}'"):
            keras_masking.correct_mlm_embeddings(model, mask_token_id=3)
        with pytest.raises(ValueError, match=r"'position_embedding' \(17 x 16\)"):
            keras_masking.correct_mlm_embeddings(model, mask_token_id=3)
        np.testing.assert_array_equal(table_of(word), tables[0])
        np.testing.assert_array_equal(table_of(position), tables[1])
        return
    assert find_token_embedding(model) is word
    keras_masking.correct_mlm_embeddings(model, mask_token_id=3)
    np.testing.assert_allclose(table_of(word), numpy_formula(tables[0], 3), atol=1e-6)
    np.testing.assert_array_equal(table_of(position), tables[1])


def test_an_unbuilt_head_is_refused_before_the_table_changes():
    """On an `ExLMPretrainer` not yet called, the table was corrected and then
    the head failed ("no attribute 'output_row_scale'"), with no record: a
    retry after a first batch corrected the table twice."""
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )
    pretrainer = ExLMPretrainer(backbone, k=2, mask_token_id=3, unselectable_token_ids=(1, 2))
    table = table_of(backbone.token_embedding)
    with pytest.raises(ValueError, match=r"\['mlm_head'\].*not built yet"):
        keras_masking.correct_mlm_embeddings(pretrainer, mask_token_id=3)
    np.testing.assert_array_equal(table_of(backbone.token_embedding), table)
