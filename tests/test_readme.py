"""README's code runs as written, on a tiny model in README's folder layout.

The test writes what README's code expects next to it (an unpacked Google
Chinese BERT, ``chinese_L-12_H-768_A-12/``, here a 1-layer one with an MLM
head, and a FewCLUE folder, ``fewclue/eprstmt/``), then runs every ``python``
block in order in one namespace, and every ``keras-masking`` command of the
``bash`` blocks through the CLI, from that folder. The two set-up commands
are what ``.ci/run`` runs; the test checks that they are the same. README's
code runs on TensorFlow only (``application``: tests/conftest.py).
"""

import pathlib
import re
import shlex

import numpy as np
import pytest

import keras_masking
from keras_masking import cli
from tests.clue import fixtures as clue_fixtures

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# Characters README's examples tokenize, on top of the CLUE test vocabulary.
README_CHARACTERS = "这家店的菜很好吃服务太差了不会再来"


def readme_blocks(language):
    text = README.read_text(encoding="utf-8")
    return [code for lang, code in FENCE.findall(text) if lang == language]


def commands(block):
    """The shell commands of a block, with continuation lines joined."""
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _overridden(argv, flags):
    """``argv`` with each flag of ``flags`` given the values there (the command
    line takes a flag once: its values as written are dropped)."""
    kept, skipping = [], False
    for text in argv:
        if text.startswith("--"):
            skipping = text in flags
        if not skipping:
            kept.append(text)
    return kept + [item for flag, values in flags.items() for item in (flag, *values)]


@pytest.fixture(scope="module")
def readme_folder(tmp_path_factory):
    """README's layout: ``chinese_L-12_H-768_A-12/`` (config, checkpoint, vocab), ``fewclue/``."""
    import keras

    from keras_masking.models import TransformerBackbone
    from keras_masking.models import TransformerMaskedLM
    from keras_masking.models import save_tf_checkpoint
    from tests.clue.helpers import VOCABULARY

    folder = tmp_path_factory.mktemp("readme")
    vocabulary = list(dict.fromkeys(VOCABULARY + list(README_CHARACTERS)))
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        vocabulary_size=len(vocabulary),
        num_layers=1,  # a step's cost is mostly tracing and compiling: one layer
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=128,
    )
    bert = folder / "chinese_L-12_H-768_A-12"
    bert.mkdir()
    save_tf_checkpoint(TransformerMaskedLM(backbone), str(bert / "bert_model.ckpt"))
    (bert / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    clue_fixtures.eprstmt(folder / "fewclue", train=16, dev=8)
    keras.backend.clear_session()
    return folder


def test_the_setup_commands_are_what_ci_runs():
    setup = [command for block in readme_blocks("bash") for command in commands(block)]
    install_and_demo = [command for command in setup if "keras-masking demo" in command]
    install_and_test = [command for command in setup if "pytest" in command]
    assert install_and_demo == [
        "python3 -m venv .venv && . .venv/bin/activate && "
        'pip install ".[demo]" && keras-masking demo'
    ]
    assert len(install_and_test) == 1
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    test_command = install_and_test[0].split(". .venv/bin/activate && ", 1)[1]
    assert test_command in ci
    assert "KERAS_BACKEND=tensorflow" in test_command and "KERAS_BACKEND=jax" in test_command


@pytest.mark.application
def test_every_code_block_runs_as_written(readme_folder, monkeypatch, capsys):
    from keras_masking.models import multilingual_e5_file
    from tests.models.e5_testing import write_e5_file

    monkeypatch.chdir(readme_folder)
    # multilingual-e5-small is a tiny file of its layout here, one layer (the
    # real one: tests/models/test_multilingual_e5.py).
    tiny_e5 = readme_folder / "tiny-e5-q4.bin"
    write_e5_file(tiny_e5, config={"num_layers": 1})
    monkeypatch.setattr(multilingual_e5_file, "default_multilingual_e5_file", lambda: str(tiny_e5))
    python_blocks = readme_blocks("python")
    assert len(python_blocks) >= 8, "README lost its code blocks"
    namespace = {"__name__": "readme"}
    for index, block in enumerate(python_blocks):
        # README's steps compile with XLA; here without it (a compile costs more
        # than these tiny steps; each method's XLA step has its own test).
        block = block.replace("jit_compile=True", "jit_compile=False")
        try:
            exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)
        except Exception as error:  # the block's number makes the failure findable
            raise AssertionError(f"README python block {index + 1} failed:\n{block}") from error

    # What the blocks claim, checked on what they left behind.
    assert namespace["record"] is not None  # correct_mlm_embeddings' record
    submission = readme_folder / "submission" / "eprstmt_predict.json"
    assert submission.exists()
    lines = submission.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and all('"label"' in line for line in lines)
    dev_score = re.findall(r"'score': ([0-9.]+)", capsys.readouterr().out)
    assert dev_score and 0.0 <= float(dev_score[0]) <= 100.0
    merged, reviews = namespace["merged"], namespace["reviews"]
    np.testing.assert_allclose(
        merged.predict(reviews, verbose=0), namespace["fl"].predict(reviews, verbose=0), atol=1e-5
    )
    assert not merged.backbone.add_ffn  # a plain model: the branches are in the FFN weights

    cli_commands = [
        command
        for block in readme_blocks("bash")
        for command in commands(block)
        if command.startswith("keras-masking ")
    ]
    assert any(command.startswith("keras-masking clue eprstmt") for command in cli_commands)
    for command in cli_commands:
        argv = shlex.split(command)[1:]
        # README's runs for one epoch without XLA (a compile costs more than a tiny
        # run; the runs' XLA steps: tests/clue/test_runner.py).
        if argv[:1] == ["clue"] and argv[1:2] != ["submit"]:
            argv = _overridden(argv, {"--epochs": ["1"], "--no-jit-compile": []})
        if argv[:1] == ["compare"]:
            # Two runs (the seed-by-seed comparison: tests/clue/test_compare.py).
            two_runs = {"--methods": ["plain", "fl_tuning=160"], "--seeds": ["0"]}
            argv = _overridden(argv, {"--epochs": ["1"], "--no-jit-compile": [], **two_runs})
        assert cli.main(argv) == 0, command
    assert list((readme_folder / "runs").glob("*.zip")), "clue submit wrote no zip"
    assert keras_masking.__version__
