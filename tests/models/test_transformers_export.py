"""export_to_transformers: Hugging Face folders read back by the package's own loader."""

import json
import logging
import sys

import numpy as np
import pytest

from keras_masking.data import bert_tokenizer
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor
from keras_masking.models import export_to_transformers
from keras_masking.models.transformers_export import roformer_sinusoidal_table
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

safetensors_numpy = pytest.importorskip("safetensors.numpy")

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _backbone(**overrides):
    return randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(**overrides)), scale=0.1)


def _outputs(backbone, features):
    outputs = backbone.predict(features, verbose=0)
    return {key: np.asarray(outputs[key]) for key in ("sequence_output", "pooled_output")}


def _read(folder):
    with open(folder / "config.json", encoding="utf-8") as file:
        config = json.load(file)
    return config, safetensors_numpy.load_file(str(folder / "model.safetensors"))


def test_bert_round_trip_through_the_packages_hugging_face_loader(tmp_path):
    backbone = _backbone()
    features = random_features()
    folder = export_to_transformers(backbone, tmp_path / "hf")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config, tensors = _read(folder)
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    assert config["hidden_act"] == "gelu"
    assert config["layer_norm_eps"] == backbone.layer_norm_epsilon
    assert config["max_position_embeddings"] == 24 and config["type_vocab_size"] == 2
    assert config["intermediate_size"] == 48 and config["vocab_size"] == 64
    kernel = backbone.transformer_layers[1].self_attention.query.kernel.numpy()
    np.testing.assert_array_equal(tensors["encoder.layer.1.attention.self.query.weight"], kernel.T)
    assert tensors["embeddings.word_embeddings.weight"].shape == (64, 32)
    loaded = TransformerBackbone.from_preset(folder)
    assert loaded.activation == "gelu"
    expected, got = _outputs(backbone, features), _outputs(loaded, features)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-5)


def test_a_hugging_face_folder_loads_with_its_own_epsilon_and_absolute_positions_only(tmp_path):
    folder = export_to_transformers(_backbone(layer_norm_epsilon=1e-5), tmp_path / "hf")
    config, _ = _read(folder)
    # keras-hub's BERT converter fixed 1e-12 (outputs 0.016 off at 1e-3).
    (folder / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-3}))
    assert TransformerBackbone.from_preset(folder).layer_norm_epsilon == 1e-3
    # Left out: transformers' defaults, not keras-hub's (a tanh GELU, 1e-12 or 1e-5).
    left_out = {k: v for k, v in config.items() if k not in ("hidden_act", "layer_norm_eps")}
    (folder / "config.json").write_text(json.dumps(left_out))
    loaded = TransformerBackbone.from_preset(folder)
    assert (loaded.activation, loaded.layer_norm_epsilon) == ("gelu", 1e-12)
    # Relative attention's own weights were left unused, without a word.
    relative = {**config, "position_embedding_type": "relative_key"}
    (folder / "config.json").write_text(json.dumps(relative))
    with pytest.raises(ValueError, match="'relative_key'.*not supported; expected 'absolute'"):
        TransformerBackbone.from_preset(folder)


def _roberta_folder(folder, tensors, config, token_type_row):
    """A Hugging Face RoBERTa folder of a BERT export's weights (two reserved position rows)."""
    tensors = dict(tensors)
    positions = tensors.pop("embeddings.position_embeddings.weight")
    tensors["embeddings.position_embeddings.weight"] = np.concatenate(
        [np.zeros((2, positions.shape[1]), "float32"), positions]
    )
    tensors["embeddings.token_type_embeddings.weight"] = token_type_row[None]
    folder.mkdir()
    safetensors_numpy.save_file(
        {f"roberta.{name}": value for name, value in tensors.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = {**config, "model_type": "roberta", "architectures": ["RobertaModel"],
              "max_position_embeddings": positions.shape[0] + 2, "pad_token_id": 1}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_hugging_face_roberta_keeps_its_token_type_row(tmp_path):
    """RoBERTa adds token_type_embeddings[0] to every token; keras-hub's
    converter dropped it (a fine-tuned model's row trains: outputs 3.8 off)."""
    backbone = _backbone(num_segments=0, layer_norm_epsilon=1e-5, use_pooler=False)
    root = tmp_path
    config, tensors = _read(export_to_transformers(backbone, root / "hf"))
    row = np.random.default_rng(0).normal(size=backbone.hidden_dim).astype("float32")
    with_row = _roberta_folder(root / "with_row", tensors, config, row)
    folded = dict(tensors)
    folded["embeddings.position_embeddings.weight"] = (
        tensors["embeddings.position_embeddings.weight"] + row
    )  # the same sums, the row in the position table
    without_row = _roberta_folder(root / "folded", folded, config, np.zeros_like(row))
    features = {k: v for k, v in random_features().items() if k != "segment_ids"}
    expected = TransformerBackbone.from_preset(without_row).predict(features, verbose=0)
    got = TransformerBackbone.from_preset(with_row).predict(features, verbose=0)
    np.testing.assert_allclose(got["sequence_output"], expected["sequence_output"], atol=1e-5)


def test_tanh_gelu_exports_as_gelu_new_and_reads_back(tmp_path):
    backbone = _backbone(activation="gelu_approximate", layer_norm_epsilon=1e-6)
    folder = export_to_transformers(backbone, tmp_path / "hf")
    config, _ = _read(folder)
    assert config["hidden_act"] == "gelu_new" and config["layer_norm_eps"] == 1e-6
    loaded = TransformerBackbone.from_preset(folder)
    features = random_features()
    np.testing.assert_allclose(
        _outputs(loaded, features)["sequence_output"],
        _outputs(backbone, features)["sequence_output"],
        atol=1e-4,  # keras-hub's BertBackbone keeps its own epsilon (1e-12)
    )


def test_fl_tuning_lora_and_drop_token_export_merged(tmp_path):
    backbone = _backbone()
    backbone.enable_fl_tuning(units=8)
    backbone.enable_lora(2)
    backbone.enable_drop_token(0.3)
    randomize_weights(backbone, seed=1, scale=0.1)  # the branches and LoRA start at zero
    features = random_features()
    expected = _outputs(backbone, features)
    folder = export_to_transformers(backbone, tmp_path / "hf")
    config, _ = _read(folder)
    assert config["intermediate_size"] == 48 + 8
    assert backbone.add_ffn is not None and backbone.lora is not None  # unchanged
    loaded = TransformerBackbone.from_preset(folder)
    got = _outputs(loaded, features)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-5)


def test_asa_and_drop_token_leave_nothing(tmp_path):
    backbone = _backbone()
    features = random_features()
    expected = _outputs(backbone, features)
    backbone.enable_asa(tau=0.5)
    backbone.enable_drop_token(0.3, mode="attention")
    config, tensors = _read(export_to_transformers(backbone, tmp_path / "hf"))
    assert config["intermediate_size"] == 48 and not any("advers" in name for name in tensors)
    got = _outputs(TransformerBackbone.from_preset(tmp_path / "hf"), features)
    np.testing.assert_allclose(got["sequence_output"], expected["sequence_output"], atol=1e-5)


def _classifier(num_classes=3, activation=None, **backbone_overrides):
    vocabulary = SPECIAL + [f"t{i}" for i in range(59)] + list("好坏")
    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(vocabulary), sequence_length=10
    )
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(vocabulary_size=len(vocabulary), **backbone_overrides)
    )
    classifier = TransformerTextClassifier(
        backbone, num_classes, preprocessor=preprocessor, activation=activation
    )
    randomize_weights(classifier, scale=0.1)
    return classifier, vocabulary


def test_classifier_exports_bert_for_sequence_classification_with_its_tokenizer(tmp_path):
    classifier, vocabulary = _classifier()
    folder = export_to_transformers(classifier, tmp_path / "hf", labels=["a", "b", "c"])
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    config, tensors = _read(folder)
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "a", "1": "b", "2": "c"}
    assert config["label2id"] == {"a": 0, "b": 1, "c": 2}
    assert tensors["classifier.weight"].shape == (3, 32)
    assert "bert.pooler.dense.weight" in tensors
    assert (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1] == vocabulary
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "BertTokenizer"
    assert tokenizer_config["do_lower_case"] is True
    assert tokenizer_config["model_max_length"] == 10
    # The backbone reads back (keras-hub finds the "bert." prefix); the head is a matrix product.
    features = classifier.preprocessor(["好", "坏 t3 t4"])
    features = {key: np.asarray(value) for key, value in features.items()}
    loaded = TransformerBackbone.from_preset(folder)
    pooled = _outputs(loaded, features)["pooled_output"]
    logits = pooled @ tensors["classifier.weight"].T + tensors["classifier.bias"]
    expected = np.asarray(classifier(features))  # predict would preprocess them
    np.testing.assert_allclose(logits, expected, atol=1e-5)


def test_a_head_bert_has_no_class_for_exports_the_backbone_with_a_warning(tmp_path, caplog):
    classifier, _ = _classifier(pooling="mean")
    with caplog.at_level(logging.WARNING, logger="keras_masking"):
        folder = export_to_transformers(classifier, tmp_path / "hf")
    assert "writing the backbone alone" in caplog.text
    config, tensors = _read(folder)
    assert config["architectures"] == ["BertModel"]
    assert "classifier.weight" not in tensors
    # BertModel's pooler reads [CLS]: with the trained pooler written, its
    # pooler_output was tanh(dense([CLS])), not the model's tanh(dense(mean)).
    assert "writing a zero pooler" in caplog.text
    np.testing.assert_array_equal(tensors["pooler.dense.weight"], 0.0)
    np.testing.assert_array_equal(tensors["pooler.dense.bias"], 0.0)


@pytest.mark.parametrize(
    "activation, architecture",
    [("softmax", "BertForSequenceClassification"), ("tanh", "BertModel")],
)
def test_a_softmax_head_exports_its_logits_another_activation_the_backbone(
    tmp_path, activation, architecture
):
    classifier, _ = _classifier(activation=activation)
    config, tensors = _read(export_to_transformers(classifier, tmp_path / "hf"))
    assert config["architectures"] == [architecture]
    if architecture == "BertModel":
        return
    assert config["problem_type"] == "single_label_classification"
    np.testing.assert_array_equal(
        tensors["classifier.weight"], classifier.output_dense.kernel.numpy().T
    )


def test_no_pooler_and_no_segments_become_zeros(tmp_path):
    backbone = _backbone(use_pooler=False, num_segments=0, pooling="mean")
    config, tensors = _read(export_to_transformers(backbone, tmp_path / "hf"))
    assert config["type_vocab_size"] == 1
    np.testing.assert_array_equal(tensors["embeddings.token_type_embeddings.weight"], 0.0)
    np.testing.assert_array_equal(tensors["pooler.dense.weight"], 0.0)


def test_e5s_pooling_no_pooler_and_pruned_table_read_back(tmp_path):
    """Read back by from_preset, an e5-like folder pooled the first token through
    the zero pooler (pooled_output 2.3 off on e5), and a pruned table lost its
    record (the correction then averaged the kept rows)."""
    pruned_from = {"vocabulary_size": 500, "token_embedding_mean": [0.5] * 32}
    backbone = _backbone(use_pooler=False, pooling="mean", pruned_from=pruned_from)
    loaded = TransformerBackbone.from_preset(export_to_transformers(backbone, tmp_path / "hf"))
    assert (loaded.pooling, loaded.use_pooler) == ("mean", False)
    assert loaded.get_config()["pruned_from"] == pruned_from
    features = random_features()
    expected, got = _outputs(backbone, features), _outputs(loaded, features)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-5)


def test_roformer_exports_rotary_layout(tmp_path):
    backbone = _backbone(position="rotary")
    config, tensors = _read(export_to_transformers(backbone, tmp_path / "hf"))
    assert config["model_type"] == "roformer" and config["architectures"] == ["RoFormerModel"]
    assert config["embedding_size"] == 32 and config["rotary_value"] is False
    assert "embeddings.position_embeddings.weight" not in tensors
    assert not any(name.startswith("pooler.") for name in tensors)
    np.testing.assert_allclose(
        tensors["encoder.embed_positions.weight"], roformer_sinusoidal_table(24, 8)
    )
    kernel = backbone.transformer_layers[0].feed_forward.intermediate_dense.kernel.numpy()
    np.testing.assert_array_equal(tensors["encoder.layer.0.intermediate.dense.weight"], kernel.T)


def test_sinusoidal_table_holds_the_rotary_angles():
    table = roformer_sinusoidal_table(5, 8)
    angles = np.arange(5)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(table[:, :4], np.sin(angles), atol=1e-6)
    np.testing.assert_allclose(table[:, 4:], np.cos(angles), atol=1e-6)


# === Refusals ===
def test_prefix_tuning_is_refused_before_writing(tmp_path):
    backbone = _backbone()
    backbone.enable_prefix_tuning(length=4)
    with pytest.raises(ValueError, match="prefix-tuned"):
        export_to_transformers(backbone, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_nezha_is_refused_naming_the_family(tmp_path):
    with pytest.raises(ValueError, match="NEZHA"):
        export_to_transformers(_backbone(position="relative"), tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_folder_is_refused_unless_overwrite(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    backbone = _backbone()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_to_transformers(backbone, folder)
    assert [p.name for p in folder.iterdir()] == ["keep.txt"]
    export_to_transformers(backbone, folder, overwrite=True)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left


def test_missing_safetensors_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ModuleNotFoundError, match=r"keras-masking\[export\]"):
        export_to_transformers(_backbone(), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_other_models_and_mismatched_tokenizers_are_refused(tmp_path):
    with pytest.raises(TypeError, match="TransformerBackbone"):
        export_to_transformers(object(), tmp_path / "hf")
    with pytest.raises(ValueError, match="labels name a classifier"):
        export_to_transformers(_backbone(), tmp_path / "hf", labels=["a", "b"])
    tokenizer = bert_tokenizer(SPECIAL + ["a"])
    with pytest.raises(ValueError, match="6 tokens but the model 64"):
        export_to_transformers(_backbone(), tmp_path / "hf", tokenizer=tokenizer)
    for length in (1, 25, 8.0):
        with pytest.raises(ValueError, match="sequence_length"):
            export_to_transformers(_backbone(), tmp_path / "hf", sequence_length=length)
    assert not (tmp_path / "hf").exists()


def test_sequence_length_is_the_tokenizers_model_max_length(tmp_path):
    vocabulary = SPECIAL + [f"t{i}" for i in range(64 - len(SPECIAL))]
    tokenizer = bert_tokenizer(vocabulary)
    backbone = _backbone()
    for length, expected in ((None, 24), (16, 16)):
        folder = export_to_transformers(
            backbone, tmp_path / f"hf{length}", tokenizer=tokenizer, sequence_length=length
        )
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert config["model_max_length"] == expected


# === multilingual-e5's tokenizer as XLMRobertaTokenizer files ===
XLM_R_PIECES = [
    "<s>",
    "<pad>",
    "</s>",
    "<unk>",
    "\u2581",
    "\u2581a",
    "a",
    "b",
    "ab",
    "，",
    "<mask>",
]


def _unigram_tokenizer():
    from keras_masking.models import UnigramTokenizer

    return UnigramTokenizer(
        {
            "pieces": XLM_R_PIECES,
            "scores": [0.0, 0.0, 0.0, 0.0, -3.0, -1.0, -2.0, -2.0, -1.5, -2.0, 0.0],
            "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 10},
            # "A" -> "a", zero width space -> " ", full-width comma -> ",", U+00AD deleted
            "normalization": {"65": [97], "8203": [32], "65292": [44], "173": []},
        }
    )


def _common_prefix_search(blob, key):
    """transformers' (spm_precompiled's) reading of a precompiled charsmap: the first match."""
    size = int.from_bytes(blob[:4], "little")
    units = np.frombuffer(blob[4 : 4 + size], "<u4").astype("int64")
    replacements = blob[4 + size :]
    position = int(units[0] >> 10)
    for byte in key:
        position ^= byte
        unit = int(units[position])
        if unit & ((1 << 31) | 0xFF) != byte:
            return None
        position ^= unit >> 10
        if (unit >> 8) & 1:
            start = int(units[position]) & ((1 << 31) - 1)
            return replacements[start : replacements.index(b"\x00", start)].decode("utf-8")
    return None


def test_precompiled_charsmap_maps_every_character():
    from keras_masking.models.xlm_roberta_tokenizer_files import precompiled_charsmap

    rng = np.random.default_rng(0)
    codes = sorted(set(rng.integers(1, 0x30000, 3000).tolist()) - set(range(0xD800, 0xE000)))
    normalization = {code: [int(c) for c in rng.integers(32, 0x9FFF, code % 3)] for code in codes}
    blob = precompiled_charsmap(normalization)
    for code, value in normalization.items():
        assert _common_prefix_search(blob, chr(code).encode("utf-8")) == "".join(map(chr, value))
    for code in (0x41, 0x4E2D, 0x1F600):
        if code not in normalization:
            assert _common_prefix_search(blob, chr(code).encode("utf-8")) is None


def test_unigram_tokenizer_exports_xlm_roberta_files_with_the_same_ids(tmp_path):
    tokenizer = _unigram_tokenizer()
    backbone = _backbone(vocabulary_size=len(XLM_R_PIECES), use_pooler=False, pooling="mean")
    folder = export_to_transformers(backbone, tmp_path / "hf", tokenizer=tokenizer)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "sentencepiece.bpe.model",
        "special_tokens_map.json",
        "tokenizer_config.json",
    ]
    config, _ = _read(folder)
    assert config["pad_token_id"] == 1
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "XLMRobertaTokenizer"
    # SentencePiece itself reads the model: ids + 1 are the package's (XLM-R's offset).
    sentencepiece = pytest.importorskip("sentencepiece")
    processor = sentencepiece.SentencePieceProcessor(
        model_proto=(folder / "sentencepiece.bpe.model").read_bytes()
    )
    for text in ("Ab", "a\u200bab", "ab，b", "A\u00adB a"):
        ours = [int(i) for i in tokenizer.encode(text)]
        theirs = [i + 1 if i > 2 else (3, 0, 2)[i] for i in processor.encode(text)]
        assert theirs == ours, text


def test_a_pruned_unigram_tokenizer_exports_the_model_without_tokenizer_files(tmp_path, caplog):
    tokenizer, _ = _unigram_tokenizer().prune(["ab"])
    backbone = _backbone(vocabulary_size=tokenizer.vocabulary_size())
    with caplog.at_level(logging.WARNING, logger="keras_masking"):
        folder = export_to_transformers(backbone, tmp_path / "hf", tokenizer=tokenizer)
    assert "pruned" in caplog.text
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


def test_a_corrected_backbone_reads_back_corrected_and_is_not_corrected_twice(tmp_path):
    """The folder carries the MLM-correction record: read back with
    from_preset, a second correct_mlm_embeddings changes nothing (it
    corrected the table again, 0.14 off)."""
    import keras_masking

    backbone = _backbone()
    keras_masking.correct_mlm_embeddings(backbone, mask_token_id=4, unselectable_token_ids=[0])
    folder = export_to_transformers(backbone, tmp_path / "hf")
    assert "mlm_embedding_correction.json" in {p.name for p in folder.iterdir()}
    loaded = TransformerBackbone.from_preset(folder)
    table = np.array(loaded.token_embedding.embeddings.numpy())
    assert keras_masking.correct_mlm_embeddings(loaded, mask_token_id=4) is None
    np.testing.assert_array_equal(loaded.token_embedding.embeddings.numpy(), table)
    plain = export_to_transformers(_backbone(), tmp_path / "plain")
    assert "mlm_embedding_correction.json" not in {p.name for p in plain.iterdir()}
