"""CLUE examples -> fixed-shape feature arrays, per task kind (bert4keras' encodings).

`encode_examples` pads every array to ``max_length`` (and to the number of
choices), so one compiled model serves every batch. The rows per kind:

* classification: ``[CLS] text_a [SEP] (text_b [SEP])``, the longer text
  cut first (bert4keras' ``truncate_sequences``);
* multiple choice (C3): per choice ``[CLS] context [SEP] question [SEP]
  choice [SEP]``, the context cut first;
* idiom (CHID): one row per BLANK, per candidate ``[CLS] candidate [SEP]
  left [unused1] right [SEP]``, the passage's other blanks as 4 x
  ``[MASK]``, the context a window centred on the blank;
* span (CMRC2018): ``[CLS] question [SEP] window [SEP]`` over sliding
  windows of the context; a window without the answer targets ``[CLS]``;
* entity (CLUENER): ``[CLS] text [SEP]``, entities as token spans; an
  entity that cannot be placed on tokens is counted in ``meta`` and logged.

Rows are packed by `pack_segments`, the packer of
`TransformerTextClassifierPreprocessor`; the cuts it cannot make (the
bert4keras ones, which on a tie cut the FIRST text where its round robin
cuts the second; the windows) are made before it.
"""

import dataclasses
import inspect
import logging

import numpy as np

from keras_masking.clue.examples import RECORD_TYPES
from keras_masking.clue.model_source import REQUIRED_TOKENS
from keras_masking.clue.tasks import get_task
from keras_masking.models.transformer_text_classifier_preprocessor import pack_segments
from keras_masking.models.transformer_tokenizer import tokenize_with_offsets
from keras_masking.utils.arguments import check_int

logger = logging.getLogger(__name__)

#: Choices per row when ``num_choices`` is not given: C3 has at most 4, CHID 10.
DEFAULT_NUM_CHOICES = {"multiple_choice": 4, "idiom": 10}


@dataclasses.dataclass
class EncodedSplit:
    """The arrays of one encoded split and what decoding needs.

    Attributes:
        features: dict of int32 arrays ``token_ids``, ``segment_ids``,
            ``padding_mask``, ``(rows, max_length)``; multiple choice and
            idiom ``(rows, choices, max_length)`` plus ``choice_mask``.
        labels: the loss targets, or None when unlabelled: int32 ``(rows,)``
            (classification, choices); span ``(windows, 2)`` start and end
            token (``(0, 0)`` without the answer); entity ``(rows,
            max_entities, 3)`` ``(type, start, end)`` tokens, ``-1`` padding.
        meta: a dict: ``kind``, ``ids`` (per row; idiom: the blank id),
            ``example_index`` (per row), ``dropped_pieces`` (the texts that
            hold pieces a pruned vocabulary dropped), and per kind: classification
            ``label_names``, ``truncated``; multiple choice ``num_choices``,
            ``truncated``; idiom ``num_candidates``, ``blank_index``,
            ``passage_ids``; span ``offsets`` (``(windows, max_length, 2)``:
            each context token's characters, ``-1`` elsewhere),
            ``max_context`` (the tokens an answer may start at, as BERT's
            ``run_squad.py``), ``max_answer_length``, ``lost_answers``,
            ``inexact_answers``; entity ``offsets``, ``entity_types``,
            ``lost_entities`` (``(id, entity, "boundary" or "truncated")``).

    Example:
    >>> split = EncodedSplit({"token_ids": np.zeros((2, 8), "int32")}, None, {"ids": [0, 1]})
    >>> len(split)
    2
    """

    features: dict
    labels: object
    meta: dict

    def __len__(self):
        return len(next(iter(self.features.values())))


def encode_examples(task, examples, tokenizer, max_length, **options):
    """Encodes a split's examples for a task model, with static shapes.

    Args:
        task: a `ClueTask` or a task name.
        examples: the records of the task's kind, all labelled or all
            unlabelled.
        tokenizer: a keras-hub `BertTokenizer`.
        max_length: int, the length of every row.
        **options: per kind:
            classification: ``labels`` (the label strings in id order; the
            task's by default, required for csldcp);
            multiple_choice: ``num_choices`` (4);
            idiom: ``num_choices`` (10), ``blank_token`` (``"[unused1]"``),
            ``other_blank_token`` (``"[MASK]"``), ``other_blank_length`` (4);
            span: ``stride`` (the task's, else 128: tokens between window
            starts), ``max_query_length`` (64 tokens), ``max_answer_length``
            (30 tokens, kept in ``meta`` for decoding);
            entity: ``max_entities`` (default: the split's largest count
            rounded up to a multiple of 8).

    Returns:
        An `EncodedSplit`.

    Raises:
        ValueError: bad options or records; each names the example id.

    Example:
    >>> import keras_hub
    >>> from keras_masking.clue.examples import TextExample
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好", "坏", "很"]
    >>> tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=vocab)
    >>> examples = [TextExample(0, "很好", None, "Positive"), TextExample(1, "坏", None, None)]
    >>> examples[1] = TextExample(1, "坏", None, "Negative")
    >>> split = encode_examples("eprstmt", examples, tokenizer, max_length=6)
    >>> split.features["token_ids"].tolist(), split.labels.tolist()
    ([[2, 7, 5, 3, 0, 0], [2, 6, 3, 0, 0, 0]], [1, 0])
    """
    task = get_task(task)
    encoder = {
        "classification": _encode_classification,
        "multiple_choice": _encode_multiple_choice,
        "idiom": _encode_idiom,
        "span": _encode_span,
        "entity": _encode_entity,
    }[task.kind]
    known = list(inspect.signature(encoder).parameters)[4:]  # the kind's options
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"Unknown options {unknown} for the {task.kind} task {task.name!r}; expected some "
            f"of {sorted(known)}."
        )
    max_length = check_int("max_length", max_length, minimum=4)
    examples = list(examples)
    if not examples:
        raise ValueError(f"No examples to encode for task {task.name!r} (examples is empty).")
    record = RECORD_TYPES[task.kind]
    for index, example in enumerate(examples):
        if not isinstance(example, record):
            raise ValueError(
                f"Task {task.name!r} ({task.kind}) expects {record.__name__} records. Received: "
                f"{type(example).__name__} at index {index} "
                f"(id {getattr(example, 'id', None)!r})."
            )
    for token in ("[CLS]", "[SEP]", "[PAD]"):
        _special_token_id(tokenizer, token)
    _DROPPED.clear()
    try:
        encoded = encoder(task, examples, tokenizer, max_length, **options)
        encoded.meta["dropped_pieces"] = len(_DROPPED)
    finally:
        dropped, _DROPPED[:] = list(_DROPPED), []
    if dropped:
        logger.warning(
            "%s: %d texts hold pieces the pruned vocabulary dropped, each read as <unk> "
            "(first: %r). Prune to every text the model reads, test files included, as the "
            "CLUE readers give them (CLUEWSC's marked spans, CSL's keywords joined by '；').",
            task.name,
            len(dropped),
            dropped[0][:80],
        )
    return encoded


# The texts of the encoding under way that hold pieces a pruned vocabulary
# dropped (a pruned `UnigramTokenizer`'s `dropped_pieces`).
_DROPPED = []


# BERT's special tokens as the tokenizers' attributes ("[CLS]": "cls_token_id"; a
# UnigramTokenizer's <s>, </s>, <pad>, <unk>, <mask>).
_SPECIAL_ATTRIBUTES = {token: f"{token[1:-1].lower()}_token_id" for token in REQUIRED_TOKENS}


def _special_token_id(tokenizer, token):
    """The id of a token such as ``"[CLS]"`` (else the tokenizer's own); a ValueError if none."""
    if token in tokenizer.get_vocabulary():
        return int(tokenizer.token_to_id(token))
    own = getattr(tokenizer, _SPECIAL_ATTRIBUTES.get(token, ""), None)
    if own is None:
        raise ValueError(
            f"The tokenizer's vocabulary has no token {token!r}; this encoding needs it. "
            "Use a BERT vocabulary that holds it, or choose another token in the options."
        )
    return int(own)


# === Shared helpers ===
def _ids(tokenizer, text):
    return _tokenized(tokenizer, text)[0]


def _tokenized(tokenizer, text):
    """`tokenize_with_offsets`, noting a text with pieces a pruned vocabulary dropped."""
    dropped = getattr(tokenizer, "dropped_pieces", None)
    if dropped is not None and dropped(text):
        _DROPPED.append(text)
    return tokenize_with_offsets(tokenizer, text)


def _name(example, what="Example"):
    """``Example 'id'``, with the file and line it was read from when known."""
    source = getattr(example, "source", None)
    return f"{what} {example.id!r}" + (f" ({source})" if source else "")


def _labelled(examples, field):
    """Whether the split is labelled; raises when it mixes both."""
    missing = [example.id for example in examples if getattr(example, field) is None]
    if missing and len(missing) != len(examples):
        raise ValueError(
            f"The split mixes labelled and unlabelled examples: {len(missing)} of "
            f"{len(examples)} have no {field!r}, e.g. id {missing[0]!r}. Expected all or none."
        )
    return not missing


def _pack(tokenizer, rows, max_length, choice_mask=None):
    """`pack_segments` of ``rows``; with ``choice_mask``, shaped ``(-1, choices, max_length)``."""
    features = pack_segments(tokenizer, rows, max_length)
    if choice_mask is not None:
        shape = (-1, choice_mask.shape[1], max_length)
        features = {key: value.reshape(shape) for key, value in features.items()}
        features["choice_mask"] = choice_mask
    return features


def _truncate_longest_first(sequences, budget):
    """Cuts the ends of the longest sequences until they fit (bert4keras)."""
    sequences = [list(sequence) for sequence in sequences]
    cut = False
    while sum(len(sequence) for sequence in sequences) > budget:
        longest = max(range(len(sequences)), key=lambda i: (len(sequences[i]), -i))
        sequences[longest].pop()
        cut = True
    return sequences, cut


def _check_choice_count(example, count, num_choices, what):
    if count == 0 or count > num_choices:
        raise ValueError(
            f"{_name(example)} has {count} {what}; expected 1 to num_choices={num_choices} "
            "(raise num_choices for more)."
        )


def _check_label(example, label, count, what):
    if (
        isinstance(label, bool)
        or not isinstance(label, (int, np.integer))
        or not 0 <= label < count
    ):
        raise ValueError(
            f"{_name(example)} has the label {label!r}; expected an index into its {count} {what}."
        )


def _meta(task, examples, ids=None, example_index=None, **extra):
    return {
        "kind": task.kind,
        "ids": [example.id for example in examples] if ids is None else ids,
        "example_index": list(range(len(examples))) if example_index is None else example_index,
        **extra,
    }


def _add_choices(rows, choice_mask, row, pairs):
    """Appends a row's choice pairs, padded to ``choice_mask``'s width, and marks them there."""
    # A padded choice is [CLS] [SEP]: a real row, so that no attention row is fully masked.
    rows.extend(pairs + [((),)] * (choice_mask.shape[1] - len(pairs)))
    choice_mask[row, : len(pairs)] = 1


# === Classification ===
def _encode_classification(task, examples, tokenizer, max_length, labels=None):
    label_names = tuple(labels) if labels is not None else task.labels
    if not label_names:
        raise ValueError(
            f"Task {task.name!r} has no fixed label set: pass labels=... (the split's labels, "
            "e.g. ClueSplit.labels of the training split)."
        )
    label_ids = {label: index for index, label in enumerate(label_names)}
    labelled = _labelled(examples, "label")
    targets = np.zeros(len(examples), "int32") if labelled else None
    rows, truncated, unmarked = [], 0, []
    for index, example in enumerate(examples):
        texts = [example.text_a] + ([example.text_b] if example.text_b is not None else [])
        budget = max_length - 1 - len(texts)
        (ids, offsets), *others = [_tokenized(tokenizer, text) for text in texts]
        pieces, cut = _truncate_longest_first([ids] + [other[0] for other in others], budget)
        truncated += cut
        if cut and task.name == "cluewsc":  # the cut end took a span's closing mark?
            last_mark = max(example.text_a.rfind("_"), example.text_a.rfind("]"))
            kept = len(pieces[0])
            if kept < len(ids) and (not kept or offsets[kept - 1][1] <= last_mark):
                unmarked.append(example.id)
        rows.append(tuple(pieces))
        if labelled:
            if example.label not in label_ids:
                shown = list(label_names[:20]) + (["..."] if len(label_names) > 20 else [])
                raise ValueError(
                    f"{_name(example)} has the label {example.label!r}, which is not one of "
                    f"{task.name}'s labels, the model's {len(label_names)} classes {shown}. "
                    f"Expected one of them. Received: label={example.label!r}."
                )
            targets[index] = label_ids[example.label]
    if unmarked:
        logger.warning(
            "%s: %d examples lost a span mark (_x_ or [y]) to max_length=%d, and train and score "
            "without it (bert4keras cuts so too): ids %s.",
            task.name,
            len(unmarked),
            max_length,
            unmarked[:10] + (["..."] if len(unmarked) > 10 else []),
        )
    meta = _meta(task, examples, label_names=label_names, truncated=truncated)
    return EncodedSplit(_pack(tokenizer, rows, max_length), targets, meta)


# === Multiple choice (C3) ===
def _encode_multiple_choice(
    task, examples, tokenizer, max_length, num_choices=DEFAULT_NUM_CHOICES["multiple_choice"]
):
    num_choices = check_int("num_choices", num_choices, minimum=1)
    labelled = _labelled(examples, "label")
    choice_mask = np.zeros((len(examples), num_choices), "int32")
    targets = np.zeros(len(examples), "int32") if labelled else None
    sep = _special_token_id(tokenizer, "[SEP]")
    rows, truncated, budget = [], 0, max_length - 4
    for index, example in enumerate(examples):
        _check_choice_count(example, len(example.choices), num_choices, "choices")
        context = _ids(tokenizer, example.context)
        question = _ids(tokenizer, example.question)
        pairs = []
        for choice in example.choices:
            # The context goes first; the question and choice longest first.
            pair, _ = _truncate_longest_first([question, _ids(tokenizer, choice)], budget)
            context_cut = context[: budget - len(pair[0]) - len(pair[1])]
            pairs.append((context_cut, pair[0] + [sep] + pair[1]))
        truncated += any(len(context_cut) < len(context) for context_cut, _ in pairs)
        _add_choices(rows, choice_mask, index, pairs)
        if labelled:
            _check_label(example, example.label, len(example.choices), "choices")
            targets[index] = example.label
    counts = [len(example.choices) for example in examples]
    meta = _meta(task, examples, num_choices=counts, truncated=truncated)
    return EncodedSplit(_pack(tokenizer, rows, max_length, choice_mask), targets, meta)


# === Idiom cloze (CHID) ===
def _encode_idiom(
    task,
    examples,
    tokenizer,
    max_length,
    num_choices=DEFAULT_NUM_CHOICES["idiom"],
    blank_token="[unused1]",
    other_blank_token="[MASK]",
    other_blank_length=4,
):
    num_choices = check_int("num_choices", num_choices, minimum=1)
    blank_id = _special_token_id(tokenizer, blank_token)
    other_id = _special_token_id(tokenizer, other_blank_token)
    other_length = check_int("other_blank_length", other_blank_length, 0)
    labelled = _labelled(examples, "labels")
    count = sum(len(passage.blank_ids) for passage in examples)
    choice_mask = np.zeros((count, num_choices), "int32")
    targets = np.zeros(count, "int32") if labelled else None
    rows, blanks = [], []  # blanks: (passage index, blank index) of each row
    for index, passage in enumerate(examples):
        if len(passage.parts) != len(passage.blank_ids) + 1:
            raise ValueError(
                f"{_name(passage, 'Passage')} has {len(passage.parts)} parts for "
                f"{len(passage.blank_ids)} blanks; expected one part more than blanks."
            )
        _check_choice_count(passage, len(passage.candidates), num_choices, "candidates")
        if len(passage.blank_ids) > len(passage.candidates):
            raise ValueError(
                f"{_name(passage, 'Passage')} has {len(passage.blank_ids)} blanks but only "
                f"{len(passage.candidates)} candidates; each blank takes a different candidate."
            )
        if labelled and len(passage.labels) != len(passage.blank_ids):
            raise ValueError(
                f"{_name(passage, 'Passage')} has {len(passage.labels)} labels for "
                f"{len(passage.blank_ids)} blanks; expected one label per blank."
            )
        parts = [_ids(tokenizer, part) for part in passage.parts]
        candidates = [_ids(tokenizer, candidate) for candidate in passage.candidates]
        longest = max(len(candidate) for candidate in candidates)
        budget = max_length - 4 - longest
        if budget < 0:
            raise ValueError(
                f"{_name(passage, 'Passage')}: a candidate of {longest} tokens does not fit "
                f"max_length={max_length}; expected max_length >= {longest + 4}."
            )
        others = [other_id] * other_length
        for blank in range(len(passage.blank_ids)):
            left = _join_parts(parts[: blank + 1], others)
            right = _join_parts(parts[blank + 1 :], others)
            left, right = _window(left, right, budget)
            pairs = [(candidate, left + [blank_id] + right) for candidate in candidates]
            _add_choices(rows, choice_mask, len(blanks), pairs)
            if labelled:
                _check_label(passage, passage.labels[blank], len(candidates), "candidates")
                targets[len(blanks)] = passage.labels[blank]
            blanks.append((index, blank))
    meta = _meta(
        task,
        examples,
        ids=[examples[i].blank_ids[b] for i, b in blanks],
        example_index=[i for i, _ in blanks],
        blank_index=[b for _, b in blanks],
        passage_ids=[examples[i].id for i, _ in blanks],
        num_candidates=[len(examples[i].candidates) for i, _ in blanks],
    )
    return EncodedSplit(_pack(tokenizer, rows, max_length, choice_mask), targets, meta)


def _join_parts(parts, separator):
    joined = list(parts[0])
    for part in parts[1:]:
        joined += separator + part
    return joined


def _window(left, right, budget):
    """The end of ``left`` and start of ``right``: half the budget each, unused room shared."""
    keep_left = min(len(left), max(budget // 2, budget - len(right)))
    keep_right = min(len(right), budget - keep_left)
    return left[len(left) - keep_left :], right[:keep_right]


# === Span extraction (CMRC2018) ===
def _encode_span(
    task, examples, tokenizer, max_length, stride=None, max_query_length=64, max_answer_length=30
):
    stride = task.defaults.get("stride", 128) if stride is None else stride
    stride = check_int("stride", stride, 1)
    max_query = check_int("max_query_length", max_query_length, 1)
    max_answer = check_int("max_answer_length", max_answer_length, 1)
    labelled = _labelled(examples, "answers")
    rows, offsets, targets, lost, inexact = [], [], [], [], []
    windows = {}  # example index -> [(row, first position, window)]
    for index, example in enumerate(examples):
        question = _ids(tokenizer, example.question)[:max_query]
        context, spans = _tokenized(tokenizer, example.context)
        budget = max_length - 3 - len(question)
        if budget < 1:
            raise ValueError(
                f"{_name(example)}: max_length={max_length} leaves no room for the "
                f"context after a {len(question)}-token question; expected max_length >= "
                f"{len(question) + 4} (or a smaller max_query_length)."
            )
        answer = _answer_tokens(example, spans, lost, inexact) if labelled else None
        first, start, held = len(question) + 2, 0, False  # [CLS] question [SEP] window
        while True:
            window = range(start, start + min(budget, len(context) - start))
            target = (0, 0)
            if answer is not None and answer[0] >= start and answer[1] < window.stop:
                target = (answer[0] + first - start, answer[1] + first - start)
                held = True
            windows.setdefault(index, []).append((len(rows), first, window))
            row_offsets = np.full((max_length, 2), -1, "int32")
            if len(window):
                row_offsets[first : first + len(window)] = spans[window.start : window.stop]
            rows.append((question, context[window.start : window.stop]))
            offsets.append(row_offsets)
            targets.append(target)
            if window.stop >= len(context):
                break
            start += min(len(window), stride)
        if answer is not None and not held:
            lost.append(example.id)  # no window holds it whole: [CLS] in every one
    max_context = np.zeros((len(rows), max_length), bool)
    for example_windows in windows.values():
        _mark_max_context(max_context, example_windows)
    if lost or inexact:
        logger.warning(
            "%s: %d answers could not be placed on tokens or in one window (targets "
            "[CLS]), %d only approximately (token boundaries inside the answer).",
            task.name,
            len(lost),
            len(inexact),
        )
    example_index = [index for index, rows in windows.items() for _ in rows]
    meta = _meta(
        task,
        examples,
        ids=[examples[index].id for index in example_index],
        example_index=example_index,
        offsets=np.stack(offsets),
        max_context=max_context,
        max_answer_length=max_answer,
        lost_answers=lost,
        inexact_answers=inexact,
    )
    targets = np.array(targets, "int32").reshape(-1, 2) if labelled else None
    return EncodedSplit(_pack(tokenizer, rows, max_length), targets, meta)


def _mark_max_context(max_context, windows):
    """Marks each context token in the one window where it has the most context.

    BERT's ``run_squad.py`` (which CLUE's CMRC2018 baseline runs): a token
    in several overlapping windows belongs to the window where
    ``min(tokens left of it, tokens right of it) + 0.01 * window length`` is
    largest (the first such window on a tie); an answer may start only there.
    """
    for row, first, window in windows:
        for position in window:
            best, best_row = None, None
            for other_row, _, other in windows:
                if position in other:
                    left, right = position - other.start, other.stop - 1 - position
                    value = min(left, right) + 0.01 * len(other)
                    if best is None or value > best:
                        best, best_row = value, other_row
            max_context[row, first + position - window.start] = best_row == row


def _answer_tokens(example, spans, lost, inexact):
    """The first and last token of the first placed answer; None (counted in ``lost``): [CLS]."""
    if not example.answers:
        raise ValueError(f"{_name(example)} has an empty answers tuple; expected None or answers.")
    placed = [(text, start) for text, start in example.answers if start is not None]
    if not placed:
        lost.append(example.id)
        return None
    text, start = placed[0]
    if example.context[start : start + len(text)] != text or not text:
        raise ValueError(
            f"{_name(example)}: the answer {text!r} is not at character {start} of the "
            f"context (found {example.context[start : start + len(text)]!r})."
        )
    end = start + len(text)  # exclusive
    covering = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
    if not covering:
        lost.append(example.id)
        return None
    first, last = covering[0], covering[-1]
    if spans[first][0] != start or spans[last][1] != end:
        inexact.append(example.id)
    return first, last


# === Entities (CLUENER) ===
def _encode_entity(task, examples, tokenizer, max_length, max_entities=None):
    types = task.labels
    if not types:
        raise ValueError(f"Task {task.name!r} has no entity types (labels is None).")
    type_ids = {name: index for index, name in enumerate(types)}
    labelled = _labelled(examples, "entities")
    offsets = np.full((len(examples), max_length, 2), -1, "int32")
    rows, kept, lost = [], [], []
    for index, example in enumerate(examples):
        ids, spans = _tokenized(tokenizer, example.text)
        ids, spans = ids[: max_length - 2], spans[: max_length - 2]
        rows.append((ids,))
        if spans:
            offsets[index, 1 : 1 + len(spans)] = spans
        entities = []
        if labelled:
            starts = {span[0]: position + 1 for position, span in enumerate(spans)}
            ends = {span[1] - 1: position + 1 for position, span in enumerate(spans)}
            last_char = spans[-1][1] if spans else 0
            for entity in dict.fromkeys(example.entities):  # ordered, duplicates once
                name, start, end = _check_entity(example, entity, type_ids)
                if start in starts and end in ends and starts[start] <= ends[end]:
                    entities.append((type_ids[name], starts[start], ends[end]))
                else:
                    reason = "truncated" if end >= last_char else "boundary"
                    lost.append((example.id, entity, reason))
        kept.append(entities)
    targets = None
    if labelled:
        largest = max(len(entities) for entities in kept)
        if max_entities is None:
            max_entities = max(8, -(-largest // 8) * 8)
        max_entities = check_int("max_entities", max_entities, minimum=1)
        if largest > max_entities:
            worst = examples[max(range(len(kept)), key=lambda i: len(kept[i]))].id
            raise ValueError(
                f"Example {worst!r} has {largest} entities; expected at most "
                f"max_entities={max_entities}."
            )
        targets = np.full((len(examples), max_entities, 3), -1, "int32")
        for index, entities in enumerate(kept):
            if entities:
                targets[index, : len(entities)] = entities
    if lost:
        reasons = [reason for *_, reason in lost]
        logger.warning(
            "%s: %d entities cannot be targets: %d have a boundary inside a token, %d lie past "
            "max_length=%d (see meta['lost_entities']).",
            task.name,
            len(lost),
            reasons.count("boundary"),
            reasons.count("truncated"),
            max_length,
        )
    meta = _meta(task, examples, offsets=offsets, entity_types=tuple(types), lost_entities=lost)
    return EncodedSplit(_pack(tokenizer, rows, max_length), targets, meta)


def _check_entity(example, entity, type_ids):
    if not isinstance(entity, (tuple, list)) or len(entity) != 3:
        raise ValueError(
            f"{_name(example)} has the entity {entity!r}; expected (type, start, end)."
        )
    name, start, end = entity
    if name not in type_ids:
        raise ValueError(
            f"{_name(example)} has the entity type {name!r}; expected one of {list(type_ids)}."
        )
    if not (
        isinstance(start, int) and isinstance(end, int) and 0 <= start <= end < len(example.text)
    ):
        raise ValueError(
            f"{_name(example)} has the entity {entity!r}; expected 0 <= start <= end < "
            f"{len(example.text)} (end inclusive)."
        )
    return name, start, end
