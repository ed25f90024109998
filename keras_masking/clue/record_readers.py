"""Reading one CLUE 1.1 or FewCLUE file into the records of `keras_masking.clue.examples`.

`iter_examples` streams a JSON-lines file (C3 and CMRC2018 files are one JSON
document each); every problem names the file and the line.
"""

import dataclasses
import hashlib
import json
import logging
import os
import re

from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import EntityExample
from keras_masking.clue.examples import IdiomPassage
from keras_masking.clue.examples import SpanExample
from keras_masking.clue.examples import TextExample
from keras_masking.clue.tasks import check_benchmark
from keras_masking.clue.tasks import get_task

logger = logging.getLogger("keras_masking.clue.readers")

_TEXT_FIELDS = {
    "afqmc": ("sentence1", "sentence2"),
    "bustm": ("sentence1", "sentence2"),
    "ocnli": ("sentence1", "sentence2"),
    "cmnli": ("sentence1", "sentence2"),
    "tnews": ("sentence", None),
    "iflytek": ("sentence", None),
    "eprstmt": ("sentence", None),
    "csldcp": ("content", None),
}
_INTEGER_LABEL_TASKS = ("tnews", "iflytek")  # FewCLUE writes these labels as ints
_NLI_TASKS = ("ocnli", "cmnli")  # "-": the annotators did not agree; skipped
CLUE_BLANK = re.compile(r"#idiom\d{6}#")
_FEWCLUE_BLANK = "#idiom#"
_SKIP = object()


def iter_examples(path, task, labelled=True, answers=None, benchmark=None, report=None):
    """Yields the records of one file, one at a time.

    JSON-lines files are read line by line, so a 392k-line CMNLI file never
    sits in memory; C3 and CMRC2018 files are one JSON document each.

    Args:
        path: the file.
        task: a task name or `ClueTask`.
        labelled: whether to read (and require) labels; False for test files,
            whose records must then carry their ids.
        answers: CLUE CHID with labels: the answer file's path or a dict
            ``{tag: candidate index}``.
        benchmark: None, ``"clue"`` or ``"fewclue"``; decides CHID's format
            (detected from the records when None).
        report: an optional dict, filled when the file is exhausted with
            ``"files"`` (``[{"path", "sha256", "records"}]``, the answer file
            too), ``"skipped"`` and ``"counts"`` (see `ClueSplit`).

    Yields:
        The records (`TextExample`, `ChoiceExample`, ...) of the task's kind.

    Raises:
        ValueError: a file that is empty, not UTF-8 or not JSON, a record with
            a missing or mistyped field, an unknown label, a missing (test) or
            duplicate id, spans that do not match their text. The message
            names the file and the line (or the document / question and id).

    Example:

    >>> import pathlib
    >>> _ = pathlib.Path("dev.json").write_text(
    ...     '{"keyword": ["模型", "训练"], "abst": "摘要", "label": "1"}\\n', encoding="utf-8")
    >>> records = iter_examples("dev.json", "csl")
    >>> next(records)
    TextExample(id=0, text_a='模型；训练', text_b='摘要', label='1')
    """
    task = get_task(task)
    if benchmark is not None:
        benchmark = check_benchmark(benchmark)
    reading = SplitReading(task, labelled, not labelled, benchmark, answers)
    yield from read_file(reading, path)
    if report is not None:
        report.update(files=reading.files, skipped=reading.skipped, counts=reading.counts)


@dataclasses.dataclass
class SplitReading:
    """One split being read: what its readers need and what they found."""

    task: object
    labelled: bool
    require_ids: bool
    benchmark: str | None
    answers: object
    count: int = 0  # records read, skipped ones too: the id of the next one without its own
    skipped: int = 0
    seen: dict = dataclasses.field(default_factory=dict)  # id: where it was first read
    files: list = dataclasses.field(default_factory=list)
    counts: dict = dataclasses.field(default_factory=dict)

    def check_unique(self, example_id, where):
        if example_id in self.seen:
            raise ValueError(
                f"{where}: duplicate id {example_id!r} (first used at {self.seen[example_id]}). "
                "Ids must be unique within a split."
            )
        self.seen[example_id] = where

    def example_id(self, record, where, fields=("id",)):
        for field in fields:
            if field in record:
                value = record[field]
                valid = _is(value, (int, str)) and value != ""
                return _expect(
                    valid, value, f"{where}: field {field!r}", "an int or a non-empty str"
                )
        if self.require_ids:
            raise ValueError(
                f"{where}: missing field {fields[0]!r}. Test examples must carry their id "
                "(the submission is matched by it)."
            )
        return self.count

    def add_file(self, path, digest, records):
        self.files.append({"path": os.fspath(path), "sha256": digest, "records": records})


def read_file(reading, path):
    """Yields the records of one file of the split ``reading`` reads."""
    read = _READERS[reading.task.kind]
    if reading.task.kind in ("classification", "entity"):
        records = (read(reading, where, record) for where, record in _json_lines(reading, path))
    else:
        records = read(reading, path)
    for record in records:
        reading.count += 1
        if record is _SKIP:
            reading.skipped += 1
            continue
        reading.check_unique(record.id, record.source)
        yield record


def _json_lines(reading, path):
    """Yields ``(where, JSON object)`` per non-blank line."""
    name = os.fspath(path)
    digest = hashlib.sha256()
    records = 0
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            digest.update(raw)
            line = _decode(raw, name, number)
            if line.strip():
                record = _parse(line, name, number)
                records += 1
                where = f"{name}:{number}"
                yield where, _expect(isinstance(record, dict), record, where, _OBJECT)
    if records == 0:
        raise ValueError(f"{name}: the file is empty (no JSON lines).")
    reading.add_file(path, digest.hexdigest(), records)


def _read_document(path):
    """``(parsed JSON, sha256, file name)`` of a file that is one JSON document."""
    name = os.fspath(path)
    with open(path, "rb") as file:
        data = file.read()
    digest = hashlib.sha256(data).hexdigest()
    text = _decode(data, name)
    del data
    if not text.strip():
        raise ValueError(f"{name}: the file is empty.")
    return _parse(text, name), digest, name


def _decode(data, name, line=None):
    """UTF-8 ``data`` of line ``line`` (None: all) of file ``name``, a byte-order mark dropped."""
    try:
        return data.decode("utf-8-sig" if line in (None, 1) else "utf-8")
    except UnicodeDecodeError as error:
        start = data.rfind(b"\n", 0, error.start) + 1
        line = line or data[:start].count(b"\n") + 1
        raise ValueError(
            f"{name}:{line}: not UTF-8 (byte {error.start - start} of the line). "
            "CLUE files are UTF-8."
        ) from error


def _parse(text, name, line=None):
    """JSON ``text`` of line ``line`` (None: the whole file) of file ``name``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{name}:{line or error.lineno}: not valid JSON ({error.msg} at column {error.colno})."
        ) from error


# === Checking what a record holds ===
_OBJECT = "a JSON object"
_STRINGS = "a non-empty list of strings"
_TYPE_NAMES = {str: "a str", int: "an int", list: "a list", dict: _OBJECT}


def _is(value, kind):
    """Whether ``value`` is a ``kind``; a bool is never a number here."""
    return isinstance(value, kind) and not isinstance(value, bool)


def _expect(valid, value, where, what):
    """``value`` if ``valid``, else a ValueError at ``where`` saying ``what`` was expected."""
    if not valid:
        text = repr(value)
        if len(text) > 40:
            text = text[:37] + "..."
        raise ValueError(f"{where}: expected {what}. Received: {type(value).__name__} {text}.")
    return value


def _field(record, name, where, kind, what=None):
    """Field ``name`` of ``record``, a ``kind``."""
    if name not in record:
        raise ValueError(f"{where}: missing field {name!r}.")
    value = record[name]
    return _expect(_is(value, kind), value, f"{where}: field {name!r}", what or _TYPE_NAMES[kind])


def _strings(record, name, where):
    """Field ``name`` of ``record``, a non-empty list of strings."""
    values = _field(record, name, where, list, _STRINGS)
    valid = values and all(isinstance(value, str) for value in values)
    return _expect(valid, values, f"{where}: field {name!r}", _STRINGS)


def short_labels(labels):
    if len(labels) <= 16:
        return repr(tuple(labels))
    return f"({', '.join(map(repr, labels[:5]))}, ..., {labels[-1]!r}) ({len(labels)} labels)"


# === The records of each kind ===
def _label(reading, record, where):
    """The label string of a classification record; `_SKIP` for an NLI ``"-"``."""
    task = reading.task
    integer = task.name in _INTEGER_LABEL_TASKS
    kind, what = ((str, int), "a str or an int") if integer else (str, "a str")
    value = str(_field(record, "label", where, kind, what))
    if value == "-" and task.name in _NLI_TASKS:
        return _SKIP
    if task.labels is not None and value not in task.labels:
        raise ValueError(
            f"{where}: label {record['label']!r} is not one of {task.name}'s labels "
            f"{short_labels(task.labels)}."
        )
    if not value:
        raise ValueError(f"{where}: field 'label' is an empty string.")
    return value


def _text_example(reading, where, record):
    name = reading.task.name
    label = _label(reading, record, where) if reading.labelled else None
    if label is _SKIP:
        return _SKIP
    if name == "cluewsc":
        example_id = reading.example_id(record, where, ("id", "idx"))
        return TextExample(example_id, _marked_wsc_text(record, where), None, label, source=where)
    example_id = reading.example_id(record, where)
    if name == "csl":
        text_a = "；".join(_strings(record, "keyword", where))
        text_b = _field(record, "abst", where, str)
    else:
        first, second = _TEXT_FIELDS[name]
        text_a = _field(record, first, where, str)
        text_b = _field(record, second, where, str) if second else None
    return TextExample(example_id, text_a, text_b, label, source=where)


def _marked_wsc_text(record, where):
    """The text with span1 as ``_x_`` and span2 as ``[y]`` (bert4keras)."""
    text = _field(record, "text", where, str)
    target = _field(record, "target", where, dict, "an object")
    # (position, 0 for a closing mark / 1 for an opening one, order, mark): at one
    # position, marks close before others open; nested spans close the inner one
    # first and open the outer one first.
    inserts = []
    for number, (opening, closing) in ((1, ("_", "_")), (2, ("[", "]"))):
        index = _field(target, f"span{number}_index", f"{where}: target", int)
        span = _field(target, f"span{number}_text", f"{where}: target", str)
        if not span or index < 0 or text[index : index + len(span)] != span:
            raise ValueError(
                f"{where}: target span{number}_text {span!r} is not at span{number}_index "
                f"{index} of the text (found {text[index : index + len(span)]!r} there)."
            )
        end = index + len(span)
        inserts += [(index, 1, -end, opening), (end, 0, -index, closing)]
    inserts.sort(key=lambda insert: insert[:3])
    pieces, start = [], 0
    for position, _, _, mark in inserts:
        pieces += [text[start:position], mark]
        start = position
    pieces.append(text[start:])
    return "".join(pieces)


def _entity_example(reading, where, record):
    example_id = reading.example_id(record, where)
    text = _field(record, "text", where, str)
    if not reading.labelled:
        return EntityExample(example_id, text, None, source=where)
    label = _field(record, "label", where, dict, "an object {type: {entity: [[start, end]]}}")
    types = reading.task.labels
    entities = []
    for kind, mentions in label.items():
        if types is not None and kind not in types:
            raise ValueError(
                f"{where}: entity type {kind!r} is not one of {reading.task.name}'s types "
                f"{short_labels(types)}."
            )
        at = f"{where}: label[{kind!r}]"
        _expect(isinstance(mentions, dict), mentions, at, "an object {entity: [[start, end]]}")
        for entity, spans in mentions.items():
            at = f"{where}: label[{kind!r}][{entity!r}]"
            valid = isinstance(spans, list) and spans
            _expect(valid, spans, at, "a non-empty list of [start, end] integer pairs")
            for span in spans:
                valid = isinstance(span, list) and len(span) == 2 and all(_is(i, int) for i in span)
                start, end = _expect(valid, span, f"{at}: a span", "[start, end] integers")
                found = text[start : end + 1] if 0 <= start <= end < len(text) else None
                if found != entity:
                    raise ValueError(
                        f"{where}: {kind} entity {entity!r} at [{start}, {end}] (end inclusive) "
                        f"does not match the text: text[{start}:{end + 1}] is {found!r}."
                    )
                entities.append((kind, start, end))
    entities.sort(key=lambda entity: (entity[1], entity[2], entity[0]))
    return EntityExample(example_id, text, tuple(entities), source=where)


def _chid_examples(reading, path):
    answers, answers_name = reading.answers, "the answers"
    if reading.labelled and reading.benchmark != "fewclue":
        if isinstance(answers, (str, os.PathLike)):
            answers_name = os.fspath(answers)
            answers = _chid_answers(reading, answers)
    used = set()
    file_format = reading.benchmark
    for where, record in _json_lines(reading, path):
        content = record.get("content")
        record_format = "clue" if isinstance(content, list) else "fewclue"
        file_format = file_format or record_format
        if record_format != file_format:
            expected = (
                "a list of texts with #idiomNNNNNN# blanks (CLUE CHID)"
                if file_format == "clue"
                else "a text with one #idiom# blank (FewCLUE CHID)"
            )
            _expect(False, content, f"{where}: field 'content'", expected)
        candidates = tuple(_strings(record, "candidates", where))
        if file_format == "fewclue":
            yield _fewclue_chid_passage(reading, where, record, candidates)
            continue
        if reading.labelled and answers is None:
            raise ValueError(
                f"{where}: CLUE CHID's labels are in a separate answer file "
                "(train_answer.json / dev_answer.json); pass answers=."
            )
        passage = _clue_chid_passage(reading, where, record, candidates, answers, answers_name)
        used.update(passage.blank_ids)
        yield passage
    extra = [tag for tag in answers or () if tag not in used]
    if extra and file_format == "clue":
        raise ValueError(
            f"{answers_name}: {len(extra)} tags have no blank in {os.fspath(path)} (first: "
            f"{extra[0]!r}). The answer file does not match the passages."
        )


def _chid_answers(reading, path):
    document, digest, name = _read_document(path)
    expected = "a non-empty JSON object {'#idiomNNNNNN#': index}"
    _expect(isinstance(document, dict) and document, document, name, expected)
    for tag, value in document.items():
        _expect(_is(value, int), value, f"{name}: the answer of {tag!r}", "a candidate index")
    reading.add_file(path, digest, len(document))
    return document


def _clue_chid_passage(reading, where, record, candidates, answers, answers_name):
    contents = _strings(record, "content", where)
    parts, blank_ids = [], []
    current = None
    for content in contents:
        pieces = CLUE_BLANK.split(content)
        current = pieces[0] if current is None else current + "\n" + pieces[0]
        for tag, piece in zip(CLUE_BLANK.findall(content), pieces[1:]):
            parts.append(current)
            blank_ids.append(tag)
            current = piece
    parts.append(current)
    if not blank_ids:
        hint = " (#idiom# is FewCLUE's blank)" if _FEWCLUE_BLANK in "".join(contents) else ""
        raise ValueError(f"{where}: the passage has no #idiomNNNNNN# blank{hint}.")
    for tag in blank_ids:
        reading.check_unique(tag, where)
    labels = None
    if reading.labelled:
        labels = []
        for tag in blank_ids:
            if tag not in answers:
                raise ValueError(f"{where}: blank {tag!r} has no answer in {answers_name}.")
            labels.append(_candidate_index(answers[tag], candidates, f"{where}: blank {tag!r}"))
        labels = tuple(labels)
    parts, blank_ids = tuple(parts), tuple(blank_ids)
    return IdiomPassage(reading.count, candidates, parts, blank_ids, labels, source=where)


def _fewclue_chid_passage(reading, where, record, candidates):
    example_id = reading.example_id(record, where)
    content = _field(record, "content", where, str)
    if content.count(_FEWCLUE_BLANK) != 1:
        raise ValueError(
            f"{where}: FewCLUE CHID's content must hold exactly one {_FEWCLUE_BLANK} blank. "
            f"Found {content.count(_FEWCLUE_BLANK)}."
        )
    labels = None
    if reading.labelled:
        answer = _field(record, "answer", where, int, "an int (a candidate index)")
        labels = (_candidate_index(answer, candidates, f"{where}: field 'answer'"),)
    parts = tuple(content.split(_FEWCLUE_BLANK))
    return IdiomPassage(example_id, candidates, parts, (example_id,), labels, source=where)


def _candidate_index(value, candidates, where):
    valid = _is(value, int) and 0 <= value < len(candidates)
    return _expect(valid, value, where, f"a candidate index in [0, {len(candidates) - 1}]")


def _c3_examples(reading, path):
    document, digest, name = _read_document(path)
    expected = "a JSON array of [context lines, questions, id] documents"
    _expect(isinstance(document, list), document, name, expected)
    if not document:
        raise ValueError(f"{name}: the file is empty (an empty JSON array).")
    for number, item in enumerate(document):
        where = f"{name}: document {number}"
        valid = isinstance(item, list) and len(item) >= 2
        _expect(valid, item, where, "[context lines, questions, id]")
        if len(item) > 2:
            where += f" ({item[2]!r})"
        lines, questions = item[0], item[1]
        valid = isinstance(lines, list) and all(isinstance(line, str) for line in lines)
        _expect(valid, lines, f"{where}: the context", "a list of strings")
        valid = isinstance(questions, list) and questions
        _expect(valid, questions, f"{where}: the questions", "a non-empty list")
        for q_number, question in enumerate(questions):
            here = f"{where}, question {q_number}"
            _expect(isinstance(question, dict), question, here, _OBJECT)
            example_id = reading.example_id(question, here)
            here += f" (id {example_id!r})"
            text = _field(question, "question", here, str)
            choices = tuple(_strings(question, "choice", here))
            label = None
            if reading.labelled:
                answer = _field(question, "answer", here, str)
                if answer not in choices:
                    raise ValueError(
                        f"{here}: answer {answer!r} is not among the choices {choices!r}."
                    )
                label = choices.index(answer)
            yield ChoiceExample(example_id, "".join(lines), text, choices, label, source=here)
    reading.add_file(path, digest, len(document))


def _cmrc2018_examples(reading, path):
    """CMRC2018 questions, from CLUE's squad-style files or CMRC2018's own layout."""
    document, digest, name = _read_document(path)
    articles = document.get("data") if isinstance(document, dict) else document
    expected = (
        "a SQuAD-style document {'data': [{'paragraphs': [...]}]} or CMRC2018's original "
        "layout, a list of {'context_id', 'context_text', 'qas'}"
    )
    _expect(isinstance(articles, list), document, name, expected)
    counts = reading.counts
    for key in ("answers", "answers_relocated", "answers_unplaced", "questions_unplaced"):
        counts.setdefault(key, 0)
    first = {}  # the first question with a relocated / an unplaced answer
    count = 0
    for a_number, article in enumerate(articles):
        where = f"{name}: data[{a_number}]"
        _expect(isinstance(article, dict), article, where, _OBJECT)
        for here, text, qas, squad in _cmrc2018_paragraphs(article, where):
            id_field, question_field = ("id", "question") if squad else ("query_id", "query_text")
            for q_number, qa in enumerate(qas):
                at = f"{here}.qas[{q_number}]"
                _expect(isinstance(qa, dict), qa, at, _OBJECT)
                if id_field not in qa:
                    raise ValueError(f"{at}: missing field {id_field!r}.")
                example_id = reading.example_id(qa, at, (id_field,))
                at = f"{name}: question {example_id!r}"
                question = _field(qa, question_field, at, str)
                answers = None
                if reading.labelled:
                    answers, placements = _cmrc2018_answers(qa, text, at, squad, counts)
                    for placement in placements:
                        first.setdefault(placement, example_id)
                    if all(start is None for _, start in answers):
                        counts["questions_unplaced"] += 1
                count += 1
                yield SpanExample(example_id, text, question, answers, source=at)
    if count == 0:
        raise ValueError(f"{name}: the file is empty (no questions).")
    if counts["answers_relocated"]:
        logger.warning(
            "%s: %d of %d answers have an answer_start that does not point at their text "
            "(e.g. in %s); they are placed by their text.",
            name,
            counts["answers_relocated"],
            counts["answers"],
            first.get("relocated"),
        )
    if counts["answers_unplaced"]:
        logger.warning(
            "%s: the text of %d of %d answers is not in its context (e.g. in %s): scored, "
            "not trained on; %d questions have no answer in their context.",
            name,
            counts["answers_unplaced"],
            counts["answers"],
            first.get("unplaced"),
            counts["questions_unplaced"],
        )
    reading.add_file(path, digest, count)


def _cmrc2018_paragraphs(article, where):
    """``(where, context, qas, squad style?)`` of an article of either layout."""
    if "paragraphs" in article:
        for p_number, paragraph in enumerate(_field(article, "paragraphs", where, list)):
            here = f"{where}.paragraphs[{p_number}]"
            _expect(isinstance(paragraph, dict), paragraph, here, _OBJECT)
            context = _field(paragraph, "context", here, str)
            yield here, context, _field(paragraph, "qas", here, list), True
    elif "context_text" in article:
        context = _field(article, "context_text", where, str)
        yield where, context, _field(article, "qas", where, list), False
    else:
        raise ValueError(
            f"{where}: expected 'paragraphs' (SQuAD style) or 'context_text' and 'qas' "
            f"(CMRC2018's original layout). Received the fields {sorted(article)[:8]}."
        )


def _cmrc2018_answers(qa, text, where, squad, counts):
    """``((answer text, start or None), ...)`` and the placements that are not exact."""
    answers = _field(qa, "answers", where, list)
    if not answers:
        raise ValueError(f"{where}: field 'answers' is empty; labelled splits need an answer.")
    spans, placements = [], []
    for number, answer in enumerate(answers):
        here = f"{where}, answer {number}"
        if squad:
            _expect(isinstance(answer, dict), answer, here, _OBJECT)
            answer_text = _field(answer, "text", here, str)
            given = _field(answer, "answer_start", here, int)
        else:
            # The original files hold a few numbers (147.0); the official
            # evaluation reads every answer with str().
            _expect(_is(answer, (str, int, float)), answer, here, "an answer text")
            answer_text, given = str(answer), None
        if not answer_text.strip():
            raise ValueError(f"{here}: the answer text is empty.")
        start = _locate_answer(text, answer_text, given)
        counts["answers"] += 1
        if start is None or (given is not None and start != given):
            placement = "unplaced" if start is None else "relocated"
            counts[f"answers_{placement}"] += 1
            placements.append(placement)
        spans.append((answer_text, start))
    return tuple(spans), placements


def _locate_answer(context, answer, start):
    """``start`` if ``answer`` is there, else its occurrence nearest to ``start``, or None."""
    if start is not None and start >= 0 and context[start : start + len(answer)] == answer:
        return start
    positions = [found.start() for found in re.finditer(f"(?={re.escape(answer)})", context)]
    if not positions:
        return None
    if start is None or start < 0:
        return positions[0]
    return min(positions, key=lambda found: (abs(found - start), found))


_READERS = {
    "classification": _text_example,
    "entity": _entity_example,
    "idiom": _chid_examples,
    "multiple_choice": _c3_examples,
    "span": _cmrc2018_examples,
}
