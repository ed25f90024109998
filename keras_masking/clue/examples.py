"""The immutable records the CLUE readers produce, one class per task kind.

Every record has an ``id`` (the file's id field, else its 0-based index in
the split) and, when a reader made it, a ``source`` (``"path:line"``, or the
document / question), which error messages name and comparisons ignore. In
unlabelled splits the gold field (``label``, ``labels``, ``answers``,
``entities``) is None. `RECORD_TYPES` maps each task kind to its class.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class _Record:
    """What every record has: its id and where it was read (not compared)."""

    id: object
    source: str | None = dataclasses.field(default=None, compare=False, repr=False, kw_only=True)


@dataclasses.dataclass(frozen=True)
class TextExample(_Record):
    """A single text or a text pair with a label string.

    Pairs read as (sentence1, sentence2); CSL as (``"；".join(keywords)``,
    abstract); CLUEWSC as one text with span1 wrapped in ``_`` ... ``_`` and
    span2 in ``[`` ... ``]`` (bert4keras' marking).

    Args:
        id: the example id (int or str).
        text_a: the first (or only) text.
        text_b: the second text, or None.
        label: the label string as the task's `labels` spell it, or None.

    Example:

    >>> TextExample(0, "今天天气好", None, "Positive").label
    'Positive'
    """

    text_a: str
    text_b: str | None
    label: str | None


@dataclasses.dataclass(frozen=True)
class ChoiceExample(_Record):
    """A C3 question on a context, with its choices.

    Args:
        id: the question id (test) or the question's index in the split.
        context: the context lines joined with ``""``.
        question: the question.
        choices: the choice texts (up to 4).
        label: the index of the answer in ``choices``, or None.

    Example:

    >>> example = ChoiceExample(0, "男：你好。", "他说了什么？", ("你好", "再见"), 0)
    >>> example.choices[example.label]
    '你好'
    """

    context: str
    question: str
    choices: tuple
    label: int | None


@dataclasses.dataclass(frozen=True)
class IdiomPassage(_Record):
    """A CHID passage with blanks, each to be filled with one candidate idiom.

    CLUE CHID: a line's content texts joined with ``"\\n"``, its blanks the
    ``#idiomNNNNNN#`` tags; FewCLUE CHID: one line, one blank.

    Args:
        id: the passage id: CLUE: the line's 0-based index; FewCLUE: the
            line's id.
        candidates: the candidate idioms (10 in CLUE, 7 in FewCLUE).
        parts: the texts between blanks; ``len(parts) == len(blank_ids) + 1``.
        blank_ids: the id of each blank (the tag, or the FewCLUE line id).
        labels: the candidate index of each blank, or None.

    Example:

    >>> passage = IdiomPassage(
    ...     0, ("一心一意", "三心二意"), ("他做事", "。"), ("#idiom000001#",), (0,))
    >>> passage.parts[0] + passage.candidates[passage.labels[0]] + passage.parts[1]
    '他做事一心一意。'
    """

    candidates: tuple
    parts: tuple
    blank_ids: tuple
    labels: tuple | None


@dataclasses.dataclass(frozen=True)
class SpanExample(_Record):
    """A CMRC2018 question on a context, with its answer spans.

    Args:
        id: the question id.
        context: the paragraph.
        question: the question.
        answers: ``((text, char_start), ...)`` with
            ``context[char_start:char_start + len(text)] == text``, or None
            (unlabelled). ``char_start`` is None for an answer whose text
            is not in the context (a few in CMRC2018's official files): it
            is scored by its text, never trained on.

    Example:

    >>> example = SpanExample("q1", "北京是中国的首都。", "中国的首都是哪里？", (("北京", 0),))
    >>> text, start = example.answers[0]
    >>> example.context[start:start + len(text)]
    '北京'
    """

    context: str
    question: str
    answers: tuple | None


@dataclasses.dataclass(frozen=True)
class EntityExample(_Record):
    """A CLUENER sentence with its entities.

    Args:
        id: the example id.
        text: the sentence.
        entities: ``((type, start, end), ...)`` with ``end`` INCLUSIVE
            (``text[start:end + 1]`` is the entity), sorted by position, or
            None.

    Example:

    >>> example = EntityExample(0, "浙商银行企业信贷部", (("company", 0, 3),))
    >>> kind, start, end = example.entities[0]
    >>> kind, example.text[start:end + 1]
    ('company', '浙商银行')
    """

    text: str
    entities: tuple | None


#: The record class of each task kind.
RECORD_TYPES = {
    "classification": TextExample,
    "multiple_choice": ChoiceExample,
    "idiom": IdiomPassage,
    "span": SpanExample,
    "entity": EntityExample,
}
