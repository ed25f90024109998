"""The keras-masking command line on a reference checkpoint."""

import collections
import os
import re
import subprocess
import sys

import numpy as np
from tests.testing import write_reference_checkpoint

from keras_masking import cli
from keras_masking.cli import main
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM


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


# === convert on a full disk ===
def test_convert_refuses_a_disk_without_room_for_the_weights(tmp_path, capsys, monkeypatch):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "ckpt")
    usage = collections.namedtuple("usage", "total used free")
    seen = []

    def disk_usage(path):
        seen.append(path)
        return usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20)  # 1 MiB free

    def never(*args, **kwargs):
        raise AssertionError("save_to_preset ran on a full disk")

    monkeypatch.setattr(cli.shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(TransformerBackbone, "save_to_preset", never)
    code = main(["convert", config_path, prefix, str(tmp_path / "out" / "preset")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and seen == [str(tmp_path / "out")]
    assert error.startswith("keras-masking convert: error: [Errno 28] Not enough free space")
    assert re.search(r"it needs about \d+\.\d MiB, its disk has 1\.0 MiB free", error), error
    assert os.listdir(tmp_path / "out") == []


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
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda path: usage(2**40, 2**40, 2**20))
    argv = ["correct-embeddings", prefix, str(tmp_path / "out"), "--mask-token-id", "3"]
    assert main(argv + ["--drop-mlm-head"]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "[Errno 28] Not enough free space to write OUTPUT" in error
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
    assert estimate < written <= estimate * cli.SPACE_MARGIN + cli.SPACE_SLACK


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
