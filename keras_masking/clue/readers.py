"""Reading a CLUE 1.1 or FewCLUE task's split from a data folder.

`read_split` finds the task's folder under the data folder (``data_dir/tnews``,
``data_dir/cluewsc2020``, ``data_dir/afqmc_public`` ...) or takes ``data_dir``
itself when it holds the files, tells CLUE from FewCLUE by the file names
(`detect_benchmark`) and reads the split into the records of
`keras_masking.clue.examples`. JSON-lines files stream (`iter_examples`); C3
and CMRC2018 files are one JSON document each and are read whole.

Files per split (CLUE 1.1 / FewCLUE):

- ``train``: ``train.json`` (OCNLI ``train.50k.json``; C3 ``m-train.json`` +
  ``d-train.json``; CHID with ``train_answer.json``) / ``train_few_all.json``,
  or ``train_{k}.json`` with ``few_shot=k``.
- ``dev``: ``dev.json`` (C3 ``m-dev.json`` + ``d-dev.json``; CHID with
  ``dev_answer.json``) / ``dev_few_all.json`` or ``dev_{k}.json``.
- ``test``: ``test1.1.json`` or ``test.json``, else ``test1.0.json`` /
  ``test.json`` (no labels).
- ``test1.0`` (CLUE 1.0's TNEWS, CLUEWSC, C3, CHID): ``test1.0.json``.
- ``test_public`` (FewCLUE, labelled): ``test_public.json``.
"""

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re

from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import EntityExample
from keras_masking.clue.examples import IdiomPassage
from keras_masking.clue.examples import SpanExample
from keras_masking.clue.examples import TextExample
from keras_masking.clue.tasks import check_benchmark
from keras_masking.clue.tasks import get_task
from keras_masking.utils.arguments import check_int

logger = logging.getLogger(__name__)

FEW_SHOT_SPLITS = 5  # FewCLUE's train_0..train_4 / dev_0..dev_4
_FEWCLUE_MARKERS = (
    ("train_few_all.json", "dev_few_all.json", "test_public.json", "unlabeled.json")
    + tuple(f"train_{k}.json" for k in range(FEW_SHOT_SPLITS))
    + tuple(f"dev_{k}.json" for k in range(FEW_SHOT_SPLITS))
)
_CLUE_MARKERS = ("train.json", "dev.json", "test1.0.json", "test1.1.json")
_CLUE_TASK_MARKERS = {
    "ocnli": ("train.50k.json",),
    "c3": ("m-train.json", "d-train.json", "m-dev.json", "d-dev.json"),
    "chid": ("train_answer.json", "dev_answer.json"),
}
_CLUE_FILES = {
    "train": ("train.json",),
    "dev": ("dev.json",),
    "test": ("test1.1.json", "test.json", "test1.0.json"),
    "test1.0": ("test1.0.json",),
}
_BENCHMARK_NAMES = {"clue": "CLUE", "fewclue": "FewCLUE", None: "CLUE or FewCLUE"}

# Text fields of the classification tasks: (first, second or None).
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
_CLUE_BLANK = re.compile(r"#idiom\d{6}#")
_FEWCLUE_BLANK = "#idiom#"
_SKIP = object()


@dataclasses.dataclass
class ClueSplit:
    """One split of one task, read.

    Args:
        task: the `ClueTask`.
        benchmark: ``"clue"`` or ``"fewclue"``.
        split: ``"train"``, ``"dev"``, ``"test"``, ``"test1.0"``,
            ``"test_public"``, ``"train_0"`` .. ``"train_4"``, ``"dev_0"`` ..
        examples: the records (`TextExample`, `ChoiceExample`, ...).
        files: ``[{"path", "sha256", "records"}]`` for every file read (CHID
            answer files too); ``records`` counts lines, C3 documents,
            CMRC2018 questions or CHID answer tags.
        skipped: examples skipped (``"-"`` labels of OCNLI / CMNLI).
        labelled: whether the examples carry labels.
        labels: the task's label strings (CLUENER: its entity types), or
            None.
        counts: what reading changed (recorded in ``run.json``): CMRC2018's
            ``answers``, ``answers_relocated`` (placed by the answer's text),
            ``answers_unplaced`` (the text is not in the context: scored, not
            trained on), ``questions_unplaced`` and, for a training split,
            ``questions_dropped``. Empty for the other tasks.

    Example:

    >>> import pathlib
    >>> folder = pathlib.Path("eprstmt")
    >>> folder.mkdir()
    >>> _ = (folder / "dev_few_all.json").write_text(
    ...     '{"id": 7, "sentence": "很好", "label": "Positive"}\\n', encoding="utf-8")
    >>> split = read_split(".", "eprstmt", "dev")
    >>> split.benchmark, split.examples[0], split.files[0]["records"]
    ('fewclue', TextExample(id=7, text_a='很好', text_b=None, label='Positive'), 1)
    """

    task: object
    benchmark: str
    split: str
    examples: list
    files: list
    skipped: int
    labelled: bool
    labels: tuple | None
    counts: dict = dataclasses.field(default_factory=dict)

    def __len__(self):
        return len(self.examples)


# === Finding the files ===
def detect_benchmark(data_dir, task, benchmark=None):
    """Finds a task's folder and tells whether it holds CLUE or FewCLUE files.

    The folders tried, in order: ``data_dir/<name>`` for each folder name of
    the task (``tnews``, ``tnews_public``, ...), then ``data_dir`` itself.

    Args:
        data_dir: the data folder.
        task: a task name or `ClueTask`.
        benchmark: None to detect, or ``"clue"`` / ``"fewclue"`` to require.

    Returns:
        ``(benchmark, folder)``: ``"clue"`` or ``"fewclue"`` and a
        `pathlib.Path`.

    Raises:
        FileNotFoundError: no folder holds the task's files (every path tried
            is listed).
        ValueError: a folder holds both benchmarks' files, two folders hold
            the task's files, or the benchmark does not have the task.

    Example:

    >>> import pathlib
    >>> pathlib.Path("data/cluewsc2020").mkdir(parents=True)
    >>> _ = pathlib.Path("data/cluewsc2020/train.json").write_text("{}\\n")
    >>> benchmark, folder = detect_benchmark("data", "wsc")
    >>> benchmark, folder.name
    ('clue', 'cluewsc2020')
    """
    task = get_task(task)
    if benchmark is not None:
        benchmark = check_benchmark(benchmark)
        if benchmark not in task.benchmarks:
            raise ValueError(
                f"{task.name} is not a {_BENCHMARK_NAMES[benchmark]} task. "
                f"It is part of: {', '.join(_BENCHMARK_NAMES[b] for b in task.benchmarks)}."
            )
    data_dir = pathlib.Path(data_dir)
    found, tried = [], []
    for folder in [data_dir / name for name in _task_folders(task)] + [data_dir]:
        if folder == data_dir and found:
            break  # a task folder wins over files lying in the data folder itself
        tried.append(os.fspath(folder))
        kind = _folder_benchmark(folder, task, benchmark) if folder.is_dir() else None
        if kind is not None:
            found.append((kind, folder))
    matching = [(kind, folder) for kind, folder in found if benchmark in (None, kind)]
    if not matching:
        others = "".join(
            f"; {_BENCHMARK_NAMES[kind]} files are in {os.fspath(folder)}" for kind, folder in found
        )
        raise FileNotFoundError(
            f"No {_BENCHMARK_NAMES[benchmark]} files of {task.name} found. "
            f"Tried: {', '.join(tried)}{others}."
        )
    if len(matching) > 1:
        raise ValueError(
            f"More than one folder holds {task.name} files: "
            + ", ".join(f"{os.fspath(f)} ({_BENCHMARK_NAMES[kind]})" for kind, f in matching)
            + ". Keep one, or pass the task's folder as data_dir"
            + ("." if benchmark else " and benchmark=.")
        )
    kind, folder = matching[0]
    if kind not in task.benchmarks:
        raise ValueError(
            f"{os.fspath(folder)} holds {_BENCHMARK_NAMES[kind]} files, but {task.name} is not a "
            f"{_BENCHMARK_NAMES[kind]} task."
        )
    return kind, folder


def _task_folders(task):
    """The folder names a task's files may sit in (CLUE's downloads add ``_public``)."""
    names = ("cluewsc2020", "wsc", "cluewsc") if task.name == "cluewsc" else (task.name,)
    return names + ((f"{names[0]}_public",) if "clue" in task.benchmarks else ())


def _folder_benchmark(folder, task, benchmark):
    """``"clue"``, ``"fewclue"`` or None: whose files ``folder`` holds."""
    clue = [
        name
        for name in _CLUE_MARKERS + _CLUE_TASK_MARKERS.get(task.name, ())
        if (folder / name).is_file()
    ]
    fewclue = [name for name in _FEWCLUE_MARKERS if (folder / name).is_file()]
    if clue and fewclue:
        raise ValueError(
            f"{os.fspath(folder)} holds both CLUE files ({os.fspath(folder / clue[0])}) and "
            f"FewCLUE files ({os.fspath(folder / fewclue[0])}). Keep each benchmark in its own "
            "folder."
        )
    if clue or fewclue:
        return "clue" if clue else "fewclue"
    if not (folder / "test.json").is_file():
        return None
    if benchmark is not None or len(task.benchmarks) == 1:
        return benchmark or task.benchmarks[0]
    raise ValueError(
        f"{os.fspath(folder / 'test.json')} alone does not tell CLUE from FewCLUE. "
        "Pass benchmark='clue' or benchmark='fewclue'."
    )


def _split_files(task, benchmark, folder, split, few_shot):
    """``(split name, [data files], answers file or None)``; raises if missing."""
    if benchmark == "fewclue":
        match = re.fullmatch(r"(train|dev)(?:_(\d+|few_all))?", split)
        if match:
            base, suffix = match.groups()
            if suffix is not None and few_shot != "all":
                raise ValueError(
                    f"split={split!r} already names its file; few_shot={few_shot!r} contradicts it."
                )
            suffix = suffix or ("few_all" if few_shot == "all" else str(few_shot))
            if suffix != "few_all":
                check_int("the few-shot split", int(suffix), 0, FEW_SHOT_SPLITS - 1)
            name = base if suffix == "few_all" else f"{base}_{suffix}"
            file = f"{base}_{suffix}"
        elif split in ("test", "test_public"):
            if few_shot != "all":
                raise ValueError(
                    f"few_shot={few_shot!r} selects a train / dev file; the {split} split has one "
                    "file. Pass few_shot='all'."
                )
            name, file = split, split
        else:
            raise ValueError(
                f"Unknown FewCLUE split {split!r}. Expected 'train', 'dev' (with few_shot='all' "
                f"or 0..{FEW_SHOT_SPLITS - 1}), 'train_k', 'dev_k', 'test_public' or 'test'."
            )
        return name, [_first_existing(folder, (f"{file}.json",), task, split)], None
    if few_shot != "all":
        raise ValueError(
            f"few_shot={few_shot!r} is a FewCLUE option; CLUE's {task.name} has one "
            f"{split} split. Pass few_shot='all'."
        )
    if split not in _CLUE_FILES:
        raise ValueError(
            f"Unknown CLUE split {split!r}. Expected 'train', 'dev', 'test' or 'test1.0'."
        )
    if task.name == "c3" and split in ("train", "dev"):
        paths = [folder / f"m-{split}.json", folder / f"d-{split}.json"]
        missing = [os.fspath(path) for path in paths if not path.is_file()]
        if missing:
            raise FileNotFoundError(
                f"C3's {split} split is {paths[0].name} + {paths[1].name}; missing: "
                f"{', '.join(missing)}."
            )
        return split, paths, None
    candidates = _CLUE_FILES[split]
    if task.name == "ocnli" and split == "train":
        candidates = ("train.50k.json",) + candidates
    path = _first_existing(folder, candidates, task, split)
    answers = None
    if task.name == "chid" and split in ("train", "dev"):
        answers = _first_existing(folder, (f"{split}_answer.json",), task, f"{split} answers")
    return split, [path], answers


def _first_existing(folder, names, task, what):
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"No {what} file of {task.name} found. Tried: "
        f"{', '.join(os.fspath(folder / name) for name in names)}."
    )


# === Reading a split ===
def read_split(data_dir, task, split, benchmark=None, few_shot="all"):
    """Reads one split of a CLUE 1.1 or FewCLUE task.

    Args:
        data_dir: the data folder: the one holding the task folders, or the
            task's folder itself.
        task: a task name (aliases allowed) or `ClueTask`.
        split: ``"train"``, ``"dev"``, ``"test"``; CLUE: ``"test1.0"``;
            FewCLUE: ``"test_public"``, ``"train_k"`` / ``"dev_k"``.
        benchmark: None to detect it from the files, or ``"clue"`` /
            ``"fewclue"``.
        few_shot: FewCLUE's ``"train"`` / ``"dev"``: ``"all"``
            (``*_few_all.json``) or ``k`` in 0..4 (``train_k.json``).

    Returns:
        A `ClueSplit`. Test splits (``test``, ``test1.0``) are unlabelled;
        every other split is labelled.

    Raises:
        FileNotFoundError: the split's files are missing (as `detect_benchmark`).
        ValueError: a bad file or record (as `iter_examples`), an unknown split.

    Example:

    >>> import pathlib
    >>> folder = pathlib.Path("clue/ocnli")
    >>> folder.mkdir(parents=True)
    >>> _ = (folder / "dev.json").write_text(
    ...     '{"sentence1": "他来了", "sentence2": "他没来", "label": "contradiction"}\\n'
    ...     '{"sentence1": "下雨了", "sentence2": "天晴", "label": "-"}\\n', encoding="utf-8")
    >>> split = read_split("clue", "ocnli", "dev")
    >>> split.examples, split.skipped
    ([TextExample(id=0, text_a='他来了', text_b='他没来', label='contradiction')], 1)
    """
    task = get_task(task)
    if not isinstance(split, str):
        raise ValueError(f"Expected split, a string. Received: split={split!r}.")
    if few_shot != "all":
        few_shot = check_int("few_shot", few_shot, 0, FEW_SHOT_SPLITS - 1)
    benchmark, folder = detect_benchmark(data_dir, task, benchmark)
    name, paths, answers = _split_files(task, benchmark, folder, split, few_shot)
    labelled = name not in ("test", "test1.0")
    reading = _Reading(task, labelled, name.startswith("test"), benchmark, answers)
    examples = [example for path in paths for example in _read_file(reading, path)]
    counts = reading.counts
    if task.kind == "span" and labelled and name.startswith("train"):
        # Train without the questions none of whose answers is in the context
        # (they stay in dev splits, where every answer text is scored).
        kept = [e for e in examples if any(start is not None for _, start in e.answers)]
        counts["questions_dropped"] = len(examples) - len(kept)
        if counts["questions_dropped"]:
            logger.warning(
                "%s %s: %d questions have no answer found in their context and are left out "
                "of training.",
                task.name,
                name,
                counts["questions_dropped"],
            )
        examples = kept
    if not examples:
        dropped = counts.get("questions_dropped")
        what = f"{dropped} questions without an answer in their context"
        if not dropped:
            what = f"{reading.skipped} '-' labels"
        raise ValueError(f"{os.fspath(paths[0])}: no examples left after skipping {what}.")
    if reading.skipped:
        logger.info("%s %s: skipped %d examples labelled '-'.", task.name, name, reading.skipped)
    logger.info(
        "Read %s %s %s: %d examples from %s.",
        _BENCHMARK_NAMES[benchmark],
        task.name,
        name,
        len(examples),
        ", ".join(os.fspath(path) for path in paths),
    )
    files, skipped = reading.files, reading.skipped
    return ClueSplit(task, benchmark, name, examples, files, skipped, labelled, task.labels, counts)


# === Reading one file ===
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
    reading = _Reading(task, labelled, not labelled, benchmark, answers)
    yield from _read_file(reading, path)
    if report is not None:
        report.update(files=reading.files, skipped=reading.skipped, counts=reading.counts)


@dataclasses.dataclass
class _Reading:
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


def _read_file(reading, path):
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
    """``(parsed JSON, sha256)`` of a file that is one JSON document."""
    name = os.fspath(path)
    with open(path, "rb") as file:
        data = file.read()
    digest = hashlib.sha256(data).hexdigest()
    text = _decode(data, name)
    del data
    if not text.strip():
        raise ValueError(f"{name}: the file is empty.")
    return _parse(text, name), digest


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


def _short(labels):
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
            f"{_short(task.labels)}."
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
    inserts = []  # (position, 0 for a closing mark / 1 for an opening one, mark)
    for number, (opening, closing) in ((1, ("_", "_")), (2, ("[", "]"))):
        index = _field(target, f"span{number}_index", f"{where}: target", int)
        span = _field(target, f"span{number}_text", f"{where}: target", str)
        if not span or index < 0 or text[index : index + len(span)] != span:
            raise ValueError(
                f"{where}: target span{number}_text {span!r} is not at span{number}_index "
                f"{index} of the text (found {text[index : index + len(span)]!r} there)."
            )
        inserts += [(index, 1, opening), (index + len(span), 0, closing)]
    inserts.sort(key=lambda insert: (insert[0], insert[1]))
    pieces, start = [], 0
    for position, _, mark in inserts:
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
                f"{_short(types)}."
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
    document, digest = _read_document(path)
    name = os.fspath(path)
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
        pieces = _CLUE_BLANK.split(content)
        current = pieces[0] if current is None else current + "\n" + pieces[0]
        for tag, piece in zip(_CLUE_BLANK.findall(content), pieces[1:]):
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
    document, digest = _read_document(path)
    name = os.fspath(path)
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
    document, digest = _read_document(path)
    name = os.fspath(path)
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
        placement = "exact"
        if start is None:
            placement = "unplaced"
        elif given is not None and start != given:
            placement = "relocated"
        counts["answers"] += 1
        if placement != "exact":
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


def read_task_splits(data_dir, task, benchmark=None, few_shot="all"):
    """Reads a task's train and dev splits, and its test splits where present.

    Args:
        data_dir: the data folder (see `read_split`).
        task: a task name or `ClueTask`.
        benchmark: None to detect it, or ``"clue"`` / ``"fewclue"``.
        few_shot: FewCLUE's ``"all"`` or a split index 0..4 (train and dev).

    Returns:
        A dict ``{"train", "dev"}`` of `ClueSplit`, plus ``"test"`` (no
        labels) and, for FewCLUE, ``"test_public"`` (labelled) when the
        folder holds them. A CLUE folder holding both ``test1.1.json`` (or
        ``test.json``) and ``test1.0.json`` (TNEWS, CLUEWSC2020, C3, CHID)
        gives both: ``"test"`` and ``"test1.0"``, one submission file each,
        as CLUE's baselines write them.

    Raises:
        FileNotFoundError / ValueError: as `read_split`, for train and dev.

    Example:
    >>> import pathlib
    >>> folder = pathlib.Path("fewclue/eprstmt")
    >>> folder.mkdir(parents=True)
    >>> for split in ("train_few_all", "dev_few_all"):
    ...     _ = (folder / f"{split}.json").write_text(
    ...         '{"id": 0, "sentence": "好", "label": "Positive"}\\n', encoding="utf-8")
    >>> sorted(read_task_splits("fewclue", "eprstmt"))
    ['dev', 'train']
    """
    benchmark, _ = detect_benchmark(data_dir, task, benchmark)
    splits = {
        "train": read_split(data_dir, task, "train", benchmark, few_shot),
        "dev": read_split(data_dir, task, "dev", benchmark, few_shot),
    }
    optional = ("test", "test_public") if benchmark == "fewclue" else ("test", "test1.0")
    for name in optional:
        try:
            splits[name] = read_split(data_dir, task, name, benchmark)
        except FileNotFoundError:
            continue
    if "test1.0" in splits and (
        "test" not in splits or splits["test"].files == splits["test1.0"].files
    ):
        del splits["test1.0"]  # the folder's only test file: it is the "test" split
    return splits


_READERS = {
    "classification": _text_example,
    "entity": _entity_example,
    "idiom": _chid_examples,
    "multiple_choice": _c3_examples,
    "span": _cmrc2018_examples,
}
