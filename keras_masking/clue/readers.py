"""Reading a CLUE 1.1 or FewCLUE task's split from a data folder.

The data folder is always an argument: `read_split` finds the task's folder
under it (``data_dir/tnews``, ``data_dir/cluewsc2020``, ``data_dir/afqmc_public``
...) or takes ``data_dir`` itself when it holds the files, tells the two
layouts apart by their file names (`detect_benchmark`), and reads the split's
files into the records of `keras_masking.clue.examples`. JSON-lines files
stream (`iter_examples` yields one record at a time); C3 and CMRC2018 files
are single JSON documents and are read whole.

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

Every problem in a file is a ValueError that names the file and the line (or,
in JSON documents, the document / question and its id), what was expected
and what was found.
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

# Folder names a task's files may sit in under the data folder (CLUE's
# downloads unpack to "<name>_public").
TASK_FOLDERS = {
    "afqmc": ("afqmc", "afqmc_public"),
    "tnews": ("tnews", "tnews_public"),
    "iflytek": ("iflytek", "iflytek_public"),
    "ocnli": ("ocnli", "ocnli_public"),
    "cmnli": ("cmnli", "cmnli_public"),
    "cluewsc": ("cluewsc2020", "wsc", "cluewsc", "cluewsc2020_public"),
    "csl": ("csl", "csl_public"),
    "cluener": ("cluener", "cluener_public"),
    "c3": ("c3", "c3_public"),
    "chid": ("chid", "chid_public"),
    "cmrc2018": ("cmrc2018", "cmrc2018_public"),
    "bustm": ("bustm",),
    "eprstmt": ("eprstmt",),
    "csldcp": ("csldcp",),
}

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
            answer files too). ``records``: the lines of a JSON-lines file, the documents
            of a C3 file, the questions of a CMRC2018 file, the tags of a
            CHID answer file.
        skipped: examples skipped (``"-"`` labels of OCNLI / CMNLI).
        labelled: whether the examples carry labels.
        labels: the task's label strings (CLUENER: its entity types), or
            None.
        counts: what reading changed, by name (recorded in ``run.json``):
            CMRC2018 ``answers``, ``answers_relocated`` (an ``answer_start``
            of -1 or pointing elsewhere, placed by the answer's text),
            ``answers_unplaced`` (the text is not in the context: scored,
            not trained on), ``questions_unplaced`` (no answer placed) and,
            for a training split, ``questions_dropped`` (those questions,
            left out of training). Empty for the other tasks.

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
    the task (CLUE's and FewCLUE's names and CLUE's ``<name>_public``), then
    ``data_dir`` itself. FewCLUE folders hold ``*_few_all.json``,
    ``train_k.json`` / ``dev_k.json`` or ``test_public.json``; CLUE folders
    ``train.json``, ``dev.json``, ``test1.x.json`` (and the task's own names:
    ``train.50k.json``, ``m-train.json``, ``train_answer.json``).

    Args:
        data_dir: the data folder.
        task: a task name or `ClueTask`.
        benchmark: None to detect, or ``"clue"`` / ``"fewclue"`` to require.

    Returns:
        ``(benchmark, folder)``: ``"clue"`` or ``"fewclue"`` and a
        `pathlib.Path`.

    Raises:
        FileNotFoundError: no folder holds the task's files; the message
            lists every path tried.
        ValueError: a folder holds both CLUE and FewCLUE files (both named),
            two folders hold the task's files, or the files are of a
            benchmark that does not have the task.

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
    folders = [data_dir / name for name in TASK_FOLDERS[task.name]] + [data_dir]
    found = []
    tried = []
    for folder in folders:
        if folder == data_dir and found:
            break  # a task folder wins over files lying in the data folder itself
        tried.append(folder)
        if not folder.is_dir():
            continue
        kind = _folder_benchmark(folder, task, benchmark)
        if kind is not None:
            found.append((kind, folder))
    if benchmark is not None:
        matching = [(kind, folder) for kind, folder in found if kind == benchmark]
        if not matching:
            others = "".join(
                f"; {_BENCHMARK_NAMES[kind]} files are in {os.fspath(folder)}"
                for kind, folder in found
            )
            raise FileNotFoundError(
                f"No {_BENCHMARK_NAMES[benchmark]} files of {task.name} found. Tried: "
                f"{', '.join(os.fspath(path) for path in tried)}{others}."
            )
        found = matching
    if not found:
        raise FileNotFoundError(
            f"No CLUE or FewCLUE files of {task.name} found. Tried: "
            f"{', '.join(os.fspath(path) for path in tried)}."
        )
    if len(found) > 1:
        raise ValueError(
            f"More than one folder holds {task.name} files: "
            + ", ".join(f"{os.fspath(folder)} ({_BENCHMARK_NAMES[kind]})" for kind, folder in found)
            + ". Keep one, or pass the task's folder as data_dir"
            + ("." if benchmark else " and benchmark=.")
        )
    kind, folder = found[0]
    if kind not in task.benchmarks:
        raise ValueError(
            f"{os.fspath(folder)} holds {_BENCHMARK_NAMES[kind]} files, but {task.name} is not a "
            f"{_BENCHMARK_NAMES[kind]} task."
        )
    return kind, folder


_BENCHMARK_NAMES = {"clue": "CLUE", "fewclue": "FewCLUE"}


def _folder_benchmark(folder, task, benchmark):
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
    if clue:
        return "clue"
    if fewclue:
        return "fewclue"
    if (folder / "test.json").is_file():
        if benchmark is not None:
            return benchmark
        if len(task.benchmarks) == 1:
            return task.benchmarks[0]
        raise ValueError(
            f"{os.fspath(folder / 'test.json')} alone does not tell CLUE from FewCLUE. "
            "Pass benchmark='clue' or benchmark='fewclue'."
        )
    return None


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
            suffix = suffix or (None if few_shot == "all" else str(few_shot))
            if suffix is not None and suffix != "few_all":
                check_int("the few-shot split", int(suffix), 0, FEW_SHOT_SPLITS - 1)
                name, candidates = f"{base}_{suffix}", (f"{base}_{suffix}.json",)
            else:
                name, candidates = base, (f"{base}_few_all.json",)
        elif split in ("test", "test_public"):
            if few_shot != "all":
                raise ValueError(
                    f"few_shot={few_shot!r} selects a train / dev file; the {split} split has one "
                    "file. Pass few_shot='all'."
                )
            name, candidates = split, (f"{split}.json",)
        else:
            raise ValueError(
                f"Unknown FewCLUE split {split!r}. Expected 'train', 'dev' (with few_shot='all' "
                f"or 0..{FEW_SHOT_SPLITS - 1}), 'train_k', 'dev_k', 'test_public' or 'test'."
            )
        return name, [_first_existing(folder, candidates, task, split)], None
    if few_shot != "all":
        raise ValueError(
            f"few_shot={few_shot!r} is a FewCLUE option; CLUE's {task.name} has one "
            f"{split} split. Pass few_shot='all'."
        )
    if split not in ("train", "dev", "test", "test1.0"):
        raise ValueError(
            f"Unknown CLUE split {split!r}. Expected 'train', 'dev', 'test' or 'test1.0'."
        )
    if split == "test":
        candidates = ("test1.1.json", "test.json", "test1.0.json")
    elif split == "test1.0":
        candidates = ("test1.0.json",)
    elif task.name == "ocnli" and split == "train":
        candidates = ("train.50k.json", "train.json")
    else:
        candidates = (f"{split}.json",)
    if task.name == "c3" and split in ("train", "dev"):
        paths = [folder / f"m-{split}.json", folder / f"d-{split}.json"]
        missing = [path for path in paths if not path.is_file()]
        if missing:
            raise FileNotFoundError(
                f"C3's {split} split is {paths[0].name} + {paths[1].name}; missing: "
                f"{', '.join(os.fspath(path) for path in missing)}."
            )
        return split, paths, None
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
        FileNotFoundError: the folder or the split's files are missing (every
            path tried is listed).
        ValueError: a bad file or record (the file and line are named; see
            `iter_examples`), duplicate ids, an unknown split.

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
    is_test = name.startswith("test")
    labelled = name not in ("test", "test1.0")
    files = []
    labels = task.labels
    examples = []
    skipped = 0
    seen = {}  # ids of every file of the split: where each was first read
    counts = {}
    for path in paths:
        report = {"ids": seen}
        for example in iter_examples(
            path,
            task,
            labelled=labelled,
            labels=labels,
            answers=answers,
            require_ids=is_test,
            first_index=len(examples) + skipped,
            benchmark=benchmark,
            report=report,
        ):
            examples.append(example)
        files.extend(report["files"])
        skipped += report["skipped"]
        for key, value in report["counts"].items():
            counts[key] = counts.get(key, 0) + value
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
        raise ValueError(
            f"{os.fspath(paths[0])}: no examples left after skipping "
            + (
                f"{dropped} questions without an answer in their context."
                if dropped
                else f"{skipped} '-' labels."
            )
        )
    if skipped:
        logger.info("%s %s: skipped %d examples labelled '-'.", task.name, name, skipped)
    logger.info(
        "Read %s %s %s: %d examples from %s.",
        _BENCHMARK_NAMES[benchmark],
        task.name,
        name,
        len(examples),
        ", ".join(os.fspath(path) for path in paths),
    )
    return ClueSplit(task, benchmark, name, examples, files, skipped, labelled, labels, counts)


# === Reading one file ===
def iter_examples(
    path,
    task,
    labelled=True,
    labels=None,
    answers=None,
    require_ids=None,
    first_index=0,
    benchmark=None,
    report=None,
):
    """Yields the records of one file, one at a time.

    JSON-lines files (every task but C3 and CMRC2018) are read line by line,
    so a 392k-line CMNLI file never sits in memory; C3 and CMRC2018 files are
    one JSON document each and are parsed whole.

    Args:
        path: the file.
        task: a task name or `ClueTask`.
        labelled: whether to read (and require) labels; False for test files.
        labels: the allowed label strings; None: the task's `labels`.
        answers: CLUE CHID with labels: the answer file's path or a dict
            ``{tag: candidate index}``.
        require_ids: whether every record must carry an id (default: not
            ``labelled``, i.e. test files).
        first_index: the index of the file's first record, for ids of
            records without one (a split of several files continues).
        benchmark: None, ``"clue"`` or ``"fewclue"``; decides CHID's format
            (detected from the records when None).
        report: an optional dict, filled when the file is exhausted with
            ``"files"`` (``[{"path", "sha256", "records"}]``, the answer file
            too), ``"skipped"`` and ``"counts"`` (see `ClueSplit`).

    Yields:
        `TextExample`, `ChoiceExample`, `IdiomPassage`, `SpanExample` or
        `EntityExample` records, by the task's kind.

    Raises:
        ValueError: a file that is empty, not UTF-8 or not JSON; a record
            with a missing or mistyped field, an unknown label, a missing
            (test) or duplicate id, spans or answers that do not match their
            text. The message names the file and the line (JSON documents:
            the document / question and its id).

    Example:

    >>> import pathlib
    >>> _ = pathlib.Path("dev.json").write_text(
    ...     '{"keyword": ["模型", "训练"], "abst": "摘要", "label": "1"}\\n', encoding="utf-8")
    >>> records = iter_examples("dev.json", "csl")
    >>> next(records)
    TextExample(id=0, text_a='模型；训练', text_b='摘要', label='1')
    """
    task = get_task(task)
    labels = task.labels if labels is None else tuple(labels)
    if require_ids is None:
        require_ids = not labelled
    if benchmark is not None:
        benchmark = check_benchmark(benchmark)
    if report is None:
        report = {}
    seen = report.pop("ids", {})  # read_split's: ids unique over the split's files
    report.update(files=[], skipped=0, counts={})
    context = _Context(path, task, labelled, labels, require_ids, first_index, report, seen)
    if task.kind == "multiple_choice":
        yield from _c3_examples(context)
    elif task.kind == "span":
        yield from _cmrc2018_examples(context)
    elif task.kind == "idiom":
        yield from _chid_examples(context, answers, benchmark)
    else:
        read = _entity_example if task.kind == "entity" else _text_example
        for where, index, record in _json_lines(context):
            example = read(context, where, index, record)
            if example is _SKIP:
                report["skipped"] += 1
                continue
            context.check_unique(example.id, where)
            yield example


@dataclasses.dataclass
class _Context:
    path: object
    task: object
    labelled: bool
    labels: tuple | None
    require_ids: bool
    first_index: int
    report: dict
    seen: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self):
        return os.fspath(self.path)

    def check_unique(self, example_id, where):
        if example_id in self.seen:
            raise ValueError(
                f"{where}: duplicate id {example_id!r} (first used at {self.seen[example_id]}). "
                "Ids must be unique within a split."
            )
        self.seen[example_id] = where

    def example_id(self, record, where, index, fields=("id",)):
        for field in fields:
            if field in record:
                value = record[field]
                if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
                    raise ValueError(
                        f"{where}: field {field!r} must be an int or a non-empty str. "
                        f"Received: {_describe(value)}."
                    )
                return value
        if self.require_ids:
            raise ValueError(
                f"{where}: missing field {fields[0]!r}. Test examples must carry their id "
                "(the submission is matched by it)."
            )
        return self.first_index + index


def _json_lines(context):
    """Yields ``(where, record index, JSON object)`` per non-blank line."""
    digest = hashlib.sha256()
    records = 0
    with open(context.path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            digest.update(raw)
            where = f"{context.name}:{number}"
            line = _decode(raw, context.name, number)
            if not line.strip():
                continue
            record = _parse(line, context.name, number)
            if not isinstance(record, dict):
                raise ValueError(
                    f"{where}: expected a JSON object. Received: {type(record).__name__}."
                )
            records += 1
            yield where, records - 1, record
    if records == 0:
        raise ValueError(f"{context.name}: the file is empty (no JSON lines).")
    context.report["files"].append(
        {"path": context.name, "sha256": digest.hexdigest(), "records": records}
    )


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
    """UTF-8 ``data`` (a byte-order mark dropped) of line ``line`` of file ``name``
    (None: the whole file), or a ValueError naming the file and line."""
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
    """JSON ``text`` of line ``line`` of file ``name`` (None: the whole file), or a
    ValueError naming the file and line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{name}:{line or error.lineno}: not valid JSON ({error.msg} at column {error.colno})."
        ) from error


def _describe(value):
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _field(record, name, where, kind, what=None):
    if name not in record:
        raise ValueError(f"{where}: missing field {name!r}.")
    value = record[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = what or f"a {kind.__name__}"
        raise ValueError(
            f"{where}: field {name!r} must be {expected}. Received: {_describe(value)}."
        )
    return value


def _strings(record, name, where, non_empty=True):
    values = _field(record, name, where, list, "a list of strings")
    if not all(isinstance(value, str) for value in values):
        raise ValueError(
            f"{where}: field {name!r} must be a list of strings. Received: {_describe(values)}."
        )
    if non_empty and not values:
        raise ValueError(f"{where}: field {name!r} is an empty list.")
    return values


def _short(labels):
    if len(labels) <= 16:
        return repr(tuple(labels))
    return f"({', '.join(map(repr, labels[:5]))}, ..., {labels[-1]!r}) ({len(labels)} labels)"


# --- classification ---
def _label(context, record, where):
    task = context.task
    if "label" not in record:
        raise ValueError(f"{where}: missing field 'label'.")
    value = record["label"]
    if task.name in _INTEGER_LABEL_TASKS and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        expected = "a str or an int" if task.name in _INTEGER_LABEL_TASKS else "a str"
        raise ValueError(
            f"{where}: field 'label' must be {expected}. Received: {_describe(value)}."
        )
    if value == "-" and task.name in _NLI_TASKS:
        return _SKIP
    if context.labels is not None and value not in context.labels:
        raise ValueError(
            f"{where}: label {record['label']!r} is not one of {task.name}'s labels "
            f"{_short(context.labels)}."
        )
    if not value:
        raise ValueError(f"{where}: field 'label' is an empty string.")
    return value


def _text_example(context, where, index, record):
    name = context.task.name
    label = _label(context, record, where) if context.labelled else None
    if label is _SKIP:
        return _SKIP
    if name == "cluewsc":
        example_id = context.example_id(record, where, index, ("id", "idx"))
        text = _marked_wsc_text(record, where)
        return TextExample(example_id, text, None, label, source=where)
    example_id = context.example_id(record, where, index)
    if name == "csl":
        keywords = _strings(record, "keyword", where)
        return TextExample(
            example_id,
            "；".join(keywords),
            _field(record, "abst", where, str),
            label,
            source=where,
        )
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
        index = _field(target, f"span{number}_index", f"{where}: target", int, "an int")
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


# --- entities ---
def _entity_example(context, where, index, record):
    example_id = context.example_id(record, where, index)
    text = _field(record, "text", where, str)
    if not context.labelled:
        return EntityExample(example_id, text, None, source=where)
    label = _field(record, "label", where, dict, "an object {type: {entity: [[start, end]]}}")
    entities = []
    for kind, mentions in label.items():
        if context.labels is not None and kind not in context.labels:
            raise ValueError(
                f"{where}: entity type {kind!r} is not one of {context.task.name}'s types "
                f"{_short(context.labels)}."
            )
        if not isinstance(mentions, dict):
            raise ValueError(
                f"{where}: label[{kind!r}] must be an object {{entity: [[start, end]]}}. "
                f"Received: {_describe(mentions)}."
            )
        for entity, spans in mentions.items():
            if not isinstance(spans, list) or not spans:
                raise ValueError(
                    f"{where}: label[{kind!r}][{entity!r}] must be a non-empty list of "
                    f"[start, end]. Received: {_describe(spans)}."
                )
            for span in spans:
                valid = (
                    isinstance(span, list)
                    and len(span) == 2
                    and all(isinstance(i, int) and not isinstance(i, bool) for i in span)
                )
                if not valid:
                    raise ValueError(
                        f"{where}: label[{kind!r}][{entity!r}] spans must be [start, end] "
                        f"integer pairs. Received: {_describe(span)}."
                    )
                start, end = span
                found = text[start : end + 1] if 0 <= start <= end < len(text) else None
                if found != entity:
                    raise ValueError(
                        f"{where}: {kind} entity {entity!r} at [{start}, {end}] (end inclusive) "
                        f"does not match the text: text[{start}:{end + 1}] is {found!r}."
                    )
                entities.append((kind, start, end))
    entities.sort(key=lambda entity: (entity[1], entity[2], entity[0]))
    return EntityExample(example_id, text, tuple(entities), source=where)


# --- CHID ---
def _chid_examples(context, answers, benchmark):
    answers_file = None
    if context.labelled and benchmark != "fewclue":
        if isinstance(answers, (str, os.PathLike)):
            answers_file = os.fspath(answers)
            answers = _chid_answers(answers, context.report)
    used = set()
    file_format = benchmark
    for where, index, record in _json_lines(context):
        content = record.get("content")
        record_format = "clue" if isinstance(content, list) else "fewclue"
        if file_format is None:
            file_format = record_format
        if record_format != file_format:
            raise ValueError(
                f"{where}: field 'content' must be "
                + (
                    "a list of texts with #idiomNNNNNN# blanks (CLUE CHID)"
                    if file_format == "clue"
                    else "a text with one #idiom# blank (FewCLUE CHID)"
                )
                + f". Received: {_describe(content)}."
            )
        candidates = tuple(_strings(record, "candidates", where))
        if file_format == "clue":
            if context.labelled and answers is None:
                raise ValueError(
                    f"{where}: CLUE CHID's labels are in a separate answer file "
                    "(train_answer.json / dev_answer.json); pass answers=."
                )
            passage = _clue_chid_passage(
                context, where, index, record, candidates, answers, answers_file
            )
            used.update(passage.blank_ids)
        else:
            passage = _fewclue_chid_passage(context, where, index, record, candidates)
        context.check_unique(passage.id, where)
        yield passage
    if answers is not None and file_format == "clue":
        extra = [tag for tag in answers if tag not in used]
        if extra:
            raise ValueError(
                f"{answers_file or 'answers'}: {len(extra)} tags have no blank in "
                f"{context.name} (first: {extra[0]!r}). The answer file does not match the "
                "passages."
            )


def _chid_answers(path, report):
    document, digest = _read_document(path)
    name = os.fspath(path)
    if not isinstance(document, dict) or not document:
        raise ValueError(
            f"{name}: expected a non-empty JSON object {{'#idiomNNNNNN#': index}}. "
            f"Received: {_describe(document)}."
        )
    for tag, value in document.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"{name}: the answer of {tag!r} must be an int (a candidate index). "
                f"Received: {_describe(value)}."
            )
    report["files"].append({"path": name, "sha256": digest, "records": len(document)})
    return document


def _clue_chid_passage(context, where, index, record, candidates, answers, answers_file):
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
        context.check_unique(tag, where)
    labels = None
    if context.labelled:
        labels = []
        for tag in blank_ids:
            if tag not in answers:
                raise ValueError(
                    f"{where}: blank {tag!r} has no answer in {answers_file or 'the answers'}."
                )
            labels.append(_candidate_index(answers[tag], candidates, f"{where}: blank {tag!r}"))
        labels = tuple(labels)
    return IdiomPassage(
        context.first_index + index,
        candidates,
        tuple(parts),
        tuple(blank_ids),
        labels,
        source=where,
    )


def _fewclue_chid_passage(context, where, index, record, candidates):
    example_id = context.example_id(record, where, index)
    content = _field(record, "content", where, str)
    if content.count(_FEWCLUE_BLANK) != 1:
        raise ValueError(
            f"{where}: FewCLUE CHID's content must hold exactly one {_FEWCLUE_BLANK} blank. "
            f"Found {content.count(_FEWCLUE_BLANK)}."
        )
    labels = None
    if context.labelled:
        answer = _field(record, "answer", where, int, "an int (a candidate index)")
        labels = (_candidate_index(answer, candidates, f"{where}: field 'answer'"),)
    parts = tuple(content.split(_FEWCLUE_BLANK))
    return IdiomPassage(example_id, candidates, parts, (example_id,), labels, source=where)


def _candidate_index(value, candidates, where):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(candidates):
        raise ValueError(
            f"{where}: the answer must be a candidate index in [0, {len(candidates) - 1}]. "
            f"Received: {_describe(value)}."
        )
    return value


# --- C3 ---
def _c3_examples(context):
    document, digest = _read_document(context.path)
    name = context.name
    if not isinstance(document, list):
        raise ValueError(
            f"{name}: expected a JSON array of [context lines, questions, id] documents. "
            f"Received: {type(document).__name__}."
        )
    if not document:
        raise ValueError(f"{name}: the file is empty (an empty JSON array).")
    count = 0
    for number, item in enumerate(document):
        where = f"{name}: document {number}"
        if not isinstance(item, list) or len(item) < 2:
            raise ValueError(
                f"{where}: expected [context lines, questions, id]. Received: {_describe(item)}."
            )
        if len(item) > 2:
            where += f" ({item[2]!r})"
        lines, questions = item[0], item[1]
        if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
            raise ValueError(
                f"{where}: the context must be a list of strings. Received: {_describe(lines)}."
            )
        if not isinstance(questions, list) or not questions:
            raise ValueError(
                f"{where}: the questions must be a non-empty list. "
                f"Received: {_describe(questions)}."
            )
        context_text = "".join(lines)
        for q_number, question in enumerate(questions):
            here = f"{where}, question {q_number}"
            if not isinstance(question, dict):
                raise ValueError(
                    f"{here}: expected a JSON object. Received: {type(question).__name__}."
                )
            example_id = context.example_id(question, here, count)
            here += f" (id {example_id!r})"
            text = _field(question, "question", here, str)
            choices = tuple(_strings(question, "choice", here))
            label = None
            if context.labelled:
                answer = _field(question, "answer", here, str)
                if answer not in choices:
                    raise ValueError(
                        f"{here}: answer {answer!r} is not among the choices {choices!r}."
                    )
                label = choices.index(answer)
            count += 1
            context.check_unique(example_id, here)
            yield ChoiceExample(example_id, context_text, text, choices, label, source=here)
    context.report["files"].append({"path": name, "sha256": digest, "records": len(document)})


# --- CMRC2018 ---
def _cmrc2018_examples(context):
    """CMRC2018 questions, from the squad-style files or the original layout.

    Squad style (CLUE's download, ``squad-style-data/``): ``{"data":
    [{"paragraphs": [{"context", "qas": [{"id", "question", "answers":
    [{"text", "answer_start"}]}]}]}]}``. The original layout (CMRC2018's
    ``data/`` and CLUE's README): a list (or ``{"data": [...]}``) of
    ``{"context_id", "context_text", "qas": [{"query_id", "query_text",
    "answers": [texts]}]}``.

    Answers are placed by their text, as CLUE's baselines do: a squad
    ``answer_start`` that points at the text is kept; one that is -1 or
    points elsewhere (200 of the official dev's 9,657 answers) is replaced by
    the occurrence of the text nearest to it; original-layout answers take
    the text's first occurrence. An answer whose text is not in the context
    keeps ``answer_start`` None: it is scored (by text) but not trained on.
    """
    document, digest = _read_document(context.path)
    name = context.name
    articles = document.get("data") if isinstance(document, dict) else document
    if not isinstance(articles, list):
        raise ValueError(
            f"{name}: expected a SQuAD-style document {{'data': [{{'paragraphs': [...]}}]}} or "
            "CMRC2018's original layout, a list of {'context_id', 'context_text', 'qas'}. "
            f"Received: {_describe(document)}."
        )
    counts = context.report["counts"]
    counts.update(answers=0, answers_relocated=0, answers_unplaced=0, questions_unplaced=0)
    examples = {"relocated": None, "unplaced": None}
    count = 0
    for a_number, article in enumerate(articles):
        where = f"{name}: data[{a_number}]"
        if not isinstance(article, dict):
            raise ValueError(f"{where}: expected a JSON object. Received: {_describe(article)}.")
        for here, text, qas, squad in _cmrc2018_paragraphs(article, where):
            for q_number, qa in enumerate(qas):
                at = f"{here}.qas[{q_number}]"
                if not isinstance(qa, dict):
                    raise ValueError(f"{at}: expected a JSON object. Received: {_describe(qa)}.")
                id_field, question_field = ("id", "question") if squad else _ORIGINAL_QA
                if id_field not in qa:
                    raise ValueError(f"{at}: missing field {id_field!r}.")
                example_id = context.example_id(qa, at, count, (id_field,))
                at = f"{name}: question {example_id!r}"
                question = _field(qa, question_field, at, str)
                answers = None
                if context.labelled:
                    answers, placements = _cmrc2018_answers(qa, text, at, squad, counts)
                    for kind in placements:
                        if examples.get(kind, example_id) is None:
                            examples[kind] = example_id
                    if all(start is None for _, start in answers):
                        counts["questions_unplaced"] += 1
                count += 1
                context.check_unique(example_id, at)
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
            examples["relocated"],
        )
    if counts["answers_unplaced"]:
        logger.warning(
            "%s: the text of %d of %d answers is not in its context (e.g. in %s): scored, "
            "not trained on; %d questions have no answer in their context.",
            name,
            counts["answers_unplaced"],
            counts["answers"],
            examples["unplaced"],
            counts["questions_unplaced"],
        )
    context.report["files"].append({"path": name, "sha256": digest, "records": count})


_ORIGINAL_QA = ("query_id", "query_text")


def _cmrc2018_paragraphs(article, where):
    """``(where, context, qas, squad style?)`` of an article of either layout."""
    if "paragraphs" in article:
        for p_number, paragraph in enumerate(_field(article, "paragraphs", where, list)):
            here = f"{where}.paragraphs[{p_number}]"
            if not isinstance(paragraph, dict):
                raise ValueError(
                    f"{here}: expected a JSON object. Received: {_describe(paragraph)}."
                )
            yield (
                here,
                _field(paragraph, "context", here, str),
                _field(paragraph, "qas", here, list),
                True,
            )
    elif "context_text" in article:
        yield (
            where,
            _field(article, "context_text", where, str),
            _field(article, "qas", where, list),
            False,
        )
    else:
        raise ValueError(
            f"{where}: expected 'paragraphs' (SQuAD style) or 'context_text' and 'qas' "
            f"(CMRC2018's original layout). Received the fields {sorted(article)[:8]}."
        )


def _cmrc2018_answers(qa, text, where, squad, counts):
    answers = _field(qa, "answers", where, list)
    if not answers:
        raise ValueError(f"{where}: field 'answers' is empty; labelled splits need an answer.")
    spans, placements = [], []
    for number, answer in enumerate(answers):
        here = f"{where}, answer {number}"
        if squad:
            if not isinstance(answer, dict):
                raise ValueError(f"{here}: expected a JSON object. Received: {_describe(answer)}.")
            answer_text = _field(answer, "text", here, str)
            given = _field(answer, "answer_start", here, int, "an int")
        else:
            # The original files hold a few numbers (147.0); the official
            # evaluation reads every answer with str().
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise ValueError(f"{here}: expected an answer text. Received: {_describe(answer)}.")
            answer_text, given = str(answer), None
        if not answer_text.strip():
            raise ValueError(f"{here}: the answer text is empty.")
        start = locate_answer(text, answer_text, given)
        placement = "exact"
        if start is None:
            placement = "unplaced"
        elif given is not None and start != given:
            placement = "relocated"
        counts["answers"] += 1
        if placement != "exact":
            counts[f"answers_{placement}"] += 1
        spans.append((answer_text, start))
        placements.append(placement)
    return tuple(spans), placements


def locate_answer(context, answer, start=None):
    """Where ``answer`` is in ``context``: ``start`` if it points at it, else the
    occurrence nearest to ``start`` (the first when ``start`` is None or < 0).

    Args:
        context: the paragraph.
        answer: the answer text.
        start: the given character offset, or None.

    Returns:
        The character offset of the answer, or None when the text does not
        occur in the context.

    Example:
    >>> locate_answer("俗名龙尖，又名龙尖", "龙尖", 3)  # off by one: the nearest occurrence
    2
    >>> locate_answer("俗名龙尖", "龙鱼", -1) is None
    True
    """
    if start is not None and start >= 0 and context[start : start + len(answer)] == answer:
        return start
    positions = []
    position = context.find(answer)
    while position >= 0:
        positions.append(position)
        position = context.find(answer, position + 1)
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
