"""Tokens with character offsets, and the bert4keras encodings of every CLUE kind."""

import logging
import os
import pathlib

import numpy as np
import pytest

from keras_masking.clue.encoding import _special_token_id
from keras_masking.clue.encoding import encode_examples
from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import EntityExample
from keras_masking.clue.examples import IdiomPassage
from keras_masking.clue.examples import SpanExample
from keras_masking.clue.examples import TextExample
from keras_masking.models.transformer_tokenizer import tokenize_with_offsets
from tests.clue.helpers import CLS
from tests.clue.helpers import MASK
from tests.clue.helpers import PAD
from tests.clue.helpers import SEP
from tests.clue.helpers import UNK
from tests.clue.helpers import UNUSED1
from tests.clue.helpers import ids
from tests.clue.helpers import token_id
from tests.clue.helpers import tokenizer

# Real data (the FewCLUE files, the Chinese BERT vocabulary) is read only from
# the folder $KERAS_MASKING_DATA names; the tests that need it skip without it.
DATA = os.environ.get("KERAS_MASKING_DATA")
SHARED = pathlib.Path(DATA or pathlib.Path(__file__).parent / "no-data")
TEXTS = [
    "今天天气很好",  # Chinese
    "Hello, World! playing plays",  # English, continuation pieces, punctuation
    "在北京playing的Olympics，很好！",  # mixed, no spaces
    "Café naïve ÉCOLE",  # accents
    "☃ 😀 zzz 小明",  # unknown characters and words
    "Ｆｕｌｌ ﬁ \u3000 soft\xadhyphen zero\u200bwidth",  # fullwidth, ligature, odd spaces
    "e\u0301 12 123 1998年",  # a combining accent, digits and pieces
    "",
]


# === tokenize_with_offsets ===
@pytest.mark.parametrize("strip_accents", [False, True], ids=["keep_accents", "strip_accents"])
@pytest.mark.parametrize("lowercase", [True, False], ids=["lowercase", "cased"])
def test_ids_equal_the_keras_hub_tokenizer(lowercase, strip_accents):
    hub = tokenizer(lowercase=lowercase, strip_accents=strip_accents)
    for text in TEXTS:
        token_ids, spans = tokenize_with_offsets(hub, text)
        assert token_ids == [int(i) for i in hub(text)], text
        assert len(spans) == len(token_ids)
        assert all(0 <= start < end <= len(text) for start, end in spans)
        assert spans == sorted(spans)


def test_spans_point_at_the_original_characters():
    text = "在北京Playing的Café，☃"
    token_ids, spans = tokenize_with_offsets(tokenizer(strip_accents=True), text)
    pieces = [(token, text[start:end]) for token, (start, end) in zip(token_ids, spans)]
    assert pieces == [
        (token_id("在"), "在"),
        (token_id("北"), "北"),
        (token_id("京"), "京"),
        (token_id("play"), "Play"),
        (token_id("##ing"), "ing"),
        (token_id("的"), "的"),
        (token_id("cafe"), "Café"),  # accent stripped, the span keeps the é
        (token_id(","), "，"),  # NFKC case folding: the fullwidth comma reads as ","
        (UNK, "☃"),
    ]
    # A combining accent belongs to its letter; a fullwidth word maps to itself.
    token_ids, spans = tokenize_with_offsets(tokenizer(strip_accents=True), "cafe\u0301 Ｆｕｌｌ")
    assert token_ids == [token_id("cafe"), token_id("full")]
    assert spans == [(0, 5), (6, 10)]
    # An unknown word is one [UNK] spanning the word.
    assert tokenize_with_offsets(tokenizer(), "hello zzz") == (
        [token_id("hello"), UNK],
        [(0, 5), (6, 9)],
    )


def test_ids_equal_keras_hub_on_the_chinese_vocabulary():
    vocabulary = SHARED / "vocab" / "bert-base-chinese-vocab.txt"
    data = SHARED / "fewclue" / "cluewsc" / "train_few_all.json"
    if not vocabulary.exists() or not data.exists():
        pytest.skip("needs $KERAS_MASKING_DATA (vocab/ and fewclue/)")
    import json

    from keras_masking.data.tokenization import bert_tokenizer

    hub = bert_tokenizer(vocabulary)
    texts = [json.loads(line)["text"] for line in data.open(encoding="utf-8")][:40] + TEXTS
    for text in texts:
        token_ids, spans = tokenize_with_offsets(hub, text)
        assert token_ids == [int(i) for i in hub(text)], text
        for token, (start, end) in zip(token_ids, spans):
            piece = hub.id_to_token(token).removeprefix("##")
            if token != hub.token_to_id("[UNK]") and text[start:end].isascii():
                assert text[start:end].lower() == piece


def test_tokenization_bad_input():
    with pytest.raises(TypeError, match=r"expects text as a str. Received: int"):
        tokenize_with_offsets(tokenizer(), 12)
    with pytest.raises(TypeError, match=r"expects a keras-hub WordPiece tokenizer"):
        tokenize_with_offsets("vocab.txt", "好")
    with pytest.raises(ValueError, match=r"no token '\[unused9\]'"):
        _special_token_id(tokenizer(), "[unused9]")
    assert _special_token_id(tokenizer(), "[unused1]") == UNUSED1


# === Classification ===
def test_classification_pairs_cut_the_longer_text_first():
    examples = [
        TextExample(0, "今天天气很好", "北京", "1"),  # 6 + 2 tokens into 8 - 3 = 5
        TextExample(1, "好", None, "0"),
    ]
    split = encode_examples("afqmc", examples, tokenizer(), max_length=8)
    assert split.features["token_ids"].tolist() == [
        [CLS] + ids("今天天") + [SEP] + ids("北京") + [SEP],
        [CLS] + ids("好") + [SEP] + [PAD] * 5,
    ]
    assert split.features["segment_ids"].tolist()[0] == [0] * 5 + [1] * 3
    assert split.features["padding_mask"].tolist()[1] == [1] * 3 + [0] * 5
    assert split.labels.tolist() == [1, 0]
    assert split.meta["ids"] == [0, 1] and split.meta["truncated"] == 1
    assert split.meta["label_names"] == ("0", "1")
    assert {v.dtype for v in split.features.values()} == {np.dtype("int32")}


def test_a_cluewsc_text_cut_through_its_span_marks_is_warned(caplog):
    examples = [
        TextExample("kept", "_小明_说[他]今天很好", None, "true"),  # the marks end at token 8
        TextExample("lost", "_小明_今天天气很好[他]", None, "false"),  # "]" is token 13
    ]
    with caplog.at_level(logging.WARNING, logger="keras_masking"):
        split = encode_examples("cluewsc", examples, tokenizer(), max_length=11)  # 9 tokens
    assert split.meta["truncated"] == 2
    assert "cluewsc: 1 examples lost a span mark" in caplog.text
    assert "['lost']" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="keras_masking"):
        encode_examples("cluewsc", examples, tokenizer(), max_length=16)
    assert "span mark" not in caplog.text


def test_texts_with_pieces_a_pruned_vocabulary_dropped_are_counted_and_warned(caplog):
    """A pruned e5 tokenizer reads such pieces as <unk> (CLUEWSC's span marks
    were, pruned to the files' own strings): said, not silent."""
    from keras_masking.models import UnigramTokenizer
    from tests.models.unigram_testing import toy_model

    tokenizer, _ = UnigramTokenizer(toy_model()).prune(["ab"])
    examples = [TextExample(0, "ab", None, "Positive"), TextExample(1, "ab c", None, "Negative")]
    with caplog.at_level(logging.WARNING):
        split = encode_examples("eprstmt", examples, tokenizer, max_length=8)
    assert split.meta["dropped_pieces"] == 1
    assert "1 texts hold pieces the pruned vocabulary dropped" in caplog.text
    assert "'ab c'" in caplog.text
    assert encode_examples("eprstmt", examples[:1], tokenizer, 8).meta["dropped_pieces"] == 0


def test_classification_labels_and_bad_input():
    unlabelled = encode_examples("tnews", [TextExample("t1", "好", None, None)], tokenizer(), 8)
    assert unlabelled.labels is None
    with pytest.raises(ValueError, match=r"Example 'x' has the label 'maybe'.*afqmc's labels"):
        encode_examples("afqmc", [TextExample("x", "好", "好", "maybe")], tokenizer(), 8)
    mixed = [TextExample(0, "好", None, "0"), TextExample(1, "好", None, None)]
    with pytest.raises(ValueError, match=r"mixes labelled and unlabelled.*id 1"):
        encode_examples("csl", mixed, tokenizer(), 8)
    # csldcp's classes are its 67 disciplines; labels= still narrows them.
    split = encode_examples("csldcp", [TextExample(0, "好", None, "数学")], tokenizer(), 8)
    assert split.labels.tolist() == [39] and len(split.meta["label_names"]) == 67
    split = encode_examples(
        "csldcp", [TextExample(0, "好", None, "数学")], tokenizer(), 8, labels=("物理", "数学")
    )
    assert split.labels.tolist() == [1]
    with pytest.raises(ValueError, match=r"expects TextExample records. Received: ChoiceExample"):
        encode_examples("afqmc", [ChoiceExample(0, "", "", ("a",), 0)], tokenizer(), 8)
    with pytest.raises(ValueError, match=r"Unknown options \['stride'\]"):
        encode_examples("afqmc", [TextExample(0, "好", None, "0")], tokenizer(), 8, stride=3)
    with pytest.raises(
        ValueError, match=r"Expected an integer for max_length. Received: max_length="
    ):
        encode_examples("afqmc", [TextExample(0, "好", None, "0")], tokenizer(), "8")


def test_labels_outside_the_models_classes_name_their_file_and_line(tmp_path):
    from keras_masking.clue import read_split

    folder = tmp_path / "tnews"
    folder.mkdir()
    lines = ['{"sentence": "好", "label": "100"}', '{"sentence": "坏", "label": "103"}']
    (folder / "train.json").write_text(lines[0] + "\n", encoding="utf-8")
    (folder / "dev.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    train, dev = read_split(tmp_path, "tnews", "train"), read_split(tmp_path, "tnews", "dev")
    # A model with the classes of the training file only: dev's "103" is none of them.
    seen = tuple(sorted({e.label for e in train.examples}))
    with pytest.raises(
        ValueError,
        match=r"Example 1 \(.*dev.json:2\) has the label '103', which is not one of tnews's "
        r"labels, the model's 1 classes \['100'\]. Expected one of them. Received: label='103'.",
    ):
        encode_examples("tnews", dev.examples, tokenizer(), 8, labels=seen)
    c3 = [ChoiceExample("q", "好", "问", ("一", "二", "三", "四", "五"), 4, source="d.json: q 0")]
    with pytest.raises(ValueError, match=r"Example 'q' \(d.json: q 0\) has 5 choices"):
        encode_examples("c3", c3, tokenizer(), 12)
    # The source is no part of a record's identity.
    assert dev.examples[0] == TextExample(0, "好", None, "100")


# === Multiple choice (C3) ===
def test_c3_choices_padded_and_context_cut_first():
    example = ChoiceExample("q1", "男你好女再见", "说了什么", ("你好", "再见", "什么"), 1)
    split = encode_examples("c3", [example], tokenizer(), max_length=14)
    token_ids = split.features["token_ids"][0]
    assert token_ids.shape == (4, 14) and split.features["choice_mask"].tolist() == [[1, 1, 1, 0]]
    # 14 - 4 special = 10 tokens: question 4 + choice 2 leave 4 of the 6 context tokens.
    expected = [CLS] + ids("男你好女") + [SEP] + ids("说了什么") + [SEP] + ids("你好") + [SEP]
    assert token_ids[0].tolist() == expected
    assert split.features["segment_ids"][0, 0].tolist() == [0] * 6 + [1] * 8
    # The padded fourth choice is a real two-token row, masked by choice_mask.
    assert token_ids[3].tolist() == [CLS, SEP] + [PAD] * 12
    assert split.features["padding_mask"][0, 3].tolist() == [1, 1] + [0] * 12
    assert split.labels.tolist() == [1] and split.meta["truncated"] == 1
    assert split.meta["num_choices"] == [3]


def test_c3_bad_input():
    five = ChoiceExample("q9", "", "问", tuple("一二三四五"), 0)
    with pytest.raises(
        ValueError, match=r"Example 'q9' has 5 choices; expected 1 to num_choices=4"
    ):
        encode_examples("c3", [five], tokenizer(), 16)
    assert encode_examples("c3", [five], tokenizer(), 16, num_choices=5).features[
        "choice_mask"
    ].tolist() == [[1] * 5]
    wrong = ChoiceExample("q2", "", "问", ("一", "二"), 2)
    with pytest.raises(ValueError, match=r"Example 'q2' has the label 2; expected an index"):
        encode_examples("c3", [wrong], tokenizer(), 16)


# === Idiom cloze (CHID) ===
def test_chid_rows_per_blank_with_the_other_blanks_masked():
    passage = IdiomPassage(
        "p0",
        candidates=("一心一意", "三心二意"),
        parts=("他做事", "小明", "。"),
        blank_ids=("#idiom000001#", "#idiom000002#"),
        labels=(0, 1),
    )
    split = encode_examples("chid", [passage], tokenizer(), max_length=24, num_choices=3)
    features = split.features
    assert features["token_ids"].shape == (2, 3, 24)
    assert features["choice_mask"].tolist() == [[1, 1, 0], [1, 1, 0]]
    first = [CLS] + ids("一心一意") + [SEP] + ids("他做事") + [UNUSED1] + ids("小明")
    first += [MASK] * 4 + ids("。") + [SEP]
    assert features["token_ids"][0, 0, : len(first)].tolist() == first
    second = [CLS] + ids("三心二意") + [SEP] + ids("他做事") + [MASK] * 4 + ids("小明")
    second += [UNUSED1] + ids("。") + [SEP]
    assert features["token_ids"][1, 1, : len(second)].tolist() == second
    assert features["segment_ids"][0, 0, :7].tolist() == [0] * 6 + [1]
    assert split.labels.tolist() == [0, 1]
    assert split.meta["ids"] == ["#idiom000001#", "#idiom000002#"]
    assert split.meta["passage_ids"] == ["p0", "p0"] and split.meta["num_candidates"] == [2, 2]


def test_chid_window_is_centred_on_the_blank():
    left, right = "今天天气很好北京是中国的首都", "大学上海交通他做事"  # 14 and 9 tokens
    passage = IdiomPassage(0, ("一心一意",), (left, right), ("#idiom1#",), (0,))
    split = encode_examples("chid", [passage], tokenizer(), max_length=16, num_choices=1)
    # 16 - 4 special - 4 candidate = 8 context tokens: 4 before and 4 after the blank.
    row = split.features["token_ids"][0, 0].tolist()
    expected = [CLS] + ids("一心一意") + [SEP] + ids("国的首都") + [UNUSED1] + ids("大学上海")
    assert row == expected + [SEP]
    # A short right side leaves its budget to the left.
    passage = IdiomPassage(0, ("一心一意",), (left, "。"), ("#idiom1#",), (0,))
    row = encode_examples("chid", [passage], tokenizer(), 16, num_choices=1).features["token_ids"]
    expected = [CLS] + ids("一心一意") + [SEP] + ids(left[-7:]) + [UNUSED1] + ids("。")
    assert row[0, 0].tolist() == expected + [SEP]


def test_chid_bad_input():
    many = IdiomPassage("p1", ("一心一意",), ("a", "b", "c"), ("#1#", "#2#"), (0, 0))
    with pytest.raises(ValueError, match=r"Passage 'p1' has 2 blanks but only 1 candidates"):
        encode_examples("chid", [many], tokenizer(), 16)
    parts = IdiomPassage("p2", ("一心一意",), ("a",), ("#1#",), (0,))
    with pytest.raises(ValueError, match=r"Passage 'p2' has 1 parts for 1 blanks"):
        encode_examples("chid", [parts], tokenizer(), 16)
    with pytest.raises(ValueError, match=r"Passage 'p3': a candidate of 4 tokens does not fit"):
        encode_examples(
            "chid", [IdiomPassage("p3", ("一心一意",), ("", ""), ("#1#",), (0,))], tokenizer(), 7
        )


# === Span extraction (CMRC2018) ===
def test_cmrc2018_windows_and_answer_targets():
    context = "今天天气很好北京是中国的首都大学上海交通"  # 20 tokens, one per character
    answer = ("上海", context.index("上海"))  # characters 16-17
    example = SpanExample("q1", context, "他说", (answer,))
    split = encode_examples("cmrc2018", [example], tokenizer(), max_length=13, stride=4)
    # 13 - 3 special - 2 question = 8 context tokens a window: starts 0, 4, 8, 12.
    features, offsets = split.features, split.meta["offsets"]
    assert features["token_ids"].shape == (4, 13) and split.meta["ids"] == ["q1"] * 4
    assert features["token_ids"][1].tolist() == [CLS] + ids("他说") + [SEP] + ids(context[4:12]) + [
        SEP
    ]
    assert features["segment_ids"][1].tolist() == [0] * 4 + [1] * 9
    assert offsets[1, 4:12].tolist() == [[c, c + 1] for c in range(4, 12)]
    assert (offsets[1, :4] == -1).all() and (offsets[1, 12] == -1).all()
    # Only the last window (characters 12-19) holds the answer (16-17): the others target [CLS].
    assert split.labels.tolist() == [[0, 0], [0, 0], [0, 0], [8, 9]]
    start, end = split.labels[3]
    assert context[offsets[3, start, 0] : offsets[3, end, 1]] == "上海"
    assert split.meta["max_answer_length"] == 30 and split.meta["lost_answers"] == []
    # Each context token belongs to the window where it has the most context (run_squad.py).
    owners = split.meta["max_context"][:, 4:12].astype(int).tolist()
    assert owners == [
        [1, 1, 1, 1, 1, 1, 0, 0],  # characters 0-5
        [0, 0, 1, 1, 1, 1, 0, 0],  # 6-9
        [0, 0, 1, 1, 1, 1, 0, 0],  # 10-13
        [0, 0, 1, 1, 1, 1, 1, 1],  # 14-19
    ]
    assert split.meta["max_context"].sum() == len(context)


def test_cmrc2018_answers_without_a_place_are_not_targets():
    context = "今天天气很好北京是中国的首都"
    # The first answer's text is not in the context (answer_start None): the next is used.
    example = SpanExample("q1", context, "他说", (("上海", None), ("北京", 6)))
    split = encode_examples("cmrc2018", [example], tokenizer(), max_length=24)
    assert split.labels.tolist() == [[10, 11]] and split.meta["lost_answers"] == []
    nowhere = SpanExample("q2", context, "他说", (("上海", None),))
    split = encode_examples("cmrc2018", [nowhere, example], tokenizer(), max_length=24)
    assert split.labels.tolist() == [[0, 0], [10, 11]] and split.meta["lost_answers"] == ["q2"]


def test_a_cmrc2018_answer_no_window_holds_is_counted_lost(caplog):
    """Every window targets [CLS]; it was not counted. 8 context tokens a window
    (13 - 3 special - 2 question), starting at 0, 4, 8: tokens 6-13 are in none."""
    context = "今天天气很好北京是中国的首都"
    across = SpanExample("q3", context, "他说", (("北京是中国的首都", 6),))
    inside = SpanExample("q1", context, "他说", (("北京", 6),))
    with caplog.at_level("WARNING", logger="keras_masking"):
        split = encode_examples("cmrc2018", [across, inside], tokenizer(), max_length=13, stride=4)
    rows = split.meta["ids"].count("q3")
    assert split.labels[:rows].tolist() == [[0, 0]] * rows
    assert split.labels[rows:].tolist() == [[10, 11], [6, 7], [0, 0]]
    assert split.meta["lost_answers"] == ["q3"]
    assert "1 answers could not be placed on tokens or in one window" in caplog.text
    # A stride that starts a window at token 6 holds it.
    split = encode_examples("cmrc2018", [across], tokenizer(), max_length=13, stride=6)
    assert [4, 11] in split.labels.tolist() and split.meta["lost_answers"] == []


def test_cmrc2018_inexact_and_unlabelled():
    example = SpanExample("q2", "hello 123", "他说", (("23", 7),))  # "123" is 12 + ##3
    split = encode_examples("cmrc2018", [example], tokenizer(), max_length=16)
    assert split.meta["inexact_answers"] == ["q2"]  # the answer starts inside the token "12"
    assert split.labels.tolist() == [[5, 6]]  # the covering tokens 12, ##3
    test = encode_examples("cmrc2018", [SpanExample("q3", "好", "问", None)], tokenizer(), 16)
    assert test.labels is None and test.features["token_ids"].shape == (1, 16)
    wrong = SpanExample("q4", "今天天气", "问", (("天气", 0),))
    with pytest.raises(ValueError, match=r"Example 'q4': the answer '天气' is not at character 0"):
        encode_examples("cmrc2018", [wrong], tokenizer(), 16)


# === Entities (CLUENER) ===
def test_cluener_token_spans_and_lost_entities_are_counted(caplog):
    text = "浙商银行playing北京是中国的首都"
    entities = (
        ("company", 0, 3),  # 浙商银行: tokens 1-4
        ("game", 4, 6),  # "pla": ends inside the token "play" -> boundary
        ("address", 11, 12),  # 北京: tokens 7-8
        ("address", 17, 18),  # 首都: past max_length -> truncated
    )
    with caplog.at_level(logging.WARNING):
        split = encode_examples("cluener", [EntityExample("s1", text, entities)], tokenizer(), 12)
    assert (
        "2 entities cannot be targets: 1 have a boundary inside a token, 1 lie past" in caplog.text
    )
    company, address = 2, 0  # the types' ids in the task's label order
    assert split.labels.shape == (1, 8, 3)
    assert split.labels[0, :2].tolist() == [[company, 1, 4], [address, 7, 8]]
    assert (split.labels[0, 2:] == -1).all()
    assert split.meta["lost_entities"] == [
        ("s1", ("game", 4, 6), "boundary"),
        ("s1", ("address", 17, 18), "truncated"),
    ]
    offsets = split.meta["offsets"][0]
    assert offsets[1].tolist() == [0, 1] and offsets[5].tolist() == [4, 8]  # "play"
    assert offsets[0].tolist() == [-1, -1] and offsets[11].tolist() == [-1, -1]  # [CLS], [SEP]
    assert split.features["token_ids"][0, -1] == SEP


def test_cluener_bad_input():
    bad_type = EntityExample("s2", "北京", (("city", 0, 1),))
    with pytest.raises(ValueError, match=r"Example 's2' has the entity type 'city'"):
        encode_examples("cluener", [bad_type], tokenizer(), 12)
    bad_end = EntityExample("s3", "北京", (("address", 0, 2),))
    with pytest.raises(ValueError, match=r"Example 's3' has the entity .*expected 0 <= start"):
        encode_examples("cluener", [bad_end], tokenizer(), 12)
    many = EntityExample("s4", "北京北京", tuple(("address", i, i) for i in range(4)))
    with pytest.raises(
        ValueError, match=r"Example 's4' has 4 entities; expected at most max_entities=2"
    ):
        encode_examples("cluener", [many], tokenizer(), 12, max_entities=2)
    test = encode_examples("cluener", [EntityExample("t", "北京", None)], tokenizer(), 12)
    assert test.labels is None
