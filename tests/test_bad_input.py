"""Bad input gets a clear error, and nothing is half-loaded."""

import json

import numpy as np
import pytest
from conftest import random_features
from conftest import tiny_backbone_kwargs
from conftest import write_reference_checkpoint

import keras_masking
from keras_masking.models import TransformerBackbone
from keras_masking.models import from_tf_checkpoint
from keras_masking.models import load_tf_checkpoint_weights

QUERY = "bert/encoder/layer_1/attention/self/query/kernel"


def test_config_with_misspelled_keys(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path)
    config = json.loads(open(config_path).read())
    config["num_layers"] = config.pop("num_hidden_layers")
    open(config_path, "w").write(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"missing required key\(s\) \['num_hidden_layers'\].*num_layers"
    ):
        from_tf_checkpoint(config_path, prefix)


def test_bert_checkpoint_loaded_as_nezha(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path)
    with pytest.raises(ValueError, match="position_embeddings.*model='bert'"):
        from_tf_checkpoint(config_path, prefix, model="nezha")


@pytest.mark.parametrize("family", ["roformer", "nezha"])
def test_relative_checkpoints_loaded_as_bert(family, tmp_path):
    config_path, prefix, _ = write_reference_checkpoint(family, tmp_path)
    config = json.loads(open(config_path).read())
    config.pop("max_relative_position", None)  # only the weights tell now
    open(config_path, "w").write(json.dumps(config))
    with pytest.raises(ValueError, match="no absolute position table"):
        from_tf_checkpoint(config_path, prefix, model="bert")


def test_nezha_config_loaded_as_roformer(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("nezha", tmp_path)
    with pytest.raises(ValueError, match="NEZHA setting"):
        from_tf_checkpoint(config_path, prefix, model="roformer")
    config = json.loads(open(config_path).read())
    config.pop("max_relative_position")
    config["use_relative_position"] = True
    open(config_path, "w").write(json.dumps(config))
    with pytest.raises(ValueError, match="use_relative_position"):
        from_tf_checkpoint(config_path, prefix, model="bert")


def test_unknown_family():
    with pytest.raises(ValueError, match="must be one of"):
        keras_masking.models.google_config.backbone_kwargs_from_google_config({}, "albert")


def test_partial_checkpoint_names_what_is_missing(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path, drop=[QUERY])
    with pytest.raises(ValueError, match=f"missing from the checkpoint: \\['{QUERY}'\\]"):
        from_tf_checkpoint(config_path, prefix)


def test_missing_mlm_head_when_asked_for(tmp_path):
    _, weights_dir = tmp_path / "a", tmp_path / "b"
    config_path, prefix, _ = write_reference_checkpoint(
        "bert", weights_dir, drop=["cls/predictions/output_bias"]
    )
    assert from_tf_checkpoint(config_path, prefix).use_pooler
    with pytest.raises(ValueError, match="cls/predictions/output_bias"):
        from_tf_checkpoint(config_path, prefix, with_mlm=True)


def test_shape_mismatch_is_listed(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint(
        "bert", tmp_path, extra={QUERY: np.zeros((32, 16), "float32")}
    )
    with pytest.raises(ValueError, match=r"shape mismatches.*\(32, 16\) vs model \(32, 32\)"):
        from_tf_checkpoint(config_path, prefix)


def test_unexpected_variables_strict_and_lenient(tmp_path, caplog):
    extra = {
        "bert/encoder/layer_0/adapter/kernel": np.ones((2, 2), "float32"),
        "global_step": np.array(7, "int64"),
        "cls/seq_relationship/output_bias": np.zeros(2, "float32"),
        QUERY + "/adam_m": np.zeros((32, 32), "float32"),
    }
    config_path, prefix, expected = write_reference_checkpoint("bert", tmp_path, extra=extra)
    with pytest.raises(
        ValueError, match=r"not used by a bert model: \['bert/encoder/layer_0/adapter/kernel'\]"
    ):
        from_tf_checkpoint(config_path, prefix)
    with caplog.at_level("WARNING", logger="keras_masking"):
        backbone = from_tf_checkpoint(config_path, prefix, strict=False)
    assert "adapter/kernel" in caplog.text
    features = {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    np.testing.assert_allclose(
        backbone(features)["sequence_output"], expected["sequence_output"], atol=2e-5
    )


def test_failed_load_leaves_model_untouched(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path, drop=[QUERY])
    backbone = from_tf_checkpoint(*write_reference_checkpoint("bert", tmp_path / "full")[:2])
    before = [np.array(w) for w in backbone.get_weights()]
    with pytest.raises(ValueError, match="nothing was loaded"):
        load_tf_checkpoint_weights(backbone, prefix)
    for a, b in zip(backbone.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="bert_config.json"):
        from_tf_checkpoint(tmp_path / "bert_config.json", tmp_path / "model.ckpt")
    config_path, _, _ = write_reference_checkpoint("bert", tmp_path)
    with pytest.raises(FileNotFoundError, match="No TF checkpoint"):
        from_tf_checkpoint(config_path, tmp_path / "nothing.ckpt")


def test_token_ids_out_of_vocabulary():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    features = random_features()
    features["token_ids"][0, 3] = 64
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 64\).*\[64\]"):
        backbone(features)
    features["token_ids"][0, 3] = -1
    with pytest.raises(ValueError, match="token_ids"):
        backbone(features)


def test_segment_and_position_ids_out_of_range():
    backbone = TransformerBackbone(**tiny_backbone_kwargs(custom_position_ids=True))
    features = random_features()
    bad_segments = {
        **features,
        "segment_ids": features["segment_ids"] + 1,
        "position_ids": np.tile(np.arange(10), (2, 1)),
    }
    with pytest.raises(ValueError, match="segment_ids"):
        backbone(bad_segments)
    bad_positions = {**features, "position_ids": np.tile(np.arange(20, 30), (2, 1))}
    with pytest.raises(ValueError, match="position_ids.*max_sequence_length=24"):
        backbone(bad_positions)


def test_sequence_longer_than_position_table():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    with pytest.raises(ValueError, match="30 tokens.*max_sequence_length=24"):
        backbone(random_features(length=30))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"position": "sinusoid"}, "position"),
        ({"hidden_dim": 30}, "divisible"),
        ({"num_layers": 0}, "num_layers"),
        ({"dropout": 1.5}, "dropout"),
    ],
)
def test_bad_constructor_arguments(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerBackbone(**tiny_backbone_kwargs(**changes))


def test_rotary2d_needs_a_head_size_divisible_by_4():
    with pytest.raises(ValueError, match="divisible by 4"):
        TransformerBackbone(**tiny_backbone_kwargs(position="rotary2d", num_heads=16))
