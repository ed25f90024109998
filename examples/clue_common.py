"""What the CLUE example scripts share: their flags, loading, scoring and saving.

Each ``clue_*.py`` script next to this file fine-tunes one CLUE / FewCLUE
classification task with one method, in plain Keras. The parts that are the
same in every script live here, so each script shows only its method:

* `argument_parser` and `parse_args`: the model flags (``--checkpoint`` and
  ``--model``, or ``--preset``; ``--config``, ``--vocab``), the data flags
  (``--task``, ``--data-dir``, ``--output-dir``) and the training flags
  (``--epochs``, ``--batch-size``, ``--max-length``, ``--learning-rate``,
  ``--seed``), all checked before anything loads: a bad flag exits with
  code 2 and a message naming it;
* `load`: the backbone and its tokenizer, the task's splits and their
  arrays (`keras_masking.clue.read_split`, `encode_examples`);
* `predict_splits` and `save_results`: the dev score (and FewCLUE's
  ``test_public``) with `decode_predictions` and `score`, the test
  submission (`write_submission`), ``model.keras`` and ``results.json`` in
  the output folder.

Run the scripts from anywhere (``python examples/clue_drop_token.py ...``):
Python puts this folder on the import path, so ``import clue_common`` works.
"""

import argparse
import dataclasses
import math
import os
import pathlib

import keras

from keras_masking.clue import ModelSource
from keras_masking.clue import check_max_length
from keras_masking.clue import decode_predictions
from keras_masking.clue import detect_benchmark
from keras_masking.clue import encode_examples
from keras_masking.clue import get_task
from keras_masking.clue import predict_in_batches
from keras_masking.clue import read_task_splits
from keras_masking.clue import score
from keras_masking.clue import task_names
from keras_masking.clue import write_submission
from keras_masking.utils.files import write_json_atomically

# The default --data-dir: $KERAS_MASKING_DATA/fewclue, when that variable is set.
DEFAULT_DATA_DIR = (
    pathlib.Path(os.environ["KERAS_MASKING_DATA"], "fewclue")
    if os.environ.get("KERAS_MASKING_DATA")
    else None
)
MODEL_FAMILIES = ("bert", "roberta", "roformer", "nezha")
CLASSIFICATION_TASKS = tuple(
    name for name in task_names() if get_task(name).kind == "classification"
)


# === Flag types: each refusal names the flag (argparse adds "argument --flag:") ===
def integer_at_least(minimum):
    """An argparse type: an int >= ``minimum``."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}. Received: {text!r}."
            )
        return value

    return parse


def positive_float(text):
    """An argparse type: a finite float > 0."""
    value = _float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number. Received: {text!r}.")
    return value


def non_negative_float(text):
    """An argparse type: a finite float >= 0."""
    value = _float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a number >= 0. Received: {text!r}.")
    return value


def rate(text):
    """An argparse type: a float in [0, 1)."""
    value = _float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a rate in [0, 1). Received: {text!r}.")
    return value


def _float(text):
    try:
        return float(text)
    except ValueError:
        return math.nan


# === Flags ===
def argument_parser(doc, task="tnews", learning_rate=2e-5, tasks=CLASSIFICATION_TASKS):
    """The model, data and training flags every example takes.

    Args:
        doc: the script's docstring (its first line describes the script,
            the rest is shown after the flags).
        task: the default ``--task``.
        learning_rate: the default ``--learning-rate``: the method's, a
            dict ``{task: rate}`` of the method's per task (the entry
            ``None``, if any, for the other tasks), or None for the task's.
        tasks: the task names ``--task`` accepts.

    Returns:
        An `argparse.ArgumentParser`; add the method's flags, then call
        `parse_args`.
    """
    summary, _, guide = doc.partition("\n")
    parser = argparse.ArgumentParser(
        description=summary,
        epilog=guide,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = parser.add_argument_group("model")
    source = model.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint",
        "--tf-checkpoint",
        dest="checkpoint",
        help="Google-layout TF checkpoint: prefix, folder or .index file",
    )
    source.add_argument("--preset", help="preset folder (ours, keras-hub's, Hugging Face BERT)")
    model.add_argument(
        "--model",
        "--family",
        dest="model",
        default="bert",
        choices=MODEL_FAMILIES,
        help="the checkpoint's family (default: bert)",
    )
    model.add_argument("--config", help="bert_config.json (default: next to the checkpoint)")
    model.add_argument("--vocab", help="vocab.txt (default: next to the model, or the preset's)")
    data = parser.add_argument_group("data")
    data.add_argument("--task", default=task, choices=tasks, help=f"default: {task}")
    if DEFAULT_DATA_DIR is not None and DEFAULT_DATA_DIR.is_dir():
        data.add_argument(
            "--data-dir", default=str(DEFAULT_DATA_DIR), help=f"default: {DEFAULT_DATA_DIR}"
        )
    else:
        data.add_argument("--data-dir", required=True, help="the folder with the task's folder")
    data.add_argument(
        "--output-dir", help="a new or empty folder (default: a new one under ./runs)"
    )
    training = parser.add_argument_group("training (default: the task's settings)")
    per_task = learning_rate if isinstance(learning_rate, dict) else {None: learning_rate}
    others = per_task.get(None) or "the task's"
    shown_rate = ", ".join(
        [f"{task} {rate}" for task, rate in per_task.items() if task]
        + [f"other tasks {others}" if len(per_task) > 1 else str(others)]
    )
    training.add_argument("--epochs", type=integer_at_least(1))
    training.add_argument("--batch-size", type=integer_at_least(1))
    training.add_argument(
        "--max-length", "--sequence-length", dest="max_length", type=integer_at_least(8)
    )
    training.add_argument(
        "--learning-rate",
        type=positive_float,
        help=f"peak learning rate (default: {shown_rate})",
    )
    parser.set_defaults(method_learning_rates=per_task)
    training.add_argument("--seed", type=integer_at_least(0), default=0)
    return parser


def parse_args(parser, argv, method, new_output_dir=True):
    """Parses ``argv`` and checks the files the flags name; reads no weights.

    Training settings left out take the task's (``get_task(task).defaults``).

    Args:
        parser: from `argument_parser`, with the method's flags added.
        argv: the arguments (None: ``sys.argv[1:]``).
        method: the method's name, for the default output folder
            (``runs/TASK_METHOD``; None: ``runs/TASK``).
        new_output_dir: whether ``--output-dir`` must be new or empty.

    Returns:
        The `argparse.Namespace`. Problems exit with code 2 (``parser.error``).
    """
    return check_args(parser, parser.parse_args(argv), method, new_output_dir)


def check_args(parser, args, method, new_output_dir=True):
    """`parse_args` after parsing: the task's defaults, then the files' checks."""
    defaults = get_task(args.task).defaults
    if args.learning_rate is None:  # the method's rate (for this task), else the task's
        rates = args.method_learning_rates
        args.learning_rate = rates.get(args.task, rates.get(None))
    for name in ("epochs", "batch_size", "max_length", "learning_rate"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    try:
        model_source(args).check()
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    try:
        detect_benchmark(args.data_dir, args.task)
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"--data-dir {args.data_dir!r}: {error}")
    if args.output_dir is None:
        args.output_dir = new_run_folder(args.task if method is None else f"{args.task}_{method}")
    elif pathlib.Path(args.output_dir).is_file():
        parser.error(f"--output-dir {args.output_dir!r} is a file; expected a folder.")
    elif new_output_dir and not _is_new_or_empty(args.output_dir):
        parser.error(
            f"--output-dir {args.output_dir!r} exists and is not empty; choose a new folder."
        )
    return args


def new_run_folder(name, root="runs"):
    """``runs/NAME``, or ``runs/NAME-2``, ``-3``... when taken."""
    candidate, number = pathlib.Path(root) / name, 1
    while not _is_new_or_empty(candidate):
        number += 1
        candidate = pathlib.Path(root) / f"{name}-{number}"
    return str(candidate)


def _is_new_or_empty(path):
    path = pathlib.Path(path)
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def model_source(args):
    """The `ModelSource` the model flags name."""
    return ModelSource(
        checkpoint=args.checkpoint,
        preset=args.preset,
        model=args.model,
        config=args.config,
        vocabulary=args.vocab,
    )


# === Loading ===
@dataclasses.dataclass
class LoadedRun:
    """The model and data of a run, as `load` returns them.

    Attributes:
        args: the parsed flags.
        backbone: the pretrained `TransformerBackbone`.
        tokenizer: its keras-hub `BertTokenizer`.
        splits: split name -> `ClueSplit`: ``train``, ``dev``, and ``test``
            (unlabelled) / ``test_public`` (FewCLUE, labelled) when present.
        encoded: split name -> `EncodedSplit` (static-shape arrays), or
            empty when `load` was asked not to encode.
    """

    args: argparse.Namespace
    backbone: keras.Model
    tokenizer: object
    splits: dict
    encoded: dict

    @property
    def output_dir(self):
        return pathlib.Path(self.args.output_dir)

    @property
    def task(self):
        return self.splits["train"].task

    @property
    def benchmark(self):
        return self.splits["train"].benchmark

    @property
    def labels(self):
        """The label strings in class order (csldcp's come from its train split)."""
        return self.splits["train"].labels

    @property
    def unselectable_token_ids(self):
        """``(cls_id, sep_id)``: the ids a method leaves alone."""
        return (self.tokenizer.cls_token_id, self.tokenizer.sep_token_id)

    @property
    def total_steps(self):
        """Optimizer steps of the run: epochs x batches per epoch."""
        rows = len(self.splits["train"].examples)
        return self.args.epochs * math.ceil(rows / self.args.batch_size)


def load(args, encode=True):
    """Seeds Keras, loads the model, reads the task's splits and encodes them.

    The output folder is created once all of it has loaded.

    Args:
        args: from `parse_args`.
        encode: False to skip `encode_examples` (a model that tokenizes raw
            strings itself).

    Returns:
        A `LoadedRun`.
    """
    keras.utils.set_random_seed(args.seed)
    backbone, tokenizer = model_source(args).load()
    try:
        check_max_length(backbone, args.max_length)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    splits = read_task_splits(args.data_dir, args.task)
    labels = splits["train"].labels
    encoded = {}
    if encode:
        encoded = {
            name: encode_examples(
                args.task, split.examples, tokenizer, args.max_length, labels=labels
            )
            for name, split in splits.items()
        }
    sizes = ", ".join(f"{name} {len(split.examples)}" for name, split in splits.items())
    print(f"{args.task} ({splits['train'].benchmark}): {sizes}; backend {keras.config.backend()}")
    pathlib.Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    return LoadedRun(args, backbone, tokenizer, splits, encoded)


# === Scoring and saving ===
def predict_splits(model, run):
    """Predictions (id -> label string) of ``model`` on every split but train.

    Every batch is full (the last one padded), so the compiled predict step
    traces once.
    """
    predictions = {}
    for name, encoded in run.encoded.items():
        if name != "train":
            outputs = predict_in_batches(model, encoded.features, run.args.batch_size)
            predictions[name] = decode_predictions(
                run.task, outputs, encoded, run.splits[name].examples
            )
    return predictions


def save_results(run, model, history, predictions=None, **extra):
    """Scores dev (and test_public), writes the submission, the model and results.json.

    Args:
        run: the `LoadedRun`.
        model: the model to predict with and save (``model.keras``).
        history: ``fit(...).history``.
        predictions: split name -> {id: label}; default `predict_splits`.
        **extra: more JSON-ready entries for ``results.json``.

    Returns:
        The results dict written to ``OUTPUT_DIR/results.json``: ``dev``
        (and ``test_public``) scores, the ``submission`` file name (None
        without a test split), the ``history`` and the ``arguments``.
    """
    if predictions is None:
        predictions = predict_splits(model, run)
    output_dir = run.output_dir
    results = {"task": run.task.name, "benchmark": run.benchmark}
    for name in ("dev", "test_public"):
        if name in predictions:
            results[name] = score(run.task, predictions[name], run.splits[name].examples)
    results["submission"] = None
    if "test" in predictions:
        path = write_submission(
            output_dir, run.task, run.benchmark, predictions["test"], run.splits["test"]
        )
        results["submission"] = path.name
    save_model_atomically(model, output_dir / "model.keras")
    results["model"] = "model.keras"
    results["history"] = {
        key: [float(value) for value in values] for key, values in history.items()
    }
    results["arguments"] = vars(run.args)
    results.update(extra)
    write_json_atomically(output_dir / "results.json", results)
    line = f"dev {results['dev']['metric']} {results['dev']['score']:.2f}"
    if "test_public" in results:
        line += f", test_public {results['test_public']['score']:.2f}"
    if results["submission"]:
        line += f"; submission {output_dir / results['submission']}"
    print(f"{line}; wrote {output_dir}")
    return results


def save_model_atomically(model, path):
    """``model.save(path)`` through a temporary file: a finished file or none."""
    path = pathlib.Path(path)
    partial = path.with_name(f".{path.stem}.partial-{os.getpid()}.keras")
    try:
        model.save(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
