"""MLM embedding correction, hardened: every model shape, no double correction,
no NaN spread, errors before `fit` starts, clear errors on bad files and input.

Bad-input cases are grouped by public entry point (one parametrized test or
block per entry point); each asserts the clear message and that nothing was
changed or written.
"""

import json
import os
import pathlib
import re

import keras
import keras_hub
import numpy as np
import pytest
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import tiny_backbone_kwargs
from tests.testing import write_reference_checkpoint

import keras_masking
from keras_masking.callbacks import MLMEmbeddingCorrection
from keras_masking.methods import correction_record
from keras_masking.methods import find_token_embedding
from keras_masking.methods import masking_configuration
from keras_masking.methods import mlm_model_average
from keras_masking.methods import sample_mlm_maskings
from keras_masking.methods.mlm_embedding_correction import MLMEmbeddingCorrection as Record
from keras_masking.methods.mlm_embedding_correction import check_mlm_correction
from keras_masking.methods.mlm_embedding_correction_files import RECORD_FILE
from keras_masking.methods.mlm_embedding_correction_files import correct_checkpoint_embeddings
from keras_masking.methods.mlm_embedding_correction_files import correct_preset_embeddings
from keras_masking.methods.mlm_embedding_correction_files import is_preset_folder
from keras_masking.methods.mlm_embedding_correction_files import read_correction_record
from keras_masking.methods.token_embedding_lookup import find_tied_heads
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from keras_masking.models import from_tf_checkpoint
from keras_masking.models import load_tf_checkpoint_weights
from keras_masking.models import read_tf_checkpoint
from keras_masking.models import save_tf_checkpoint
from keras_masking.models.tf_checkpoint import resolve_checkpoint_prefix
from keras_masking.models.tf_checkpoint import write_tf_checkpoint
from keras_masking.ops import embedding_correction as ec

MASK = 3
SPECIAL = [0, 1, 2, 3]
WORDS = "bert/embeddings/word_embeddings"


def formula(table, mask_id=MASK, r=0.15, p_m=0.8, p_r=0.1, unselectable=None):
    """``(1-r) E + r (p_m E[MASK] + p_k E + p_r mean E)``, written out in numpy."""
    table = np.asarray(table, np.float64)
    expected = (1 - r) * table + r * (
        p_m * table[mask_id] + (1 - p_m - p_r) * table + p_r * table.mean(0)
    )
    if unselectable is not None:
        expected[unselectable] = table[unselectable]
    return expected


def table_of(layer):
    return keras.ops.convert_to_numpy(layer.embeddings).copy()


def weights_of(model):
    return [keras.ops.convert_to_numpy(w).copy() for w in model.weights]


def assert_same_weights(model, before):
    after = weights_of(model)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)


def files_in(folder):
    folder = pathlib.Path(folder)
    if not folder.exists():
        return None
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file()
    )


# --- Item 1: the callback finds the token embedding of every model shape. ---


def _hub(cls):
    return cls(**{**HUB_SIZES, "num_layers": 1})


def _ours():
    return TransformerBackbone(**tiny_backbone_kwargs(num_layers=1))


def _pooled(backbone, outputs):
    if isinstance(outputs, dict):
        return outputs["pooled_output"]
    return outputs[:, 0, :]  # RoBERTa: the <s> state


def _shape(name):
    """``(model, backbone)`` for one way of putting a backbone in a classifier."""
    kind, how = name.split("-")
    backbone = {
        "ours": _ours,
        "bert": lambda: _hub(keras_hub.models.BertBackbone),
        "roberta": lambda: _hub(keras_hub.models.RobertaBackbone),
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
    table = table_of(backbone.token_embedding)
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
    corrected = table_of(backbone.token_embedding)
    np.testing.assert_allclose(corrected, formula(table, unselectable=SPECIAL), atol=1e-6)
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
    np.testing.assert_array_equal(table_of(backbone.token_embedding), corrected)
    assert again.record is None


def test_a_model_with_two_backbones_asks_which():
    first, second = _ours(), _hub(keras_hub.models.BertBackbone)
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


# --- Item 2: a corrected checkpoint loads as corrected. ---


def test_corrected_checkpoint_loads_as_corrected_and_is_not_corrected_twice(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "in")
    original = read_tf_checkpoint(prefix)[WORDS]
    out = correct_checkpoint_embeddings(
        prefix,
        tmp_path / "out",
        mask_token_id=5,
        unselectable_token_ids=[0, 1, 2],
        drop_mlm_head=True,
    )
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]
    record = read_correction_record(tmp_path / "out")
    assert record["mask_token_id"] == 5 and record["unselectable_token_ids"] == [0, 1, 2]
    backbone = from_tf_checkpoint(tmp_path / "out" / "bert_config.json", out)
    loaded = correction_record(backbone)
    assert loaded is not None and loaded.mask_token_id == 5 and loaded.corrected_rows == 125
    assert backbone.get_config()["mlm_embedding_correction"]["mask_token_id"] == 5
    corrected = table_of(backbone.token_embedding)
    np.testing.assert_allclose(corrected, formula(original, 5, unselectable=[0, 1, 2]), atol=1e-6)
    # Refused a second time: by the function, the callback and the files.
    assert keras_masking.correct_mlm_embeddings(backbone, mask_token_id=5) is None
    assert not check_mlm_correction(backbone, mask_token_id=5)
    callback = MLMEmbeddingCorrection(mask_token_id=5)
    callback.set_model(backbone)
    callback.on_train_begin()
    assert callback.record is None
    np.testing.assert_array_equal(table_of(backbone.token_embedding), corrected)
    backbone.save_to_preset(str(tmp_path / "preset"))
    with pytest.raises(ValueError, match="already corrected"):
        correct_preset_embeddings(tmp_path / "preset", tmp_path / "again", mask_token_id=5)
    assert not (tmp_path / "again").exists()
    # Saved as a TF checkpoint again, the record travels with it.
    save_tf_checkpoint(backbone, str(tmp_path / "resaved" / "bert_model.ckpt"))
    with pytest.raises(ValueError, match="already corrected"):
        correct_checkpoint_embeddings(tmp_path / "resaved", tmp_path / "again", mask_token_id=5)
    fresh = from_tf_checkpoint(tmp_path / "resaved" / "bert_config.json", tmp_path / "resaved")
    assert correction_record(fresh).mask_token_id == 5
    # Undo after loading inverts to the original checkpoint's table.
    keras_masking.undo_mlm_embedding_correction(fresh)
    np.testing.assert_allclose(table_of(fresh.token_embedding), original, rtol=1e-5, atol=1e-6)
    # Loading the uncorrected checkpoint into a corrected model clears the record.
    load_tf_checkpoint_weights(backbone, prefix, strict=False)
    assert correction_record(backbone) is None
    np.testing.assert_array_equal(table_of(backbone.token_embedding), original)
    # ... and loading the corrected one sets it.
    load_tf_checkpoint_weights(backbone, out)
    assert correction_record(backbone).mask_token_id == 5
    del config_path


def test_corrected_keras_hub_preset_loads_as_corrected(tmp_path):
    hub = _hub(keras_hub.models.BertBackbone)
    original = table_of(hub.token_embedding)
    hub.save_to_preset(str(tmp_path / "hub"))
    correct_preset_embeddings(tmp_path / "hub", tmp_path / "corrected", mask_token_id=5)
    backbone = TransformerBackbone.from_preset(str(tmp_path / "corrected"))
    assert correction_record(backbone).mask_token_id == 5
    np.testing.assert_allclose(
        table_of(backbone.token_embedding), formula(original, 5), rtol=1e-5, atol=1e-6
    )
    assert keras_masking.correct_mlm_embeddings(backbone, mask_token_id=5) is None
    # The uncorrected preset carries no record.
    assert correction_record(TransformerBackbone.from_preset(str(tmp_path / "hub"))) is None


def test_corrected_checkpoint_with_its_head_loads_as_corrected(tmp_path):
    _, prefix, _ = write_reference_checkpoint("bert", tmp_path / "in")
    out = correct_checkpoint_embeddings(
        prefix, tmp_path / "out", mask_token_id=5, tied_output="correct"
    )
    masked_lm = from_tf_checkpoint(tmp_path / "out" / "bert_config.json", out, with_mlm=True)
    assert correction_record(masked_lm).tied_output == "correct"
    table = table_of(masked_lm.backbone.token_embedding)
    assert keras_masking.correct_mlm_embeddings(masked_lm, mask_token_id=5) is None
    np.testing.assert_array_equal(table_of(masked_lm.backbone.token_embedding), table)


# --- Item 3: a non-finite table is refused before anything changes. ---


def test_non_finite_table_is_refused_everywhere(tmp_path):
    backbone = _ours()
    table = table_of(backbone.token_embedding)
    table[7, 2] = np.nan
    table[9, 0] = np.inf
    backbone.token_embedding.embeddings.assign(table)
    message = r"NaN or inf values in 2 of 64 rows \(first: row 7\)"
    with pytest.raises(ValueError, match=message):
        keras_masking.correct_mlm_embeddings(backbone, mask_token_id=MASK)
    np.testing.assert_array_equal(table_of(backbone.token_embedding), table)
    assert correction_record(backbone) is None
    with pytest.raises(ValueError, match=message):
        ec.expected_input_embeddings(table, MASK)
    callback = MLMEmbeddingCorrection(mask_token_id=MASK, when="train_end")
    callback.set_model(backbone)
    with pytest.raises(ValueError, match=message):
        callback.on_train_begin()
    bad = np.random.default_rng(0).normal(size=(128, 32)).astype("float32")
    bad[100] = -np.inf
    _, prefix, _ = write_reference_checkpoint("bert", tmp_path / "in", extra={WORDS: bad})
    with pytest.raises(ValueError, match=r"word_embeddings.*1 of 128 rows \(first: row 100\)"):
        correct_checkpoint_embeddings(prefix, tmp_path / "out", mask_token_id=5, drop_mlm_head=True)
    assert files_in(tmp_path / "out") is None
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


# --- Item 4: the callback fails before the first step. ---


def _compiled_classifier():
    backbone = _ours()
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
        ({"mask_token_id": 64}, r"mask_token_id` must be an integer in \[0, 64\)"),
        ({"mask_token_id": 64, "when": "train_end"}, r"in \[0, 64\)"),
        ({"mask_token_id": 3, "unselectable_token_ids": [0, 64]}, r"out-of-range ids \[64\]"),
        ({"mask_token_id": 3, "embedding": "nope", "when": "train_end"}, "named 'nope'"),
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
    masked_lm = keras_hub.models.BertMaskedLM(_hub(keras_hub.models.BertBackbone))
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


# --- Item 5: clear errors on bad checkpoint files, naming the file. ---


@pytest.fixture
def checkpoint(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "ckpt")
    return config_path, prefix


def test_truncated_data_file_names_the_file_and_variable(checkpoint):
    config_path, prefix = checkpoint
    data = prefix + ".data-00000-of-00001"
    raw = pathlib.Path(data).read_bytes()
    pathlib.Path(data).write_bytes(raw[: len(raw) // 2])
    pattern = re.escape(data) + r": cannot read variable '.*'; the file is truncated or corrupt"
    with pytest.raises(ValueError, match=pattern):
        read_tf_checkpoint(prefix)
    with pytest.raises(ValueError, match=pattern):
        from_tf_checkpoint(config_path, prefix)
    pathlib.Path(data).write_bytes(raw[:4] + bytes(64) + raw[68:])  # corrupt, same size
    with pytest.raises(ValueError, match=pattern):
        read_tf_checkpoint(prefix)


def test_missing_data_shard_and_bad_index_name_the_file(checkpoint):
    config_path, prefix = checkpoint
    data = prefix + ".data-00000-of-00001"
    os.rename(data, data + ".moved")
    with pytest.raises(FileNotFoundError, match=re.escape(data) + ".*missing"):
        from_tf_checkpoint(config_path, prefix)
    os.rename(data + ".moved", data)
    index = prefix + ".index"
    raw = pathlib.Path(index).read_bytes()
    pathlib.Path(index).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=re.escape(index) + ": not a readable TF checkpoint"):
        read_tf_checkpoint(prefix)
    os.remove(index)
    with pytest.raises(FileNotFoundError, match=r"No TF checkpoint.*\.index"):
        read_tf_checkpoint(prefix)


def test_a_failed_write_leaves_no_checkpoint(tmp_path, monkeypatch):
    import tensorflow as tf

    def full_disk(**kwargs):
        pathlib.Path(kwargs["prefix"] + ".index").write_bytes(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(tf.raw_ops, "SaveV2", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_tf_checkpoint({"a": np.ones(3, "float32")}, str(tmp_path / "out" / "model.ckpt"))
    assert files_in(tmp_path / "out") == []


# --- Item 6: bad input per public entry point (each case asserts the message
# and that nothing changed). ---


@pytest.fixture(scope="module")
def backbone():
    return _ours()


@pytest.fixture
def unchanged(backbone):
    """Checks after the test that the shared backbone was not changed."""
    before = weights_of(backbone)
    yield backbone
    assert_same_weights(backbone, before)
    assert correction_record(backbone) is None


CORRECT_BAD = [
    ({"mask_token_id": -1}, r"mask_token_id` must be an integer in \[0, 64\).*=-1"),
    ({"mask_token_id": 2.5}, r"mask_token_id` must be an integer.*=2\.5"),
    ({"mask_token_id": 3.0}, r"mask_token_id` must be an integer.*=3\.0"),
    ({"mask_token_id": True}, r"mask_token_id` must be an integer.*=True"),
    ({"mask_token_id": "3"}, r"mask_token_id` must be an integer.*='3'"),
    ({"mask_token_id": None}, r"mask_token_id` must be an integer.*=None"),
    ({"mask_token_id": np.int64(64)}, r"in \[0, 64\)"),
    ({"mask_rate": "0.15"}, r"mask_rate` must be a number in \[0, 1\]"),
    ({"mask_rate": True}, r"mask_rate` must be a number in \[0, 1\]. Received: mask_rate=True"),
    ({"mask_rate": float("nan")}, r"mask_rate` must be a number in \[0, 1\]"),
    ({"mask_rate": np.float32(1.5)}, r"mask_rate` must be a number in \[0, 1\]"),
    ({"random_token_rate": -0.1}, r"random_token_rate` must be a number"),
    ({"mask_rate": 1.0, "mask_token_rate": 1.0, "random_token_rate": 0.0}, "replaces every"),
    ({"unselectable_token_ids": 5}, "unselectable_token_ids` must be a list"),
    ({"unselectable_token_ids": "0,1"}, "unselectable_token_ids` must be a list"),
    ({"unselectable_token_ids": [0, 1.5]}, r"non-integers \[1\.5\]"),
    ({"unselectable_token_ids": [True]}, r"non-integers \[True\]"),
    ({"unselectable_token_ids": [-1, 2]}, r"out-of-range ids \[-1\]"),
    ({"tied_output": None}, "tied_output` must be one of"),
    ({"tied_output": "KEEP"}, "tied_output` must be one of"),
    ({"embedding": 5}, "embedding` must be an Embedding layer, a layer name or None"),
    ({"embedding": keras.layers.Dense(2)}, "must be a keras.layers.Embedding"),
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
        with pytest.raises(TypeError, match=f"`model` must be a Keras model.*{message}"):
            keras_masking.correct_mlm_embeddings(model, mask_token_id=MASK)


def test_numpy_scalars_are_accepted_where_numbers_are():
    backbone = _ours()
    table = table_of(backbone.token_embedding)
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
    expected = formula(table, MASK, float(np.float32(0.2)), 0.7, float(np.float32(0.1)), SPECIAL)
    np.testing.assert_allclose(table_of(backbone.token_embedding), expected, atol=1e-6)
    callback = MLMEmbeddingCorrection(
        mask_token_id=np.int32(MASK), mask_rate=np.float32(0.2), unselectable_token_ids=(0, 1)
    )
    assert callback.settings["mask_rate"] == pytest.approx(0.2)


CALLBACK_BAD = [
    ({}, "Pass `mask_token_id`"),
    ({"mask_token_id": -1}, r"mask_token_id` must be an integer >= 0. Received: mask_token_id=-1"),
    (
        {"mask_token_id": 2.5},
        r"mask_token_id` must be an integer >= 0. Received: mask_token_id=2\.5",
    ),
    ({"mask_token_id": True}, "mask_token_id` must be an integer"),
    ({"mask_token_id": "103"}, "mask_token_id` must be an integer"),
    ({"mask_token_id": 3, "mask_rate": 2.0}, "mask_rate` must be a number in"),
    ({"mask_token_id": 3, "mask_token_rate": False}, "mask_token_rate` must be a number"),
    ({"mask_token_id": 3, "mask_token_rate": 0.9, "random_token_rate": 0.2}, "must not exceed 1"),
    (
        {"mask_token_id": 3, "mask_rate": 1, "mask_token_rate": 0.9, "random_token_rate": 0.1},
        "replaces every token",
    ),
    ({"mask_token_id": 3, "unselectable_token_ids": [0, -2]}, r"out-of-range ids \[-2\]"),
    ({"mask_token_id": 3, "unselectable_token_ids": [0.0]}, "non-integers"),
    ({"mask_token_id": 3, "tied_output": "both"}, "tied_output` must be one of"),
    ({"mask_token_id": 3, "embedding": 0}, "embedding` must be a keras.layers.Embedding"),
    ({"mask_token_id": 3, "when": "epoch_end"}, "when` must be one of"),
    ({"mask_token_id": 3, "when": None}, "when` must be one of"),
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
    with pytest.raises(TypeError, match="mask_generator` must be a keras_hub.*str"):
        MLMEmbeddingCorrection(mask_generator="masker")
    # Agreeing values (numpy ones included) are accepted.
    callback = MLMEmbeddingCorrection(
        mask_token_id=np.int64(4), mask_rate=np.float32(0.2), mask_generator=_generator()
    )
    assert callback.settings["mask_token_id"] == 4 and callback.settings["mask_rate"] == 0.2


def test_masking_configuration_bad_input():
    for value in (None, 3, keras.layers.Dense(2)):
        with pytest.raises(TypeError, match="mask_generator` must be a keras_hub"):
            masking_configuration(value)
    with pytest.raises(TypeError, match="mask_generator` must be a keras_hub"):
        keras_masking.correct_mlm_embeddings.from_mask_generator(_ours(), "masker")


def test_find_token_embedding_bad_input(unchanged):
    with pytest.raises(TypeError, match="`model` must be a Keras model or layer.*list"):
        find_token_embedding([unchanged])
    with pytest.raises(TypeError, match="`embedding` must be an Embedding layer"):
        find_token_embedding(unchanged, embedding=1.5)
    with pytest.raises(TypeError, match="must be a keras.layers.Embedding"):
        find_token_embedding(unchanged, embedding=keras.layers.Dense(2))
    for size in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="vocabulary_size` must be a positive integer"):
            find_token_embedding(unchanged, vocabulary_size=size)
    with pytest.raises(ValueError, match="candidates none"):
        find_token_embedding(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    with pytest.raises(TypeError, match="token_embedding` must be a keras.layers.Embedding"):
        find_tied_heads(unchanged, "token_embedding")
    assert find_token_embedding(unchanged, vocabulary_size=np.int64(64)).input_dim == 64


def test_record_functions_bad_input(unchanged):
    with pytest.raises(TypeError, match="`model` must be a Keras model"):
        correction_record("model")
    with pytest.raises(TypeError, match="`model` must be a Keras model"):
        keras_masking.undo_mlm_embedding_correction(None)
    with pytest.raises(ValueError, match="record must be a dict"):
        Record.from_config([1, 2])
    with pytest.raises(ValueError, match=r"missing \['mask_token_id'"):
        Record.from_config({"mask_rate": 0.1})
    record = keras_masking.correct_mlm_embeddings(_ours(), MASK).to_config()
    with pytest.raises(ValueError, match=r"unknown keys \['source'\]"):
        Record.from_config({**record, "source": "x"})
    # A record that does not fit the table: undo refuses, nothing changes.
    other = _ours()
    other.mlm_embedding_correction = {**record, "vocabulary_size": 65}
    table = table_of(other.token_embedding)
    with pytest.raises(ValueError, match="65 x 32 table, but the layer is 64 x 32"):
        keras_masking.undo_mlm_embedding_correction(other)
    np.testing.assert_array_equal(table_of(other.token_embedding), table)


OPS_TABLE = np.random.default_rng(0).normal(size=(6, 3))
OPS_BAD = [
    (lambda: ec.selectable_rows(0), "vocabulary_size` must be a positive integer"),
    (lambda: ec.selectable_rows(2.5), "vocabulary_size` must be a positive integer"),
    (lambda: ec.selectable_rows(True), "vocabulary_size` must be a positive integer"),
    (lambda: ec.selectable_rows(6, [6]), r"out-of-range ids \[6\]"),
    (lambda: ec.selectable_rows(6, [1.0]), "non-integers"),
    (lambda: ec.correction_coefficients(OPS_TABLE[0], 1), r"Received shape \(3,\)"),
    (lambda: ec.correction_coefficients(np.zeros((0, 3)), 0), r"Received shape \(0, 3\)"),
    (lambda: ec.correction_coefficients([["a", "b"]], 0), "must be a numeric"),
    (lambda: ec.correction_coefficients(OPS_TABLE, 6), r"in \[0, 6\)"),
    (lambda: ec.correction_coefficients(OPS_TABLE, 1, mask_rate=-1), "mask_rate"),
    (lambda: ec.expected_input_embeddings(OPS_TABLE, 1.5), "mask_token_id` must be an integer"),
    (lambda: ec.expected_input_embeddings(OPS_TABLE, 1, unselectable_token_ids=[9]), r"\[9\]"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.0, np.zeros(3), np.ones(6, bool)), "scale"),
    (lambda: ec.apply_correction(OPS_TABLE, np.nan, np.zeros(3), np.ones(6, bool)), "scale"),
    (lambda: ec.apply_correction(OPS_TABLE, True, np.zeros(3), np.ones(6, bool)), "scale"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.9, np.zeros(4), np.ones(6, bool)), r"\(3,\)"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.9, np.zeros(3), np.ones(6)), "bool"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.9, np.zeros(3), np.ones(5, bool)), r"\(6,\)"),
    (lambda: ec.invert_expected_input_embeddings(OPS_TABLE, -1, np.zeros(3), None), "scale"),
    (lambda: ec.validate_masking_rates(0.1, 0.6, 0.6), "must not exceed 1"),
]


@pytest.mark.parametrize("call, message", OPS_BAD)
def test_embedding_correction_ops_bad_input(call, message):
    before = OPS_TABLE.copy()
    with pytest.raises(ValueError, match=message):
        call()
    np.testing.assert_array_equal(OPS_TABLE, before)


def test_embedding_correction_ops_accept_numpy_scalars():
    rates = (np.float32(0.2), np.float16(0.5), np.float32(0.25))
    got = ec.expected_input_embeddings(OPS_TABLE, np.int32(1), *rates, np.array([0]))
    expected = formula(OPS_TABLE, 1, *map(float, rates), unselectable=[0])
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert got.dtype == np.float64


SAMPLE_BAD = [
    ({"samples": 0}, "samples` must be a positive integer"),
    ({"samples": 2.5}, "samples` must be a positive integer"),
    ({"samples": True}, "samples` must be a positive integer"),
    ({"vocabulary_size": 0}, "vocabulary_size` must be a positive integer"),
    ({"mask_token_id": 64}, r"mask_token_id` must be an integer in \[0, 64\)"),
    ({"mask_token_id": 3.5}, "mask_token_id` must be an integer"),
    ({"token_ids": np.full((2, 4), 1.7)}, "token_ids` must be a non-empty integer array"),
    ({"token_ids": np.full((2, 4), 64)}, r"token_ids` must lie in \[0, 64\).*\[64\]"),
    ({"token_ids": np.zeros((0,), "int32")}, "non-empty"),
    ({"padding_mask": np.ones((2, 5), "int32")}, r"padding_mask` must be.*\(2, 4\)"),
    ({"padding_mask": np.full((2, 4), 0.5)}, "padding_mask` must be a 0/1 or bool"),
    ({"seed": -1}, "seed` must be a non-negative integer"),
    ({"seed": 1.5}, "seed` must be a non-negative integer"),
    ({"mask_rate": 1.1}, "mask_rate` must be a number"),
    ({"unselectable_token_ids": [70]}, r"\[70\]"),
]


@pytest.mark.parametrize("kwargs, message", SAMPLE_BAD)
def test_sample_mlm_maskings_bad_input(kwargs, message):
    arguments = dict(
        token_ids=np.ones((2, 4), "int32"), samples=3, mask_token_id=MASK, vocabulary_size=64
    )
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sample_mlm_maskings(**arguments)


@pytest.fixture(scope="module")
def averaged_model(backbone):
    return keras.Model(
        backbone.input, keras.layers.Dense(2)(backbone(backbone.input)["pooled_output"])
    )


AVERAGE_BAD = [
    ({"samples": 0}, ValueError, "samples` must be a positive integer"),
    ({"samples": True}, ValueError, "samples` must be a positive integer"),
    ({"batch_size": 0}, ValueError, "batch_size` must be a positive integer"),
    ({"from_logits": "yes"}, ValueError, "from_logits` must be True or False"),
    ({"mask_token_id": 64}, ValueError, r"mask_token_id` must be an integer in \[0, 64\)"),
    ({"mask_token_id": 3.0}, ValueError, "mask_token_id` must be an integer"),
    ({"inputs": [1, 2]}, ValueError, "inputs` must be a dict holding 'token_ids'"),
    ({"inputs": {"ids": np.ones((2, 4))}}, ValueError, r"Received: \['ids'\]"),
    ({"token_ids": np.full((2, 8), 99)}, ValueError, r"token_ids` must lie in \[0, 64\)"),
    ({"token_ids": np.ones((3, 8), "int32")}, ValueError, "batch size of token_ids"),
    ({"model": "classifier"}, TypeError, "model` must be a Keras model"),
]


@pytest.mark.parametrize("kwargs, error, message", AVERAGE_BAD)
def test_mlm_model_average_bad_input(averaged_model, kwargs, error, message):
    inputs = random_features(length=8)
    if "token_ids" in kwargs:
        inputs["token_ids"] = kwargs.pop("token_ids")
    arguments = dict(model=averaged_model, inputs=inputs, mask_token_id=MASK, samples=2)
    arguments.update(kwargs)
    with pytest.raises(error, match=message):
        mlm_model_average(**arguments)


CHECKPOINT_BAD = [
    ({"mask_token_id": 128}, r"mask_token_id` must be an integer in \[0, 128\)"),
    ({"mask_token_id": 2.5}, "mask_token_id` must be an integer"),
    ({"mask_rate": 1.5}, "mask_rate` must be a number"),
    ({"mask_rate": "0.1"}, "mask_rate` must be a number"),
    ({"unselectable_token_ids": [0, 500]}, r"out-of-range ids \[500\]"),
    ({"tied_output": "both"}, "tied_output` must be one of"),
    ({"drop_mlm_head": "yes"}, "drop_mlm_head` must be a bool"),
    ({"tied_output": "keep", "drop_mlm_head": False}, "cannot keep its original output rows"),
    ({"output_dir": "INPUT"}, "must differ from the input"),
    ({"output_dir": "NONEMPTY"}, "exists and is not empty"),
    ({"output_dir": "FILE"}, "exists and is a file"),
    ({"output_dir": None}, "output_dir` must be a path"),
    ({"checkpoint_path": 7}, "checkpoint_path` must be a path"),
    ({"checkpoint_path": "MISSING"}, "No TF checkpoint"),
]


@pytest.mark.parametrize("kwargs, message", CHECKPOINT_BAD)
def test_correct_checkpoint_embeddings_bad_input(tmp_path, kwargs, message):
    _, prefix, _ = write_reference_checkpoint("bert", tmp_path / "in")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    (tmp_path / "afile").write_text("mine")
    places = {
        "INPUT": tmp_path / "in",
        "NONEMPTY": tmp_path / "busy",
        "FILE": tmp_path / "afile",
        "MISSING": tmp_path / "none" / "bert_model.ckpt",
    }
    arguments = dict(
        checkpoint_path=prefix,
        output_dir=tmp_path / "out",
        mask_token_id=5,
        tied_output="correct",
    )
    arguments.update({k: places.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()})
    before = {name: files_in(tmp_path / name) for name in ("in", "busy")}
    with pytest.raises((ValueError, TypeError, FileNotFoundError), match=message):
        correct_checkpoint_embeddings(**arguments)
    assert {name: files_in(tmp_path / name) for name in ("in", "busy")} == before
    assert sorted(os.listdir(tmp_path)) == ["afile", "busy", "in"]


def test_correct_preset_embeddings_bad_input(tmp_path):
    _ours().save_to_preset(str(tmp_path / "preset"))
    before = files_in(tmp_path / "preset")
    cases = [
        ({}, ValueError, "Pass `mask_token_id`"),
        ({"mask_token_id": 3, "mask_probability": 0.1}, TypeError, "Unknown masking settings"),
        ({"mask_token_id": 3, "mask_rate": -1}, ValueError, "mask_rate` must be a number"),
        ({"mask_token_id": 64}, ValueError, r"mask_token_id` must be an integer in \[0, 64\)"),
        ({"mask_token_id": 3, "tied_output": 1}, ValueError, "tied_output` must be one of"),
        ({"mask_token_id": 3, "output_dir": "same"}, ValueError, "must differ from the input"),
        ({"mask_token_id": 3, "preset_dir": "nothing"}, ValueError, "not a preset folder"),
        ({"mask_token_id": 3, "preset_dir": 5}, TypeError, "preset_dir` must be a path"),
    ]
    for kwargs, error, message in cases:
        kwargs = dict(kwargs)
        preset = kwargs.pop("preset_dir", tmp_path / "preset")
        preset = tmp_path / preset if isinstance(preset, str) else preset
        output = kwargs.pop("output_dir", "out")
        output = tmp_path / "preset" if output == "same" else tmp_path / output
        with pytest.raises(error, match=message):
            correct_preset_embeddings(preset, output, **kwargs)
        assert files_in(tmp_path / "preset") == before
        assert sorted(os.listdir(tmp_path)) == ["preset"]
    assert len(cases) == 8


def test_record_file_and_preset_check_bad_input(tmp_path):
    with pytest.raises(TypeError, match="`path` must be a path"):
        is_preset_folder(None)
    with pytest.raises(TypeError, match="`folder` must be a path"):
        read_correction_record(3)
    (tmp_path / RECORD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / RECORD_FILE)) + ": not a"):
        read_correction_record(tmp_path)
    (tmp_path / RECORD_FILE).write_text(json.dumps({"mask_token_id": 3}))
    with pytest.raises(ValueError, match=r"missing \['mask_rate'"):
        read_correction_record(tmp_path)
    assert read_correction_record(tmp_path / "elsewhere") is None


def test_from_tf_checkpoint_bad_input(checkpoint, tmp_path):
    config_path, prefix = checkpoint
    cases = [
        ({"with_mlm": "yes"}, ValueError, "with_mlm` must be True or False"),
        ({"strict": None}, ValueError, "strict` must be True or False"),
        ({"with_pool": "yes"}, ValueError, "with_pool` must be 'auto', True or False"),
        ({"config_path": None}, TypeError, "config_path` must be a path"),
        ({"checkpoint_path": 3.5}, TypeError, "checkpoint_path` must be a path"),
        ({"model": "albert"}, ValueError, "must be one of"),
    ]
    for kwargs, error, message in cases:
        arguments = {"config_path": config_path, "checkpoint_path": prefix, **kwargs}
        with pytest.raises(error, match=message):
            from_tf_checkpoint(**arguments)
    # A record that does not fit the checkpoint, or is not JSON: the file is named.
    record_path = pathlib.Path(prefix).parent / RECORD_FILE
    record = keras_masking.correct_mlm_embeddings(_ours(), MASK).to_config()
    record_path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"{RECORD_FILE}: the record is for a 64 x 32 table"):
        from_tf_checkpoint(config_path, prefix)
    record_path.write_text("[")
    with pytest.raises(ValueError, match=f"{RECORD_FILE}: not a readable JSON record"):
        from_tf_checkpoint(config_path, prefix)


def test_load_tf_checkpoint_weights_bad_input(checkpoint):
    config_path, prefix = checkpoint
    backbone = from_tf_checkpoint(config_path, prefix)
    before = weights_of(backbone)
    values = read_tf_checkpoint(prefix)
    query = "bert/encoder/layer_0/attention/self/query/kernel"
    cases = [
        ((keras_hub.models.BertBackbone(**HUB_SIZES), prefix), {}, TypeError, "from_keras_hub"),
        ((backbone, prefix), {"strict": "no"}, ValueError, "strict` must be True or False"),
        ((backbone, prefix), {"source": 5}, ValueError, "source` must be a str"),
        ((backbone, {1: np.ones(2)}), {}, TypeError, "path or a dict"),
        ((backbone, {**values, query: np.ones((32, 16))}), {}, ValueError, query + r": checkp"),
        ((backbone, {**values, query: np.full((32, 32), "x")}), {}, ValueError, query + ".*float"),
        ((backbone, {k: v for k, v in values.items() if k != WORDS}), {}, ValueError, WORDS),
        ((backbone, None), {}, TypeError, "checkpoint_path` must be a path"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            load_tf_checkpoint_weights(*args, **kwargs)
        assert_same_weights(backbone, before)


def test_save_and_write_tf_checkpoint_bad_input(tmp_path):
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    with pytest.raises(TypeError, match="save_tf_checkpoint` expects a keras_masking"):
        save_tf_checkpoint(hub, str(tmp_path / "a" / "m.ckpt"))
    backbone = _ours()
    for prefix in (None, 5):
        with pytest.raises(TypeError, match="checkpoint_prefix` must be a path"):
            save_tf_checkpoint(backbone, prefix)
    with pytest.raises(TypeError, match="config_path` must be a path"):
        save_tf_checkpoint(backbone, str(tmp_path / "a" / "m.ckpt"), config_path=3)
    masked_lm = TransformerMaskedLM(_ours())
    keras_masking.correct_mlm_embeddings(masked_lm, MASK)  # tied_output="keep"
    with pytest.raises(ValueError, match="save `model.backbone`"):
        save_tf_checkpoint(masked_lm, str(tmp_path / "a" / "m.ckpt"))
    for values, message in (
        ({}, "non-empty dict"),
        ([("a", np.ones(2))], "non-empty dict"),
        ({1: np.ones(2)}, "names must be non-empty str"),
        ({"a": object()}, r"values\['a'\]` is not an array"),
    ):
        with pytest.raises(ValueError, match=message):
            write_tf_checkpoint(values, str(tmp_path / "a" / "m.ckpt"))
    with pytest.raises(TypeError, match="checkpoint_prefix` must be a path"):
        write_tf_checkpoint({"a": np.ones(2)}, None)
    assert sorted(os.listdir(tmp_path)) in ([], ["a"]) and not files_in(tmp_path / "a")


def test_resolve_checkpoint_prefix_bad_input(checkpoint, tmp_path):
    _, prefix = checkpoint
    with pytest.raises(TypeError, match="checkpoint_path` must be a path"):
        resolve_checkpoint_prefix(None)
    with pytest.raises(TypeError, match="checkpoint_path` must be a path"):
        resolve_checkpoint_prefix(b"x")
    with pytest.raises(FileNotFoundError, match="No TF checkpoint"):
        resolve_checkpoint_prefix(tmp_path / "missing.ckpt")
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "a.index").write_bytes(b"")
    (folder / "b.index").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"expected one TF checkpoint.*a\.index.*b\.index"):
        resolve_checkpoint_prefix(folder)
    assert resolve_checkpoint_prefix(pathlib.Path(prefix + ".index")) == prefix
