"""CLUE 1.1 and FewCLUE submission files: names, writing, checking, the zip.

One UTF-8 file per task, named by `submission_file_name`, written atomically;
its records per task kind (one `_Layout` both writes and checks them):

- classification: a line ``{"id": ..., "label": "<label string>"}`` per test
  example, in test order (``"103"`` for TNEWS, never the class index 3);
- C3: a line ``{"id": "<question id>", "label": "<choice index>"}``, both
  strings, as bert4keras' CLUE baseline (``c3.py``) writes them;
- CHID: CLUE: ONE JSON object ``{"#idiom012345#": candidate index, ...}``;
  FewCLUE: a line ``{"id": ..., "answer": candidate index}`` per blank;
- CMRC2018: ONE JSON object ``{question id: answer text}``;
- CLUENER: a line ``{"id": ..., "label": {type: {entity text: [[start, end]]}}}``
  (end inclusive).
"""

import json
import logging
import numbers
import os
import pathlib
import re
import zipfile
from collections.abc import Mapping

from keras_masking.clue.examples import RECORD_TYPES
from keras_masking.clue.readers import BENCHMARK_NAMES
from keras_masking.clue.readers import ClueSplit
from keras_masking.clue.record_readers import CLUE_BLANK
from keras_masking.clue.record_readers import short_labels
from keras_masking.clue.tasks import CLUE_1_0_TASKS
from keras_masking.clue.tasks import TASKS
from keras_masking.clue.tasks import check_benchmark
from keras_masking.clue.tasks import get_task
from keras_masking.utils.files import text_lines
from keras_masking.utils.files import write_atomically

logger = logging.getLogger(__name__)

_CLUE_STEMS = {"ocnli": "ocnli_50k"}
VERSIONS = ("1.1", "1.0")
_TEST_SPLITS = ("test", "test1.0", "test_public")
_MAX_PROBLEMS = 20


def submission_file_name(task, benchmark, version="1.1"):
    """The file name CLUE / FewCLUE expects for a task's predictions.

    Args:
        task: a task name or `ClueTask`.
        benchmark: ``"clue"`` or ``"fewclue"``.
        version: CLUE's ``"1.1"`` (default) or ``"1.0"``.

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
    if version not in _versions(benchmark):
        raise ValueError(
            f"Expected version in {_versions(benchmark)} for {benchmark}. "
            f"Received: version={version!r}."
        )
    if benchmark not in task.benchmarks:
        title = BENCHMARK_NAMES[benchmark]
        names = {each.name for each in TASKS.values() if benchmark in each.benchmarks}
        raise ValueError(
            f"{task.name} is not a {title} task; it has no submission file there. "
            f"{title} tasks: {sorted(names)}."
        )
    if benchmark == "fewclue":  # FewCLUE's copy of a CLUE task ends in "f"
        stem = task.name + ("f" if "clue" in task.benchmarks else "")
    else:
        stem = _CLUE_STEMS.get(task.name, task.name)
        stem += version.replace(".", "") if task.name in CLUE_1_0_TASKS else ""
    return f"{stem}_predict.json"


def _versions(benchmark):
    return VERSIONS if benchmark == "clue" else ("1.1",)


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
        record = RECORD_TYPES[task.kind]
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


# === The records of each kind: written and checked with the same code ===
class _Layout:
    """How one task's predictions sit in its submission file, for writing and checking."""

    def __init__(self, task, benchmark, test_split):
        self.task, self.benchmark = get_task(task), check_benchmark(benchmark)
        submission_file_name(self.task, self.benchmark)  # raises if the benchmark lacks the task
        kind, clue = self.task.kind, self.benchmark == "clue"
        self.tags = kind == "idiom" and clue  # ONE object keyed by blank tags
        one_object = kind == "span" or self.tags
        self.field = None if one_object else ("answer" if kind == "idiom" else "label")
        self.labels, self.version, self.expected = self.task.labels, None, None
        if test_split is not None:
            examples, self.labels, self.version = _split_parts(
                self.task, self.benchmark, test_split
            )
            if kind == "idiom":
                self.expected = {blank: e for e in examples for blank in e.blank_ids}
            else:
                self.expected = {self.key(example.id): example for example in examples}

    def key(self, key):
        return str(key) if self.task.kind == "multiple_choice" else key

    def id_problem(self, key, written=False):
        """What is wrong with an id's type, or None: a float or bool is no test file's
        id (``5.0 == 5`` and ``True == 1`` in Python), and C3's file ids are strings."""
        if isinstance(key, (bool, float)):
            return f"id {key!r} is a {type(key).__name__}: write the test file's ids as they are"
        if not written and self.task.kind == "multiple_choice" and not isinstance(key, str):
            return f"id {key!r} must be a string, as the test file has it ({str(key)!r})"
        return None

    def value(self, prediction, example):
        """A prediction as the file holds it; left as it is when it cannot be."""
        kind = self.task.kind
        if kind in ("multiple_choice", "idiom") and _is_int(prediction):
            return str(int(prediction)) if kind == "multiple_choice" else int(prediction)
        if kind != "entity" or example is None or not _are_entities(prediction):
            return prediction
        label = {}
        for kind, start, end in sorted(prediction, key=lambda e: (int(e[1]), int(e[2]), e[0])):
            start, end = int(start), int(end)
            spans = label.setdefault(kind, {}).setdefault(example.text[start : end + 1], [])
            if [start, end] not in spans:
                spans.append([start, end])
        return label

    def problem(self, key, value, example):
        """What is wrong with one value (``example``: its test record, or None)."""
        kind, task = self.task.kind, self.task
        if kind == "classification":
            return _label_problem(task, self.labels, value)
        if kind == "span":
            return (
                None
                if isinstance(value, str)
                else f"the answer must be a text. Received: {value!r:.40}"
            )
        if kind == "entity":
            return _entity_problem(task, self.labels, value, example)
        if self.tags and not CLUE_BLANK.fullmatch(str(key)):
            return f"key {key!r} is not a blank tag like '#idiom012345#'"
        if kind == "multiple_choice":
            if not isinstance(value, str):
                return f"label {value!r} must be the choice index as a string, e.g. '{value}'"
            if not value.isdigit():
                return f"label {value!r} is not a choice index ('0', '1', ...)"
            count, what = (len(example.choices) if example else None), "choices"
        else:
            if not _is_int(value):
                return f"the answer must be a candidate index (an int). Received: {value!r:.40}"
            count, what = (len(example.candidates) if example else None), "candidates"
        if count is not None and not 0 <= int(value) < count:
            return f"{what[:-1]} {value} is out of range: {count} {what}"
        return None

    def problems(self, records):
        """The problems of the values of ``[(where, key, value)]`` (not of their ids)."""
        problems = []
        for where, key, value in records:
            if self.expected is None or key in self.expected:
                problem = self.problem(key, value, (self.expected or {}).get(key))
                if problem:
                    problems.append(f"{where}: {problem}")
        return problems


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _are_entities(value):
    return (
        not isinstance(value, (str, bytes, Mapping))
        and hasattr(value, "__iter__")
        and all(
            isinstance(entity, (list, tuple))
            and len(entity) == 3
            and isinstance(entity[0], str)
            and all(map(_is_int, entity[1:]))
            for entity in value
        )
    )


def _label_problem(task, labels, value):
    """A problem with a classification label, or None."""
    index = int(value) if _is_int(value) or (isinstance(value, str) and value.isdigit()) else None
    hint = ""
    if labels is not None and index is not None and 0 <= index < len(labels):
        if labels[index] != str(value):
            hint = (
                f"; it looks like a class index: class {index} of {task.name} is "
                f"{labels[index]!r} (write task.labels[index])"
            )
    if not isinstance(value, str):
        noun = type(value).__name__
        article = "an" if noun[:1] in "aeiou" else "a"
        return f"label {value!r} is {article} {noun}; {task.name} expects the label string" + (
            hint or (f" (one of {short_labels(labels)})" if labels else "")
        )
    if labels is None:
        return None if value else "label is an empty string"
    if value not in labels:
        return f"label {value!r} is not one of {task.name}'s labels {short_labels(labels)}{hint}"
    return None


def _entity_problem(task, labels, value, example):
    """A problem with a CLUENER label ``{type: {entity text: [[start, end]]}}``, or None."""
    if not isinstance(value, dict):
        return (
            f"label must be an object {{type: {{entity: [[start, end]]}}}}. Received: {value!r:.40}"
        )
    text = example.text if example is not None else None
    for kind, mentions in value.items():
        if labels is not None and kind not in labels:
            return f"entity type {kind!r} is not one of {task.name}'s types {short_labels(labels)}"
        if not isinstance(mentions, dict):
            return f"label[{kind!r}] must be an object {{entity: [[start, end]]}}"
        for entity, spans in mentions.items():
            where = f"label[{kind!r}][{entity!r}]"
            if not isinstance(spans, list) or not all(
                isinstance(span, list) and len(span) == 2 and all(map(_is_int, span))
                for span in spans
            ):
                return f"{where} must be a list of [start, end] pairs"
            for start, end in spans:
                if not 0 <= start <= end:
                    return f"{where}: span [{start}, {end}] has end < start"
                if text is not None and end >= len(text):
                    return (
                        f"entity ({kind!r}, {start}, {end}) is outside the text of {len(text)} "
                        "characters (end is inclusive)"
                    )
                if end - start + 1 != len(entity):
                    return (
                        f"{where}: span [{start}, {end}] covers {end - start + 1} characters, "
                        f"the entity {len(entity)} (end is inclusive)"
                    )
                if text is not None and text[start : end + 1] != entity:
                    return (
                        f"{kind} entity {entity!r} at [{start}, {end}] does not match the text "
                        f"({text[start : end + 1]!r} there)"
                    )
    return None


def _coverage_problems(records, expected, in_order):
    """Missing, unknown and (``in_order``: a record a line) misordered ids."""
    keys, found = list(expected), [key for _, key, _ in records]
    found_keys = set(found)
    missing = [key for key in keys if key not in found_keys]
    unknown = [key for key in found if key not in expected]
    if missing and unknown and {str(k) for k in missing} == {str(k) for k in unknown}:
        return [
            f"ids have the wrong type: the file has {unknown[0]!r} where the test file has "
            f"{missing[0]!r} (write the test file's ids as they are)"
        ]
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of {len(keys)} test ids are missing (first: {missing[:5]!r})"
        )
    if unknown:
        problems.append(f"{len(unknown)} ids are not in the test split (first: {unknown[:5]!r})")
    if in_order and not problems:
        for position, (wanted, (where, key, _)) in enumerate(zip(keys, records)):
            if wanted != key:
                problems.append(
                    f"{where}: records are not in the test file's order "
                    f"(expected id {wanted!r} at record {position}, found {key!r})"
                )
                break
    return problems


def _summarise(problems):
    if len(problems) > _MAX_PROBLEMS:
        extra = len(problems) - _MAX_PROBLEMS
        problems = problems[:_MAX_PROBLEMS] + [f"... and {extra} more problems."]
    return problems


# === Writing ===
def write_submission(output_dir, task, benchmark, predictions, test_split):
    """Checks predictions against the test split and writes the task's file.

    Args:
        output_dir: the folder to write into (created if missing).
        task: a task name or `ClueTask`.
        benchmark: ``"clue"`` or ``"fewclue"``.
        predictions: a dict ``{id: prediction}``: classification: the label
            STRING; C3: the choice index; CHID: ``{blank id: candidate
            index}``; CMRC2018: the answer text; CLUENER: a list of
            ``(type, start, end_inclusive)``.
        test_split: the `ClueSplit` of the test file (``test1.0.json`` gives
            the CLUE 1.0 name), or a list of its examples.

    Returns:
        The `pathlib.Path` of the file written.

    Raises:
        ValueError: before anything is written, with every problem
            `check_submission` would find in the file.

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
    layout = _Layout(task, benchmark, test_split)
    name = submission_file_name(layout.task, layout.benchmark, layout.version)
    if not isinstance(predictions, Mapping):
        raise ValueError(
            "Expected predictions, a dict {id: prediction}. "
            f"Received: {type(predictions).__name__}."
        )
    wrong_ids = [layout.id_problem(key, written=True) for key in predictions]
    if any(wrong_ids):
        raise ValueError(f"Not writing {name}: {next(filter(None, wrong_ids))}.")
    expected = layout.expected
    order = {key: position for position, key in enumerate(expected)}
    records = sorted(
        (
            (f"id {key!r}", layout.key(key), layout.value(value, expected.get(layout.key(key))))
            for key, value in predictions.items()
        ),
        key=lambda record: order.get(record[1], len(order)),
    )
    problems = layout.problems(records) + _coverage_problems(records, expected, False)
    if problems:
        raise ValueError(
            f"Not writing {name}: the predictions do not fit {layout.task.name}'s test split:\n  "
            + "\n  ".join(_summarise(problems))
        )
    if layout.field is None:
        rows = [{key: value for _, key, value in records}]
    else:
        rows = [{"id": key, layout.field: value} for _, key, value in records]
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = write_atomically(output_dir / name, lambda file: file.write(text))
    logger.info("Wrote %s (%d predictions).", path, len(records))
    return path


# === Checking ===
def check_submission(path, task, benchmark, test_split=None):
    """Lists what is wrong with a submission file (an empty list: nothing).

    Checks the name, the encoding, the task's shape, the ids and the
    values; with the test split, that every test id is predicted, in order,
    with values that fit its example.

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
    layout = _Layout(task, benchmark, test_split)
    path = pathlib.Path(path)
    problems = _name_problems(path.name, layout)
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
    read = _read_object if layout.field is None else _read_lines
    records, read_problems = read(layout, text)
    if records is None:
        return _summarise(problems + read_problems)
    problems += sorted(read_problems + layout.problems(records), key=_line_number)
    if layout.expected is not None:
        problems += _coverage_problems(records, layout.expected, layout.field is not None)
    return _summarise(problems)


def _line_number(problem):
    match = re.match(r"line (\d+):", problem)
    return int(match.group(1)) if match else 0


def _name_problems(name, layout):
    task, benchmark = layout.task, layout.benchmark
    versions = [layout.version] if layout.version else _versions(benchmark)
    expected = list(dict.fromkeys(submission_file_name(task, benchmark, v) for v in versions))
    if name in expected:
        return []
    message = (
        f"file name {name!r} is not what {BENCHMARK_NAMES[benchmark]} expects for "
        f"{task.name}: {expected[0]!r}"
    )
    if len(expected) > 1:
        message += f" (or {expected[1]!r} for CLUE 1.0's test file)"
    return [message]


def _read_object(layout, text):
    """``([(where, key, value)], problems)`` of a file that is one JSON object."""
    problems = []

    def pairs(items):
        keys = set()
        for key, value in items:
            if key in keys:
                problems.append(f"id {key!r} appears more than once")
            keys.add(key)
        return dict(items)

    shape = "{'#idiom012345#': index}" if layout.tags else "{question id: answer}"
    name = layout.task.name
    try:
        document = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":
            return None, [
                f"line {error.lineno}: a second JSON value; {name} expects ONE JSON object "
                f"{shape} (not a record a line)"
            ]
        return None, [f"line {error.lineno}: not valid JSON ({error.msg})"]
    if not isinstance(document, dict):
        return None, [
            f"expected ONE JSON object {shape} for {name}. Received: {type(document).__name__}"
        ]
    if set(document) in ({"id", "label"}, {"id", "answer"}):
        return None, [
            f"the file holds one record {sorted(document)}; {name} expects ONE JSON object "
            f"{shape} over all test ids"
        ]
    records = [(f"id {key!r}", key, value) for key, value in document.items()]
    return records, problems


def _read_lines(layout, text):
    """``([(where, key, value)], problems)`` of a file with a record a line."""
    field = layout.field
    records, problems, lines = [], [], {}
    for number, line in enumerate(text_lines(text), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(f"line {number}: not valid JSON ({error.msg})")
            continue
        if not isinstance(record, dict):
            problems.append(
                f"line {number}: expected a JSON object {{'id': ..., '{field}': ...}}. "
                f"Received: {type(record).__name__}"
            )
            continue
        missing = [name for name in ("id", field) if name not in record]
        if missing:
            problems.append(f"line {number}: missing {' and '.join(map(repr, missing))}")
            continue
        problem = layout.id_problem(record["id"])
        if problem:
            problems.append(f"line {number}: {problem}")
            continue
        key = layout.key(record["id"])
        if key in lines:
            problems.append(f"line {number}: id {key!r} repeats line {lines[key]}")
            continue
        lines[key] = number
        records.append((f"line {number}", key, record[field]))
    return records, problems


# === The zip ===
FEWCLUE_ZIP_NAME = "fewclue_submit_examples.zip"


def default_zip_name(benchmark, team="team", date="YYYYMMDD"):
    """The name a benchmark asks its submission zip to have.

    FewCLUE's README: "zip fewclue_submit_examples.zip *.json".

    Args:
        benchmark: ``"clue"`` or ``"fewclue"``.
        team: the team name (CLUE).
        date: ``YYYYMMDD`` (CLUE).

    Returns:
        ``submit_<team>_<date>.zip`` (CLUE) or ``fewclue_submit_examples.zip``.

    Example:
    >>> default_zip_name("clue", "mylab", "20240101"), default_zip_name("fewclue")
    ('submit_mylab_20240101.zip', 'fewclue_submit_examples.zip')
    """
    if check_benchmark(benchmark) == "fewclue":
        return FEWCLUE_ZIP_NAME
    return f"submit_{team}_{date}.zip"


def build_submission_zip(files, zip_path):
    """Zips submission files, each at the zip's root, as CLUE accepts them.

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
    known = {  # the benchmark of every submission file name
        submission_file_name(task, benchmark, version): benchmark
        for task in TASKS.values()
        for benchmark in task.benchmarks
        for version in _versions(benchmark)
    }
    seen, benchmarks = {}, {}
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
        benchmarks.setdefault(known[path.name], path.name)
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
    logger.info("Wrote %s (%d file%s).", zip_path, len(paths), "s" if len(paths) != 1 else "")
    return zip_path
