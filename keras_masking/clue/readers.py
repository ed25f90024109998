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
import logging
import os
import pathlib
import re

from keras_masking.clue.record_readers import SplitReading
from keras_masking.clue.record_readers import iter_examples  # noqa: F401 (public)
from keras_masking.clue.record_readers import read_file
from keras_masking.clue.tasks import CLUE_1_0_TASKS
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
BENCHMARK_NAMES = {"clue": "CLUE", "fewclue": "FewCLUE", None: "CLUE or FewCLUE"}


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
                f"{task.name} is not a {BENCHMARK_NAMES[benchmark]} task. "
                f"It is part of: {', '.join(BENCHMARK_NAMES[b] for b in task.benchmarks)}."
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
            f"; {BENCHMARK_NAMES[kind]} files are in {os.fspath(folder)}" for kind, folder in found
        )
        raise FileNotFoundError(
            f"No {BENCHMARK_NAMES[benchmark]} files of {task.name} found. "
            f"Tried: {', '.join(tried)}{others}."
        )
    if len(matching) > 1:
        raise ValueError(
            f"More than one folder holds {task.name} files: "
            + ", ".join(f"{os.fspath(f)} ({BENCHMARK_NAMES[kind]})" for kind, f in matching)
            + ". Keep one, or pass the task's folder as data_dir"
            + ("." if benchmark else " and benchmark=.")
        )
    kind, folder = matching[0]
    if kind not in task.benchmarks:
        raise ValueError(
            f"{os.fspath(folder)} holds {BENCHMARK_NAMES[kind]} files, but {task.name} is not a "
            f"{BENCHMARK_NAMES[kind]} task."
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
    reading = SplitReading(task, labelled, name.startswith("test"), benchmark, answers)
    examples = [example for path in paths for example in read_file(reading, path)]
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
        BENCHMARK_NAMES[benchmark],
        task.name,
        name,
        len(examples),
        ", ".join(os.fspath(path) for path in paths),
    )
    files, skipped = reading.files, reading.skipped
    return ClueSplit(task, benchmark, name, examples, files, skipped, labelled, task.labels, counts)


def read_labelled_file(path, task, benchmark):
    """Reads a labelled file of a task in its dev split's format: a held-out test set.

    Args:
        path: the file (one file; C3: one ``m-`` or ``d-`` file). CHID keeps
            its labels in a separate answer file and is refused.
        task: a task name (aliases allowed) or `ClueTask`.
        benchmark: ``"clue"`` or ``"fewclue"``, as the task's other splits.

    Returns:
        A labelled `ClueSplit` named ``"test_file"``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: CHID, a bad record (naming the file and line), no
            examples.

    Example:

    >>> import pathlib
    >>> _ = pathlib.Path("held_out.json").write_text(
    ...     '{"id": 1, "sentence": "好吃", "label": "Positive"}\\n', encoding="utf-8")
    >>> split = read_labelled_file("held_out.json", "eprstmt", "fewclue")
    >>> split.split, split.examples
    ('test_file', [TextExample(id=1, text_a='好吃', text_b=None, label='Positive')])
    """
    task = get_task(task)
    if task.name == "chid":
        raise ValueError(
            "A labelled test file for chid is not supported: CHID's labels are in a separate "
            "answer file."
        )
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"Expected a path for the test file. Received: {path!r}.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Test file {os.fspath(path)!r}: no such file.")
    reading = SplitReading(task, True, False, check_benchmark(benchmark), None)
    examples = list(read_file(reading, path))
    if not examples:
        raise ValueError(f"{os.fspath(path)}: no labelled examples.")
    logger.info(
        "Read a labelled test file of %s: %d examples from %s.",
        task.name, len(examples), os.fspath(path),
    )  # fmt: skip
    return ClueSplit(task, reading.benchmark, "test_file", examples, reading.files,
                     reading.skipped, True, task.labels, reading.counts)  # fmt: skip


def check_held_out(test, splits):
    """Refuses a test file that is one of the run's own files; warns of shared examples.

    A test set scores what nothing was chosen or trained on: the run's train
    file or the dev file that chooses the epoch is refused (the same bytes),
    and examples equal to a train or dev example (all but the id) are
    counted in a warning.

    Args:
        test: the test file's `ClueSplit` (`read_labelled_file`).
        splits: the run's splits, ``{"train", "dev", ...}`` (`read_task_splits`).

    Raises:
        ValueError: the test file has the bytes of the train or dev file.

    Example:

    >>> import pathlib
    >>> folder = pathlib.Path("fewclue/eprstmt")
    >>> folder.mkdir(parents=True)
    >>> for name, text in (("train_few_all", "好吃"), ("dev_few_all", "难吃")):
    ...     _ = (folder / f"{name}.json").write_text(
    ...         f'{{"id": 1, "sentence": "{text}", "label": "Positive"}}\\n', encoding="utf-8")
    >>> splits = read_task_splits("fewclue", "eprstmt")
    >>> test = read_labelled_file(folder / "dev_few_all.json", "eprstmt", "fewclue")
    >>> check_held_out(test, splits)
    Traceback (most recent call last):
    ...
    ValueError: Test file ... has the bytes of the dev split's file ...: a test set must be
    held out from training and from the dev that chooses the epoch.
    """
    tested = {entry["sha256"] for entry in test.files}
    path = test.files[0]["path"]
    shared = {}
    for name in ("train", "dev"):
        for entry in splits[name].files:
            if entry["sha256"] in tested:
                raise ValueError(
                    f"Test file {path} has the bytes of the {name} split's file {entry['path']}: "
                    "a test set must be held out from training and from the dev that chooses "
                    "the epoch."
                )
        seen = {dataclasses.replace(example, id=None) for example in splits[name].examples}
        shared[name] = sum(dataclasses.replace(e, id=None) in seen for e in test.examples)
    if any(shared.values()):
        logger.warning(
            "Test file %s: %s of its %d examples equal a train or dev example (all but the id); "
            "its score is not held out for those.",
            path, ", ".join(f"{count} {name}" for name, count in shared.items() if count),
            len(test.examples),
        )  # fmt: skip


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
    optional = ("test", "test_public") if benchmark == "fewclue" else ("test",)
    if benchmark != "fewclue" and get_task(task).name in CLUE_1_0_TASKS:
        optional += ("test1.0",)  # another task's test1.0.json would overwrite its submission
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


def classification_texts(path):
    """The texts a CLUE run reads from one file, as the readers build them.

    For a ``.json`` file in a folder named after a classification task
    (``fewclue/cluewsc/dev_few_all.json``): each example's ``text_a`` and
    ``text_b``, where CLUEWSC marks its spans (``_…_``, ``[…]``) and CSL joins
    its keywords, so a vocabulary pruned to them (`keras-masking convert-e5
    --prune-to`) keeps their pieces. Any other file: ``[]``.

    Args:
        path: a file path.

    Returns:
        A list of str.

    Example:
    >>> classification_texts("corpus/lines.txt")  # not a CLUE task's file
    []
    """
    path = pathlib.Path(path)
    try:
        task = get_task(path.parent.name)
    except ValueError:
        return []
    if path.suffix != ".json" or task.kind != "classification":
        return []
    for labelled in (True, False):  # a test file has no labels
        try:
            examples = list(iter_examples(path, task, labelled=labelled))
        except ValueError:
            continue
        return [text for e in examples for text in (e.text_a, e.text_b) if text]
    return []
