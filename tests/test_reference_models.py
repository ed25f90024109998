"""Each family against Hugging Face transformers' outputs on the same weights.

The fixtures (tests/fixtures/*.npz, made by make_reference.py with torch)
hold random weights in Google's TF checkpoint layout and the PyTorch
outputs; here they are written as a real TF checkpoint, loaded with
`from_tf_checkpoint`, and compared.
"""

import numpy as np
import pytest
from conftest import FAMILIES
from conftest import write_reference_checkpoint

import keras_masking


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_hugging_face_outputs(family, tmp_path):
    config_path, prefix, expected = write_reference_checkpoint(family, tmp_path)
    masked_lm = keras_masking.models.from_tf_checkpoint(
        config_path, prefix, model=family, with_mlm=True
    )
    features = {
        "token_ids": expected["token_ids"],
        "segment_ids": expected["segment_ids"],
        "padding_mask": expected["padding_mask"],
    }
    outputs = masked_lm.backbone(features)
    np.testing.assert_allclose(outputs["sequence_output"], expected["sequence_output"], atol=2e-5)
    if "pooled_output" in expected:
        assert masked_lm.backbone.use_pooler
        np.testing.assert_allclose(outputs["pooled_output"], expected["pooled_output"], atol=2e-5)
    else:
        assert not masked_lm.backbone.use_pooler
    length = features["token_ids"].shape[1]
    positions = np.tile(np.arange(length, dtype="int32"), (2, 1))
    logits = masked_lm({**features, "mask_positions": positions})
    np.testing.assert_allclose(logits, expected["mlm_logits"], atol=5e-5)


@pytest.mark.parametrize("family", ["roformer", "nezha"])
def test_outputs_differ_under_another_position_scheme(family, tmp_path):
    """The comparison above can fail: the wrong scheme gives other numbers."""
    config_path, prefix, expected = write_reference_checkpoint(family, tmp_path)
    backbone = keras_masking.models.from_tf_checkpoint(config_path, prefix, model=family)
    kwargs = backbone.get_config()
    kwargs["position"] = {"roformer": "relative", "nezha": "rotary"}[family]
    for key in ("name", "trainable", "dtype"):
        kwargs.pop(key)
    swapped = keras_masking.models.TransformerBackbone(**kwargs)
    swapped.set_weights(backbone.get_weights())
    features = {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    difference = np.abs(
        np.asarray(swapped(features)["sequence_output"]) - expected["sequence_output"]
    ).max()
    assert difference > 1e-2
