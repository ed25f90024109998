"""Bad input gets a clear error, and nothing is half-loaded."""

import json
import re

import keras
import numpy as np
import pytest
from tests.testing import load_reference
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs
from tests.testing import write_reference_checkpoint

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
    with pytest.raises(
        ValueError,
        match=r"Expected token_ids in \[0, 64\).*Received: token_ids with the values \[64\]",
    ):
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


@pytest.mark.parametrize(
    "field, value", [("token_ids", 64), ("token_ids", -1), ("segment_ids", 2), ("position_ids", 24)]
)
def test_out_of_range_ids_in_compiled_calls_give_nan_rows(field, value):
    # A compiled step cannot raise on values: the row with the bad id is NaN
    # on every backend (not clamped to a real row, as TensorFlow's gather is).
    backbone = randomize_weights(
        TransformerBackbone(**tiny_backbone_kwargs(custom_position_ids=True))
    )
    features = random_features()
    features["position_ids"] = np.tile(np.arange(10, dtype="int32"), (2, 1))
    expected = keras.ops.convert_to_numpy(backbone(features)["sequence_output"])
    features[field] = features[field].copy()
    features[field][0, 3] = value
    model = keras.Model(backbone.input, backbone.output)
    model.compile(jit_compile=True)
    outputs = model.predict_on_batch(features)
    assert np.isnan(outputs["sequence_output"][0]).all()
    assert np.isnan(outputs["pooled_output"][0]).all()
    np.testing.assert_allclose(outputs["sequence_output"][1], expected[1], atol=1e-5)


def test_sequence_longer_than_position_table():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    with pytest.raises(ValueError, match="30 tokens.*max_sequence_length=24"):
        backbone(random_features(length=30))


# === TransformerBackbone's constructor: 34 bad arguments, each named ===
BAD_CONSTRUCTOR_ARGUMENTS = [
    ({"position": "sinusoid"}, "position.*Received: position='sinusoid'"),
    ({"position": None}, "position.*Received: position=None"),
    ({"hidden_dim": 30}, "divisible.*hidden_dim=30, num_heads=4"),
    ({"num_layers": 0}, r"integer >= 1 for num_layers. Received: num_layers=0"),
    ({"num_layers": 2.5}, r"integer for num_layers. Received: num_layers=2.5"),
    ({"hidden_dim": 31.9}, r"integer for hidden_dim. Received: hidden_dim=31.9"),
    ({"num_layers": True}, r"integer for num_layers. Received: num_layers=True"),
    ({"vocabulary_size": 0}, "vocabulary_size=0"),
    ({"num_heads": -4}, "num_heads=-4"),
    ({"intermediate_dim": "48"}, "intermediate_dim='48'"),
    ({"max_sequence_length": None}, "max_sequence_length=None"),
    ({"num_segments": -1}, r"integer >= 0 for num_segments. Received: num_segments=-1"),
    ({"num_segments": 1.5}, "num_segments=1.5"),
    ({"max_relative_position": 0}, "max_relative_position=0"),
    ({"dropout": 1.5}, r"dropout in \[0.0, 1.0\). Received: dropout=1.5"),
    ({"dropout": -0.1}, "dropout=-0.1"),
    ({"dropout": "0.1"}, "number for dropout. Received: dropout='0.1'"),
    ({"attention_dropout": 1.0}, "attention_dropout=1.0"),
    ({"attention_dropout": float("nan")}, "attention_dropout=nan"),
    ({"layer_norm_epsilon": 0}, "layer_norm_epsilon=0.0"),
    ({"layer_norm_epsilon": -1e-12}, "layer_norm_epsilon=-1e-12"),
    ({"activation": "swishy"}, "Unknown activation.*activation='swishy'"),
    ({"activation": 3}, "activation name or a callable.*activation=3"),
    ({"use_pooler": "no"}, "bool for use_pooler. Received: use_pooler='no'"),
    ({"custom_position_ids": 1}, "custom_position_ids=1"),
    ({"frozen_base": "yes"}, "frozen_base='yes'"),
    ({"position": "rotary", "hidden_dim": 36}, "even head size.*hidden_dim=36"),
    ({"position": "rotary2d", "num_heads": 16}, "divisible by 4.*num_heads=16"),
    ({"add_ffn": {"unit": 4}}, r"add_ffn to hold only the keys.*\['unit'\]"),
    ({"add_ffn": 4}, "dict or None for add_ffn. Received: add_ffn=4"),
    ({"mlm_embedding_correction": "yes"}, "mlm_embedding_correction='yes'"),
    ({"add_ffn": {"units": 2.5}}, "units=2.5"),
    ({"add_ffn": {"units": 2, "layers": [5]}}, r"layer indices in \[0, 2\).*\[5\]"),
    ({"key_value_prefix": {"length": -1}}, "length=-1"),
    ({"add_attention_units": {"units_per_head": 0}}, "units_per_head=0"),
]


@pytest.mark.parametrize("changes, message", BAD_CONSTRUCTOR_ARGUMENTS)
def test_bad_constructor_arguments(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerBackbone(**tiny_backbone_kwargs(**changes))


def test_numpy_numbers_are_accepted_as_python_ones():
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(
            num_layers=np.int64(2),
            hidden_dim=np.int32(32),
            dropout=np.float32(0.25),
            use_pooler=np.bool_(True),
        )
    )
    config = backbone.get_config()
    assert config["num_layers"] == 2 and type(config["num_layers"]) is int
    assert type(config["hidden_dim"]) is int and config["dropout"] == 0.25
    assert type(config["dropout"]) is float and config["use_pooler"] is True
    assert len(backbone.transformer_layers) == 2
    json.dumps(config)  # plain Python numbers only


# === The attachment hooks: 11 bad arguments, nothing attached after each ===
BAD_ATTACHMENTS = [
    ("attach_add_ffn", {"units": 2.5}, "units=2.5"),
    ("attach_add_ffn", {"units": 0}, "units=0"),
    ("attach_add_ffn", {"units": 2, "layers": [0.5]}, r"integer layer indices.*\[0.5\]"),
    ("attach_add_ffn", {"units": 2, "layers": [True]}, r"integer layer indices.*\[True\]"),
    ("attach_add_ffn", {"units": 2, "layers": "0"}, "list of layer indices.*layers='0'"),
    ("attach_add_ffn", {"units": 2, "layers": []}, r"non-empty list.*layers=\[\]"),
    ("attach_key_value_prefixes", {"length": 1.5}, "length=1.5"),
    ("attach_key_value_prefixes", {"length": 2, "dropout": 1.0}, "dropout=1.0"),
    ("attach_key_value_prefixes", {"length": 2, "reparameterize": "yes"}, "reparameterize"),
    ("attach_key_value_prefixes", {"length": 2, "hidden_units": 0}, "hidden_units=0"),
    ("attach_attention_units", {"units_per_head": -1}, "units_per_head=-1"),
]


@pytest.mark.parametrize("method, arguments, message", BAD_ATTACHMENTS)
def test_bad_attachment_arguments_attach_nothing(method, arguments, message):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    weights = len(backbone.weights)
    with pytest.raises(ValueError, match=message):
        getattr(backbone, method)(**arguments)
    assert backbone.add_ffn is None and backbone.key_value_prefix is None
    assert backbone.add_attention_units is None and len(backbone.weights) == weights
    for block in backbone.transformer_layers:
        assert block.feed_forward_branch is None and block.key_value_prefix is None
        assert block.attention_units is None


# === Google bert_config.json values: 18 bad ones, each naming key and file ===
SOURCE = "ckpt/bert_config.json"
BAD_CONFIG_VALUES = [
    ({"num_hidden_layers": "12"}, "integer >= 1 for 'num_hidden_layers'.*\"12\" \\(a string\\)"),
    ({"num_hidden_layers": 12.5}, "'num_hidden_layers'.*12.5 \\(a number\\)"),
    ({"num_hidden_layers": -1}, "'num_hidden_layers'.*-1 \\(an integer\\)"),
    ({"hidden_size": 0}, "'hidden_size'.*0"),
    ({"num_attention_heads": True}, "'num_attention_heads'.*true \\(a boolean\\)"),
    ({"vocab_size": None}, "'vocab_size'.*null"),
    ({"type_vocab_size": -1}, "integer >= 0 for 'type_vocab_size'"),
    ({"max_position_embeddings": 512.0}, "'max_position_embeddings'.*512.0"),
    ({"hidden_dropout_prob": 1.0}, r"\[0.0, 1.0\) for 'hidden_dropout_prob'"),
    ({"hidden_dropout_prob": "0.1"}, "'hidden_dropout_prob'.*\"0.1\" \\(a string\\)"),
    ({"attention_probs_dropout_prob": -0.1}, "'attention_probs_dropout_prob'.*-0.1"),
    ({"layer_norm_eps": 0}, r"\(0.0, inf\) for 'layer_norm_eps'"),
    ({"hidden_act": 3}, "activation name.*'hidden_act'.*3 \\(an integer\\)"),
    ({"hidden_act": "swishy"}, "'hidden_act'.*Unknown activation 'swishy'"),
    ({"hidden_size": 30}, "'hidden_size' divisible by 'num_attention_heads'.*30.*4"),
    ({"embedding_size": "128"}, "'embedding_size'.*\"128\""),
    ({"initializer_range": "0.02"}, "'initializer_range'"),
    ({"max_relative_position": 0}, "'max_relative_position'.*0"),
]


@pytest.mark.parametrize("changes, message", BAD_CONFIG_VALUES)
def test_bad_google_config_values_name_key_and_file(changes, message):
    from keras_masking.models.google_config import backbone_kwargs_from_google_config

    config, _, _ = load_reference("nezha")
    config.update(changes)
    before = json.dumps(config, sort_keys=True)
    with pytest.raises(ValueError, match=re.escape(SOURCE) + ": .*" + message):
        backbone_kwargs_from_google_config(config, "nezha", source=SOURCE)
    assert json.dumps(config, sort_keys=True) == before


def test_google_config_values_read_exactly():
    from keras_masking.models.google_config import backbone_kwargs_from_google_config

    config, _, _ = load_reference("nezha")
    kwargs = backbone_kwargs_from_google_config(config, "nezha", source=SOURCE)
    assert kwargs == {
        "vocabulary_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "hidden_dim": 32,
        "intermediate_dim": 64,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "max_sequence_length": 64,
        "num_segments": 2,
        "position": "relative",
        "activation": "gelu",
        "layer_norm_epsilon": 1e-12,
        "max_relative_position": 4,
    }


def test_config_file_with_a_string_size_names_the_file(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint(
        "bert", tmp_path, config_changes={"num_hidden_layers": "12"}
    )
    with pytest.raises(ValueError, match=re.escape(config_path) + ".*'num_hidden_layers'"):
        from_tf_checkpoint(config_path, prefix)


# === Reading bert_config.json: 5 bad files, each named ===
def _bad_config_files(folder):
    folder.mkdir(exist_ok=True)
    (folder / "latin1.json").write_bytes(b'{"vocab_size": "\xe9"}')
    (folder / "array.json").write_text("[1, 2]")
    (folder / "broken.json").write_text('{"vocab_size": 12,')
    (folder / "a_folder").mkdir(exist_ok=True)
    return [
        (folder / "missing.json", FileNotFoundError, "No config file at .*missing.json"),
        (folder / "a_folder", ValueError, "a_folder: expected a config file.*received a folder"),
        (folder / "latin1.json", ValueError, "latin1.json: not a UTF-8 text file"),
        (folder / "array.json", ValueError, "array.json: expected a JSON object.*JSON list"),
        (folder / "broken.json", ValueError, "broken.json: not valid JSON"),
    ]


def test_bad_config_files_are_named(tmp_path):
    from keras_masking.models.google_config import read_google_config

    cases = _bad_config_files(tmp_path)
    assert len(cases) == 5
    for path, error, message in cases:
        with pytest.raises(error, match=message):
            read_google_config(path)
