"""The tasks of CLUE 1.1 and FewCLUE: kind, labels, metric, training defaults.

One `ClueTask` per task name; a task that both benchmarks share (``tnews``,
``iflytek``, ``ocnli``, ``csl``, ``cluewsc``, ``chid``) is one entry whose
``benchmarks`` names both. Labels are the strings as they appear in CLUE's
files (FewCLUE's integer tnews / iflytek labels read as the same strings), in
the order that gives each its class id. The training defaults are those of
the bert4keras CLUE baselines (maximum length, batch size, epochs) with the
AdamW learning rate this package fine-tunes with.
"""

import dataclasses

KINDS = ("classification", "multiple_choice", "idiom", "span", "entity")
METRICS = ("accuracy", "entity_f1", "cmrc2018")
BENCHMARKS = ("clue", "fewclue")

TNEWS_LABELS = tuple(
    str(code)
    for code in (100, 101, 102, 103, 104, 106, 107, 108, 109, 110, 112, 113, 114, 115, 116)
)
IFLYTEK_LABELS = tuple(str(code) for code in range(119))
NLI_LABELS = ("entailment", "neutral", "contradiction")
CLUENER_TYPES = (
    "address",
    "book",
    "company",
    "game",
    "government",
    "movie",
    "name",
    "organization",
    "position",
    "scene",
)


@dataclasses.dataclass(frozen=True)
class ClueTask:
    """One CLUE / FewCLUE task: what kind of problem it is and how it is scored.

    Args:
        name: the canonical lowercase name (``"afqmc"``, ``"tnews"``, ...).
        kind: ``"classification"``, ``"multiple_choice"`` (C3), ``"idiom"``
            (CHID), ``"span"`` (CMRC2018) or ``"entity"`` (CLUENER).
        benchmarks: the benchmarks that hold the task, a subset of
            ``("clue", "fewclue")``.
        labels: classification: the label strings as the files spell them,
            in class-id order; CLUENER: its 10 entity types; None where the
            task has no fixed label set (csldcp's disciplines are derived
            from its training split by the reader; C3, CHID, CMRC2018).
        metric: ``"accuracy"``, ``"entity_f1"`` or ``"cmrc2018"`` (EM / F1).
        defaults: training defaults (``max_length``, ``batch_size``,
            ``epochs``, ``learning_rate``, ``accumulation``; ``stride`` for
            CMRC2018). A copy is kept; treat it as read-only.

    Example:

    >>> task = get_task("tnews")
    >>> task.kind, len(task.labels), task.labels[3]
    ('classification', 15, '103')
    >>> task.defaults["max_length"]
    128
    """

    name: str
    kind: str
    benchmarks: tuple
    labels: tuple | None
    metric: str
    defaults: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Expected kind in {KINDS}. Received: kind={self.kind!r}.")
        if self.metric not in METRICS:
            raise ValueError(f"Expected metric in {METRICS}. Received: metric={self.metric!r}.")
        benchmarks = tuple(self.benchmarks)
        if not benchmarks or any(benchmark not in BENCHMARKS for benchmark in benchmarks):
            raise ValueError(
                f"Expected benchmarks, a non-empty subset of {BENCHMARKS}. "
                f"Received: benchmarks={self.benchmarks!r}."
            )
        object.__setattr__(self, "benchmarks", benchmarks)
        if self.labels is not None:
            labels = tuple(self.labels)
            if not all(isinstance(label, str) for label in labels) or len(set(labels)) != len(
                labels
            ):
                raise ValueError(
                    f"Expected labels, distinct strings. Received: labels={self.labels!r}."
                )
            object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "defaults", dict(self.defaults))


def _defaults(
    max_length=128, batch_size=32, epochs=10, learning_rate=2e-5, accumulation=1, **extra
):
    return dict(
        max_length=max_length,
        batch_size=batch_size,
        epochs=epochs,
        learning_rate=learning_rate,
        accumulation=accumulation,
        **extra,
    )


_BOTH = ("clue", "fewclue")
_CLUE = ("clue",)
_FEW = ("fewclue",)

TASKS = {
    task.name: task
    for task in (
        ClueTask("afqmc", "classification", _CLUE, ("0", "1"), "accuracy", _defaults()),
        ClueTask("tnews", "classification", _BOTH, TNEWS_LABELS, "accuracy", _defaults()),
        ClueTask("iflytek", "classification", _BOTH, IFLYTEK_LABELS, "accuracy", _defaults()),
        ClueTask("ocnli", "classification", _BOTH, NLI_LABELS, "accuracy", _defaults()),
        ClueTask("cmnli", "classification", _CLUE, NLI_LABELS, "accuracy", _defaults()),
        ClueTask(
            "cluewsc", "classification", _BOTH, ("true", "false"), "accuracy", _defaults(epochs=30)
        ),
        ClueTask("csl", "classification", _BOTH, ("0", "1"), "accuracy", _defaults()),
        ClueTask(
            "cluener", "entity", _CLUE, CLUENER_TYPES, "entity_f1", _defaults(256, batch_size=16)
        ),
        ClueTask(
            "c3",
            "multiple_choice",
            _CLUE,
            None,
            "accuracy",
            _defaults(512, batch_size=4, epochs=10, accumulation=4),
        ),
        ClueTask("chid", "idiom", _BOTH, None, "accuracy", _defaults(64, batch_size=12, epochs=5)),
        ClueTask(
            "cmrc2018",
            "span",
            _CLUE,
            None,
            "cmrc2018",
            _defaults(512, batch_size=4, epochs=2, learning_rate=3e-5, accumulation=4, stride=128),
        ),
        ClueTask("bustm", "classification", _FEW, ("0", "1"), "accuracy", _defaults()),
        ClueTask(
            "eprstmt", "classification", _FEW, ("Negative", "Positive"), "accuracy", _defaults()
        ),
        ClueTask("csldcp", "classification", _FEW, None, "accuracy", _defaults()),
    )
}

ALIASES = {
    "wsc": "cluewsc",
    "cluewsc2020": "cluewsc",
    "cluener2020": "cluener",
    "cmrc": "cmrc2018",
}


def get_task(name):
    """Returns the `ClueTask` of a task name (case-insensitive, with aliases).

    Args:
        name: a task name (``"afqmc"``, ``"TNEWS"``, ``"wsc"``,
            ``"cluewsc2020"``, ...) or a `ClueTask`, returned as it is.

    Returns:
        The `ClueTask`.

    Raises:
        ValueError: an unknown name; the message lists the known ones.

    Example:

    >>> get_task("CLUEWSC2020").name
    'cluewsc'
    >>> get_task("c3").kind
    'multiple_choice'
    """
    if isinstance(name, ClueTask):
        return name
    if not isinstance(name, str):
        raise ValueError(f"Expected a task name (a string) or a ClueTask. Received: task={name!r}.")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in TASKS:
        raise ValueError(
            f"Unknown task {name!r}. Expected one of {sorted(TASKS)} "
            f"(or an alias: {sorted(ALIASES)})."
        )
    return TASKS[key]


def task_names(benchmark=None):
    """The canonical task names, all or those of one benchmark.

    Args:
        benchmark: None, ``"clue"`` or ``"fewclue"``.

    Returns:
        A tuple of names, in registry order.

    Example:

    >>> task_names("fewclue")
    ('tnews', 'iflytek', 'ocnli', 'cluewsc', 'csl', 'chid', 'bustm', 'eprstmt', 'csldcp')
    """
    if benchmark is None:
        return tuple(TASKS)
    benchmark = check_benchmark(benchmark)
    return tuple(name for name, task in TASKS.items() if benchmark in task.benchmarks)


def check_benchmark(benchmark):
    """Returns ``benchmark`` lowercased, or raises a ValueError naming it.

    Args:
        benchmark: ``"clue"`` or ``"fewclue"`` (any case).

    Returns:
        ``"clue"`` or ``"fewclue"``.

    Example:

    >>> check_benchmark("FewCLUE")
    'fewclue'
    """
    key = benchmark.lower() if isinstance(benchmark, str) else benchmark
    if key not in BENCHMARKS:
        raise ValueError(f"Expected benchmark in {BENCHMARKS}. Received: benchmark={benchmark!r}.")
    return key
