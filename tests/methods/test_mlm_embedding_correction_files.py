"""MLM embedding correction on files: TF checkpoints and preset folders.

A corrected copy is written beside the input, never over it; the copy loads
as corrected, so it is never corrected twice. Each bad-input case asserts the
clear message and that nothing was written.
"""

import hashlib
import os
import pathlib

import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.callbacks import MLMEmbeddingCorrection
from keras_masking.cli import main
from keras_masking.methods import correction_record
from keras_masking.methods.mlm_embedding_correction import check_mlm_correction
from keras_masking.methods.mlm_embedding_correction_files import correct_checkpoint_embeddings
from keras_masking.methods.mlm_embedding_correction_files import correct_preset_embeddings
from keras_masking.methods.mlm_embedding_correction_files import is_preset_folder
from keras_masking.models import TransformerBackbone
from keras_masking.models import from_tf_checkpoint
from keras_masking.models import load_tf_checkpoint_weights
from keras_masking.models import read_tf_checkpoint
from keras_masking.models import save_tf_checkpoint
from keras_masking.models.mlm_embedding_correction_record import read_correction_record
from tests.methods.mlm_correction_helpers import WORDS
from tests.methods.mlm_correction_helpers import files_in
from tests.methods.mlm_correction_helpers import numpy_formula
from tests.methods.mlm_correction_helpers import table_of
from tests.methods.mlm_correction_helpers import tiny_hub
from tests.methods.mlm_correction_helpers import tiny_ours
from tests.testing import load_reference
from tests.testing import tiny_backbone_kwargs
from tests.testing import write_reference_checkpoint


def _digest(folder):
    return {
        path.name: hashlib.md5(path.read_bytes()).hexdigest()
        for path in sorted(pathlib.Path(folder).iterdir())
    }


def test_checkpoint_correction_writes_a_loadable_copy(tmp_path, capsys):
    config_path, prefix, expected = write_reference_checkpoint("bert", tmp_path / "in")
    (tmp_path / "in" / "vocab.txt").write_text("[PAD]\n")
    before = _digest(tmp_path / "in")
    main(
        [
            "correct-embeddings",
            prefix,
            str(tmp_path / "out"),
            "--mask-token-id",
            "5",
            "--unselectable-token-ids",
            "0,1,2",
            "--tied-output",
            "correct",
        ]
    )
    assert _digest(tmp_path / "in") == before  # the input is never modified
    out = read_tf_checkpoint(tmp_path / "out")
    _, weights, _ = load_reference("bert")
    np.testing.assert_allclose(
        out[WORDS], numpy_formula(weights[WORDS], 5, unselectable=[0, 1, 2]), atol=1e-6
    )
    for name, value in weights.items():
        if name != WORDS:
            np.testing.assert_array_equal(out[name], value)
    assert (tmp_path / "out" / "vocab.txt").exists()
    model = from_tf_checkpoint(
        tmp_path / "out" / "bert_config.json", tmp_path / "out", with_mlm=True
    )
    assert model.count_params() > 0
    # The output loads as corrected: not corrected a second time.
    assert correction_record(model).mask_token_id == 5
    table = np.asarray(model.backbone.token_embedding.embeddings)
    assert keras_masking.correct_mlm_embeddings(model, mask_token_id=5) is None
    np.testing.assert_array_equal(np.asarray(model.backbone.token_embedding.embeddings), table)
    with pytest.raises(ValueError, match="already corrected"):
        correct_checkpoint_embeddings(tmp_path / "out", tmp_path / "again", mask_token_id=5)
    command = ["correct-embeddings", str(tmp_path / "out"), str(tmp_path / "again")]
    assert main(command + ["--mask-token-id", "5"]) == 1
    assert "already corrected" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()


def test_checkpoint_keep_refuses_tied_head_unless_dropped(tmp_path):
    _, prefix, _ = write_reference_checkpoint("nezha", tmp_path / "in")
    with pytest.raises(ValueError, match="cannot keep its original output rows"):
        correct_checkpoint_embeddings(prefix, tmp_path / "out", mask_token_id=5)
    assert not (tmp_path / "out").exists()
    main(
        [
            "correct-embeddings",
            prefix,
            str(tmp_path / "out"),
            "--mask-token-id",
            "5",
            "--drop-mlm-head",
        ]
    )
    assert not any(name.startswith("cls/") for name in read_tf_checkpoint(tmp_path / "out"))


def test_checkpoint_without_word_embeddings(tmp_path):
    _, prefix, _ = write_reference_checkpoint("bert", tmp_path / "in", drop=[WORDS])
    with pytest.raises(ValueError, match="no bert/embeddings/word_embeddings"):
        correct_checkpoint_embeddings(prefix, tmp_path / "out", mask_token_id=5)
    with pytest.raises(ValueError, match="Expected an output folder outside the input"):
        correct_checkpoint_embeddings(prefix, tmp_path / "in", mask_token_id=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_preset_folder_correction(tmp_path):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    backbone.save_to_preset(str(tmp_path / "in"))
    before = _digest(tmp_path / "in")
    table = np.asarray(backbone.token_embedding.embeddings)
    main(
        ["correct-embeddings", str(tmp_path / "in"), str(tmp_path / "out"), "--mask-token-id", "3"]
    )
    assert _digest(tmp_path / "in") == before
    corrected = TransformerBackbone.from_preset(str(tmp_path / "out"))
    np.testing.assert_allclose(
        np.asarray(corrected.token_embedding.embeddings), numpy_formula(table, 3), atol=1e-6
    )
    assert correction_record(corrected).mask_token_id == 3
    assert (tmp_path / "out" / "mlm_embedding_correction.json").exists()
    # --drop-mlm-head is the checkpoints' (a preset keeps its model): it was ignored.
    argv = ["correct-embeddings", str(tmp_path / "in"), str(tmp_path / "out2"), "--mask-token-id"]
    assert main([*argv, "3", "--drop-mlm-head"]) == 1
    assert not (tmp_path / "out2").exists()


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
    corrected = table_of(backbone)
    np.testing.assert_allclose(
        corrected, numpy_formula(original, 5, unselectable=[0, 1, 2]), atol=1e-6
    )
    # Refused a second time: by the function, the callback and the files.
    assert keras_masking.correct_mlm_embeddings(backbone, mask_token_id=5) is None
    assert not check_mlm_correction(backbone, mask_token_id=5)
    callback = MLMEmbeddingCorrection(mask_token_id=5)
    callback.set_model(backbone)
    callback.on_train_begin()
    assert callback.record is None
    np.testing.assert_array_equal(table_of(backbone), corrected)
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
    np.testing.assert_allclose(table_of(fresh), original, rtol=1e-5, atol=1e-6)
    # Loading the uncorrected checkpoint into a corrected model clears the record.
    load_tf_checkpoint_weights(backbone, prefix, strict=False)
    assert correction_record(backbone) is None
    np.testing.assert_array_equal(table_of(backbone), original)
    # ... and loading the corrected one sets it.
    load_tf_checkpoint_weights(backbone, out)
    assert correction_record(backbone).mask_token_id == 5
    del config_path


def test_corrected_keras_hub_preset_loads_as_corrected(tmp_path):
    hub = tiny_hub(keras_hub.models.BertBackbone)
    original = table_of(hub)
    hub.save_to_preset(str(tmp_path / "hub"))
    correct_preset_embeddings(tmp_path / "hub", tmp_path / "corrected", mask_token_id=5)
    backbone = TransformerBackbone.from_preset(str(tmp_path / "corrected"))
    assert correction_record(backbone).mask_token_id == 5
    np.testing.assert_allclose(table_of(backbone), numpy_formula(original, 5), rtol=1e-5, atol=1e-6)
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
    table = table_of(masked_lm)
    assert keras_masking.correct_mlm_embeddings(masked_lm, mask_token_id=5) is None
    np.testing.assert_array_equal(table_of(masked_lm), table)


def test_non_finite_checkpoint_table_is_refused_and_nothing_is_written(tmp_path):
    bad = np.random.default_rng(0).normal(size=(128, 32)).astype("float32")
    bad[100] = -np.inf
    _, prefix, _ = write_reference_checkpoint("bert", tmp_path / "in", extra={WORDS: bad})
    with pytest.raises(ValueError, match=r"word_embeddings.*1 of 128 rows \(first: row 100\)"):
        correct_checkpoint_embeddings(prefix, tmp_path / "out", mask_token_id=5, drop_mlm_head=True)
    assert files_in(tmp_path / "out") is None
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


CHECKPOINT_BAD = [
    ({"mask_token_id": 128}, r"Expected mask_token_id in \[0, 128\)"),
    ({"mask_token_id": 2.5}, "Expected an integer for mask_token_id"),
    ({"mask_rate": 1.5}, r"Expected mask_rate in \[0.0, 1.0\]"),
    ({"mask_rate": "0.1"}, "Expected a number for mask_rate"),
    ({"unselectable_token_ids": [0, 500]}, r"unselectable_token_ids in \[0, 127\].*500"),
    ({"tied_output": "both"}, "Expected one of 'keep', 'correct' for tied_output"),
    ({"drop_mlm_head": "yes"}, "Expected True or False for drop_mlm_head"),
    ({"tied_output": "keep", "drop_mlm_head": False}, "cannot keep its original output rows"),
    ({"output_dir": "INPUT"}, "Expected an output folder outside the input"),
    ({"output_dir": "INSIDE"}, "Expected an output folder outside the input"),
    ({"output_dir": "NONEMPTY"}, "exists and is not empty"),
    ({"output_dir": "FILE"}, "exists and is a file"),
    ({"output_dir": None}, r"Expected a path \(str or os.PathLike\) for output_dir"),
    ({"checkpoint_path": 7}, r"Expected a path \(str or os.PathLike\) for checkpoint_path"),
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
        "INSIDE": tmp_path / "in" / "corrected",
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
    tiny_ours().save_to_preset(str(tmp_path / "preset"))
    before = files_in(tmp_path / "preset")
    cases = [
        ({}, TypeError, "missing 1 required keyword-only argument: 'mask_token_id'"),
        (
            {"mask_token_id": 3, "mask_probability": 0.1},
            TypeError,
            r"Unknown masking settings \['mask_probability'\]",
        ),
        ({"mask_token_id": 3, "mask_rate": -1}, ValueError, r"Expected mask_rate in \[0.0, 1.0\]"),
        ({"mask_token_id": 64}, ValueError, r"Expected mask_token_id in \[0, 64\)"),
        (
            {"mask_token_id": 3, "tied_output": 1},
            ValueError,
            "Expected one of 'keep', 'correct' for tied_output",
        ),
        (
            {"mask_token_id": 3, "output_dir": "same"},
            ValueError,
            "Expected an output folder outside the input",
        ),
        # Inside the input: the input was modified, and the output held a copy
        # of its own temporary folder.
        (
            {"mask_token_id": 3, "output_dir": "inside"},
            ValueError,
            "Expected an output folder outside the input",
        ),
        ({"mask_token_id": 3, "preset_dir": "nothing"}, ValueError, "not a preset folder"),
        ({"mask_token_id": 3, "preset_dir": 5}, TypeError, "Expected a path .* for preset_dir"),
    ]
    for kwargs, error, message in cases:
        kwargs = dict(kwargs)
        preset = kwargs.pop("preset_dir", tmp_path / "preset")
        preset = tmp_path / preset if isinstance(preset, str) else preset
        output = kwargs.pop("output_dir", "out")
        places = {"same": tmp_path / "preset", "inside": tmp_path / "preset" / "sub"}
        output = places.get(output, tmp_path / output)
        with pytest.raises(error, match=message):
            correct_preset_embeddings(preset, output, **kwargs)
        assert files_in(tmp_path / "preset") == before
        assert sorted(os.listdir(tmp_path)) == ["preset"]
    assert len(cases) == 9


def test_is_preset_folder_bad_input():
    with pytest.raises(TypeError, match=r"Expected a path \(str or os.PathLike\) for path"):
        is_preset_folder(None)


def test_a_pruned_checkpoint_is_corrected_with_the_full_tables_mean(tmp_path, caplog):
    """bert_config.json's pruned_from holds the mean of the table the random tokens were
    drawn from: the files path used the pruned table's own (0.06 off the in-memory one)."""
    mean = np.linspace(-1.0, 1.0, 32).tolist()
    pruned_from = {"vocabulary_size": 500, "token_embedding_mean": mean}
    backbone = TransformerBackbone(**tiny_backbone_kwargs(pruned_from=pruned_from))
    save_tf_checkpoint(backbone, str(tmp_path / "in" / "bert_model.ckpt"))
    correct_checkpoint_embeddings(tmp_path / "in", tmp_path / "out", mask_token_id=3)
    keras_masking.correct_mlm_embeddings(backbone, mask_token_id=3)
    np.testing.assert_allclose(read_tf_checkpoint(tmp_path / "out")[WORDS], table_of(backbone),
                               atol=1e-6)  # fmt: skip
    # Its config written elsewhere, the record cannot be read: said, not silent.
    (tmp_path / "in" / "bert_config.json").rename(tmp_path / "config.json")
    with caplog.at_level("WARNING", logger="keras_masking"):
        correct_checkpoint_embeddings(tmp_path / "in", tmp_path / "out2", mask_token_id=3)
    assert "no bert_config.json beside the checkpoint" in caplog.text


def test_only_the_named_checkpoint_of_a_folder_is_copied_and_marked_corrected(tmp_path, caplog):
    """A pretraining folder holds model.ckpt-100 and model.ckpt-200: the uncorrected
    other one was copied, and the folder's record marked it corrected."""
    for step in (100, 200):
        save_tf_checkpoint(tiny_ours(), str(tmp_path / f"run{step}" / f"model.ckpt-{step}"))
    (tmp_path / "in").mkdir()
    for step in (100, 200):
        for path in (tmp_path / f"run{step}").glob("model.ckpt-*"):
            path.rename(tmp_path / "in" / path.name)
    (tmp_path / "run100" / "bert_config.json").rename(tmp_path / "in" / "bert_config.json")
    with caplog.at_level("WARNING", logger="keras_masking"):
        correct_checkpoint_embeddings(
            tmp_path / "in" / "model.ckpt-200", tmp_path / "out", mask_token_id=3
        )
    assert sorted(os.listdir(tmp_path / "out")) == [
        "bert_config.json", "checkpoint", "mlm_embedding_correction.json",
        "model.ckpt-200.data-00000-of-00001", "model.ckpt-200.index",
    ]  # fmt: skip
    assert "model.ckpt-100.index" in caplog.text


@pytest.mark.parametrize("task", ["masked_lm", "classifier", "keras_hub_masked_lm"])
def test_a_preset_holding_a_task_is_corrected(task, tmp_path):
    """keras-hub refuses Task.from_preset: every preset with a task.json failed."""
    backbone = tiny_ours()
    if task == "masked_lm":
        model = keras_masking.models.TransformerMaskedLM(backbone)
    elif task == "classifier":
        model = keras_masking.models.TransformerTextClassifier(backbone, num_classes=2)
    else:
        model = keras_hub.models.BertMaskedLM(tiny_hub(keras_hub.models.BertBackbone))
    table = table_of(model)
    model.save_to_preset(str(tmp_path / "in"))
    correct_preset_embeddings(
        tmp_path / "in", tmp_path / "out", mask_token_id=3, tied_output="correct"
    )
    loaded = type(model).from_preset(str(tmp_path / "out"))
    np.testing.assert_allclose(table_of(loaded), numpy_formula(table, 3), atol=1e-6)
