"""A tiny Chinese + English WordPiece vocabulary for the CLUE tests."""

import functools

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused1]"]
CHINESE = (
    "今天天气很好北京是中国的首都大学上海交通他做事一心三意二。，！？、"
    "浙商银行企业信贷部男女你好再见说了什么在年月日人们喜欢这个地方来自"
    "小明和红去公园玩看书电影游戏"
)
PIECES = [
    "hello", "world", "play", "##ing", "##s", "the", "olymp", "##ics", "beijing", "cafe",
    "naive", "full", "1998", "12", "##3", "a", "##b", "ok", ",", ".", "!", "'", "-", "(", ")",
]  # fmt: skip

VOCABULARY = SPECIAL + list(dict.fromkeys(CHINESE)) + PIECES
PAD, UNK, CLS, SEP, MASK, UNUSED1 = range(6)


def token_id(token):
    return VOCABULARY.index(token)


@functools.lru_cache(maxsize=None)
def tokenizer(lowercase=True, strip_accents=False):
    """A keras-hub BertTokenizer on `VOCABULARY` (cached: building one is slow)."""
    import keras_hub

    return keras_hub.tokenizers.BertTokenizer(
        vocabulary=VOCABULARY, lowercase=lowercase, strip_accents=strip_accents
    )


def ids(text):
    """The ids of ``text``'s characters, one token per Chinese character."""
    return [token_id(char) for char in text]
