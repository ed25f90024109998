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

Outputs are written to a temporary folder next to OUTPUT and renamed when
complete, so an interrupted run (a full disk, Ctrl-C) leaves no OUTPUT folder;
``convert`` and ``correct-embeddings`` first check that OUTPUT's disk has room
(the model's weights, from the model or the input),
and a temporary folder left by a process that died (a crash inside h5py on a
full disk) is removed by the next write to the same OUTPUT. ``clue`` keeps its
run folder when interrupted (run the same command to resume) and says so.
An OUTPUT that exists and is not empty, or that is the input folder or inside
it, is refused before anything is read. Errors end in one line on stderr:
exit code 2 for a bad command line, 1 for a run that failed.

Example:
```
keras-masking convert chinese_L-12_H-768_A-12/bert_config.json \\
    chinese_L-12_H-768_A-12/bert_model.ckpt ./bert_preset --model bert
keras-masking clue tnews --data-dir fewclue --output-dir runs/tnews \\
    --checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt --drop-token 0.1
keras-masking clue submit runs --team mylab
keras-masking --version
```
"""

import argparse
import errno
import math
import os
import shutil
import sys
import uuid

from keras_masking.version import __version__

PROG = "keras-masking"
FAMILIES = ("bert", "roberta", "roformer", "nezha")


# === Argument types (a bad value is a usage error: exit code 2) ===
def _rate(text):
    """A float in [0, 1] from the command line."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"Expected a number between 0 and 1. Received: {text!r}")
    return value


def _token_id(text):
    """A non-negative integer from the command line (``5.9`` is refused)."""
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"Expected a non-negative integer token id. Received: {text!r}"
        )
    return value


def _token_ids(text):
    """A comma-separated list of non-negative integers (empty: None)."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        return None
    ids = []
    for part in parts:
        try:
            ids.append(_token_id(part))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                "Expected comma-separated non-negative integer token ids, such as '0,100,101'. "
                f"Received: {text!r} (bad entry {part!r})"
            ) from None
    return ids


# === Output folders: checked first, written under a temporary name ===
def _check_output_folder(output, input_folders):
    """Refuses an output that would overwrite files or write into an input.

    Args:
        output: the OUTPUT argument.
        input_folders: the folders the command reads from.

    Returns:
        The absolute output path.
    """
    absolute = os.path.abspath(output)
    if os.path.exists(absolute) and not os.path.isdir(absolute):
        raise ValueError(f"OUTPUT {output!r} is an existing file; expected a new folder.")
    if os.path.isdir(absolute) and os.listdir(absolute):
        raise ValueError(
            f"OUTPUT {output!r} exists and is not empty; writing there would overwrite its "
            "files. Expected a new or empty folder."
        )
    real = os.path.realpath(absolute)
    for folder in input_folders:
        source = os.path.realpath(folder)
        if real == source or real.startswith(source.rstrip(os.sep) + os.sep):
            raise ValueError(
                f"OUTPUT {output!r} is the input folder {folder!r} or inside it; expected a "
                "folder outside the input, which is never modified."
            )
    return absolute


def _write_folder(output, write, needed_bytes=None):
    """Runs ``write(folder)`` on a temporary folder next to ``output``, then
    renames it to ``output``; on any failure the temporary folder is removed.

    Args:
        output: the absolute output folder.
        write: a callable taking the temporary folder.
        needed_bytes: optional estimate of what ``write`` writes: a disk with
            less free space (plus a margin) is refused before anything is
            written.
    """
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    _remove_stale_partials(output)
    if needed_bytes is not None:
        _check_free_space(parent, needed_bytes, output)
    partial = os.path.join(
        parent, f".{os.path.basename(output)}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )
    os.mkdir(partial)
    try:
        write(partial)
        if os.path.isdir(output):
            os.rmdir(output)  # empty (checked before); fails if anything appeared
        os.rename(partial, output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _remove_stale_partials(output):
    """Removes the temporary folders of ``output`` whose process has died.

    A process killed while writing (h5py segfaults when the disk fills up)
    cannot clean up; its ``.NAME.partial-PID-XXXX`` folder goes with the next
    write to the same output.
    """
    parent, name = os.path.split(output)
    prefix = f".{name}.partial-"
    for entry in os.listdir(parent):
        if not entry.startswith(prefix):
            continue
        pid = entry[len(prefix) :].split("-")[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def _process_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


# Free space asked beyond the estimate: HDF5's and the JSON files' overhead.
SPACE_MARGIN = 1.05
SPACE_SLACK = 16 * 2**20


def _check_free_space(folder, needed_bytes, output):
    needed = int(needed_bytes * SPACE_MARGIN) + SPACE_SLACK
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"Not enough free space to write OUTPUT {output!r}: it needs about "
            f"{_megabytes(needed)}, its disk has {_megabytes(free)} free",
        )


def _megabytes(count):
    return f"{count / 2**20:.1f} MiB"


def _weight_bytes(model):
    """The bytes of ``model``'s weights (what its preset's weights file holds)."""
    import numpy as np

    return sum(
        int(np.prod(variable.shape)) * np.dtype(variable.dtype).itemsize
        for variable in model.weights
    )


def _files_bytes(folder):
    """The bytes of the files under ``folder`` (a preset: its copy's size)."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(folder)
        for name in names
    )


def _checkpoint_bytes(prefix):
    """The bytes of a TF checkpoint's model variables (its training state left
    out), from its index; None when the index cannot be read (the reader then
    says why)."""
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


def _checkpoint_prefix(path, argument, expected="a TF checkpoint prefix, folder or .index file"):
    from keras_masking.models.tf_checkpoint import resolve_checkpoint_prefix

    if not os.path.exists(path) and not os.path.exists(str(path) + ".index"):
        raise FileNotFoundError(
            f"{argument} {path!r}: no such file or folder; expected {expected}."
        )
    return resolve_checkpoint_prefix(path)


# === Subcommands ===
def _convert(args):
    from keras_masking.models import from_tf_checkpoint

    if not os.path.isfile(args.config):
        what = "a folder" if os.path.isdir(args.config) else "no such file"
        raise FileNotFoundError(
            f"CONFIG {args.config!r}: {what}; expected a bert_config.json file."
        )
    prefix = _checkpoint_prefix(args.checkpoint, "CHECKPOINT")
    inputs = (os.path.dirname(os.path.abspath(prefix)), os.path.dirname(args.config) or ".")
    output = _check_output_folder(args.output, inputs)
    model = from_tf_checkpoint(
        args.config,
        prefix,
        model=args.model,
        with_mlm=args.with_mlm,
        strict=not args.lenient,
    )
    _write_folder(output, model.save_to_preset, needed_bytes=_weight_bytes(model))
    print(f"Wrote a {type(model).__name__} preset to {args.output}")


def _inspect(args):
    from keras_masking.models import read_tf_checkpoint
    from keras_masking.models.google_checkpoint_layout import is_training_state

    values = read_tf_checkpoint(_checkpoint_prefix(args.checkpoint, "CHECKPOINT"))
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
    from keras_masking.methods.mlm_embedding_correction_files import correct_checkpoint_embeddings
    from keras_masking.methods.mlm_embedding_correction_files import correct_preset_embeddings
    from keras_masking.methods.mlm_embedding_correction_files import is_preset_folder

    settings = dict(
        mask_token_id=args.mask_token_id,
        mask_rate=args.mask_rate,
        mask_token_rate=args.mask_token_rate,
        random_token_rate=args.random_token_rate,
        unselectable_token_ids=args.unselectable_token_ids,
    )
    if is_preset_folder(args.input):
        output = _check_output_folder(args.output, [args.input])
        records = []

        def write(folder):
            records.append(
                correct_preset_embeddings(args.input, folder, args.tied_output, **settings)
            )

        _write_folder(output, write, needed_bytes=_files_bytes(args.input))
        rows = records[0].corrected_rows
    else:
        prefix = _checkpoint_prefix(
            args.input, "INPUT", "a TF checkpoint (prefix, folder or .index) or a preset folder"
        )
        output = _check_output_folder(args.output, [os.path.dirname(os.path.abspath(prefix))])

        def write(folder):
            correct_checkpoint_embeddings(
                prefix,
                folder,
                tied_output=args.tied_output,
                drop_mlm_head=args.drop_mlm_head,
                **settings,
            )

        _write_folder(output, write, needed_bytes=_checkpoint_bytes(prefix))
        rows = "all selectable"
    print(f"Corrected {rows} embedding rows; wrote {args.output}")


def _clue(args):
    from keras_masking import clue

    try:
        result = _finetune(clue.finetune, args)
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


def _finetune(finetune, args):
    return finetune(
        args.task,
        args.data_dir,
        args.output_dir,
        checkpoint=args.checkpoint,
        model=args.model,
        preset=args.preset,
        config=args.config,
        vocab=args.vocab,
        correct_embeddings=args.correct_embeddings,
        drop_token=args.drop_token,
        asa=args.asa,
        fl_tuning=args.fl_tuning,
        prefix_tuning=args.prefix_tuning,
        lora=args.lora,
        exlm_k=args.exlm_k,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        max_length=args.max_length,
        accumulation=args.accumulation,
        warmup_proportion=args.warmup,
        weight_decay=args.weight_decay,
        seed=args.seed,
        benchmark=args.benchmark,
        few_shot=args.few_shot,
        verbose=0 if args.quiet else 1,
        data_parallel=args.data_parallel,
    )


def _clue_submit(args):
    from keras_masking.clue.submit import submit

    zip_path, files = submit(args.runs_dir, team=args.team, date=args.date, output=args.output)
    print(f"Checked {len(files)} submission files; wrote {zip_path}")


def _demo(argv):
    from keras_masking.demo import main as demo_main

    demo_main(argv)


# === Errors ===
def _is_expected_error(error):
    """Bad files and values, missing extras (not bugs): one line, exit code 1."""
    if isinstance(error, (ValueError, OSError, ImportError)):
        return True
    # TensorFlow's reader errors (a truncated or corrupt checkpoint file).
    return any(
        cls.__name__ == "OpError" and cls.__module__.startswith("tensorflow")
        for cls in type(error).__mro__
    )


def _one_line(error):
    message = str(error) or type(error).__name__
    return " ".join(message.split())


def _run(command, function, *arguments):
    try:
        function(*arguments)
    except KeyboardInterrupt:
        print(f"{PROG} {command}: interrupted; no output was written.", file=sys.stderr)
        return 130
    except SystemExit as exit_request:  # argparse inside the demo
        return _exit_code(exit_request)
    except Exception as error:
        if not _is_expected_error(error):
            raise
        print(f"{PROG} {command}: error: {_one_line(error)}", file=sys.stderr)
        return 1
    return 0


def _exit_code(exit_request):
    code = exit_request.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def build_parser():
    """The ``keras-masking`` argument parser.

    Returns:
        An `argparse.ArgumentParser` with the subcommands.

    Example:
    ```python
    args = build_parser().parse_args(["inspect", "bert_model.ckpt"])
    args.command  # "inspect"
    ```
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
    correct.add_argument("--mask-token-id", type=_token_id, required=True)
    correct.add_argument("--mask-rate", type=_rate, default=0.15)
    correct.add_argument("--mask-token-rate", type=_rate, default=0.8)
    correct.add_argument("--random-token-rate", type=_rate, default=0.1)
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
    _add_clue_parser(commands)
    return parser


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"Expected a positive integer. Received: {text!r}")
    return value


def _count(text):
    """An integer >= 0 (a method's size; 0 leaves it off)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"Expected an integer >= 0. Received: {text!r}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"Expected a positive number. Received: {text!r}")
    return value


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"Expected a number >= 0. Received: {text!r}")
    return value


def _drop_rate(text):
    value = _rate(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"Expected a rate in [0, 1). Received: {text!r}")
    return value


def _few_shot(text):
    if text == "all":
        return text
    if text in ("0", "1", "2", "3", "4"):
        return int(text)
    raise argparse.ArgumentTypeError(f"Expected 'all' or 0..4. Received: {text!r}")


def _add_clue_parser(commands):
    clue = commands.add_parser(
        "clue",
        help="fine-tune a CLUE / FewCLUE task and write its submission file",
        description="Fine-tune a CLUE 1.1 or FewCLUE task; 'keras-masking clue submit RUNS_DIR' "
        "checks the submission files and builds CLUE's zip.",
    )
    clue.add_argument(
        "task",
        metavar="TASK",
        help="afqmc, tnews, iflytek, ocnli, cmnli, cluewsc, "
        "csl, cluener, c3, chid, cmrc2018, bustm, eprstmt, csldcp",
    )
    clue.add_argument("--data-dir", required=True, help="folder with the task's folder")
    clue.add_argument("--output-dir", required=True, help="the run's folder (resumed if it exists)")
    source = clue.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="Google-layout TF checkpoint (prefix or folder)")
    source.add_argument("--preset", help="preset folder (ours, keras-hub's, Hugging Face BERT)")
    clue.add_argument("--model", default="bert", choices=FAMILIES, help="the checkpoint's family")
    clue.add_argument("--config", help="bert_config.json (default: next to the checkpoint)")
    clue.add_argument("--vocab", help="vocab.txt (default: next to the model)")
    methods = clue.add_argument_group("methods")
    methods.add_argument("--correct-embeddings", action="store_true")
    methods.add_argument("--drop-token", type=_drop_rate, default=0.0, metavar="RATE")
    methods.add_argument("--asa", type=_non_negative_float, default=None, metavar="TAU")
    tuning = methods.add_mutually_exclusive_group()
    tuning.add_argument("--fl-tuning", type=_count, default=0, metavar="UNITS")
    tuning.add_argument("--prefix-tuning", type=_count, default=0, metavar="LENGTH")
    tuning.add_argument("--lora", type=_count, default=0, metavar="RANK")
    methods.add_argument("--exlm-k", type=_count, default=0, metavar="K")
    training = clue.add_argument_group("training (default: the task's)")
    training.add_argument("--epochs", type=_positive_int)
    training.add_argument("--batch-size", type=_positive_int)
    training.add_argument("--lr", type=_positive_float, help="peak learning rate")
    training.add_argument("--max-length", type=_positive_int)
    training.add_argument("--accumulation", type=_positive_int, help="batches per optimizer step")
    training.add_argument("--warmup", type=_drop_rate, default=0.1, help="warmup share of steps")
    training.add_argument("--weight-decay", type=_non_negative_float, default=0.01)
    training.add_argument("--seed", type=_count, default=0)
    training.add_argument("--benchmark", choices=("clue", "fewclue"), help="default: detected")
    training.add_argument("--few-shot", type=_few_shot, default="all", help="all or 0..4")
    training.add_argument(
        "--data-parallel",
        action="store_true",
        help="train on every device with the backend's data-parallel engine",
    )
    clue.add_argument("--quiet", action="store_true", help="no progress bars")


def _date(text):
    from keras_masking.clue.submit import check_date

    try:
        return check_date(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_submit_parser():
    """The ``keras-masking clue submit`` argument parser."""
    parser = argparse.ArgumentParser(
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
            None.

    Returns:
        The exit code: 0 on success, 2 for a bad command line, 1 when the run
        failed on a bad file or value (with one line on stderr saying why).

    Example:
    ```python
    main(["--version"])  # prints "keras-masking 0.3.0", returns 0
    ```
    """
    argv = sys.argv[1:] if argv is None else [str(argument) for argument in argv]
    if argv[:1] == ["demo"]:
        return _run("demo", _demo, argv[1:])
    if argv[:2] == ["clue", "submit"]:
        try:
            args = build_submit_parser().parse_args(argv[2:])
        except SystemExit as exit_request:
            return _exit_code(exit_request)
        return _run("clue submit", _clue_submit, args)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:
        return _exit_code(exit_request)
    handlers = {
        "convert": _convert,
        "inspect": _inspect,
        "correct-embeddings": _correct_embeddings,
        "clue": _clue,
    }
    return _run(args.command, handlers[args.command], args)


if __name__ == "__main__":
    sys.exit(main())
