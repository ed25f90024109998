"""WordPiece token ids with the character span of every token.

Span and entity tasks (CMRC2018, CLUENER) label characters, models see
WordPiece tokens: `tokenize_with_offsets` gives both, the ids equal to what
the keras-hub tokenizer itself returns for the same text. It follows the
tokenizer's own settings, in keras-hub's order: for a `TransformerTokenizer`
the text cleaned first as Google's BERT does (space separators, tabs and
line breaks become spaces; NUL, U+FFFD, control, format and private-use
characters are deleted) and the whole text lowercased (as BERT does), accents
stripped when ``strip_accents`` (NFD, marks removed), then the text split on
whitespace (removed), punctuation and CJK characters (each kept as a word),
then each word lowercased when keras-hub's ``lowercase`` is on (Unicode NFKC
case folding, default ignorable code points dropped), then split into
WordPieces greedily, longest match first (``##`` continuation pieces; a word
that cannot be covered, or longer than the tokenizer's
``max_input_chars_per_word`` characters, or for keras-hub's own tokenizers
100 UTF-8 bytes, is one ``[UNK]``).

Each normalised character keeps the span of the original characters it
came from (an accented letter and its combining marks, a ligature), so a
token's span is ``[first char start, last char end)`` in the ORIGINAL text.
"""

import unicodedata
import weakref

import regex

from keras_masking.models.transformer_tokenizer import clean_character_like_bert

_WHITESPACE = r"[ \t\n\r\f]|\p{Cc}|\p{Cf}"
_PUNCTUATION = r"[!-/]|[:-@]|[\[-`]|[{-~]|\p{P}"
_CJK = (
    r"[\u4E00-\u9FFF]|[\u3400-\u4DBF]|[\U00020000-\U0002A6DF]|[\U0002A700-\U0002B73F]"
    r"|[\U0002B740-\U0002B81F]|[\U0002B820-\U0002CEAF]|[\uF900-\uFAFF]|[\U0002F800-\U0002FA1F]"
)
# Unicode's Default_Ignorable_Code_Point ranges, which NFKC case folding drops.
_DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
_MAX_BYTES_PER_WORD = 100


def tokenize_with_offsets(tokenizer, text):
    """WordPiece ids of ``text`` and the character span of each token.

    Args:
        tokenizer: a keras-hub `BertTokenizer` (or any
            `keras_hub.tokenizers.WordPieceTokenizer`); its vocabulary and
            its ``lowercase``, ``strip_accents``, ``split``,
            ``split_on_cjk``, ``suffix_indicator`` and ``oov_token``
            settings are followed.
        text: a string.

    Returns:
        ``(token_ids, spans)``: a list of ints, equal to
        ``tokenizer(text)``, and a list of ``(start, end)`` character
        offsets into ``text`` (end exclusive), one per token, so that
        ``text[start:end]`` is the text a token came from (an ``[UNK]``
        spans its whole word).

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
    return _offset_tokenizer(tokenizer).tokenize(text)


def special_token_id(tokenizer, token):
    """The id of a vocabulary token such as ``"[CLS]"`` or ``"[unused1]"``.

    Args:
        tokenizer: a keras-hub WordPiece tokenizer.
        token: the token string.

    Returns:
        An int.

    Raises:
        ValueError: the token is not in the vocabulary (it is named).

    Example:
    >>> import keras_hub
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused1]"]
    >>> special_token_id(keras_hub.tokenizers.BertTokenizer(vocabulary=vocab), "[unused1]")
    5
    """
    index = _offset_tokenizer(tokenizer).vocabulary.get(token)
    if index is None:
        raise ValueError(
            f"The tokenizer's vocabulary has no token {token!r}; this encoding needs it. "
            "Use a BERT vocabulary that holds it, or choose another token in the options."
        )
    return index


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
        if self.max_chars_per_word is not None:
            too_long = len(word) > self.max_chars_per_word
        else:
            too_long = len(word.encode("utf-8")) > _MAX_BYTES_PER_WORD
        if too_long:
            ids.append(self.oov_id)
            token_spans.append((spans[0][0], spans[-1][1]))
            return
        pieces, start = [], 0
        while start < len(word):
            end, found = len(word), None
            while start < end:
                piece = word[start:end] if start == 0 else self.suffix + word[start:end]
                found = self.vocabulary.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                ids.append(self.oov_id)
                token_spans.append((spans[0][0], spans[-1][1]))
                return
            pieces.append((found, (spans[start][0], spans[end - 1][1])))
            start = end
        for found, span in pieces:
            ids.append(found)
            token_spans.append(span)


_CACHE = weakref.WeakKeyDictionary()


def _offset_tokenizer(tokenizer):
    """The prepared `_OffsetWordPiece` of a tokenizer, rebuilt when it changes."""
    key = (
        id(getattr(tokenizer, "vocabulary", None)),
        getattr(tokenizer, "lowercase", None),
        getattr(tokenizer, "bert_lowercase", None),
        getattr(tokenizer, "clean_text", None),
        getattr(tokenizer, "max_input_chars_per_word", None),
        getattr(tokenizer, "strip_accents", None),
        getattr(tokenizer, "split", None),
        getattr(tokenizer, "split_on_cjk", None),
    )
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
    kept, kept_spans = [], []
    for char, span in zip(text, spans):
        cleaned = clean_character_like_bert(char)
        if cleaned:
            kept.append(cleaned)
            kept_spans.append(span)
    return "".join(kept), kept_spans


def _strip_accents(text):
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFD", text)
    return "".join(char for char in decomposed if unicodedata.category(char) != "Mn")


def _case_fold(text):
    if text.isascii():
        return text.lower()
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return "".join(char for char in folded if not _is_default_ignorable(char))


def _is_default_ignorable(char):
    code = ord(char)
    return any(low <= code <= high for low, high in _DEFAULT_IGNORABLE)


def _normalize_with_spans(text, spans, normalize):
    """``normalize(text)`` and the original span of each of its characters.

    The text is normalised one cluster at a time (a starter character and
    the combining marks after it), each output character taking its
    cluster's span. Should that differ from normalising the whole text (a
    composition across clusters), the whole result is returned with every
    character spanning the whole input, so ids never change.
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
    if "".join(pieces) != whole:
        return whole, [(spans[0][0], spans[-1][1])] * len(whole)
    return whole, new_spans


def _is_starter(char):
    return unicodedata.combining(char) == 0 and not unicodedata.category(char).startswith("M")
