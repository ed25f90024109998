"""`keras-masking correct-embeddings` on TF checkpoints and preset folders."""

import hashlib
import pathlib

import numpy as np
import pytest
from tests.testing import load_reference
from tests.testing import tiny_backbone_kwargs
from tests.testing import write_reference_checkpoint
from tests.test_mlm_embedding_correction import numpy_formula

import keras_masking
from keras_masking.cli import main
from keras_masking.methods import correction_record
from keras_masking.methods.mlm_embedding_correction_files import correct_checkpoint_embeddings
from keras_masking.models import TransformerBackbone
from keras_masking.models import from_tf_checkpoint
from keras_masking.models import read_tf_checkpoint

WORDS = "bert/embeddings/word_embeddings"


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
    with pytest.raises(ValueError, match="must differ"):
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
