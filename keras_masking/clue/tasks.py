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

from keras_masking.utils.arguments import check_choice

KINDS = ("classification", "multiple_choice", "idiom", "span", "entity")
METRICS = ("accuracy", "cluener", "cmrc2018")
BENCHMARKS = ("clue", "fewclue")

TNEWS_LABELS = tuple(
    str(code)
    for code in (100, 101, 102, 103, 104, 106, 107, 108, 109, 110, 112, 113, 114, 115, 116)
)
IFLYTEK_LABELS = tuple(str(code) for code in range(119))
NLI_LABELS = ("entailment", "neutral", "contradiction")
# FewCLUE CSLDCP's 67 disciplines, in the order of FewCLUE's
# datasets/csldcp/labels_all.txt (class ids follow it). A training file may hold
# only some of them (a subset of train_few_all.json does), so the task's list is
# fixed here rather than read from the data.
# fmt: off
CSLDCP_LABELS = (
    "材料科学与工程", "作物学", "口腔医学", "药学", "教育学", "水利工程", "理论经济学",
    "食品科学与工程", "畜牧学/兽医学", "体育学", "核科学与技术", "力学", "园艺学", "水产", "法学",
    "地质学/地质资源与地质工程", "石油与天然气工程", "农林经济管理", "信息与通信工程",
    "图书馆、情报与档案管理", "政治学", "电气工程", "海洋科学", "民族学", "航空宇航科学与技术",
    "化学/化学工程与技术", "哲学", "公共卫生与预防医学", "艺术学", "农业工程", "船舶与海洋工程",
    "计算机科学与技术", "冶金工程", "交通运输工程", "动力工程及工程热物理", "纺织科学与工程",
    "建筑学", "环境科学与工程", "公共管理", "数学", "物理学", "林学/林业工程", "心理学", "历史学",
    "工商管理", "应用经济学", "中医学/中药学", "天文学", "机械工程", "土木工程", "光学工程",
    "地理学", "农业资源利用", "生物学/生物科学与工程", "兵器科学与技术", "矿业工程", "大气科学",
    "基础医学/临床医学", "电子科学与技术", "测绘科学与技术", "控制科学与工程", "军事学",
    "中国语言文学", "新闻传播学", "社会学", "地球物理学", "植物保护",
)
# fmt: on
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
            in class-id order (csldcp: its 67 disciplines); CLUENER: its 10
            entity types; None where the task has no label set (C3, CHID,
            CMRC2018).
        metric: ``"accuracy"``, ``"cluener"`` (CLUENER2020's official score:
            the mean F1 over the ten types of entity texts) or
            ``"cmrc2018"`` (EM / F1).
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
        check_choice("kind", self.kind, KINDS)
        check_choice("metric", self.metric, METRICS)
        benchmarks = tuple(self.benchmarks)
        if not benchmarks or any(benchmark not in BENCHMARKS for benchmark in benchmarks):
            raise ValueError(
                f"Expected benchmarks, a non-empty subset of {BENCHMARKS}. "
                f"Received: benchmarks={self.benchmarks!r}."
            )
        object.__setattr__(self, "benchmarks", benchmarks)
        if self.labels is not None:
            labels = tuple(self.labels)
            strings = all(isinstance(label, str) for label in labels)
            if not strings or len(set(labels)) != len(labels):
                raise ValueError(
                    f"Expected labels, distinct strings. Received: labels={self.labels!r}."
                )
            object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "defaults", dict(self.defaults))


_TRAINING = {"batch_size": 32, "epochs": 10, "learning_rate": 2e-5, "accumulation": 1}


def _defaults(max_length=128, **changes):
    """The training defaults with ``max_length`` and ``changes``."""
    return {"max_length": max_length, **_TRAINING, **changes}


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
            "cluener", "entity", _CLUE, CLUENER_TYPES, "cluener", _defaults(256, batch_size=16)
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
        ClueTask("csldcp", "classification", _FEW, CSLDCP_LABELS, "accuracy", _defaults()),
    )
}

ALIASES = {
    "wsc": "cluewsc",
    "cluewsc2020": "cluewsc",
    "cluener2020": "cluener",
    "cmrc": "cmrc2018",
}


# The tasks whose CLUE 1.0 test file (test1.0.json) differs from 1.1's, each
# with a 1.0 submission file of its own; the other tasks have one test file.
CLUE_1_0_TASKS = ("tnews", "cluewsc", "c3", "chid")


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
