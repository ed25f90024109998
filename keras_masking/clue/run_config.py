"""`RunConfig`: one fine-tuning run's settings, in one place.

The model to start from, the training settings, the data options and the
methods of a `finetune` run. `finetune`, `compare`, the ``keras-masking clue``
and ``compare`` commands (whose flags are generated from these fields) and
the demo all build one; each value is checked here, once, when it is built.
"""

import dataclasses
import os

import keras

from keras_masking.clue.method_plan import FLAGS as METHOD_FLAGS
from keras_masking.clue.method_plan import MethodPlan
from keras_masking.clue.model_source import FAMILIES
from keras_masking.clue.noise import check_noise_rate
from keras_masking.clue.tasks import get_task
from keras_masking.distribution import data_parallel_engine
from keras_masking.distribution import replicas_in_sync
from keras_masking.utils.arguments import MAX_SEED
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

# The settings that default to the task's (`ClueTask.defaults`).
TASK_SETTINGS = ("epochs", "batch_size", "learning_rate", "max_length", "accumulation")
# The commands a setting is a flag of.
BOTH = ("clue", "compare")


def _setting(default, flag, help, group="training", kind=None, commands=BOTH, metavar=None):
    """A `RunConfig` field: its default and how the command line spells it."""
    metadata = {"flag": flag, "help": help, "group": group, "kind": kind,
                "commands": commands, "metavar": metavar}  # fmt: skip
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One fine-tuning run's settings: the model, training, data and methods.

    Args:
        checkpoint: a Google-layout TF checkpoint (prefix, folder or
            ``.index``); or
        preset: a preset folder (this package's, keras-hub's, Hugging Face).
        model: the checkpoint's family: ``"bert"``, ``"roberta"``
            (RoBERTa-wwm), ``"roformer"`` or ``"nezha"``.
        config: ``bert_config.json`` (default: next to the checkpoint).
        vocab: ``vocab.txt`` (default: next to the model, or the preset's).
        epochs, batch_size, learning_rate, max_length, accumulation: the
            training settings; None takes the task's defaults (`resolved`).
        warmup_proportion: float in [0, 1), the share of the steps with a
            rising learning rate.
        weight_decay: float >= 0, AdamW's decay (biases and LayerNorm excluded).
        seed: int >= 0; the same seed gives the same run.
        jit_compile: True (XLA, one compile per run) or False (no XLA).
        data_parallel: True: train on every device with the backend's
            data-parallel engine (``batch_size`` stays the global batch).
        benchmark: None (detect), ``"clue"`` or ``"fewclue"``.
        few_shot: FewCLUE's ``"all"`` (``*_few_all``) or a split index 0..4.
        dev_noise: float in [0, 1]; above 0, every epoch also scores dev with
            that share of its characters replaced.
        test_file: a labelled file in the task's dev format (a held-out test
            set, `read_labelled_file`), scored at every epoch; it chooses
            nothing. None: no such file.
        methods: a `MethodPlan` (or a dict of its switches).

    Raises:
        ValueError: a value out of range or of the wrong type, naming it.

    Example:
    >>> config = RunConfig.from_options(preset="my_preset", epochs=3, fl_tuning=160)
    >>> config.epochs, config.methods.fl_tuning
    (3, 160)
    >>> config.resolved("tnews").batch_size  # the task's default
    32
    >>> RunConfig(epochs=0)
    Traceback (most recent call last):
    ...
    ValueError: Expected an integer >= 1 for epochs. Received: epochs=0.
    """

    # === The model ===
    checkpoint: str | None = _setting(
        None, "--checkpoint", "Google-layout TF checkpoint (prefix or folder)", "model"
    )
    preset: str | None = _setting(
        None, "--preset", "preset folder (ours, keras-hub's, Hugging Face BERT)", "model"
    )
    model: str = _setting("bert", "--model", "the checkpoint's family", "model", kind=FAMILIES)
    config: str | None = _setting(
        None, "--config", "bert_config.json (default: next to the checkpoint)", "model"
    )
    vocab: str | None = _setting(None, "--vocab", "vocab.txt (default: next to the model)", "model")
    # === Training (None: the task's) ===
    epochs: int | None = _setting(None, "--epochs", None, kind=int)
    batch_size: int | None = _setting(None, "--batch-size", None, kind=int)
    learning_rate: float | None = _setting(
        None, "--learning-rate", "peak learning rate", kind=float
    )
    max_length: int | None = _setting(None, "--max-length", None, kind=int)
    accumulation: int | None = _setting(
        None, "--accumulation", "batches whose gradients average into one update", kind=int
    )
    warmup_proportion: float = _setting(0.1, "--warmup", "warmup share", kind=float)
    weight_decay: float = _setting(0.01, "--weight-decay", None, kind=float)
    seed: int = _setting(0, "--seed", None, kind=int, commands=("clue",))
    jit_compile: bool = _setting(
        True, "--no-jit-compile", "no XLA: a faster start for tiny models", kind=bool
    )
    data_parallel: bool = _setting(
        False, "--data-parallel", "train on every device with the backend's data-parallel engine",
        kind=bool,
    )  # fmt: skip
    # === Data ===
    benchmark: str | None = _setting(
        None, "--benchmark", "default: detected", "data", kind=("clue", "fewclue")
    )
    few_shot: str | int = _setting("all", "--few-shot", "all or 0..4", "data", kind="few_shot")
    dev_noise: float = _setting(
        0.0, "--dev-noise", "also score dev with this share of its characters replaced (0.1: "
        "10%%), a robustness check (text and sentence-pair tasks)", "data", kind=float,
        metavar="SHARE",
    )  # fmt: skip
    test_file: str | None = _setting(
        None, "--test", "a labelled file in the task's dev format, scored at every epoch and "
        "never used to choose one (compare: at the epoch dev's half A chose)", "data",
        metavar="FILE",
    )  # fmt: skip
    # === Methods ===
    methods: MethodPlan = dataclasses.field(default_factory=MethodPlan)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            object.__setattr__(self, field.name, check_setting(field.name, value))
        if self.preset is not None and (self.config is not None or self.model != "bert"):
            raise ValueError(
                "model and config describe a checkpoint (--checkpoint); a preset carries its "
                f"own. Received: preset={self.preset!r} with model={self.model!r}, "
                f"config={self.config!r}."
            )

    # === Building ===
    @classmethod
    def from_options(cls, run_config=None, **options):
        """A config from keywords: settings and method switches, flat.

        Args:
            run_config: a `RunConfig` the options change, or None (defaults).
            **options: `RunConfig` fields and `MethodPlan` switches
                (``fl_tuning=160``, ``drop_token=0.1``...); switches given
                with ``methods`` add to it.

        Returns:
            A `RunConfig`.

        Raises:
            TypeError: a keyword that is neither, naming the known ones.
            ValueError: a switch given in ``methods`` and as a keyword with
                another value.
        """
        base = cls() if run_config is None else run_config
        if not isinstance(base, cls):
            raise TypeError(
                f"Expected a RunConfig for run_config. Received: {type(base).__name__}."
            )
        switches = {name: options.pop(name) for name in list(options) if name in METHOD_FLAGS}
        unknown = sorted(set(options) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(
                f"Unknown run settings {unknown}. Expected RunConfig fields "
                f"({', '.join(field.name for field in dataclasses.fields(cls))}) or method "
                f"switches ({', '.join(METHOD_FLAGS)})."
            )
        if switches:
            given = "methods" in options
            methods = check_setting("methods", options.get("methods", base.methods))
            clashes = [
                name
                for name, value in switches.items()
                if given and getattr(methods, name) not in (getattr(MethodPlan(), name), value)
            ]
            if clashes:
                raise ValueError(
                    f"The method switches {clashes} are set twice, in methods and as keywords, "
                    f"to other values: methods has "
                    f"{ {name: getattr(methods, name) for name in clashes} }, the keywords "
                    f"{ {name: switches[name] for name in clashes} }."
                )
            options["methods"] = dataclasses.replace(methods, **switches)
        return dataclasses.replace(base, **options)

    @classmethod
    def from_record(cls, arguments):
        """The config a run recorded in its ``run.json`` (its ``arguments``)."""
        names = {field.name for field in dataclasses.fields(cls)} - {"methods", "jit_compile"}
        options = {name: arguments[name] for name in names if name in arguments}
        if arguments.get("checkpoint") is None:
            options["model"] = "bert"
        switches = {name: arguments[name] for name in METHOD_FLAGS if name in arguments}
        return cls.from_options(**options, **switches)

    def resolved(self, task):
        """This config for ``task``: the task's defaults filled in, the task's rules checked.

        Args:
            task: a `ClueTask` or task name.

        Returns:
            A `RunConfig` without None training settings.

        Raises:
            ValueError: methods that do not combine or do not apply to the
                task, noise for a task that is not text classification,
                accumulation in a TensorFlow data-parallel run.
        """
        task = get_task(task)
        self.methods.check(task)
        check_noise_rate("dev_noise", self.dev_noise, task)
        filled = {
            name: task.defaults[name] for name in TASK_SETTINGS if getattr(self, name) is None
        }
        resolved = dataclasses.replace(self, **filled)
        # The replicas split every global batch; an uneven split is another step.
        replicas = replicas_in_sync(data_parallel_engine() if resolved.data_parallel else None)
        if resolved.batch_size % replicas:
            raise ValueError(
                f"Expected a batch_size that the {replicas} data-parallel replicas divide (each "
                f"takes an equal share of every global batch). Received: batch_size="
                f"{resolved.batch_size} for task {task.name!r}."
            )
        if resolved.data_parallel and keras.backend.backend() == "tensorflow":
            if resolved.accumulation > 1:
                raise ValueError(
                    f"accumulation={resolved.accumulation} cannot run data parallel on "
                    "TensorFlow (Keras' gradient accumulation fails inside a tf.distribute "
                    f"step). Pass accumulation=1 with a batch_size {resolved.accumulation} "
                    "times larger: the replicas share the global batch."
                )
        return resolved

    def training_record(self):
        """The training settings as a JSON-ready dict (`run.json`'s names)."""
        names = (*TASK_SETTINGS, "warmup_proportion", "weight_decay", "seed")
        return {name: getattr(self, name) for name in names}


def check_setting(name, value):
    """``value`` for the `RunConfig` field ``name``, checked (a clear error when bad)."""
    if name == "methods":
        if isinstance(value, dict):
            return MethodPlan(**value)
        if not isinstance(value, MethodPlan):
            raise ValueError(
                f"Expected a MethodPlan or a dict of switches for methods. Received: {value!r}."
            )
        return value
    if name in ("checkpoint", "preset", "config", "vocab", "test_file"):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"Expected a path for {name}. Received: {value!r}.")
        return None if value is None else os.fspath(value)
    if value is None and name in (*TASK_SETTINGS, "benchmark"):
        return None
    if name in ("model", "benchmark"):
        choices = FAMILIES if name == "model" else ("clue", "fewclue")
        if value not in choices:
            raise ValueError(f"Expected {name} in {list(choices)}. Received: {name}={value!r}.")
        return value
    if name == "few_shot":
        return value if value == "all" else check_int("few_shot", value, 0, 4)
    if name in ("epochs", "batch_size", "accumulation"):
        return check_int(name, value, minimum=1)
    if name == "max_length":
        return check_int(name, value, minimum=8)
    if name == "learning_rate":
        return check_float(name, value, minimum=0.0, open_minimum=True)
    if name == "warmup_proportion":
        return check_float(name, value, 0.0, 1.0, open_maximum=True)
    if name == "weight_decay":
        return check_float(name, value, minimum=0.0)
    if name == "seed":
        return check_int(name, value, minimum=0, maximum=MAX_SEED)
    if name == "dev_noise":
        return check_float(name, value, 0.0, 1.0)
    return check_bool(name, value)  # jit_compile, data_parallel
