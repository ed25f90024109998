"""Google's ``bert_config.json``: every value read exactly, every bad one named."""

import json
import re

import pytest

import keras_masking
from keras_masking.models import from_tf_checkpoint
from tests.testing import load_reference
from tests.testing import write_reference_checkpoint


def test_config_with_misspelled_keys(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path)
    config = json.loads(open(config_path).read())
    config["num_layers"] = config.pop("num_hidden_layers")
    open(config_path, "w").write(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"missing required key\(s\) \['num_hidden_layers'\].*num_layers"
    ):
        from_tf_checkpoint(config_path, prefix)


def test_unknown_family():
    with pytest.raises(ValueError, match="Expected one of 'bert', .* for model"):
        keras_masking.models.google_config.backbone_kwargs_from_google_config({}, "albert")


SOURCE = "ckpt/bert_config.json"


BAD_CONFIG_VALUES = [
    ({"num_hidden_layers": "12"}, "integer for 'num_hidden_layers'.*\"12\" \\(a string\\)"),
    ({"num_hidden_layers": 12.5}, "'num_hidden_layers'.*12.5 \\(a number\\)"),
    ({"num_hidden_layers": -1}, "'num_hidden_layers'.*-1 \\(an integer\\)"),
    ({"hidden_size": 0}, "'hidden_size'.*0"),
    ({"num_attention_heads": True}, "'num_attention_heads'.*true \\(a boolean\\)"),
    ({"vocab_size": None}, "'vocab_size'.*null"),
    ({"type_vocab_size": -1}, "integer >= 0 for 'type_vocab_size'"),
    ({"max_position_embeddings": 512.0}, "'max_position_embeddings'.*512.0"),
    ({"hidden_dropout_prob": 1.0}, r"'hidden_dropout_prob' in \[0.0, 1.0\)"),
    ({"hidden_dropout_prob": "0.1"}, "'hidden_dropout_prob'.*\"0.1\" \\(a string\\)"),
    ({"attention_probs_dropout_prob": -0.1}, "'attention_probs_dropout_prob'.*-0.1"),
    ({"layer_norm_eps": 0}, r"'layer_norm_eps' in \(0.0, inf\)"),
    ({"hidden_act": 3}, "activation name.*'hidden_act'.*3 \\(an integer\\)"),
    ({"hidden_act": "swishy"}, "'hidden_act'.*Unknown activation 'swishy'"),
    ({"hidden_size": 30}, "'hidden_size' divisible by 'num_attention_heads'.*30.*4"),
    ({"embedding_size": "128"}, "'embedding_size'.*\"128\""),
    ({"initializer_range": "0.02"}, "'initializer_range'"),
    ({"max_relative_position": 0}, "'max_relative_position'.*0"),
]


@pytest.mark.parametrize(
    "family, changes, message",
    [
        # Settings the weights do not show, which this package would not compute: they
        # loaded without a word (outputs 3.8 and 1.6 off the configs' models).
        ("roformer", {"rotary_value": True}, "'rotary_value': true rotates the values"),
        ("bert", {"position_embedding_type": "relative_key"}, "'relative_key'.*not supported"),
    ],
)
def test_settings_the_package_would_not_compute_are_refused(family, changes, message):
    from keras_masking.models.google_config import backbone_kwargs_from_google_config

    config, _, _ = load_reference(family)
    assert backbone_kwargs_from_google_config(dict(config), family, source=SOURCE)
    with pytest.raises(ValueError, match=re.escape(SOURCE) + ": .*" + message):
        backbone_kwargs_from_google_config({**config, **changes}, family, source=SOURCE)


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
