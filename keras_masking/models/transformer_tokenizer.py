"""TransformerTokenizer: WordPiece as Google's BERT tokenizes, for our presets.

keras-hub's `BertTokenizer` is not Google's nor Hugging Face's BERT tokenizer,
which users' Chinese checkpoints were trained with: it splits words at control
and format characters where BERT deletes them, keeps non-ASCII spaces inside
words, cuts words at 100 UTF-8 bytes (BERT: 100 characters), and case-folds
with NFKC, which turns full-width punctuation and letters into ASCII ("，" ->
","), while Chinese BERT, RoBERTa-wwm, RoFormer and NEZHA vocabularies hold,
and their pretraining saw, both forms. `TransformerTokenizer` is keras-hub's
`BertTokenizer` with BERT's cleaning, lowercasing and word limit, giving the
same ids on the eager (Python) path and in a ``tf.data`` graph.

`tokenize_with_offsets` gives the ids of any keras-hub `BertTokenizer` with
the character span of each token in the original text, for span and entity
tasks (CMRC2018, CLUENER).
"""

import difflib
import functools
import sys
import unicodedata
import weakref

import keras
import keras_hub
import numpy as np
import regex

from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_int

CASE_FOLDINGS = ("bert", "nfkc")
MAX_INPUT_CHARS_PER_WORD = 100


def _cleaned(code):
    """What BERT's text cleaning makes of one code point: None (deleted), " " or itself."""
    char = chr(code)
    category = unicodedata.category(char)
    if code == 0xFFFD or (category[0] == "C" and char not in "\t\n\r"):
        return None
    if char in "\t\n\r" or category == "Zs" or char.isspace():
        return " "  # U+2028 and U+2029 too: BERT splits words with str.split
    return code


class _CleaningTable(dict):
    """``str.translate`` table of BERT's text cleaning, filled as characters come."""

    def __missing__(self, code):
        self[code] = value = _cleaned(code)
        return value


_CLEANING_TABLE = _CleaningTable()


@functools.lru_cache(maxsize=None)
def _re2_cleaning_patterns():
    """RE2 classes ``(deleted, spaces)`` of the same cleaning, for the tf.data path.

    Built from this Python's tables (not RE2's own, whose Unicode version
    differs), without surrogates (not in UTF-8).
    """
    ranges = {None: [], " ": []}
    for code, value in enumerate(map(_cleaned, range(0x110000))):
        if (value is not None and value != " ") or 0xD800 <= code <= 0xDFFF:
            continue
        found = ranges[value]
        if found and found[-1][1] == code - 1:
            found[-1][1] = code
        else:
            found.append([code, code])
    return tuple(
        "[" + "".join(f"\\x{{{low:x}}}-\\x{{{high:x}}}" for low, high in ranges[key]) + "]"
        for key in (None, " ")
    )


def _map_strings(inputs, python_function, tf_function):
    """``python_function`` on Python and numpy strings, ``tf_function`` on (dense) TF ones."""
    if isinstance(inputs, str):
        return python_function(inputs)
    if isinstance(inputs, bytes):
        return python_function(inputs.decode("utf-8")).encode("utf-8")
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_map_strings(value, python_function, tf_function) for value in inputs)
    if isinstance(inputs, np.ndarray):
        if inputs.dtype.kind not in "OSU":
            return inputs
        mapped = [_map_strings(value, python_function, tf_function) for value in inputs.ravel()]
        if inputs.dtype.kind != "O":
            return np.array(mapped, dtype=inputs.dtype.kind).reshape(inputs.shape)
        output = np.empty(inputs.shape, dtype=object)
        output.ravel()[:] = mapped
        return output
    tf = sys.modules.get("tensorflow")  # a TensorFlow tensor means it is imported
    if tf is None or not isinstance(inputs, (tf.Tensor, tf.RaggedTensor)):
        return inputs
    if inputs.dtype != tf.string:
        return inputs  # not strings: keras-hub names what it received
    if isinstance(inputs, tf.RaggedTensor):
        return tf.ragged.map_flat_values(tf_function, inputs)
    return tf_function(inputs)


def _clean_python(text):
    if text.isprintable() and "\ufffd" not in text:
        return text  # nothing to clean: no C*, Z* (but " ") or U+FFFD character
    return text.translate(_CLEANING_TABLE)


def _clean_tf(text):
    import tensorflow as tf

    deleted, spaces = _re2_cleaning_patterns()
    return tf.strings.regex_replace(tf.strings.regex_replace(text, deleted, ""), spaces, " ")


def clean_text_like_bert(inputs):
    """BERT's text cleaning (Hugging Face's ``_clean_text``), for every input form.

    NUL, U+FFFD and every character of Unicode category C* but tab, line
    feed and carriage return are deleted; every space separator, tab and
    line break (U+2028 and U+2029 included) becomes a space.

    Args:
        inputs: a string, bytes, a nested list of them, a numpy string
            array, or a TensorFlow string tensor (dense or ragged, eager or
            in a ``tf.data`` graph).

    Returns:
        The same form, cleaned.

    Example:
    >>> clean_text_like_bert(["价格\\xa0100元", "zero\\u200bwidth\\x00", b"a\\xc2\\xa0b"])
    ['价格 100元', 'zerowidth', b'a b']
    """
    return _map_strings(inputs, _clean_python, _clean_tf)


def _lowercase_tf(text, without_nul=False):
    import tensorflow as tf

    if without_nul:
        return tf.strings.lower(text, encoding="utf-8")
    # ICU's lowercasing stops at a NUL: NUL is escaped as U+FFFF "0" (and
    # U+FFFF itself as U+FFFF "1"), which lowercasing leaves alone, then restored.
    text = tf.strings.regex_replace(text, "\uffff", "\uffff1")
    text = tf.strings.regex_replace(text, r"\x00", "\uffff0")
    text = tf.strings.lower(text, encoding="utf-8")
    text = tf.strings.regex_replace(text, "\uffff0", "\x00")
    return tf.strings.regex_replace(text, "\uffff1", "\uffff")


def lowercase_like_bert(inputs):
    """Lowercases strings as ``str.lower`` does, for every input form.

    TensorFlow lowercases with ICU's case mapping, which equals Python's for
    every character outside the newest Unicode additions.

    Args:
        inputs: the forms `clean_text_like_bert` takes.

    Returns:
        The same form, lowercased.

    Example:
    >>> lowercase_like_bert(["Ｈello，世界！", b"ABC"])
    ['ｈello，世界！', b'abc']
    """
    return _map_strings(inputs, str.lower, _lowercase_tf)


@functools.lru_cache(maxsize=None)
def _char_limited_wordpiece_class():
    """tf-text's FastWordpieceTokenizer, with BERT's limit in characters."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    class CharLimitedWordpieceTokenizer(tf_text.FastWordpieceTokenizer):
        """A word of more than ``max_chars_per_word`` characters is the unknown token."""

        def __init__(self, max_chars_per_word, unknown_token, **kwargs):
            # Bytes never cut a word the character limit keeps (4 bytes a character at most).
            super().__init__(
                unknown_token=unknown_token, max_bytes_per_word=4 * max_chars_per_word, **kwargs
            )
            self._max_chars_per_word = max_chars_per_word
            self._unknown_token = unknown_token

        def _limit(self, words):
            too_long = tf.strings.length(words, unit="UTF8_CHAR") > self._max_chars_per_word
            return tf.where(too_long, self._unknown_token, words)

        def tokenize_with_offsets(self, input):  # noqa: A002 (tf-text's name)
            if isinstance(input, tf.RaggedTensor):
                input = tf.ragged.map_flat_values(self._limit, input)
            else:
                input = self._limit(tf.convert_to_tensor(input))
            return super().tokenize_with_offsets(input)

    return CharLimitedWordpieceTokenizer


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerTokenizer(keras_hub.tokenizers.BertTokenizer):
    """keras-hub's `BertTokenizer`, tokenizing as Google's BERT, for our presets.

    Text is cleaned as BERT does (`clean_text_like_bert`); with
    ``lowercase=True`` and ``case_folding="bert"`` it is lowercased with
    plain Unicode lowercasing and its accents stripped, so full-width
    punctuation and letters keep their own vocabulary rows. The eager and
    ``tf.data`` paths give the ids of Hugging Face's ``BertTokenizer``, and
    of Google's but for private-use and unassigned characters (deleted here
    and by Hugging Face's; ``[UNK]`` in Google's code).

    It is the class keras-hub's ``Tokenizer.from_preset`` loads for a
    `TransformerBackbone` preset (through ``backbone_cls``).

    Args:
        vocabulary: a list of tokens or a ``vocab.txt`` path.
        lowercase: bool. True for uncased English and for Chinese BERT.
        strip_accents: bool or None (None: as ``lowercase``, as BERT does).
        case_folding: ``"bert"`` or ``"nfkc"``, how ``lowercase`` lowercases.
        max_input_chars_per_word: int >= 1. Longer words are one ``[UNK]``
            (100, as Hugging Face's ``BertTokenizer``; Google's script: 200).
        **kwargs: other `keras_hub.tokenizers.BertTokenizer` arguments. With
            ``split=False`` the inputs are words, taken as they are (no
            cleaning).

    Example:
    >>> vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好", "，", ",", "a"]
    >>> tokenizer = TransformerTokenizer(vocabulary=vocabulary, lowercase=True)
    >>> [int(i) for i in tokenizer("好，A")]
    [5, 6, 8]
    >>> [int(i) for i in tokenizer("\\u3000好\\u200b\\xa0a\\x00")]
    [5, 8]
    >>> nfkc = TransformerTokenizer(vocabulary=vocabulary, lowercase=True, case_folding="nfkc")
    >>> [int(i) for i in nfkc("好，A")]
    [5, 7, 8]
    """

    backbone_cls = TransformerBackbone

    def __init__(
        self,
        vocabulary=None,
        lowercase=False,
        strip_accents=None,
        case_folding="bert",
        max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
        **kwargs,
    ):
        check_choice("case_folding", case_folding, CASE_FOLDINGS)
        lowercase = check_bool("lowercase", lowercase)
        max_input_chars_per_word = check_int(
            "max_input_chars_per_word", max_input_chars_per_word, minimum=1
        )
        bert_lowercase = lowercase and case_folding == "bert"
        if bert_lowercase and kwargs.get("special_tokens_in_strings"):
            raise ValueError(
                "case_folding='bert' lowercases whole strings, special tokens written in them "
                "included; with special_tokens_in_strings=True use case_folding='nfkc'."
            )
        self.bert_lowercase = bert_lowercase
        self.case_folding = case_folding
        # Read by `_set_vocabulary_tf`, which the base class's constructor calls.
        self.max_input_chars_per_word = max_input_chars_per_word
        super().__init__(
            vocabulary=vocabulary,
            lowercase=lowercase and not bert_lowercase,
            strip_accents=lowercase if strip_accents is None else strip_accents,
            **kwargs,
        )

    @property
    def clean_text(self):
        """Whether strings are cleaned as BERT does (all but ``split=False``)."""
        return bool(self.split)

    def tokenize(self, inputs):
        if self.clean_text:
            inputs = clean_text_like_bert(inputs)
        if self.bert_lowercase:
            # Cleaned text holds no NUL: ICU lowercases it whole.
            lowercase_tf = functools.partial(_lowercase_tf, without_nul=self.clean_text)
            inputs = _map_strings(inputs, str.lower, lowercase_tf)
        return super().tokenize(inputs)

    def _set_vocabulary_tf(self):
        self._fast_word_piece = _char_limited_wordpiece_class()(
            max_chars_per_word=self.max_input_chars_per_word,
            unknown_token=self.oov_token,
            vocab=self.vocabulary,
            token_out_type=self.compute_dtype,
            suffix_indicator=self.suffix_indicator,
            no_pretokenization=True,
            support_detokenization=True,
        )

    def _tokenize_word_python(self, word):
        """Greedy longest-match-first WordPiece of one word, as BERT's."""
        if not word:
            return []
        suffix = self.suffix_indicator
        pieces = _wordpiece(word, self._token_to_id_map, suffix, self.max_input_chars_per_word)
        if pieces is None:
            return [self.oov_token]
        return [(suffix if start else "") + word[start:end] for start, end, _ in pieces]

    def get_config(self):
        config = super().get_config()
        config["lowercase"] = self.lowercase or self.bert_lowercase
        config["case_folding"] = self.case_folding
        config["max_input_chars_per_word"] = self.max_input_chars_per_word
        return config


def _wordpiece(word, vocabulary, suffix, max_chars=None):
    """Greedy longest-match-first WordPiece of ``word``, as BERT's.

    ``[(start, end, token id)]`` of its pieces (``suffix`` before every piece
    but the first), or None when the word is one unknown token: longer than
    ``max_chars`` characters (None: keras-hub's 100 UTF-8 bytes), or with a
    part that is not in ``vocabulary``.
    """
    length = len(word.encode("utf-8")) if max_chars is None else len(word)
    if length > (_MAX_BYTES_PER_WORD if max_chars is None else max_chars):
        return None
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            found = vocabulary.get(word[start:end] if start == 0 else suffix + word[start:end])
            if found is not None:
                break
        else:
            return None
        pieces.append((start, end, found))
        start = end
    return pieces


# === Token ids with the character span of every token ===
_WHITESPACE = r"[ \t\n\r\f]|\p{Cc}|\p{Cf}"
_PUNCTUATION = r"[!-/]|[:-@]|[\[-`]|[{-~]|\p{P}"
_CJK = (
    r"[\u4E00-\u9FFF]|[\u3400-\u4DBF]|[\U00020000-\U0002A6DF]|[\U0002A700-\U0002B73F]"
    r"|[\U0002B740-\U0002B81F]|[\U0002B820-\U0002CEAF]|[\uF900-\uFAFF]|[\U0002F800-\U0002FA1F]"
)
# NFKC case folding drops Unicode's default-ignorable code points.
_DEFAULT_IGNORABLE = regex.compile(r"\p{Default_Ignorable_Code_Point}")
_MAX_BYTES_PER_WORD = 100


def tokenize_with_offsets(tokenizer, text):
    """WordPiece ids of ``text`` and the character span of each token.

    Args:
        tokenizer: a keras-hub `BertTokenizer` (or any
            `keras_hub.tokenizers.WordPieceTokenizer`), or a
            `UnigramTokenizer` (its `encode_with_offsets`); its vocabulary and
            its ``lowercase``, ``strip_accents``, ``split``,
            ``split_on_cjk``, ``suffix_indicator`` and ``oov_token``
            settings are followed.
        text: a string.

    Returns:
        ``(token_ids, spans)``: the ids of ``tokenizer(text)``, and for each
        the ``(start, end)`` of the text it came from (an ``[UNK]`` spans its
        whole word).

    Raises:
        TypeError: ``text`` is not a string, or ``tokenizer`` has no
            vocabulary.

    Example:
    >>> import keras_hub
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "北", "京", "play", "##ing"]
    >>> tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=vocab, lowercase=True)
    >>> ids, spans = tokenize_with_offsets(tokenizer, "在北京 Playing")
    >>> ids, spans
    ([1, 5, 6, 7, 8], [(0, 1), (1, 2), (2, 3), (4, 8), (8, 11)])
    """
    if not isinstance(text, str):
        raise TypeError(
            f"tokenize_with_offsets expects text as a str. Received: {type(text).__name__} "
            f"{text!r:.60}."
        )
    if hasattr(tokenizer, "encode_with_offsets"):  # a UnigramTokenizer
        return tokenizer.encode_with_offsets(text)
    return _offset_tokenizer(tokenizer).tokenize(text)


class _OffsetWordPiece:
    """A tokenizer's settings and vocabulary, prepared for offset tokenising."""

    def __init__(self, tokenizer):
        vocabulary = getattr(tokenizer, "vocabulary", None)
        if vocabulary is None and hasattr(tokenizer, "get_vocabulary"):
            vocabulary = tokenizer.get_vocabulary()
        if not vocabulary or isinstance(vocabulary, str):
            raise TypeError(
                "tokenize_with_offsets expects a keras-hub WordPiece tokenizer with a vocabulary "
                f"(e.g. keras_hub.tokenizers.BertTokenizer). Received: {tokenizer!r:.80}."
            )
        self.vocabulary = {token: index for index, token in enumerate(vocabulary)}
        self.lowercase = bool(getattr(tokenizer, "lowercase", False))
        # `TransformerTokenizer` cleans and lowercases whole strings as Google's BERT does,
        # and limits words in characters, not bytes.
        self.clean_text = bool(getattr(tokenizer, "clean_text", False))
        self.bert_lowercase = bool(getattr(tokenizer, "bert_lowercase", False))
        self.max_chars_per_word = getattr(tokenizer, "max_input_chars_per_word", None)
        self.strip_accents = bool(getattr(tokenizer, "strip_accents", False))
        self.split = bool(getattr(tokenizer, "split", True))
        split_on_cjk = bool(getattr(tokenizer, "split_on_cjk", True))
        self.suffix = getattr(tokenizer, "suffix_indicator", "##")
        oov = getattr(tokenizer, "oov_token", "[UNK]")
        if oov not in self.vocabulary:
            raise ValueError(
                f"The tokenizer's out-of-vocabulary token {oov!r} is not in its vocabulary."
            )
        self.oov_id = self.vocabulary[oov]
        special = ()
        if getattr(tokenizer, "special_tokens_in_strings", False):
            special = tuple(getattr(tokenizer, "special_tokens", ()) or ())
        self.special = frozenset(special)
        delimiters = [_WHITESPACE, _PUNCTUATION] + ([_CJK] if split_on_cjk else [])
        kept = [_PUNCTUATION] + ([_CJK] if split_on_cjk else [])
        if special:
            escaped = "|".join(regex.escape(token) for token in special)
            delimiters.insert(0, escaped)
            kept.insert(0, escaped)
        self.delimiter = regex.compile("|".join(delimiters))
        self.kept = regex.compile("|".join(kept))

    def tokenize(self, text):
        spans = [(index, index + 1) for index in range(len(text))]
        if self.clean_text:
            text, spans = _clean_with_spans(text, spans)
        if self.bert_lowercase:
            text, spans = _normalize_with_spans(text, spans, str.lower)
        if self.strip_accents:
            text, spans = _normalize_with_spans(text, spans, _strip_accents)
        ids, token_spans = [], []
        for start, end in self._words(text):
            word, word_spans = text[start:end], spans[start:end]
            if self.lowercase and word not in self.special:
                word, word_spans = _normalize_with_spans(word, word_spans, _case_fold)
            self._word_pieces(word, word_spans, ids, token_spans)
        return ids, token_spans

    def _words(self, text):
        """``(start, end)`` of each word of ``text``, as keras-hub splits it."""
        if not self.split:
            return [(0, len(text))] if text else []
        words, position = [], 0
        for match in self.delimiter.finditer(text):
            if match.start() > position:
                words.append((position, match.start()))
            if self.kept.fullmatch(match.group()):
                words.append((match.start(), match.end()))
            position = match.end()
        if position < len(text):
            words.append((position, len(text)))
        return words

    def _word_pieces(self, word, spans, ids, token_spans):
        if not word:
            return
        pieces = _wordpiece(word, self.vocabulary, self.suffix, self.max_chars_per_word)
        if pieces is None:
            ids.append(self.oov_id)
            token_spans.append((spans[0][0], spans[-1][1]))
            return
        for start, end, found in pieces:
            ids.append(found)
            token_spans.append((spans[start][0], spans[end - 1][1]))


_CACHE = weakref.WeakKeyDictionary()
# The tokenizer settings `_OffsetWordPiece` follows.
_SETTINGS = ("lowercase", "bert_lowercase", "clean_text", "max_input_chars_per_word")
_SETTINGS += ("strip_accents", "split", "split_on_cjk")


def _offset_tokenizer(tokenizer):
    """The prepared `_OffsetWordPiece` of a tokenizer, rebuilt when it changes."""
    key = (id(getattr(tokenizer, "vocabulary", None)),)
    key += tuple(getattr(tokenizer, name, None) for name in _SETTINGS)
    try:
        cached = _CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable
        return _OffsetWordPiece(tokenizer)
    if cached is None or cached[0] != key:
        cached = (key, _OffsetWordPiece(tokenizer))
        _CACHE[tokenizer] = cached
    return cached[1]


def _clean_with_spans(text, spans):
    """BERT's text cleaning; each kept character keeps its span, deleted ones vanish."""
    if text.isprintable() and "\ufffd" not in text:
        return text, spans
    kept = [(char.translate(_CLEANING_TABLE), span) for char, span in zip(text, spans)]
    kept = [(cleaned, span) for cleaned, span in kept if cleaned]
    return "".join(cleaned for cleaned, _ in kept), [span for _, span in kept]


def _strip_accents(text):
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFD", text)
    return "".join(char for char in decomposed if unicodedata.category(char) != "Mn")


def _case_fold(text):
    if text.isascii():
        return text.lower()
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return _DEFAULT_IGNORABLE.sub("", folded)


def _normalize_with_spans(text, spans, normalize):
    """``normalize(text)`` and the original span of each of its characters.

    The text is normalised one cluster at a time (a starter character and
    the combining marks after it), each output character taking its
    cluster's span. Where that differs from normalising the whole text (a
    composition across clusters, or a final sigma: ``"ΟΔΟΣ".lower()`` ends
    in ``ς``, ``"Σ".lower()`` is ``σ``), the whole text's characters there
    span the clusters that differ, and every other character keeps its own
    cluster's span; the characters, and so the ids, are the whole text's.
    """
    whole = normalize(text)
    if whole == text:
        return text, spans
    pieces, new_spans, start = [], [], 0
    for index in range(1, len(text) + 1):
        if index < len(text) and not _is_starter(text[index]):
            continue
        piece = normalize(text[start:index])
        pieces.append(piece)
        new_spans.extend([(spans[start][0], spans[index - 1][1])] * len(piece))
        start = index
    joined = "".join(pieces)
    if joined == whole:
        return whole, new_spans
    whole_spans = []
    matcher = difflib.SequenceMatcher(None, joined, whole, autojunk=False)
    for tag, low, high, whole_low, whole_high in matcher.get_opcodes():
        if tag == "equal":
            whole_spans.extend(new_spans[low:high])
            continue
        # The differing clusters (or, for inserted characters, their neighbours).
        around = new_spans[max(low - (low == high), 0) : min(max(high, low + 1), len(new_spans))]
        around = around or [(spans[0][0], spans[-1][1])]
        covered = (min(a for a, _ in around), max(b for _, b in around))
        whole_spans.extend([covered] * (whole_high - whole_low))
    return whole, whole_spans


def _is_starter(char):
    return unicodedata.combining(char) == 0 and not unicodedata.category(char).startswith("M")
