"""TransformerTokenizer gives the tokens of BERT's reference tokenizer.

The reference below is our own plain-Python model of the BERT tokenizer of
Google's ``tokenization.py`` (``BasicTokenizer`` + ``WordpieceTokenizer``:
lower case, accents stripped with NFD, Chinese characters split) with the two
settings of Hugging Face's ``BertTokenizer`` that users' Chinese checkpoints
are tokenized with: every "other" character (Unicode category C*: control,
format, private use, unassigned) is deleted, not only Cc and Cf, and a word
of more than 100 characters is one ``[UNK]`` (Google's script: 200).
Every eager and ``tf.data`` result is compared with it, on the real FewCLUE
texts (when $KERAS_MASKING_DATA names a folder holding them) and on a list of special characters.
"""

import functools
import json
import os
import pathlib
import re
import unicodedata

import numpy as np
import pytest

from keras_masking.data import bert_tokenizer
from keras_masking.models import TransformerTokenizer
from keras_masking.models.transformer_tokenizer import tokenize_with_offsets

# Real data (the FewCLUE files, the Chinese BERT vocabulary) is read only from
# the folder $KERAS_MASKING_DATA names; the tests that need it skip without it.
DATA = os.environ.get("KERAS_MASKING_DATA")
SHARED = pathlib.Path(DATA or pathlib.Path(__file__).parent / "no-data")
CHINESE_VOCAB = SHARED / "vocab" / "bert-base-chinese-vocab.txt"
FEWCLUE = SHARED / "fewclue"
needs_real_data = pytest.mark.skipif(
    not (CHINESE_VOCAB.exists() and FEWCLUE.exists()),
    reason="needs $KERAS_MASKING_DATA (vocab/ and fewclue/)",
)


# === The reference: BERT's BasicTokenizer + WordpieceTokenizer, from the algorithm ===
def _ref_is_whitespace(char):
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _ref_is_control(char):
    return char not in "\t\n\r" and unicodedata.category(char).startswith("C")


def _ref_is_punctuation(char):
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _ref_is_chinese(char):
    code = ord(char)
    return any(
        low <= code <= high
        for low, high in (
            (0x4E00, 0x9FFF),
            (0x3400, 0x4DBF),
            (0x20000, 0x2A6DF),
            (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F),
            (0x2B820, 0x2CEAF),
            (0xF900, 0xFAFF),
            (0x2F800, 0x2FA1F),
        )
    )


def _ref_strip_accents(text):
    return "".join(
        char for char in unicodedata.normalize("NFD", text) if unicodedata.category(char) != "Mn"
    )


def _ref_split_on_punctuation(text):
    words, current = [], ""
    for char in text:
        if _ref_is_punctuation(char):
            words += [current, char] if current else [char]
            current = ""
        else:
            current += char
    return words + [current] if current else words


def reference_words(text, folding="bert"):
    """BERT's BasicTokenizer (lower case): the words WordPiece receives.

    ``folding="nfkc"``: keras-hub's NFKC case folding of each word, after
    the split, in place of BERT's ``lower``.
    """
    kept = []
    for char in text:
        if char in "\x00\ufffd" or _ref_is_control(char):
            continue
        kept.append(" " if _ref_is_whitespace(char) else char)
    text = "".join(f" {char} " if _ref_is_chinese(char) else char for char in kept)
    words = []
    for word in text.split():  # str.split: also U+2028 and U+2029
        if folding == "bert":
            words += _ref_split_on_punctuation(_ref_strip_accents(word.lower()))
        else:
            for piece in _ref_split_on_punctuation(_ref_strip_accents(word)):
                folded = unicodedata.normalize("NFKC", piece).casefold()
                folded = unicodedata.normalize("NFKC", folded)
                words.append("".join(c for c in folded if not _ref_default_ignorable(c)))
    return [word for word in words if word]


def _ref_default_ignorable(char):
    # NFKC_Casefold drops Default_Ignorable_Code_Point characters.
    code = ord(char)
    return (
        code in (0x00AD, 0x034F, 0x061C, 0x3164, 0xFEFF, 0xFFA0)
        or 0x115F <= code <= 0x1160
        or 0x17B4 <= code <= 0x17B5
        or 0x180B <= code <= 0x180F
        or 0x200B <= code <= 0x200F
        or 0x202A <= code <= 0x202E
        or 0x2060 <= code <= 0x206F
        or 0xFE00 <= code <= 0xFE0F
        or 0xFFF0 <= code <= 0xFFF8
        or 0x1BCA0 <= code <= 0x1BCA3
        or 0x1D173 <= code <= 0x1D17A
        or 0xE0000 <= code <= 0xE0FFF
    )


def reference_tokens(text, vocabulary, folding="bert", max_chars=100):
    """Words of `reference_words`, each greedy longest-match WordPiece."""
    tokens = []
    for word in reference_words(text, folding):
        if len(word) > max_chars:
            tokens.append("[UNK]")
            continue
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocabulary:
                    break
                end -= 1
            if end == start:
                pieces = ["[UNK]"]
                break
            pieces.append(piece)
            start = end
        tokens += pieces
    return tokens


# === Texts ===
def _special_texts():
    """Texts around every kind of character BERT's cleaning and splitting treats apart."""
    texts = [
        "价格\xa0100元",
        "nul\x00char 你好",
        "\u3000\u3000时间：2014年12月4-6日<br>\u3000\u3000地点",
        "zero\u200bwidth soft\xadhyphen join\u200dER bom\ufeffmark lrm\u200emark",
        "vertical\vtab form\ffeed\x1cfile\x1dgroup\x85next",
        "line\u2028separator paragraph\u2029separator",
        "replace\ufffdment 替\ufffd换",
        "private\ue000use 私\uf8ff用 \U000f0000plane \U0010fffd",
        "Café Ñandú ÉCOLE naïve Ångström e\u0301 中\u0301文 a\u20ddb क\u0903ि",
        FINAL_SIGMA,
        "İstanbul ǅemal ﬁnance",
        "emoji 😀👍🏽 👨\u200d👩\u200d👧 🇨🇳 ❤️ 😀中文🎉",
        "ＦＵＬＬ　ｗｉｄｔｈ　１２３！，。（）【】",
        "tab\tnew\nline\r\ncarriage",
        "  leading and trailing \u3000 ",
        "",
        "\x00\ufffd\u200b",
        "я" * 100 + " " + "я" * 101 + " " + "é" * 101,
        "あ" * 101 + " 한" * 3 + " " + "한국어" * 34 + " " + "🎉" * 101,
        "http://example.com/" + "a" * 90 + " " + "Ⅻ㍿℃ ｶﾀｶﾅ",
    ]
    return texts + _texts_around(("Zs", "Zl", "Zp", "Cc", "Cf"))


# Python's (and Google's) lower case of a word-final capital sigma is "ς";
# Hugging Face's Rust tokenizer lowercases one character at a time: "σ".
FINAL_SIGMA = "ΣΟΦΟΣ ΟΔΟΣ. Σ aΣb"


def _texts_around(categories):
    """``ab?cd 价?格 ?`` for every character ``?`` of these categories or a space."""
    return [
        f"ab{char}cd 价{char}格 {char}"
        for char in map(chr, range(0x110000))
        if unicodedata.category(char) in categories or char.isspace()
    ]


@functools.lru_cache(maxsize=None)
def _fewclue_texts():
    """Every text field of every FewCLUE file (strings in lists and dicts included)."""

    def strings(value, key=None):
        if isinstance(value, str) and key not in ("id", "label", "level", "genre", "prem_id"):
            yield value
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
        elif isinstance(value, dict):
            for name, item in value.items():
                yield from strings(item, name)

    texts = []
    for path in sorted(FEWCLUE.glob("*/*_few_all.json")):
        # Not splitlines: U+2028 and U+2029 inside the texts are not line ends.
        for line in path.read_text(encoding="utf-8").split("\n"):
            if line.strip():
                texts.extend(text for text in strings(json.loads(line)) if text)
    return tuple(texts)


def _hard_and_sampled(texts, every=50):
    """The texts with characters BERT deletes, turns into spaces or strips, or words
    over 100 characters, and every ``every``-th of the rest."""

    def hard(text):
        if re.search("[0-9A-Za-z]{101,}", text):
            return True
        return any(
            unicodedata.category(char)[0] in "CZM" and char != " " or char == "\ufffd"
            for char in text
        )

    return [text for index, text in enumerate(texts) if index % every == 0 or hard(text)]


@pytest.fixture(scope="module")
def chinese():
    if not CHINESE_VOCAB.exists():
        pytest.skip("needs $KERAS_MASKING_DATA/vocab/bert-base-chinese-vocab.txt")
    tokenizer = bert_tokenizer(CHINESE_VOCAB)
    return tokenizer, {token: index for index, token in enumerate(tokenizer.get_vocabulary())}


def _eager_ids(tokenizer, texts):
    return [np.asarray(ids).tolist() for ids in tokenizer(list(texts))]


def _dataset_ids(tokenizer, texts, batch=256):
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(list(texts)).batch(batch).map(tokenizer)
    return [row for ids in dataset for row in ids.to_list()]


def _mismatches(texts, ids, vocabulary, folding="bert"):
    expected = [
        [vocabulary[token] for token in reference_tokens(text, vocabulary, folding)]
        for text in texts
    ]
    return [(text, got, want) for text, got, want in zip(texts, ids, expected) if got != want]


# === Item 1: the reference's tokens, eagerly and in tf.data ===
@pytest.mark.parametrize("folding", ["bert", "nfkc"])
def test_special_characters_give_the_reference_tokens(chinese, folding):
    tokenizer, vocabulary = chinese
    if folding == "nfkc":
        tokenizer = bert_tokenizer(tokenizer.get_vocabulary(), case_folding="nfkc")
    texts = _special_texts()
    assert _mismatches(texts, _eager_ids(tokenizer, texts), vocabulary, folding) == []
    assert _mismatches(texts, _dataset_ids(tokenizer, texts), vocabulary, folding) == []


def test_the_issue_examples_give_hand_written_tokens(chinese):
    tokenizer, _ = chinese
    examples = {
        "价格\xa0100元": ["价", "格", "100", "元"],
        "\u3000\u3000时间": ["时", "间"],
        # Zero-width space, soft hyphen, ZWJ, \v and \f vanish: the word stays whole.
        "ok\u200bok ok\xadok ok\u200dok ok\vok ok\fok": ["ok", "##ok"] * 5,
        "价\ue000格\x00\ufffd": ["价", "格"],  # private use, NUL, U+FFFD deleted
        "ok\u2028ok\u2029ok": ["ok"] * 3,
        # Full-width letters and punctuation keep their own rows (NFKC would make them ASCII).
        "ＨｅＬｏ，ＷＯ！": ["ｈ", "##ｅ", "##ｌ", "##ｏ", "，", "ｗ", "##ｏ", "！"],
        "😀" * 40: ["[UNK]"],
    }
    texts = list(examples)
    expected = [[tokenizer.token_to_id(token) for token in examples[text]] for text in texts]
    assert _eager_ids(tokenizer, texts) == expected
    assert _dataset_ids(tokenizer, texts) == expected
    assert [tokenize_with_offsets(tokenizer, text)[0] for text in texts] == expected


def test_every_basic_plane_character_between_letters(chinese):
    """All 63,488 BMP characters but surrogates, 200 to a text, each between letters."""
    tokenizer, vocabulary = chinese
    codes = [code for code in range(0x10000) if not 0xD800 <= code <= 0xDFFF]
    texts = [
        " ".join(f"a{chr(code)}b" for code in codes[start : start + 200])
        for start in range(0, len(codes), 200)
    ]
    assert _mismatches(texts, _eager_ids(tokenizer, texts), vocabulary) == []
    assert _mismatches(texts, _dataset_ids(tokenizer, texts, batch=64), vocabulary) == []


def test_words_are_limited_in_characters_not_bytes():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "я", "##я", "中", "😀", "##😀"]
    tokenizer = TransformerTokenizer(vocabulary=vocabulary, lowercase=True)
    texts = ["я" * 100, "я" * 101, "Я" * 60 + " 中", "😀" * 100, "😀" * 101]

    expected = [[5] + [6] * 99, [1], [5] + [6] * 59 + [7], [8] + [9] * 99, [1]]
    assert _eager_ids(tokenizer, texts) == expected  # 100 characters: 200 and 400 bytes
    assert _dataset_ids(tokenizer, texts) == expected
    assert [tokenize_with_offsets(tokenizer, text)[0] for text in texts] == expected
    # Google's own script allows 200 characters.
    longer = TransformerTokenizer(
        vocabulary=vocabulary, lowercase=True, max_input_chars_per_word=200
    )
    assert _eager_ids(longer, ["я" * 101]) == [[5] + [6] * 100]
    assert _dataset_ids(longer, ["я" * 201]) == [[1]]
    message = "Expected an integer >= 1 .*Received: max_input_chars_per_word=0"
    with pytest.raises(ValueError, match=message):
        TransformerTokenizer(vocabulary=vocabulary, max_input_chars_per_word=0)


@needs_real_data
@pytest.mark.parametrize("folding", ["bert", "nfkc"])
def test_fewclue_texts_give_the_reference_tokens(chinese, folding):
    """The FewCLUE texts that BERT's cleaning changes, and a fiftieth of the rest."""
    tokenizer, vocabulary = chinese
    if folding == "nfkc":
        tokenizer = bert_tokenizer(tokenizer.get_vocabulary(), case_folding="nfkc")
    texts = _hard_and_sampled(_fewclue_texts())
    assert len(texts) > 600
    assert _mismatches(texts, _eager_ids(tokenizer, texts), vocabulary, folding) == []
    assert _mismatches(texts, _dataset_ids(tokenizer, texts), vocabulary, folding) == []


@pytest.mark.slow
@needs_real_data
def test_all_fewclue_texts_give_the_reference_tokens(chinese):
    tokenizer, vocabulary = chinese
    texts = _fewclue_texts()
    assert len(texts) > 27000
    assert _mismatches(texts, _eager_ids(tokenizer, texts), vocabulary) == []
    assert _mismatches(texts, _dataset_ids(tokenizer, texts), vocabulary) == []


# === Item 2: tf.data sees the text eager preprocessing sees ===
@pytest.mark.parametrize("folding", ["bert", "nfkc"])
def test_text_after_a_nul_is_kept_in_tf_data(folding):
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "nu", "##l", "##lch", "##ar"]
    vocabulary += ["你", "好"]
    tokenizer = TransformerTokenizer(vocabulary=vocabulary, lowercase=True, case_folding=folding)
    texts = ["NUL\x00char 你好", "\x00你"]
    expected = [[5, 7, 8, 9, 10], [9]]  # nu ##lch ##ar 你 好: the NUL joins "nul" and "char"
    assert _eager_ids(tokenizer, texts) == expected
    assert _dataset_ids(tokenizer, texts) == expected


def test_lowercase_like_bert_keeps_text_after_a_nul():
    import tensorflow as tf

    from keras_masking.models.transformer_tokenizer import lowercase_like_bert

    texts = [["AB\x00CD", "ÉÀ\x00\x00Σ", "\uffffA\x001Ω\uffff0"]]
    lowered = lowercase_like_bert(tf.constant(texts))
    assert lowered.numpy().tolist() == [[text.lower().encode() for text in texts[0]]]
    ragged = lowercase_like_bert(tf.ragged.constant([["X\x00Y"], []]))
    assert ragged.to_list() == [[b"x\x00y"], []]


def test_offsets_give_the_tokenizer_ids_and_the_original_spans(chinese):
    tokenizer, _ = chinese
    texts = _special_texts()
    for text, ids in zip(texts, _eager_ids(tokenizer, texts)):
        assert tokenize_with_offsets(tokenizer, text)[0] == ids, text
    text = "价格\xa0100元 zero\u200bwidth"
    ids, spans = tokenize_with_offsets(tokenizer, text)
    assert [tokenizer.id_to_token(index) for index in ids] == [
        "价",
        "格",
        "100",
        "元",
        "zero",
        "##wi",
        "##dt",
        "##h",
    ]
    # The deleted zero-width space belongs to no token.
    assert [text[start:end] for start, end in spans] == [
        "价",
        "格",
        "100",
        "元",
        "zero",
        "wi",
        "dt",
        "h",
    ]
    assert spans[4:6] == [(8, 12), (13, 15)]


def test_a_final_sigma_leaves_every_other_token_its_own_span():
    # "ΟΔΟΣ".lower() ends in "ς", "Σ".lower() is "σ": the per-character spans
    # differed from the whole text's lowercasing, and every token then
    # spanned the whole text (a CMRC2018 answer decoded as the whole context).
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "海", "淀", "区", "οδος", "意"]
    vocabulary += ["σα", "##ς"]
    tokenizer = TransformerTokenizer(vocabulary=vocabulary, lowercase=True)
    text = "海淀区ΟΔΟΣ意 ΣΑΣ"
    ids, spans = tokenize_with_offsets(tokenizer, text)
    assert [tokenizer.id_to_token(index) for index in ids] == [
        "海", "淀", "区", "οδος", "意", "σα", "##ς"
    ]  # fmt: skip
    assert ids == _eager_ids(tokenizer, [text])[0]  # the tokenizer's own ids
    assert [text[start:end] for start, end in spans] == ["海", "淀", "区", "ΟΔΟΣ", "意", "ΣΑ", "Σ"]


# === Against Hugging Face's tokenizers, when transformers is installed ===
def test_equal_to_hugging_face_bert_tokenizer(chinese):
    transformers = pytest.importorskip("transformers")
    tokenizer, vocabulary = chinese
    hugging_face = transformers.BertTokenizer(
        str(CHINESE_VOCAB), do_lower_case=True, tokenize_chinese_chars=True
    )
    # Its Rust character tables predate some format characters (U+0890...),
    # and it lowercases one character at a time (final sigma): not those.
    texts = [text for text in _special_texts()[:20] if text != FINAL_SIGMA]
    texts += _texts_around(("Zs", "Zl", "Zp", "Cc"))
    if FEWCLUE.exists():
        texts += _hard_and_sampled(_fewclue_texts(), every=200)
    expected = [hugging_face.convert_tokens_to_ids(hugging_face.tokenize(text)) for text in texts]
    assert len(texts) > 100
    assert _eager_ids(tokenizer, texts) == expected
    assert _dataset_ids(tokenizer, texts) == expected


def test_equal_to_hugging_face_python_tokenizer(chinese):
    """transformers' Python BertTokenizer reads this Python's Unicode tables: every text."""
    pytest.importorskip("transformers")
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    except ImportError:
        from transformers import BertTokenizer as BertTokenizerLegacy  # transformers < 5
    tokenizer, _ = chinese
    hugging_face = BertTokenizerLegacy(
        str(CHINESE_VOCAB), do_lower_case=True, tokenize_chinese_chars=True
    )
    texts = _special_texts()
    expected = [hugging_face.convert_tokens_to_ids(hugging_face.tokenize(text)) for text in texts]
    assert _eager_ids(tokenizer, texts) == expected
    assert _dataset_ids(tokenizer, texts) == expected
