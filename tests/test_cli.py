"""The keras-masking command line on a reference checkpoint."""

import numpy as np
from conftest import write_reference_checkpoint

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
