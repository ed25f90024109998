"""keras_masking.clue.finetune and `keras-masking clue`, end to end on a tiny model."""

import json
import os
import shutil
import zipfile

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.cli import main
from keras_masking.clue import check_submission
from keras_masking.clue import finetune
from keras_masking.clue import read_split
from keras_masking.clue.decoding import decode_predictions
from keras_masking.clue.decoding import score
from keras_masking.clue.encoding import encode_examples
from keras_masking.clue.run_folder import RunFolder
from tests.clue import fixtures as clue_fixtures
from tests.clue.helpers import VOCABULARY

# On TensorFlow without XLA, whose compile costs more than these tiny runs
# (the runs from the command line, each kind below, and the resumed run
# compile with XLA); on JAX with XLA, its fast path.
SETTINGS = dict(
    epochs=2,
    batch_size=4,
    max_length=24,
    learning_rate=3e-3,
    jit_compile=keras.config.backend() != "tensorflow",
)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return clue_fixtures.tiny_preset(
        tmp_path_factory.mktemp("model") / "preset", max_sequence_length=64
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    for write in clue_fixtures.WRITERS.values():
        write(root)
    return root


def _weights(model):
    return [np.asarray(v.numpy()) for v in model.weights]


def _cli(task, data, output, preset, *extra, **settings):
    options = {**SETTINGS, **settings}
    argv = ["clue", task, str(data), str(output)]
    argv += ["--preset", str(preset), "--quiet"]
    argv += ["--epochs", str(options["epochs"]), "--batch-size", str(options["batch_size"])]
    argv += ["--max-length", str(options["max_length"]), "--lr", str(options["learning_rate"])]
    argv += [] if options["jit_compile"] else ["--no-jit-compile"]
    return main(argv + list(extra))


# === One task of each kind, from the command line ===
KINDS = {
    "eprstmt": ("eprstmt_predict.json", "fewclue", 24),
    "c3": ("c311_predict.json", "clue", 48),
    "chid": ("chidf_predict.json", "fewclue", 24),
    "cmrc2018": ("cmrc2018_predict.json", "clue", 48),
    "cluener": ("cluener_predict.json", "clue", 24),
}


@pytest.fixture(scope="module")
def cli_runs(data, preset, tmp_path_factory):
    """Every kind's run through `keras-masking clue`: {task: (exit code, output, folder)}."""
    runs = tmp_path_factory.mktemp("runs")
    done = {}
    for task, (_, _, max_length) in KINDS.items():
        # One kind compiles with XLA from the command line on TensorFlow too.
        xla = SETTINGS["jit_compile"] or task == "eprstmt"
        code = _cli(task, data, runs / task, preset, max_length=max_length, epochs=1,
                    jit_compile=xla)  # fmt: skip
        done[task] = code
    return runs, done


@pytest.mark.parametrize("task", sorted(KINDS))
def test_each_kind_runs_from_the_command_line_to_a_valid_submission(task, cli_runs, data):
    runs, codes = cli_runs
    submission, benchmark, _ = KINDS[task]
    output = runs / task
    assert codes[task] == 0
    record = json.loads((output / "run.json").read_text(encoding="utf-8"))
    assert record["status"] == "finished" and record["failure"] is None
    assert record["arguments"]["task"] == task and record["arguments"]["benchmark"] == benchmark
    assert record["submission"] == submission
    assert len(record["epochs"]) == 1 and record["best"]["epoch"] == 1
    assert record["best"]["score"] == record["epochs"][0]["dev"]["score"]
    assert record["epochs"][0]["dev"]["metric"] == keras_masking.clue.get_task(task).metric
    train = record["data"]["train"]
    assert train["examples"] > 0 and all(len(f["sha256"]) == 64 for f in train["files"])
    assert record["versions"]["backend"] == keras.config.backend()
    assert record["compile"]["jit_compile"] == (SETTINGS["jit_compile"] or task == "eprstmt")
    test = read_split(data, task, "test")
    assert check_submission(output / submission, task, benchmark, test) == []
    assert not [name for name in os.listdir(output) if ".partial" in name]


@pytest.fixture(scope="module")
def plain_run(data, preset, tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain") / "run"
    return finetune("eprstmt", data, folder, preset=preset, verbose=0, **SETTINGS)


def test_reported_scores_are_those_of_the_returned_model(plain_run, data):
    result = plain_run
    tokenizer = keras_masking.data.bert_tokenizer(VOCABULARY)
    for split, reported in (("dev", result.best_score), ("test_public", result.test_public)):
        examples = read_split(data, "eprstmt", split).examples
        encoded = encode_examples("eprstmt", examples, tokenizer, SETTINGS["max_length"])
        logits = result.model.predict(encoded.features, verbose=0)
        scores = score(
            "eprstmt", decode_predictions("eprstmt", logits, encoded, examples), examples
        )
        expected = reported if split == "dev" else reported["score"]
        assert scores["score"] == pytest.approx(expected)
    best = max(result.history, key=lambda entry: entry["dev"]["score"])
    assert result.best_epoch == best["epoch"]
    # The submission holds the returned model's test predictions, as label strings.
    test = read_split(data, "eprstmt", "test").examples
    encoded = encode_examples("eprstmt", test, tokenizer, SETTINGS["max_length"])
    predicted = decode_predictions(
        "eprstmt", result.model.predict(encoded.features, verbose=0), encoded, test
    )
    lines = result.submission_path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"id": example.id, "label": predicted[example.id]} for example in test
    ]


def test_a_noised_dev_is_scored_every_epoch_and_chooses_nothing(plain_run, data, preset, tmp_path):
    result = finetune(
        "eprstmt", data, tmp_path / "run", preset=preset, verbose=0, dev_noise=0.5, **SETTINGS
    )
    # The same training as without noise: the noised dev only adds scores.
    assert [entry["dev"] for entry in result.history] == [
        entry["dev"] for entry in plain_run.history
    ]
    assert result.best_epoch == plain_run.best_epoch
    assert result.record["arguments"]["dev_noise"] == 0.5
    assert "dev_noise" not in plain_run.record["arguments"]  # earlier runs still resume
    # Each epoch's noised score is that of its saved predictions on the noised texts.
    dev = read_split(data, "eprstmt", "dev").examples
    noised = keras_masking.clue.add_character_noise(dev, 0.5, seed=0)
    assert [example.text_a for example in noised] != [example.text_a for example in dev]
    folder = RunFolder(tmp_path / "run")
    for entry in result.history:
        predictions = folder.read_dev_predictions(entry["epoch"], "dev_noised")
        assert entry["dev_noised"] == score("eprstmt", predictions, dev)
        assert set(entry["train_metrics"]) == set(plain_run.history[0]["train_metrics"])
    # ... and the best epoch's are the returned model's on the noised texts.
    tokenizer = keras_masking.data.bert_tokenizer(VOCABULARY)
    encoded = encode_examples("eprstmt", noised, tokenizer, SETTINGS["max_length"])
    logits = result.model.predict(encoded.features, verbose=0)
    assert decode_predictions("eprstmt", logits, encoded, noised) == folder.read_dev_predictions(
        result.best_epoch, "dev_noised"
    )


@pytest.mark.parametrize(
    "task, dev_noise, message",
    [
        ("eprstmt", 1.5, r"dev_noise in \[0.0, 1.0\]"),
        ("cmrc2018", 0.1, "dev_noise applies to text classification"),
    ],
)
def test_bad_dev_noise_is_refused_before_loading(task, dev_noise, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        finetune(task, tmp_path / "no_data", tmp_path / "run", preset=tmp_path / "none",
                 dev_noise=dev_noise)  # fmt: skip
    assert not (tmp_path / "run").exists()


# === Resuming ===
class _Interrupt(keras.callbacks.Callback):
    """Raises KeyboardInterrupt after the first batch of epoch ``epoch`` (from 0)."""

    def __init__(self, epoch=None):
        super().__init__()
        self.epoch, self.current, self.ended = epoch, None, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch:
            raise KeyboardInterrupt

    def on_epoch_end(self, epoch, logs=None):
        self.ended += 1


# DropToken (attention mode, as ASA needs), ASA and the embedding correction
# together: their random draws and their evidence must survive a resume.
# Under XLA, as `keras-masking clue` runs them.
RESUMED = dict(SETTINGS, drop_token=0.3, asa=0.5, correct_embeddings=True, jit_compile=True)


@pytest.fixture(scope="module")
def interrupted(data, preset, tmp_path_factory):
    """A run stopped inside its second epoch (after its weights changed)."""
    folder = tmp_path_factory.mktemp("interrupted") / "run"
    with pytest.raises(KeyboardInterrupt):
        finetune(
            "eprstmt", data, folder, preset=preset, verbose=0, callbacks=[_Interrupt(1)], **RESUMED
        )
    return folder


def test_an_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one(
    interrupted, data, preset, tmp_path
):
    record = json.loads((interrupted / "run.json").read_text(encoding="utf-8"))
    assert record["status"] == "running" and len(record["epochs"]) == 1
    cut = tmp_path / "cut"
    shutil.copytree(interrupted, cut)
    resumed = finetune("eprstmt", data, cut, preset=preset, verbose=0, **RESUMED)
    whole = finetune("eprstmt", data, tmp_path / "whole", preset=preset, verbose=0, **RESUMED)
    assert [e["loss"] for e in resumed.history] == [e["loss"] for e in whole.history]
    for actual, expected in zip(_weights(resumed.model), _weights(whole.model)):
        np.testing.assert_array_equal(actual, expected)
    name = "eprstmt_predict.json"
    assert (cut / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    # Every method shows it is on.
    for entry in resumed.history:
        assert 0.0 < entry["methods"]["drop_share"] < 0.6
        assert 0.0 <= entry["methods"]["masked_fraction"] <= 1.0
        assert "masked_fraction_0" in entry["methods"]
    assert resumed.record["methods"] == ["correct_embeddings", "drop_token", "asa"]
    assert resumed.record["model"]["embedding_correction"]["corrected_rows"] > 0
    # The backbone's config as trained, corrected, in both records (a new run's
    # was taken before its fit corrected the table: None there).
    assert resumed.record["model"] == whole.record["model"]
    assert whole.record["model"]["backbone"]["mlm_embedding_correction"]["corrected_rows"] > 0


def test_a_finished_run_is_not_redone_and_other_arguments_are_refused(plain_run, data, preset):
    first = plain_run
    folder = first.record_path.parent
    modified = first.record_path.stat().st_mtime_ns
    counter = _Interrupt()
    again = finetune(
        "eprstmt", data, folder, preset=preset, verbose=0, callbacks=[counter], **SETTINGS
    )
    assert counter.ended == 0  # no epoch was trained
    assert first.record_path.stat().st_mtime_ns == modified
    assert again.best_score == first.best_score
    for actual, expected in zip(_weights(again.model), _weights(first.model)):
        np.testing.assert_array_equal(actual, expected)
    with pytest.raises(
        ValueError,
        match=r"other arguments \(epochs: 2 there, 3 now; "
        r"learning_rate: 0.003 there, 0.001 now\)",
    ):
        finetune(
            "eprstmt", data, folder, preset=preset, verbose=0,
            **dict(SETTINGS, epochs=3, learning_rate=1e-3),
        )  # fmt: skip
    assert first.record_path.stat().st_mtime_ns == modified


def test_a_resume_under_another_set_up_is_refused(
    interrupted, data, preset, tmp_path, restore_policy
):
    """A resume without XLA, on another backend, another package version or
    another data-parallel engine was accepted, and run.json then named only
    the new set-up (resumed without XLA, the weights ended 0.1 from either
    uninterrupted run's). So was one under mixed_bfloat16 (the weights 0.007
    from the uninterrupted run's); under mixed_float16 the resume state's
    variable count was blamed on "other arguments"."""
    kwargs = dict(preset=preset, verbose=0, **RESUMED)
    folder = tmp_path / "jit"
    shutil.copytree(interrupted, folder)
    with pytest.raises(ValueError, match=r"another set-up \(jit_compile: True there, False now\)"):
        finetune("eprstmt", data, folder, **dict(kwargs, jit_compile=False))
    for policy in ("mixed_bfloat16", "mixed_float16"):
        keras.mixed_precision.set_global_policy(policy)
        with pytest.raises(ValueError, match=f"dtype_policy: 'float32' there, '{policy}' now"):
            finetune("eprstmt", data, folder, **kwargs)
    keras.mixed_precision.set_global_policy("float32")
    folder = tmp_path / "backend"
    shutil.copytree(interrupted, folder)
    record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    record["keras_masking"], record["versions"]["backend"] = "0.0.1", "other"
    record["distribution"]["replicas"] = 8
    (folder / "run.json").write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        finetune("eprstmt", data, folder, **kwargs)
    for name, value in (("keras_masking", "'0.0.1'"), ("backend", "'other'"), ("distribution", "")):
        assert f"{name}: {value}" in str(refused.value)
    assert json.loads((folder / "run.json").read_text(encoding="utf-8")) == record  # untouched


def test_a_finished_run_checks_its_files_and_writes_a_removed_submission_again(tmp_path):
    """Other data files that the reader now prefers, or model files with other
    bytes (a parameter-efficient run reads its frozen weights from them again),
    were accepted; a removed submission file was reported but never written."""
    clue_fixtures.eprstmt(tmp_path, train=8, dev=4)
    data, preset = tmp_path / "eprstmt", tmp_path / "preset"  # the task's files at the top
    clue_fixtures.tiny_preset(preset, max_sequence_length=64)
    folder = tmp_path / "run"
    kwargs = dict(preset=preset, verbose=0, **dict(SETTINGS, epochs=1, fl_tuning=4))
    first = finetune("eprstmt", data, folder, **kwargs)
    written = first.submission_path.read_bytes()
    first.submission_path.unlink()
    again = finetune("eprstmt", data, folder, **kwargs)
    assert again.submission_path.read_bytes() == written

    config = preset / "config.json"
    original = config.read_bytes()
    config.write_bytes(original + b"\n")
    with pytest.raises(ValueError, match=r"model files changed since .*config\.json"):
        finetune("eprstmt", data, folder, **kwargs)
    config.write_bytes(original)
    shutil.copytree(data, tmp_path / "copy")
    shutil.move(tmp_path / "copy", data / "eprstmt")  # a task folder: read first
    with pytest.raises(ValueError, match=r"train is read from .*eprstmt.*; the run in"):
        finetune("eprstmt", data, folder, **kwargs)


def test_corrupt_or_foreign_run_folders_are_errors_never_a_fresh_start(
    interrupted, data, preset, tmp_path
):
    kwargs = dict(preset=preset, verbose=0, **RESUMED)
    folder = tmp_path / "run"
    shutil.copytree(interrupted, folder)
    state = folder / "resume_state.npz"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"resume_state.npz: a corrupt resume state file"):
        finetune("eprstmt", data, folder, **kwargs)
    (folder / "run.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"run.json: a corrupt run record"):
        finetune("eprstmt", data, folder, **kwargs)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files but no run.json"):
        finetune("eprstmt", data, foreign, **kwargs)
    assert sorted(os.listdir(foreign)) == ["notes.txt"]


class _PoisonWeights(keras.callbacks.Callback):
    """Makes every weight NaN when the second epoch begins."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            for variable in self.model.trainable_variables:
                variable.assign(np.full(variable.shape, np.nan, variable.dtype))


def test_a_nan_loss_stops_the_run_records_why_and_keeps_the_best_weights(data, preset, tmp_path):
    result = finetune(
        "eprstmt", data, tmp_path / "run", preset=preset, verbose=0,
        callbacks=[_PoisonWeights()], **dict(SETTINGS, epochs=3),
    )  # fmt: skip
    assert result.status == "failed"
    assert "loss became nan in epoch 2" in result.record["failure"]
    assert len(result.history) == 1 and result.best_epoch == 1
    assert all(np.isfinite(w).all() for w in _weights(result.model))
    assert result.submission_path.is_file()  # from the best (finite) weights
    record = json.loads(result.record_path.read_text(encoding="utf-8"))
    assert record["status"] == "failed"


class _Updates(keras.callbacks.Callback):
    """Whether each epoch moved the trainable weights, the updates after it, its dev score."""

    def __init__(self):
        super().__init__()
        self.moved, self.moved_embeddings, self.updates, self.dev_scores = [], [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.before = [np.array(v.numpy()) for v in self.model.trainable_variables]

    def on_epoch_end(self, epoch, logs=None):
        after = [np.array(v.numpy()) for v in self.model.trainable_variables]
        self.moved.append(any(not np.array_equal(a, b) for a, b in zip(self.before, after)))
        self.moved_embeddings.append(
            any(
                not np.array_equal(a, b)
                for v, a, b in zip(self.model.trainable_variables, self.before, after)
                if v.path.endswith("token_embedding/embeddings")
            )
        )
        self.updates.append(int(self.model.optimizer.iterations))
        self.dev_scores.append(logs["dev_score"])


def test_accumulation_over_more_batches_than_an_epoch_has_still_updates(data, preset, tmp_path):
    # 16 training examples: 2 batches of 8 per epoch, accumulation 3. Every
    # epoch ends on an update (its last group completed from its order).
    batch_size, epochs = 8, 2
    updates = _Updates()
    result = finetune(
        "eprstmt", data, tmp_path / "run", preset=preset, verbose=0, callbacks=[updates],
        **dict(SETTINGS, batch_size=batch_size, epochs=epochs, accumulation=3),
    )  # fmt: skip
    assert result.status == "finished"
    assert updates.moved == [True] * epochs
    assert updates.moved_embeddings == [True] * epochs  # the token embeddings train too
    assert updates.updates == list(range(1, epochs + 1))
    # Callbacks of the run see each epoch's dev score in the logs.
    assert updates.dev_scores == [entry["dev"]["score"] for entry in result.history]
    assert result.record["schedule"] == {
        "batches_per_epoch": 3,
        "updates_per_epoch": 1,
        "updates": epochs,
    }


def test_exlm_on_a_backbone_without_its_positions_is_refused_before_anything_is_written(
    data, preset, tmp_path
):
    with pytest.raises(ValueError, match="--exlm-k needs an ExLM-pretrained backbone"):
        finetune("eprstmt", data, tmp_path / "run", preset=preset, exlm_k=2, **SETTINGS)
    assert not (tmp_path / "run").exists()


def test_a_run_or_compare_inside_its_preset_is_refused_before_anything_is_written(data, preset):
    """A run written into its preset's folder finished, then could never be run
    again, resumed or exported: its own files changed the preset's files that
    its record holds ("The model files changed since the run began")."""
    import pathlib

    from keras_masking.clue import compare

    before = sorted(pathlib.Path(preset).rglob("*"))
    with pytest.raises(ValueError, match="is the preset .* or inside it"):
        finetune("eprstmt", data, pathlib.Path(preset) / "run", preset=preset, **SETTINGS)
    with pytest.raises(ValueError, match="is the preset .* or inside it"):
        compare("eprstmt", data, preset, ["plain"], seeds=[0], preset=preset, **SETTINGS)
    assert sorted(pathlib.Path(preset).rglob("*")) == before


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="the refusal is TensorFlow's (tf.distribute)"
)
def test_accumulation_data_parallel_on_tensorflow_is_refused_before_anything_is_written(
    data, preset, tmp_path
):
    with pytest.raises(ValueError, match="accumulation=2 cannot run data parallel"):
        finetune("eprstmt", data, tmp_path / "run", preset=preset, data_parallel=True,
                 **dict(SETTINGS, accumulation=2))  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_diverging_run_fails_on_the_command_line_without_a_submission(
    data, preset, tmp_path, capsys
):
    output = tmp_path / "run"
    capsys.readouterr()
    assert _cli("eprstmt", data, output, preset, learning_rate=1e3, epochs=2) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("keras-masking clue: failed: the training loss diverged in epoch 1")
    record = json.loads((output / "run.json").read_text(encoding="utf-8"))
    assert record["status"] == "failed" and "diverged in epoch 1" in record["failure"]
    assert record["epochs"] == [] and record["best"] is None and "submission" not in record
    assert "no epoch finished, so no submission was written" in record["failure"]
    assert 0.1 < record["initial_loss"] < 2.0  # about ln 2: two labels
    assert not (output / "eprstmt_predict.json").exists()


class _PoisonOneWeightAtEnd(keras.callbacks.Callback):
    """Makes one weight infinite after the second epoch's last batch."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == self.params["steps"] - 1:
            variable = self.model.trainable_variables[-1]
            variable.assign(np.full(variable.shape, np.inf, variable.dtype))


def test_non_finite_weights_fail_the_run_even_when_the_loss_was_finite(data, preset, tmp_path):
    result = finetune(
        "eprstmt", data, tmp_path / "run", preset=preset, verbose=0,
        callbacks=[_PoisonOneWeightAtEnd()], **dict(SETTINGS, epochs=2),
    )  # fmt: skip
    assert result.status == "failed"
    assert "1 weight(s) became non-finite in epoch 2" in result.record["failure"]
    assert len(result.history) == 1 and result.best_epoch == 1
    assert all(np.isfinite(w).all() for w in _weights(result.model))


def test_a_deleted_resume_state_is_refused_not_restarted(interrupted, data, preset, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(interrupted, folder)
    (folder / "resume_state.npz").unlink()

    def contents():
        return {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}

    before = contents()
    with pytest.raises(
        ValueError, match=r"records 1 finished epoch\(s\) but resume_state.npz is missing"
    ):
        finetune("eprstmt", data, folder, preset=preset, verbose=0, **RESUMED)
    assert contents() == before
    (folder / "best_weights.npz").unlink()
    with pytest.raises(ValueError, match=r"resume_state.npz and best_weights.npz is missing"):
        finetune("eprstmt", data, folder, preset=preset, verbose=0, **RESUMED)


def test_an_interrupted_command_says_what_it_kept(
    interrupted, data, preset, tmp_path, capsys, monkeypatch
):
    folder = tmp_path / "run"
    shutil.copytree(interrupted, folder)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(keras_masking.clue, "finetune", interrupt)
    capsys.readouterr()
    assert _cli("eprstmt", data, folder, preset) == 130
    kept = capsys.readouterr().err.strip()
    assert _cli("eprstmt", data, tmp_path / "new", preset) == 130
    nothing = capsys.readouterr().err.strip()
    assert "no output was written" not in kept
    assert kept == (
        f"keras-masking clue: interrupted; kept {folder}: run.json and the resume state after "
        "epoch 1 of 2; run the same command to resume."
    )
    assert nothing == "keras-masking clue: interrupted; no output was written."


def test_a_full_disk_during_a_run_names_the_file(data, preset, tmp_path, capsys, monkeypatch):
    from keras_masking.clue import run_folder

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    # The run record is the first file a run writes (before it trains).
    monkeypatch.setattr(run_folder.json, "dump", full)
    capsys.readouterr()
    assert _cli("eprstmt", data, tmp_path / "run", preset, epochs=1) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("keras-masking clue: error: [Errno 28] No space left on device: ")
    assert error.endswith(f"{tmp_path / 'run' / 'run.json'}'")
    assert os.listdir(tmp_path / "run") == []
    # Inside np.savez (the weights), and when open() fails on the temporary name.
    monkeypatch.setattr(run_folder.np, "savez", full)
    with pytest.raises(OSError, match=r"No space left on device: '.*best_weights\.npz'"):
        run_folder.RunFolder(tmp_path / "run").save_best([keras.Variable([1.0])], 1, 50.0)

    def no_permission(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr("builtins.open", no_permission)
    with pytest.raises(PermissionError, match=r"Permission denied: '.*run\.json'"):
        run_folder.RunFolder(tmp_path / "run").write_record({})
    assert os.listdir(tmp_path / "run") == []


# === Runs on CLUE's official layouts ===
@pytest.mark.slow
def test_a_run_writes_both_test_files_and_records_what_reading_changed(tmp_path):
    preset = clue_fixtures.tiny_preset(tmp_path / "preset", max_sequence_length=32)
    settings = dict(epochs=1, batch_size=2, max_length=16, learning_rate=1e-3, verbose=0)
    # TNEWS with CLUE 1.0's test file beside 1.1's: CLUE's baselines submit both.
    folder = tmp_path / "data" / "tnews"
    clue_fixtures.write_lines(
        folder / "train.json",
        [{"sentence": "很好", "label": "100"}, {"sentence": "不", "label": "101"}],
    )
    clue_fixtures.write_lines(folder / "dev.json", [{"sentence": "好", "label": "100"}])
    clue_fixtures.write_lines(folder / "test1.0.json", [{"id": 7, "sentence": "好"}])
    clue_fixtures.write_lines(folder / "test1.1.json", [{"id": 0, "sentence": "不好"}])
    finetune("tnews", tmp_path / "data", tmp_path / "tnews_run", preset=preset, **settings)
    record = json.loads((tmp_path / "tnews_run" / "run.json").read_text(encoding="utf-8"))
    assert (record["submission"], record["submission_1.0"]) == (
        "tnews11_predict.json",
        "tnews10_predict.json",
    )
    lines = (tmp_path / "tnews_run" / "tnews10_predict.json").read_text(encoding="utf-8")
    assert json.loads(lines)["id"] == 7
    # CMRC2018: an answer_start of -1 whose text is nowhere in the context is counted.
    context = "北京是中国的首都。"
    qas = [
        {"id": "Q0", "question": "首都？", "answers": [{"text": "北京", "answer_start": 0}]},
        {"id": "Q1", "question": "哪国？", "answers": [{"text": "中国", "answer_start": 5}]},
        {"id": "Q2", "question": "何处？", "answers": [{"text": "上海。", "answer_start": -1}]},
    ]
    document = {"data": [{"paragraphs": [{"id": "P", "context": context, "qas": qas}]}]}
    for split in ("train", "dev"):
        clue_fixtures.write_json(tmp_path / "data" / "cmrc2018" / f"{split}.json", document)
    finetune("cmrc2018", tmp_path / "data", tmp_path / "cmrc_run", preset=preset, **settings)
    record = json.loads((tmp_path / "cmrc_run" / "run.json").read_text(encoding="utf-8"))
    train, dev = record["data"]["train"], record["data"]["dev"]
    assert (train["examples"], dev["examples"]) == (2, 3)  # Q2 is scored, not trained on
    assert train["counts"] == {
        "answers": 3,
        "answers_relocated": 1,
        "answers_unplaced": 1,
        "questions_unplaced": 1,
        "questions_dropped": 1,
    }
    assert dev["counts"]["answers_unplaced"] == 1 and "questions_dropped" not in dev["counts"]


def test_the_run_record_holds_what_reading_changed(tmp_path):
    from keras_masking.clue.runner import _split_record

    qas = [{"id": "Q", "question": "何处？", "answers": [{"text": "北京", "answer_start": 3}]}]
    document = {"data": [{"paragraphs": [{"context": "在北京", "qas": qas}]}]}
    path = tmp_path / "cmrc2018" / "dev.json"
    path.parent.mkdir()
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    record = _split_record(read_split(tmp_path, "cmrc2018", "dev"))
    assert record["counts"] == {
        "answers": 1,
        "answers_relocated": 1,
        "answers_unplaced": 0,
        "questions_unplaced": 0,
    }


def test_large_classification_splits_are_encoded_in_chunks_alike(data, monkeypatch):
    from keras_masking.clue import runner

    splits = {"train": read_split(data, "eprstmt", "train")}
    settings = {"max_length": SETTINGS["max_length"], "stride": None}
    tokenizer = keras_masking.data.bert_tokenizer(VOCABULARY)
    whole = runner._encode_splits(runner.get_task("eprstmt"), splits, tokenizer, settings, 0)
    monkeypatch.setattr(runner, "ENCODE_CHUNK", 5)  # 16 examples: chunks of 5, 5, 5, 1
    chunked = runner._encode_splits(runner.get_task("eprstmt"), splits, tokenizer, settings, 0)
    for key, value in whole["train"].features.items():
        np.testing.assert_array_equal(chunked["train"].features[key], value)
    np.testing.assert_array_equal(chunked["train"].labels, whole["train"].labels)
    assert chunked["train"].meta.keys() == whole["train"].meta.keys()
    for key, value in whole["train"].meta.items():
        assert list(np.ravel(chunked["train"].meta[key])) == list(np.ravel(value)), key


# === Methods ===
def test_parameter_efficient_runs_train_only_their_parameters(data, preset, tmp_path):
    kwargs = dict(preset=preset, verbose=0, **dict(SETTINGS, epochs=1))
    fl = finetune("eprstmt", data, tmp_path / "fl", fl_tuning=8, **kwargs)
    hidden = 16
    add_ffn = 1 * (2 * hidden * 8 + 8 + hidden)  # one layer: W1', b1', W2', b2'
    head = hidden * 2 + 2
    assert fl.record["model"]["trainable_parameters"] == add_ffn + head
    assert fl.history[0]["methods"]["trainable_parameters"] == add_ffn + head
    best = np.load(fl.record_path.parent / "best_weights.npz")
    assert sum(best[name].size for name in best.files if name != "manifest") == add_ffn + head
    lora = finetune("eprstmt", data, tmp_path / "lora", lora=2, **kwargs)
    total = lora.record["model"]["total_parameters"]
    assert head < lora.record["model"]["trainable_parameters"] < total / 4


@pytest.mark.parametrize(
    "methods, message",
    [
        (dict(exlm_k=4, drop_token=0.1), "--exlm-k and --drop-token do not combine"),
        (dict(exlm_k=4, correct_embeddings=True), "--exlm-k and --correct-embeddings"),
        (dict(exlm_k=4, asa=0.5), "--exlm-k and --asa do not combine"),
        (dict(fl_tuning=8, lora=4), "--fl-tuning and --lora do not combine"),
        (dict(prefix_tuning=8, fl_tuning=8), "--fl-tuning and --prefix-tuning"),
        (dict(drop_token=1.0), r"drop_token in \[0.0, 1.0\)"),
        (dict(fl_tuning=2.5), "fl_tuning"),
    ],
)
def test_combinations_that_make_no_sense_are_refused_before_loading(methods, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        # The preset and data do not exist: the refusal comes first.
        finetune("eprstmt", tmp_path / "no_data", tmp_path / "run", preset=tmp_path / "none",
                 **methods)  # fmt: skip
    assert not (tmp_path / "run").exists()


# === Bad models and vocabularies ===
def test_a_vocabulary_that_does_not_fit_the_model_is_refused(data, tmp_path):
    small = clue_fixtures.tiny_preset(tmp_path / "small", vocabulary_size=len(VOCABULARY) - 1)
    with pytest.raises(
        ValueError,
        match=rf"has {len(VOCABULARY)} tokens but the model "
        rf"{len(VOCABULARY) - 1}",
    ):
        finetune("eprstmt", data, tmp_path / "a", preset=small, **SETTINGS)  # fmt: skip
    other = tmp_path / "vocab.txt"
    other.write_text("\n".join(reversed(VOCABULARY)) + "\n", encoding="utf-8")
    fits = clue_fixtures.tiny_preset(tmp_path / "fits")
    with pytest.raises(ValueError, match="differs from the preset's own vocabulary"):
        finetune("eprstmt", data, tmp_path / "b", preset=fits, vocab=other, **SETTINGS)
    missing = tmp_path / "missing.txt"
    missing.write_text("\n".join(VOCABULARY[1:]) + "\n", encoding="utf-8")
    bare = tmp_path / "bare"
    clue_fixtures.tiny_preset(bare, vocabulary_size=len(VOCABULARY) - 1)
    (bare / "vocab.txt").unlink()
    with pytest.raises(ValueError, match=r"lacks \['\[PAD\]'\]"):
        finetune("eprstmt", data, tmp_path / "c", preset=bare, vocab=missing, **SETTINGS)
    with pytest.raises(
        ValueError,
        match=r"max_length=64 is longer than the model's position "
        r"table \(max_sequence_length=32\)",
    ):
        finetune("eprstmt", data, tmp_path / "d", preset=fits, **dict(SETTINGS, max_length=64))
    for name in "abcd":
        assert not (tmp_path / name).exists()


def test_missing_files_are_named(data, preset, tmp_path):
    with pytest.raises(FileNotFoundError, match="--preset .*: no such folder"):
        finetune("eprstmt", data, tmp_path / "run", preset=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="--checkpoint .*: no such file or folder"):
        finetune("eprstmt", data, tmp_path / "run", checkpoint=tmp_path / "model.ckpt")
    with pytest.raises(FileNotFoundError, match="eprstmt"):
        finetune("eprstmt", tmp_path / "empty", tmp_path / "run", preset=preset)
    assert not (tmp_path / "run").exists()


def test_the_command_line_refuses_bad_flags_with_exit_code_2(capsys, tmp_path):
    base = ["clue", "tnews", "d", "o"]
    assert main(base) == 2  # no model
    assert main(base + ["--preset", "p", "--checkpoint", "c"]) == 2
    assert main(base + ["--preset", "p", "--fl-tuning", "8", "--lora", "4"]) == 2
    assert main(base + ["--preset", "p", "--drop-token", "1.5"]) == 2
    assert main(base + ["--preset", "p", "--epochs", "0"]) == 2
    error = capsys.readouterr().err
    assert "--drop-token" in error and "--epochs" in error
    assert main(base + ["--preset", str(tmp_path / "p")]) == 1
    assert "no such folder" in capsys.readouterr().err
    # DATA_DIR and OUTPUT: positionals as compare takes them; 0.5's options warn.
    assert main(["clue", "tnews", "--preset", "p"]) == 2
    assert "Expected keras-masking clue TASK DATA_DIR OUTPUT" in capsys.readouterr().err
    assert main(["clue", "tnews", "d", "o", "--data-dir", "d", "--preset", "p"]) == 2
    assert "given twice" in capsys.readouterr().err
    old = ["clue", "tnews", "--data-dir", "d", "--output-dir", str(tmp_path / "o")]
    assert main(old + ["--preset", str(tmp_path / "p")]) == 1  # parsed: the preset is missing
    error = capsys.readouterr().err
    assert "--data-dir is deprecated" in error and "no such folder" in error


def test_a_dev_sentence_with_more_entities_than_any_in_train_is_scored(preset, tmp_path):
    """The entity targets were sized by train's largest count only: a dev
    sentence with more entities (9 here, against train's 2) stopped the run
    with "has 9 entities; expected at most max_entities=8"."""
    data = clue_fixtures.cluener(tmp_path)
    many = {"text": "小明" * 9, "label": {"name": {"小明": [[2 * i, 2 * i + 1] for i in range(9)]}}}
    dev = data / "cluener" / "dev.json"
    dev.write_text(dev.read_text(encoding="utf-8") + json.dumps(many) + "\n", encoding="utf-8")
    result = finetune(
        "cluener", data, tmp_path / "run", preset=preset, verbose=0, **dict(SETTINGS, epochs=1)
    )
    assert len(result.history) == 1 and 0.0 <= result.best_score <= 100.0


# === Submissions ===
def test_submit_checks_every_file_and_builds_the_zip(cli_runs, tmp_path, capsys):
    runs = tmp_path / "runs"
    for task in ("c3", "cluener", "cmrc2018"):
        shutil.copytree(cli_runs[0] / task, runs / task)
    assert main(["clue", "submit", str(runs), "--team", "lab", "--date", "20261201"]) == 0
    archive = runs / "submit_lab_20261201.zip"
    assert sorted(zipfile.ZipFile(archive).namelist()) == [
        "c311_predict.json",
        "cluener_predict.json",
        "cmrc2018_predict.json",
    ]
    archive.unlink()
    # An id the test split does not have is caught, and nothing is written.
    broken = runs / "c3" / "c311_predict.json"
    lines = broken.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[0])
    record["id"] = "no such id"
    broken.write_text("\n".join([json.dumps(record)] + lines[1:]) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["clue", "submit", str(runs), "--team", "lab", "--date", "20261201"]) == 1
    assert "c311_predict.json" in capsys.readouterr().err
    assert not archive.exists()
    # CLUE and FewCLUE runs do not go in one zip.
    shutil.copytree(cli_runs[0] / "eprstmt", runs / "eprstmt")
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["clue", "submit", str(runs), "--team", "lab", "--date", "20261201"]) == 1
    assert "mix CLUE and FewCLUE" in capsys.readouterr().err
