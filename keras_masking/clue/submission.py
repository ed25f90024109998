"""CLUE 1.1 and FewCLUE submission files: names, writing, checking, the zip.

One file per task, named as the benchmark expects (`submission_file_name`),
UTF-8 with Chinese kept as it is, written atomically (a temporary name, then
``os.replace``). The records per task kind:

- classification: a line ``{"id": ..., "label": "<label string>"}`` per test
  example, in the test file's order (``"103"`` for TNEWS, never the class
  index 3);
- C3: a line ``{"id": "<question id>", "label": "<choice index>"}`` per
  question, both strings, as bert4keras' CLUE baseline (``c3.py``, which
  writes c310 and c311) writes them: ``{"id": str(qa["id"]), "label":
  str(index)}``;
- CHID: CLUE: ONE JSON object ``{"#idiom012345#": candidate index, ...}``;
  FewCLUE: a line ``{"id": ..., "answer": candidate index}`` per blank;
- CMRC2018: ONE JSON object ``{question id: answer text}``;
- CLUENER: a line ``{"id": ..., "label": {type: {entity text: [[start, end]]}}}``
  (end inclusive).

`check_submission` finds what most often makes CLUE reject or mis-score a
file: a wrong or unversioned name, class indices instead of label strings,
missing or repeated ids, labels outside the label set.
"""

import json
import logging
import numbers
import os
import pathlib
import re
import zipfile
from collections.abc import Mapping

from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import EntityExample
from keras_masking.clue.examples import IdiomPassage
from keras_masking.clue.examples import SpanExample
from keras_masking.clue.examples import TextExample
from keras_masking.clue.readers import ClueSplit
from keras_masking.clue.run_folder import write_atomically
from keras_masking.clue.tasks import TASKS
from keras_masking.clue.tasks import check_benchmark
from keras_masking.clue.tasks import get_task

logger = logging.getLogger(__name__)

# CLUE 1.1 names, with CLUE 1.0's where they differ.
_CLUE_NAMES = {
    "afqmc": "afqmc",
    "tnews": {"1.1": "tnews11", "1.0": "tnews10"},
    "iflytek": "iflytek",
    "ocnli": "ocnli_50k",
    "cmnli": "cmnli",
    "cluewsc": {"1.1": "cluewsc11", "1.0": "cluewsc10"},
    "csl": "csl",
    "cluener": "cluener",
    "c3": {"1.1": "c311", "1.0": "c310"},
    "chid": {"1.1": "chid11", "1.0": "chid10"},
    "cmrc2018": "cmrc2018",
}
_FEWCLUE_NAMES = {
    "tnews": "tnewsf",
    "iflytek": "iflytekf",
    "ocnli": "ocnlif",
    "cluewsc": "cluewscf",
    "csl": "cslf",
    "chid": "chidf",
    "bustm": "bustm",
    "eprstmt": "eprstmt",
    "csldcp": "csldcp",
}
VERSIONS = ("1.1", "1.0")
_TEST_SPLITS = ("test", "test1.0", "test_public")
_TAG = re.compile(r"#idiom\d{6}#")
_MAX_PROBLEMS = 20
_RECORDS = {
    "classification": TextExample,
    "multiple_choice": ChoiceExample,
    "idiom": IdiomPassage,
    "span": SpanExample,
    "entity": EntityExample,
}


def submission_file_name(task, benchmark, version="1.1"):
    """The file name CLUE / FewCLUE expects for a task's predictions.

    Args:
        task: a task name or `ClueTask`.
        benchmark: ``"clue"`` or ``"fewclue"``.
        version: CLUE's ``"1.1"`` (default) or ``"1.0"`` (TNEWS, CLUEWSC, C3
            and CHID had their own 1.0 test files and names).

    Returns:
        The file name, e.g. ``"tnews11_predict.json"``.

    Raises:
        ValueError: a task the benchmark does not have, an unknown version.

    Example:

    >>> submission_file_name("tnews", "clue"), submission_file_name("tnews", "fewclue")
    ('tnews11_predict.json', 'tnewsf_predict.json')
    >>> submission_file_name("c3", "clue", version="1.0")
    'c310_predict.json'
    """
    task = get_task(task)
    benchmark = check_benchmark(benchmark)
    if version not in VERSIONS or (benchmark == "fewclue" and version != "1.1"):
        expected = VERSIONS if benchmark == "clue" else ("1.1",)
        raise ValueError(
            f"Expected version in {expected} for {benchmark}. Received: version={version!r}."
        )
    names = _CLUE_NAMES if benchmark == "clue" else _FEWCLUE_NAMES
    if task.name not in names:
        raise ValueError(
            f"{task.name} is not a {_benchmark_name(benchmark)} task; it has no submission file "
            f"there. {_benchmark_name(benchmark)} tasks: {sorted(names)}."
        )
    stem = names[task.name]
    if isinstance(stem, dict):
        stem = stem[version]
    return f"{stem}_predict.json"


def _benchmark_name(benchmark):
    return {"clue": "CLUE", "fewclue": "FewCLUE"}[benchmark]


def _all_names():
    """``{file name: (task, benchmark, version)}`` of every submission file."""
    names = {}
    for task in TASKS.values():
        for benchmark in task.benchmarks:
            for version in VERSIONS if benchmark == "clue" else ("1.1",):
                name = submission_file_name(task, benchmark, version)
                names.setdefault(name, (task.name, benchmark, version))
    return names


# === The test split ===
def _split_parts(task, benchmark, test_split):
    """``(examples, labels, version)`` of a `ClueSplit` or a list of records."""
    if isinstance(test_split, ClueSplit):
        if test_split.task.name != task.name or test_split.benchmark != benchmark:
            raise ValueError(
                f"test_split is {test_split.benchmark} {test_split.task.name}'s "
                f"{test_split.split} split; expected one of {benchmark} {task.name}."
            )
        if test_split.split not in _TEST_SPLITS:
            raise ValueError(
                f"test_split is the {test_split.split!r} split; submissions are for a test split "
                f"({', '.join(_TEST_SPLITS)})."
            )
        names = {os.path.basename(entry["path"]) for entry in test_split.files}
        version = "1.0" if benchmark == "clue" and "test1.0.json" in names else "1.1"
        return list(test_split.examples), test_split.labels, version
    if isinstance(test_split, (list, tuple)):
        record = _RECORDS[task.kind]
        wrong = [example for example in test_split if not isinstance(example, record)]
        if wrong:
            raise ValueError(
                f"Expected test_split, {task.name}'s {record.__name__} records. "
                f"Received: {type(wrong[0]).__name__} {wrong[0]!r:.60}."
            )
        return list(test_split), task.labels, "1.1"
    raise ValueError(
        "Expected test_split, a ClueSplit (from read_split) or a list of its examples. "
        f"Received: {type(test_split).__name__}."
    )


def _expected_ids(task, examples):
    """``[(id, example, blank index or None)]`` in test order."""
    if task.kind == "idiom":
        return [
            (blank_id, passage, index)
            for passage in examples
            for index, blank_id in enumerate(passage.blank_ids)
        ]
    return [(example.id, example, None) for example in examples]


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _index_hint(task, labels, value):
    """A hint when ``value`` looks like a class index instead of a label."""
    if labels is None:
        return ""
    index = None
    if _is_int(value):
        index = int(value)
    elif isinstance(value, str) and value.isdigit():
        index = int(value)
    if index is not None and 0 <= index < len(labels) and labels[index] != str(value):
        return (
            f"; it looks like a class index: class {index} of {task.name} is "
            f"{labels[index]!r} (write task.labels[index])"
        )
    return ""


def _label_problem(task, labels, value):
    """A problem with a classification label, or None."""
    if not isinstance(value, str):
        return (
            f"label {value!r} is {_a(type(value).__name__)}; {task.name} expects the label string"
            + (_index_hint(task, labels, value) or f" (one of {_few(labels)})")
        )
    if labels is None:
        return None if value else "label is an empty string"
    if value not in labels:
        return f"label {value!r} is not one of {task.name}'s labels {_few(labels)}" + _index_hint(
            task, labels, value
        )
    return None


def _a(noun):
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _few(labels):
    if labels is None:
        return "its labels"
    if len(labels) <= 8:
        return repr(tuple(labels))
    return f"({', '.join(map(repr, labels[:4]))}, ..., {labels[-1]!r})"


def _entity_problem(task, labels, value, text):
    """A problem with a list of (type, start, end) entities, or None."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return f"expected a list of (type, start, end) entities. Received: {value!r:.60}"
    for entity in value:
        if (
            not isinstance(entity, (list, tuple))
            or len(entity) != 3
            or not isinstance(entity[0], str)
            or not all(_is_int(position) for position in entity[1:])
        ):
            return f"expected (type, start, end) entities. Received: {entity!r:.60}"
        kind, start, end = entity[0], int(entity[1]), int(entity[2])
        if labels is not None and kind not in labels:
            return f"entity type {kind!r} is not one of {task.name}'s types {_few(labels)}"
        if not 0 <= start <= end < len(text):
            return (
                f"entity ({kind!r}, {start}, {end}) is outside the text of {len(text)} characters "
                "(end is inclusive)"
            )
    return None


def _prediction_problem(task, labels, value, example):
    if task.kind == "classification":
        return _label_problem(task, labels, value)
    if task.kind == "multiple_choice":
        if not _is_int(value) or not 0 <= value < len(example.choices):
            return (
                f"expected a choice index (an int in [0, {len(example.choices) - 1}]). "
                f"Received: {value!r:.40}"
            )
        return None
    if task.kind == "idiom":
        if not _is_int(value) or not 0 <= value < len(example.candidates):
            return (
                f"expected a candidate index (an int in [0, {len(example.candidates) - 1}]). "
                f"Received: {value!r:.40}"
            )
        return None
    if task.kind == "span":
        return None if isinstance(value, str) else f"expected the answer text. Received: {value!r}"
    return _entity_problem(task, labels, value, example.text)


def _summarise(problems):
    if len(problems) > _MAX_PROBLEMS:
        extra = len(problems) - _MAX_PROBLEMS
        problems = problems[:_MAX_PROBLEMS] + [f"... and {extra} more problems."]
    return problems


# === Writing ===
def write_submission(output_dir, task, benchmark, predictions, test_split):
    """Validates predictions against the test split and writes the task's file.

    Args:
        output_dir: the folder to write into (created if missing).
        task: a task name or `ClueTask`.
        benchmark: ``"clue"`` or ``"fewclue"``.
        predictions: a dict ``{id: prediction}``: classification: the label
            STRING; C3: the choice index; CHID: ``{blank id: candidate
            index}``; CMRC2018: the answer text; CLUENER: a list of
            ``(type, start, end_inclusive)``.
        test_split: the `ClueSplit` of the test file (its ids, order, label
            set, and CLUE version: ``test1.0.json`` gives the 1.0 name), or a
            list of its examples.

    Returns:
        The `pathlib.Path` of the file written.

    Raises:
        ValueError: before anything is written: ids missing from or unknown
            to the test split, labels outside the label set (class indices
            instead of label strings), choice / candidate indices out of
            range, bad entities.

    Example:

    >>> from keras_masking.clue.examples import TextExample
    >>> test = [TextExample(0, "好看", None, None), TextExample(1, "难看", None, None)]
    >>> path = write_submission("out", "eprstmt", "fewclue", {1: "Negative", 0: "Positive"}, test)
    >>> print(path.read_text(encoding="utf-8"), end="")
    {"id": 0, "label": "Positive"}
    {"id": 1, "label": "Negative"}
    >>> check_submission(path, "eprstmt", "fewclue", test)
    []
    """
    task = get_task(task)
    benchmark = check_benchmark(benchmark)
    submission_file_name(task, benchmark)  # raises if the benchmark lacks the task
    examples, labels, version = _split_parts(task, benchmark, test_split)
    name = submission_file_name(task, benchmark, version)
    if not isinstance(predictions, Mapping):
        raise ValueError(
            "Expected predictions, a dict {id: prediction}. "
            f"Received: {type(predictions).__name__}."
        )
    expected = _expected_ids(task, examples)
    expected_keys = {key for key, _, _ in expected}
    problems = []
    missing = [key for key, _, _ in expected if key not in predictions]
    if missing:
        problems.append(
            f"{len(missing)} of {len(expected)} test ids have no prediction "
            f"(first: {missing[:5]!r})."
        )
    unknown = [key for key in predictions if key not in expected_keys]
    if unknown:
        problems.append(
            f"{len(unknown)} predictions are for ids the test split does not have "
            f"(first: {unknown[:5]!r})."
        )
    for key, example, _ in expected:
        if key in predictions:
            problem = _prediction_problem(task, labels, predictions[key], example)
            if problem:
                problems.append(f"id {key!r}: {problem}.")
    if problems:
        raise ValueError(
            f"Not writing {name}: the predictions do not fit {task.name}'s test split:\n  "
            + "\n  ".join(_summarise(problems))
        )
    text = _submission_text(task, benchmark, predictions, expected)
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / name
    write_atomically(path, lambda file: file.write(text))
    logger.info("Wrote %s (%d predictions).", path, len(expected))
    return path


def _submission_text(task, benchmark, predictions, expected):
    if task.kind == "span":
        answers = {key: predictions[key] for key, _, _ in expected}
        return json.dumps(answers, ensure_ascii=False) + "\n"
    if task.kind == "idiom" and benchmark == "clue":
        return json.dumps({key: int(predictions[key]) for key, _, _ in expected}) + "\n"
    lines = []
    for key, example, _ in expected:
        value = predictions[key]
        if task.kind == "classification":
            record = {"id": key, "label": value}
        elif task.kind == "multiple_choice":
            record = {"id": str(key), "label": str(int(value))}
        elif task.kind == "idiom":
            record = {"id": key, "answer": int(value)}
        else:
            label = {}
            for kind, start, end in sorted(value, key=lambda e: (int(e[1]), int(e[2]), e[0])):
                start, end = int(start), int(end)
                spans = label.setdefault(kind, {}).setdefault(example.text[start : end + 1], [])
                if [start, end] not in spans:
                    spans.append([start, end])
            record = {"id": key, "label": label}
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + "\n"


# === Checking ===
def check_submission(path, task, benchmark, test_split=None):
    """Lists what is wrong with a submission file (an empty list: nothing).

    Checks the file name (the versioned CLUE name, e.g. ``tnews11``), that
    the file is UTF-8 JSON in the task's shape (a line per record, or one
    object for CLUE CHID and CMRC2018), that every id appears once, that
    labels are label strings from the label set (not class indices), and,
    with the test split, that every test id is predicted, in the test order,
    with choice / candidate indices and entity spans that fit.

    Args:
        path: the submission file.
        task: a task name or `ClueTask`.
        benchmark: ``"clue"`` or ``"fewclue"``.
        test_split: optional: the test `ClueSplit` (or a list of its
            examples), for the ids, the order and the ranges.

    Returns:
        A list of problems, each a sentence naming the line or id.

    Example:

    >>> import pathlib
    >>> _ = pathlib.Path("tnews_predict.json").write_text('{"id": 0, "label": "3"}\\n')
    >>> for problem in check_submission("tnews_predict.json", "tnews", "clue"):
    ...     print(problem)
    file name 'tnews_predict.json' is not what CLUE expects for tnews:
    'tnews11_predict.json' (or 'tnews10_predict.json' for CLUE 1.0's test file)
    line 1: label '3' is not one of tnews's labels ('100', '101', '102', '103', ..., '116');
    it looks like a class index: class 3 of tnews is '103' (write task.labels[index])
    """
    task = get_task(task)
    benchmark = check_benchmark(benchmark)
    submission_file_name(task, benchmark)  # the task belongs to the benchmark
    path = pathlib.Path(path)
    examples, labels, version = (None, task.labels, None)
    if test_split is not None:
        examples, labels, version = _split_parts(task, benchmark, test_split)
    problems = _name_problems(path.name, task, benchmark, version)
    if not path.is_file():
        return problems + [f"{os.fspath(path)}: no such file"]
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        return problems + [f"line {line}: not UTF-8 (CLUE reads UTF-8)"]
    if text.startswith("\ufeff"):
        problems.append("the file starts with a byte-order mark; write UTF-8 without one")
        text = text[1:]
    if not text.strip():
        return problems + ["the file is empty"]
    lines = not (task.kind == "span" or (task.kind == "idiom" and benchmark == "clue"))
    if lines:
        found, record_problems = _read_lines(task, labels, text)
    else:
        found, record_problems = _read_object(task, text)
    problems += record_problems
    if examples is not None and found is not None:
        problems += _coverage_problems(task, found, examples, lines)
    return _summarise(problems)


def _name_problems(name, task, benchmark, version):
    versions = [version] if version else (VERSIONS if benchmark == "clue" else ("1.1",))
    expected = []
    for each in versions:
        candidate = submission_file_name(task, benchmark, each)
        if candidate not in expected:
            expected.append(candidate)
    if name in expected:
        return []
    message = (
        f"file name {name!r} is not what {_benchmark_name(benchmark)} expects for {task.name}: "
        f"{expected[0]!r}"
    )
    if len(expected) > 1:
        message += f" (or {expected[1]!r} for CLUE 1.0's test file)"
    return [message]


def _read_object(task, text):
    """``({key: value}, problems)`` of a file that is one JSON object."""
    problems = []

    def pairs(items):
        result = {}
        for key, value in items:
            if key in result:
                problems.append(f"id {key!r} appears more than once")
            result[key] = value
        return result

    shape = "{'#idiom012345#': index}" if task.kind == "idiom" else "{question id: answer}"
    try:
        document = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":
            return None, [
                f"line {error.lineno}: a second JSON value; {task.name} expects ONE JSON object "
                f"{shape} (not a record a line)"
            ]
        return None, [f"line {error.lineno}: not valid JSON ({error.msg})"]
    if not isinstance(document, dict):
        return None, [
            f"expected ONE JSON object {shape} for {task.name}. Received: {type(document).__name__}"
        ]
    if set(document) in ({"id", "label"}, {"id", "answer"}):
        return None, [
            f"the file holds one record {sorted(document)}; {task.name} expects ONE JSON object "
            f"{shape} over all test ids"
        ]
    for key, value in document.items():
        if task.kind == "idiom":
            if not _TAG.fullmatch(key):
                problems.append(f"key {key!r} is not a blank tag like '#idiom012345#'")
            if not _is_int(value):
                problems.append(
                    f"id {key!r}: the answer must be a candidate index (an int). "
                    f"Received: {value!r:.40}"
                )
        elif not isinstance(value, str):
            problems.append(f"id {key!r}: the answer must be a text. Received: {value!r:.40}")
    return document, problems


def _read_lines(task, labels, text):
    """``({id: (line, value)}, problems)`` of a JSON-lines submission."""
    field = "answer" if task.kind == "idiom" else "label"
    found = {}
    problems = []
    order = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"line {number}: not valid JSON ({error.msg})")
            continue
        if not isinstance(record, dict):
            if task.kind in ("span", "idiom"):
                problems.append(f"line {number}: expected a JSON object")
            else:
                problems.append(
                    f"line {number}: expected a JSON object {{'id': ..., '{field}': ...}}. "
                    f"Received: {type(record).__name__}"
                )
            continue
        missing = [name for name in ("id", field) if name not in record]
        if missing:
            problems.append(f"line {number}: missing {' and '.join(map(repr, missing))}")
            continue
        key, value = record["id"], record[field]
        if task.kind == "multiple_choice":
            key = str(key)
        if key in found:
            problems.append(f"line {number}: id {key!r} repeats line {found[key][0]}")
            continue
        found[key] = (number, value)
        order.append(key)
        problem = _record_problem(task, labels, value)
        if problem:
            problems.append(f"line {number}: {problem}")
    found = {key: found[key] for key in order}
    return found, problems


def _record_problem(task, labels, value):
    """A problem with a record's value, judged without the test split."""
    if task.kind == "classification":
        return _label_problem(task, labels, value)
    if task.kind == "multiple_choice":
        if not isinstance(value, str):
            return f"label {value!r} must be the choice index as a string, e.g. '{value}'"
        if not value.isdigit():
            return f"label {value!r} is not a choice index ('0', '1', ...)"
        return None
    if task.kind == "idiom":
        if not _is_int(value):
            return f"answer {value!r} must be a candidate index (an int)"
        return None
    # entity
    if not isinstance(value, dict):
        return (
            f"label must be an object {{type: {{entity: [[start, end]]}}}}. Received: {value!r:.40}"
        )
    for kind, mentions in value.items():
        if labels is not None and kind not in labels:
            return f"entity type {kind!r} is not one of {task.name}'s types {_few(labels)}"
        if not isinstance(mentions, dict):
            return f"label[{kind!r}] must be an object {{entity: [[start, end]]}}"
        for entity, spans in mentions.items():
            if not isinstance(spans, list) or not all(
                isinstance(span, list) and len(span) == 2 and all(map(_is_int, span))
                for span in spans
            ):
                return f"label[{kind!r}][{entity!r}] must be a list of [start, end] pairs"
            for start, end in spans:
                if not 0 <= start <= end:
                    return f"label[{kind!r}][{entity!r}]: span [{start}, {end}] has end < start"
                if end - start + 1 != len(entity):
                    return (
                        f"label[{kind!r}][{entity!r}]: span [{start}, {end}] covers "
                        f"{end - start + 1} characters, the entity {len(entity)} (end is inclusive)"
                    )
    return None


def _coverage_problems(task, found, examples, lines):
    """Problems that need the test split: coverage, order, ranges."""
    expected = _expected_ids(task, examples)
    if task.kind == "multiple_choice":
        expected = [(str(key), example, blank) for key, example, blank in expected]
    keys = [key for key, _, _ in expected]
    expected_keys = set(keys)
    problems = []
    missing = [key for key in keys if key not in found]
    unknown = [key for key in found if key not in expected_keys]
    if missing and unknown and {str(k) for k in missing} == {str(k) for k in unknown}:
        problems.append(
            f"ids have the wrong type: the file has {unknown[0]!r} where the test file has "
            f"{missing[0]!r} (write the test file's ids as they are)"
        )
    else:
        if missing:
            problems.append(
                f"{len(missing)} of {len(keys)} test ids are missing (first: {missing[:5]!r})"
            )
        if unknown:
            problems.append(
                f"{len(unknown)} ids are not in the test split (first: {unknown[:5]!r})"
            )
    if lines and not missing and not unknown:
        for position, (expected_key, found_key) in enumerate(zip(keys, found)):
            if expected_key != found_key:
                problems.append(
                    f"line {found[found_key][0]}: records are not in the test file's order "
                    f"(expected id {expected_key!r} at record {position}, found {found_key!r})"
                )
                break
    for key, example, _ in expected:
        if key not in found:
            continue
        value = found[key][1] if lines else found[key]
        where = f"line {found[key][0]}" if lines else f"id {key!r}"
        problem = None
        if task.kind == "multiple_choice" and isinstance(value, str) and value.isdigit():
            if int(value) >= len(example.choices):
                problem = f"choice {value} is out of range: {len(example.choices)} choices"
        elif task.kind == "idiom" and _is_int(value):
            if not 0 <= value < len(example.candidates):
                problem = f"candidate {value} is out of range: {len(example.candidates)} candidates"
        elif task.kind == "entity" and isinstance(value, dict):
            problem = _entity_text_problem(value, example.text)
        if problem:
            problems.append(f"{where}: {problem}")
    return problems


def _entity_text_problem(label, text):
    for kind, mentions in label.items():
        if not isinstance(mentions, dict):
            return None  # reported already
        for entity, spans in mentions.items():
            for span in spans if isinstance(spans, list) else ():
                if not (isinstance(span, list) and len(span) == 2 and all(map(_is_int, span))):
                    continue
                start, end = span
                if end - start + 1 != len(entity):
                    continue  # reported already
                if text[start : end + 1] != entity or end >= len(text):
                    return (
                        f"{kind} entity {entity!r} at [{start}, {end}] does not match the text "
                        f"({text[start : end + 1]!r} there)"
                    )
    return None


# === The zip ===
FEWCLUE_ZIP_NAME = "fewclue_submit_examples.zip"


def default_zip_name(benchmark, team="team", date="YYYYMMDD"):
    """The name a benchmark asks its submission zip to have.

    CLUE: ``submit_<team>_<date>.zip``; FewCLUE: ``fewclue_submit_examples.zip``
    (FewCLUE's README: "zip fewclue_submit_examples.zip *.json").

    Args:
        benchmark: ``"clue"`` or ``"fewclue"``.
        team: the team name (CLUE).
        date: ``YYYYMMDD`` (CLUE).

    Returns:
        A file name.

    Example:
    >>> default_zip_name("clue", "mylab", "20240101"), default_zip_name("fewclue")
    ('submit_mylab_20240101.zip', 'fewclue_submit_examples.zip')
    """
    if check_benchmark(benchmark) == "fewclue":
        return FEWCLUE_ZIP_NAME
    return f"submit_{team}_{date}.zip"


def build_submission_zip(files, zip_path):
    """Zips submission files, each at the zip's root, as CLUE accepts them.

    CLUE asks for the files of a submission zipped together, named
    ``submit_<team>_<date>.zip``.

    Args:
        files: the submission files' paths (names as `submission_file_name`
            gives them, all of one benchmark).
        zip_path: the zip to write (written atomically).

    Returns:
        The `pathlib.Path` of the zip.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: no files, a name that is no submission file name, two
            files of the same name, files of both benchmarks.

    Example:

    >>> import pathlib, zipfile
    >>> _ = pathlib.Path("afqmc_predict.json").write_text('{"id": 0, "label": "1"}\\n')
    >>> path = build_submission_zip(["afqmc_predict.json"], "submit_team_20240101.zip")
    >>> zipfile.ZipFile(path).namelist()
    ['afqmc_predict.json']
    """
    paths = [pathlib.Path(file) for file in files]
    if not paths:
        raise ValueError("Expected at least one submission file. Received: files=[].")
    known = _all_names()
    seen = {}
    benchmarks = {}
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"No such submission file: {os.fspath(path)}.")
        if path.name not in known:
            raise ValueError(
                f"{os.fspath(path)}: {path.name!r} is no CLUE / FewCLUE submission file name "
                "(see submission_file_name); CLUE would ignore it."
            )
        if path.name in seen:
            raise ValueError(
                f"Two files named {path.name!r}: {os.fspath(seen[path.name])} and "
                f"{os.fspath(path)}."
            )
        seen[path.name] = path
        task, benchmark, _ = known[path.name]
        benchmarks.setdefault(benchmark, path.name)
    if len(benchmarks) > 1:
        raise ValueError(
            "The files mix CLUE and FewCLUE submissions "
            f"({benchmarks['clue']!r} and {benchmarks['fewclue']!r}); zip each benchmark apart."
        )
    zip_path = pathlib.Path(zip_path)
    zip_path.parent.mkdir(parents=True, exist_ok=True)

    def write_archive(file):
        with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for path in paths:
                archive.write(path, arcname=path.name)

    write_atomically(zip_path, write_archive, mode="wb")
    logger.info("Wrote %s (%d files).", zip_path, len(paths))
    return zip_path
