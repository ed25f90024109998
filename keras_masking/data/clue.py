"""Readers for CLUE / FewCLUE classification files (one JSON object a line).

Each task maps to its text field(s) and label field, as CLUE's README and
the bert4keras baselines encode them: pairs as (text1, text2); CSL as
(``"；".join(keywords)``, abstract). Labels become contiguous ids in the
order of the task's label list. A malformed line is an error that names the
file and the line.
"""

import dataclasses
import json
import os

TNEWS_LABELS = (100, 101, 102, 103, 104, 106, 107, 108, 109, 110, 112, 113, 114, 115, 116)


@dataclasses.dataclass(frozen=True)
class ClassificationTask:
    """How to read one classification task.

    Attributes:
        name: task folder name.
        first: field of the first text (or ``"keyword"`` for CSL).
        second: field of the second text, or None for single texts.
        labels: the label values in id order.
    """

    name: str
    first: str
    second: str | None
    labels: tuple


TASKS = {
    "tnews": ClassificationTask("tnews", "sentence", None, TNEWS_LABELS),
    "iflytek": ClassificationTask("iflytek", "sentence", None, tuple(range(119))),
    "eprstmt": ClassificationTask("eprstmt", "sentence", None, ("Negative", "Positive")),
    "bustm": ClassificationTask("bustm", "sentence1", "sentence2", ("0", "1")),
    "afqmc": ClassificationTask("afqmc", "sentence1", "sentence2", ("0", "1")),
    "ocnli": ClassificationTask(
        "ocnli", "sentence1", "sentence2", ("entailment", "neutral", "contradiction")
    ),
    "cmnli": ClassificationTask(
        "cmnli", "sentence1", "sentence2", ("entailment", "neutral", "contradiction")
    ),
    "csl": ClassificationTask("csl", "keyword", "abst", ("0", "1")),
}


def read_classification_file(path, task):
    """Reads a CLUE/FewCLUE classification file.

    Args:
        path: a ``.json`` file with one JSON object per line.
        task: a name in `TASKS` or a `ClassificationTask`.

    Returns:
        ``(first_texts, second_texts or None, label_ids)``. NLI examples
        labelled ``"-"`` (no agreement) are skipped, as CLUE does.

    Raises:
        ValueError: a line that is not UTF-8 or not a JSON object, lacks a
            field, has a field of the wrong type, or has an unknown label;
            the message names the file and line. An unknown task name.
    """
    spec = _task_spec(task)
    label_ids = {str(label): index for index, label in enumerate(spec.labels)}
    first, second, labels = [], [], []
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            where = f"{os.fspath(path)}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{where}: not UTF-8 (byte {error.start} of the line). CLUE files are UTF-8."
                ) from error
            if not line.strip():
                continue
            try:
                example = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg}).") from error
            if not isinstance(example, dict):
                raise ValueError(
                    f"{where}: expected a JSON object. Received: {type(example).__name__}."
                )
            label = str(example.get("label"))
            if label == "-":
                continue
            if label not in label_ids:
                raise ValueError(
                    f"{where}: label {example.get('label')!r} is not one of {spec.name}'s labels."
                )
            if spec.first == "keyword":
                keywords = _field(example, "keyword", where, list)
                if not all(isinstance(word, str) for word in keywords):
                    raise ValueError(f"{where}: field 'keyword' must be a list of strings.")
                first.append("；".join(keywords))
            else:
                first.append(_field(example, spec.first, where, str))
            if spec.second:
                second.append(_field(example, spec.second, where, str))
            labels.append(label_ids[label])
    return first, (second if spec.second else None), labels


def _task_spec(task):
    if isinstance(task, ClassificationTask):
        return task
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}. Expected one of {sorted(TASKS)}.")
    return TASKS[task]


def _field(example, name, where, kind):
    if name not in example:
        raise ValueError(f"{where}: missing field {name!r}.")
    value = example[name]
    if not isinstance(value, kind):
        raise ValueError(
            f"{where}: field {name!r} must be a {kind.__name__}. "
            f"Received: {type(value).__name__} {value!r:.40}."
        )
    return value


def load_fewclue(root, task, split="train"):
    """Reads ``{root}/{task}/{split}_few_all.json`` (FewCLUE's pooled splits).

    Args:
        root: the ``fewclue`` folder (e.g. ``../shared/data/fewclue``).
        task: a name in `TASKS`.
        split: ``"train"`` or ``"dev"``.

    Returns:
        As `read_classification_file`.
    """
    return read_classification_file(os.path.join(root, task, f"{split}_few_all.json"), task)
