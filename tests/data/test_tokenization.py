"""keras_masking.data.tokenization: vocabularies from files, tokenizers, encoded texts."""

import json

import numpy as np
import pytest

from keras_masking.data import bert_tokenizer
from keras_masking.data import encode_texts
from keras_masking.data.tokenization import read_vocabulary
from keras_masking.models import TransformerTextClassifierPreprocessor

# === encode_texts refuses bad arguments before tokenizing ===
ENCODE_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "今", "天", "好"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"sequence_length": 0},
            r"Expected an integer >= 2 for sequence_length\. "
            r"Received: sequence_length=0\.",
        ),
        ({"sequence_length": -3}, r"Expected an integer >= 2 .*Received: sequence_length=-3\."),
        ({"sequence_length": 1}, r"Received: sequence_length=1\."),
        ({"sequence_length": 2.5}, r"Expected an integer for sequence_length"),
        ({"sequence_length": 2, "second_texts": ["好"]}, r"Expected an integer >= 3 "),
        ({"texts": None}, r"Expected a list of strings for texts\. Received: texts=None\."),
        ({"texts": 7}, r"Expected a list of strings for texts\. Received: texts=7\."),
        ({"texts": "今天"}, r"Expected a list of strings for texts\. Received: texts='今天'\."),
        ({"texts": ["今天", 5]}, r"Received: texts holding 5 of type int\."),
        (
            {"second_texts": ["好", "好"]},
            r"Expected as many second_texts as texts\. "
            r"Received: len\(texts\)=1, len\(second_texts\)=2\.",
        ),
        ({"second_texts": 3}, r"Expected a list of strings for second_texts"),
    ],
)
def test_encode_texts_bad_arguments(kwargs, message):
    arguments = {"texts": ["今天"], "sequence_length": 6, **kwargs}
    with pytest.raises(ValueError, match=message):
        encode_texts(bert_tokenizer(ENCODE_VOCABULARY), **arguments)


def test_encode_texts_values():
    tokenizer = bert_tokenizer(ENCODE_VOCABULARY)
    single = encode_texts(tokenizer, np.array(["今天好"]), 4)
    assert single["token_ids"].tolist() == [[2, 5, 6, 3]]  # truncated to [CLS] 今 天 [SEP]
    pair = encode_texts(tokenizer, ("今",), 6, second_texts=["好"])
    assert pair["token_ids"].tolist() == [[2, 5, 3, 7, 3, 0]]
    assert pair["segment_ids"].tolist() == [[0, 0, 0, 1, 1, 0]]
    assert pair["padding_mask"].tolist() == [[1, 1, 1, 1, 1, 0]]


def test_encode_texts_packs_as_the_preprocessor():
    tokenizer = bert_tokenizer(ENCODE_VOCABULARY)
    texts, second = ["今天好好", "好", "天天天天"], ["好好好好", "今天", "今"]
    encoded = encode_texts(tokenizer, texts, 7, second_texts=second)
    packed = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=7)(x=(texts, second))
    for name, value in packed.items():
        assert encoded[name].tolist() == np.asarray(value).astype("int32").tolist(), name
    # Round robin: of 4 + 4 tokens into 4, each text keeps 2.
    assert encoded["token_ids"][0].tolist() == [2, 5, 6, 3, 7, 7, 3]


def test_read_vocabulary_from_vocab_txt_tokenizer_json_and_folders(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好"]
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "vocab.txt").write_text("\n".join(tokens) + "\n\n", encoding="utf-8")
    model = {"type": "WordPiece", "vocab": {token: i for i, token in enumerate(tokens)}}
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "tokenizer.json").write_text(json.dumps({"model": model}), "utf-8")
    assert read_vocabulary(tmp_path / "text" / "vocab.txt") == tokens
    assert read_vocabulary(tmp_path / "text") == read_vocabulary(tmp_path / "json") == tokens
    with pytest.raises(FileNotFoundError, match="no vocab.txt or tokenizer.json"):
        read_vocabulary(tmp_path)
    with pytest.raises(FileNotFoundError, match="No vocabulary file"):
        read_vocabulary(tmp_path / "missing.txt")
    model["vocab"]["好"] = 9
    (tmp_path / "json" / "tokenizer.json").write_text(json.dumps({"model": model}), "utf-8")
    with pytest.raises(ValueError, match=r"token ids are not 0..5"):
        read_vocabulary(tmp_path / "json")
    (tmp_path / "json" / "tokenizer.json").write_text('{"model": {"type": "BPE"}}', "utf-8")
    with pytest.raises(ValueError, match="not a WordPiece tokenizer.json"):
        read_vocabulary(tmp_path / "json")
