"""`finetune`: one CLUE / FewCLUE task from a checkpoint to a submission file.

One ``fit`` whose callbacks (`keras_masking.clue.run_callbacks`) score dev
after every epoch, keep the best weights and the resume state in the run's
folder (`keras_masking.clue.run_folder`); an interrupted run resumes with the
result an uninterrupted run gives.
"""

import dataclasses
import functools
import logging
import math
import os
import pathlib
import platform
import sys

import keras
import numpy as np

from keras_masking.clue.batches import ArrayBatches
from keras_masking.clue.batches import epoch_order
from keras_masking.clue.batches import predict_in_batches
from keras_masking.clue.decoding import decode_predictions
from keras_masking.clue.decoding import score
from keras_masking.clue.encoding import encode_examples
from keras_masking.clue.heads import build_task_model
from keras_masking.clue.heads import task_loss
from keras_masking.clue.model_source import ModelSource
from keras_masking.clue.model_source import check_max_length
from keras_masking.clue.model_source import model_files_sha256
from keras_masking.clue.noise import DEV_NOISE_SEED
from keras_masking.clue.noise import add_character_noise
from keras_masking.clue.optimization import fine_tuning_optimizer
from keras_masking.clue.readers import check_held_out
from keras_masking.clue.readers import detect_benchmark
from keras_masking.clue.readers import read_labelled_file
from keras_masking.clue.readers import read_task_splits
from keras_masking.clue.run_callbacks import BestWeights
from keras_masking.clue.run_callbacks import DevScore
from keras_masking.clue.run_callbacks import MethodEvidence
from keras_masking.clue.run_callbacks import ResumeState
from keras_masking.clue.run_callbacks import RunRecord
from keras_masking.clue.run_callbacks import TrainingFailure
from keras_masking.clue.run_config import RunConfig
from keras_masking.clue.run_folder import RunFolder
from keras_masking.clue.submission import write_submission
from keras_masking.clue.tasks import get_task
from keras_masking.distribution import data_parallel_engine
from keras_masking.distribution import engine_in_scope
from keras_masking.distribution import engine_scope
from keras_masking.distribution import replicas_in_sync
from keras_masking.distribution.replicas import in_tf_distribute_scope
from keras_masking.utils import disable_xla_cpu_fusion_emitters
from keras_masking.utils.arguments import check_int
from keras_masking.utils.files import is_same_or_inside
from keras_masking.version import __version__

logger = logging.getLogger(__name__)

# Rows encoded at a time (a progress bar step); large training files never
# become one tokenisation call.
ENCODE_CHUNK = 4096
# Tokens a kind's encoding needs besides [CLS], [SEP], [PAD], [UNK], [MASK].
TASK_TOKENS = {"idiom": ("[unused1]",)}


@dataclasses.dataclass
class FinetuneResult:
    """What a `finetune` run returns.

    Attributes:
        status: ``"finished"`` or ``"failed"`` (``record["failure"]`` says why).
        history: a dict per finished epoch (``epoch``, ``loss``, ``dev``
            scores, ``seconds``, the methods' evidence).
        best_epoch: the epoch (from 1) whose dev score was best, or None.
        best_score: that dev score (the task's metric, x100), or None.
        model: the task model with the best weights (no ASA adversary).
        submission_path: the test predictions in CLUE's format, or None
            when the data has no unlabelled test split.
        test_public: FewCLUE's labelled test scores, or None.
        record_path: the run record, ``run.json``.
        record: its content.
        tokenizer: the run's tokenizer (the model source's), which encoded
            its data.
    """

    status: str
    history: list
    best_epoch: int | None
    best_score: float | None
    model: object
    submission_path: pathlib.Path | None
    test_public: dict | None
    record_path: pathlib.Path
    record: dict
    tokenizer: object = None


def finetune(task, data_dir, output_dir, run_config=None, *, verbose=1, callbacks=None,
             **options):  # fmt: skip
    """Fine-tunes a CLUE or FewCLUE task and writes its submission file.

    Args:
        task: a task name (``"tnews"``, ``"c3"``, ``"cluener"``...) or `ClueTask`.
        data_dir: the folder with the task's folder (CLUE 1.1 or FewCLUE
            layout, detected from the files).
        output_dir: the run's folder: new or empty, or an earlier run of the
            same arguments (resumed, or returned as it is when finished).
        run_config: a `RunConfig` (the model, training settings, data
            options and methods), or None: the defaults.
        verbose: Keras' progress output: 0 silent, 1 progress bars, 2 a line
            per epoch. The run's own lines (data, methods, each epoch's dev
            score) go to the ``logging`` module at INFO.
        callbacks: extra Keras callbacks for the ``fit``; their logs hold
            ``dev_score`` after each finished epoch.
        **options: `RunConfig` fields and method switches, flat
            (``preset=...``, ``epochs=3``, ``fl_tuning=160``), applied over
            ``run_config``. The settings left None take the task's defaults
            (``get_task(task).defaults``). With ``accumulation`` k, every
            optimizer update averages the gradients of k batches, and every
            epoch ends on an update (its last group completed with the first
            examples of its order): ``ceil(examples / (batch_size * k))``
            updates, which the learning-rate schedule counts (the record's
            ``schedule``). Under `tf.distribute` the steps run without XLA.
            With ``dev_noise`` above 0 every epoch also scores a copy of dev
            with that share of its characters replaced (`add_character_noise`,
            seed 0: the same noised dev for every run); it chooses nothing
            (the best epoch is dev's): its scores are each epoch's
            ``dev_noised`` in the record, its predictions in
            ``dev_noised_predictions/``. A ``test_file`` (a labelled file in
            the task's dev format) is scored the same way and chooses nothing
            either: each epoch's ``test_file`` in the record, its predictions
            in ``test_file_predictions/``. The embedding correction is the
            `keras_masking.callbacks.MLMEmbeddingCorrection` callback of the
            ``fit`` (a resumed run is corrected as it is built). DropToken
            keeps [CLS] and [SEP]; on TensorFlow's CPU backend the run turns
            XLA's CPU fusion emitters off (fast token dropping), which takes
            effect if nothing in the process compiled with XLA before (else
            call `keras_masking.utils.disable_xla_cpu_fusion_emitters` first).

    Returns:
        A `FinetuneResult`. A run whose loss or weights turn non-finite, or
        whose loss diverges (`run_callbacks.TrainingFailure`), stops with
        status ``"failed"``.

    Raises:
        ValueError / FileNotFoundError: bad arguments, files or data, found
            before anything is loaded or written where they can be.

    Example:
    ```python
    result = keras_masking.clue.finetune(
        "tnews", "fewclue", "runs/tnews_fl",
        checkpoint="chinese_L-12_H-768_A-12/bert_model.ckpt",
        fl_tuning=160, learning_rate=5e-3, epochs=30,
    )
    result.best_score, result.submission_path  # dev accuracy (%), tnewsf_predict.json
    ```
    """
    config = RunConfig.from_options(run_config, **options).resolved(task)
    if config.data_parallel:  # before anything is written: resolved checked it
        with engine_scope(data_parallel_engine()):
            single = dataclasses.replace(config, data_parallel=False)
            return finetune(task, data_dir, output_dir, single, verbose=verbose,
                            callbacks=callbacks)  # fmt: skip
    task = get_task(task)
    plan = config.methods
    settings = {**config.training_record(), "stride": task.defaults.get("stride")}
    verbose = check_int("verbose", verbose, 0, 2)
    # TensorFlow cannot XLA-compile a step over mirrored variables (Keras'
    # "auto" turns XLA off under tf.distribute too).
    jit_compile = config.jit_compile and not in_tf_distribute_scope()
    source, files = model_source_of(config, output_dir)
    plan.check_source(source)
    benchmark, _ = detect_benchmark(data_dir, task, config.benchmark)
    few_shot, dev_noise = config.few_shot, config.dev_noise
    arguments = {
        **recorded_data_and_model(task, benchmark, config, data_dir, files),
        **plan.describe(),
        **settings,
        **({"dev_noise": dev_noise} if dev_noise else {}),
        **({"test_file": os.path.abspath(config.test_file)} if config.test_file else {}),
    }
    folder = RunFolder(output_dir)
    earlier = folder.read_record(arguments)
    if earlier is not None:
        folder.check_resumable(earlier)
    splits = read_task_splits(arguments["data_dir"], task, benchmark, few_shot)
    if dev_noise:
        splits["dev_noised"] = _noised_dev(splits, dev_noise)
    if config.test_file:
        splits["test_file"] = read_labelled_file(config.test_file, task, benchmark)
        check_held_out(splits["test_file"], splits)
    data = {name: _split_record(split) for name, split in splits.items()}
    model_files = model_files_sha256(files)
    if earlier is not None:
        _check_same_data(folder, earlier.get("data", {}), data)
        _check_same_model(folder, earlier.get("model", {}).get("files"), model_files)
        if earlier.get("status") != "finished":
            _check_same_setup(folder, earlier, jit_compile)
    logger.info(_data_line(task, benchmark, splits))

    if plan.drop_token:
        # Fast token dropping under TensorFlow's XLA on CPU (no effect elsewhere).
        disable_xla_cpu_fusion_emitters()
    keras.utils.set_random_seed(settings["seed"])
    backbone, tokenizer = source.load(required_tokens=TASK_TOKENS.get(task.kind, ()))
    check_max_length(backbone, settings["max_length"])
    encoded = _encode_splits(task, splits, tokenizer, settings, verbose)
    # A new run corrects the embeddings when its fit begins; a resumed or
    # finished one when built (its saved weights then replace the trained ones).
    resumed = earlier is not None and (
        earlier.get("status") == "finished" or folder.state_path.exists()
    )
    run = _Run(task, benchmark, settings, folder, splits, encoded, verbose, tokenizer)
    applied = _build(run, plan, backbone, tokenizer, resumed, jit_compile)
    record = {
        "keras_masking": __version__,
        "arguments": arguments,
        "versions": _versions(),
        "distribution": _distribution_record(),
        "compile": {"jit_compile": jit_compile, "dtype_policy": keras.config.dtype_policy().name},
        "data": data,
        "model": {
            "backbone": backbone.get_config() | {"name": backbone.name},
            "trainable_parameters": run.evidence.trainable.trainable,
            "total_parameters": run.evidence.trainable.total,
            "embedding_correction": applied.correction,
            "files": model_files,
        },
        "methods": plan.active(),
        "schedule": _schedule_record(len(encoded["train"]), settings),
        "epochs": [],
        "status": "running",
        "best": None,
        "failure": None,
        "seconds": 0.0,
    }
    if earlier is not None and earlier.get("status") == "finished":
        folder.load_best(run.task_model.trainable_variables)
        logger.info("%s: finished earlier; nothing to redo.", os.fspath(folder.path))
        _write_submissions(run, earlier, missing_only=True)
        return _result(earlier, run, folder)
    failure = _train(run, record, earlier if resumed else None, applied.callbacks, callbacks)
    return _finish(run, record, failure)


def model_source_of(config, output_dir):
    """The `ModelSource` of a `RunConfig` and its files (`ModelSource.check`).

    Refuses an ``output_dir`` in the model's preset folder: a run's record
    hashes every file there, so its own files would stop it from resuming.
    """
    source = ModelSource(config.checkpoint, config.preset, config.model, config.config,
                         vocabulary=config.vocab)  # fmt: skip
    files = source.check()
    if os.path.isdir(files["model"]) and is_same_or_inside(output_dir, files["model"]):
        raise ValueError(
            f"The output folder {os.fspath(output_dir)} is the preset {files['model']} or inside "
            "it: the run's files would change the preset, whose files a run's record holds. "
            "Expected a folder outside the preset."
        )
    return source, files


def recorded_data_and_model(task, benchmark, config, data_dir, files):
    """The data and model entries of a run's (or a compare's) recorded arguments."""
    checkpoint = config.checkpoint is not None
    return {
        "task": task.name,
        "benchmark": benchmark,
        "few_shot": config.few_shot,
        "data_dir": os.path.abspath(data_dir),
        "checkpoint": files["model"] if checkpoint else None,
        "preset": files["model"] if config.preset is not None else None,
        "model": config.model if checkpoint else None,
        "config": files["config"],
        "vocab": files["vocabulary"],
    }


# === The run ===
@dataclasses.dataclass
class _Run:
    """What the steps of a run share: its data, folder and models."""

    task: object
    benchmark: str
    settings: dict
    folder: RunFolder
    splits: dict
    encoded: dict
    verbose: int
    tokenizer: object
    task_model: keras.Model = None
    trainer: keras.Model = None
    evidence: MethodEvidence = None

    def predict(self, name):
        """The task model's predictions on split ``name`` (id -> prediction)."""
        encoded, examples = self.encoded[name], self.splits[name].examples
        outputs = predict_in_batches(self.task_model, encoded.features, self.settings["batch_size"])
        return decode_predictions(self.task, outputs, encoded, examples)

    def evaluate(self, name, predictions=None):
        """The task's CLUE metric on split ``name``, of ``predictions`` (default: the model's)."""
        if predictions is None:
            predictions = self.predict(name)
        return score(self.task, predictions, self.splits[name].examples)

    def state_variables(self):
        """Every variable a resumed run needs: the trainer's (seeds included), the optimizer's."""
        optimizer = self.trainer.optimizer
        if not optimizer.built:
            optimizer.build(self.trainer.trainable_variables)
        return list(self.trainer.variables) + list(optimizer.variables)


def _build(run, plan, backbone, tokenizer, correct_now, jit_compile):
    """Applies the methods, builds the task model and compiles the trainer."""
    task, settings, encoded = run.task, run.settings, run.encoded
    head_options = {}
    if task.kind in ("multiple_choice", "idiom"):
        head_options["num_choices"] = encoded["train"].features["token_ids"].shape[1]
    if task.kind == "classification":
        head_options["num_labels"] = len(run.splits["train"].labels)

    def build_head(encoder):
        return build_task_model(task, encoder, max_length=settings["max_length"], **head_options)

    token_ids = [split.features["token_ids"] for split in encoded.values()]
    applied = plan.apply(backbone, task, tokenizer, build_head, seed=settings["seed"],
                         correct_now=correct_now, token_ids=token_ids)  # fmt: skip
    run.task_model, run.trainer = applied.task_model, applied.trainer
    optimizer = fine_tuning_optimizer(
        settings["learning_rate"],
        _schedule_record(len(encoded["train"]), settings)["updates"],
        warmup_proportion=settings["warmup_proportion"],
        weight_decay=settings["weight_decay"],
        accumulation=settings["accumulation"],
    )
    run.trainer.compile(optimizer=optimizer, loss=task_loss(task), jit_compile=jit_compile)
    if run.trainer is not run.task_model:
        run.task_model.compile(jit_compile=jit_compile)  # predicts, never trains
    features, correction = encoded["train"].features, next(iter(applied.callbacks), None)
    run.evidence = MethodEvidence(
        plan, run.task_model, applied.encoder, features, settings["batch_size"], correction
    )
    return applied


def _train(run, record, earlier, first_callbacks, callbacks):
    """Trains the remaining epochs in one ``fit``; returns why it failed, or None."""
    settings, folder = run.settings, run.folder
    variables = run.state_variables()
    start = 0
    if earlier is not None:
        start = folder.load_state(variables)
        record["epochs"] = [dict(entry) for entry in earlier.get("epochs", [])][:start]
        if len(record["epochs"]) != start:
            raise ValueError(
                f"{os.fspath(folder.record_path)}: the record lists {len(record['epochs'])} "
                f"epochs but the resume state holds {start}; the folder is inconsistent."
            )
        record["best"] = earlier.get("best")
        record["seconds"] = float(earlier.get("seconds", 0.0))
        record["initial_loss"] = earlier.get("initial_loss")
        logger.info("Resuming %s after epoch %d.", os.fspath(folder.path), start)
    folder.write_record(record)
    methods = ", ".join(record["methods"]) or "plain fine-tuning"
    logger.info("%s; %s", methods, run.evidence.trainable)
    if start >= settings["epochs"]:
        return None
    train = run.encoded["train"]
    orders = [
        _grouped_order(epoch_order(len(train), settings["seed"], epoch), settings)
        for epoch in range(start, settings["epochs"])
    ]
    batches = ArrayBatches(
        train.features, train.labels, settings["batch_size"], order=np.concatenate(orders)
    )
    failure = TrainingFailure(record)

    def scorer(name):
        predict, score = functools.partial(run.predict, name), functools.partial(run.evaluate, name)
        return DevScore(predict, score, failure, folder, split=name)

    dev = scorer("dev")
    noised = scorer("dev_noised") if "dev_noised" in run.splits else None
    tested = scorer("test_file") if "test_file" in run.splits else None
    best = BestWeights(folder, run.task_model.trainable_variables, best=record["best"])
    run.trainer.fit(
        batches,
        epochs=settings["epochs"],
        initial_epoch=start,
        steps_per_epoch=len(orders[0]) // settings["batch_size"],
        shuffle=False,  # the order is epoch_order's, which a resumed run repeats
        verbose=run.verbose,
        callbacks=[
            *first_callbacks,
            keras.callbacks.TerminateOnNaN(),
            failure,
            run.evidence,
            dev,
            *(score for score in (noised, tested) if score is not None),
            best,
            ResumeState(folder, variables),
            RunRecord(folder, record, dev, best, run.evidence, noised, tested),
            *(callbacks or []),
        ],
    )
    return failure.failure


def _finish(run, record, failure):
    """Writes the submission files and test_public scores of the best weights."""
    folder = run.folder
    if record["best"] is not None:
        folder.load_best(run.task_model.trainable_variables)
        _write_submissions(run, record)
        if "test_public" in run.splits:
            record["test_public"] = run.evaluate("test_public")
    record["status"] = "failed" if failure else "finished"
    record["failure"] = failure
    folder.write_record(record)
    if failure:
        logger.warning("%s: %s", os.fspath(folder.path), failure)
    return _result(record, run, folder)


def _write_submissions(run, record, missing_only=False):
    """The submission files of the loaded weights, named in ``record``; CLUE 1.0's
    test file too, where the data has it, as CLUE's baselines. ``missing_only``:
    a finished run's files that were removed since, written again."""
    for key, name in (("submission", "test"), ("submission_1.0", "test1.0")):
        if name not in run.splits:
            continue
        if missing_only and (not record.get(key) or (run.folder.path / record[key]).exists()):
            continue
        path = write_submission(run.folder.path, run.task, run.benchmark, run.predict(name),
                                run.splits[name])  # fmt: skip
        record[key] = path.name
        if missing_only:
            logger.info("%s: wrote the removed %s again.", os.fspath(run.folder.path), path.name)


def _result(record, run, folder):
    best = record.get("best") or {}
    submission = record.get("submission")
    return FinetuneResult(
        status=record["status"],
        history=record.get("epochs", []),
        best_epoch=best.get("epoch"),
        best_score=best.get("score"),
        model=run.task_model,
        submission_path=None if submission is None else folder.path / submission,
        test_public=record.get("test_public"),
        record_path=folder.record_path,
        record=record,
        tokenizer=run.tokenizer,
    )


# === Settings ===
def _schedule_record(examples, settings):
    """Batches and optimizer updates per epoch (`_grouped_order`'s epochs)."""
    updates = math.ceil(examples / (settings["batch_size"] * settings["accumulation"]))
    return {
        "batches_per_epoch": updates * settings["accumulation"],
        "updates_per_epoch": updates,
        "updates": updates * settings["epochs"],
    }


def _grouped_order(order, settings):
    """An epoch's order cycled up to whole accumulation groups (every epoch ends on an update)."""
    missing = -len(order) % (settings["batch_size"] * settings["accumulation"])
    return np.concatenate([order, np.resize(order, missing)]) if missing else order


# === Data ===
def _split_record(split):
    return {
        "split": split.split,
        "examples": len(split.examples),
        "skipped": split.skipped,
        "labelled": split.labelled,
        "files": split.files,
        "counts": split.counts,
    }


def _noised_dev(splits, rate):
    """Dev with ``rate`` of its characters replaced (`add_character_noise`)."""
    if "dev" not in splits:
        raise ValueError("dev_noise needs a dev split; the data folder has none.")
    dev = splits["dev"]
    examples = add_character_noise(dev.examples, rate, seed=DEV_NOISE_SEED)
    return dataclasses.replace(dev, split="dev_noised", examples=examples)


def _check_same_data(folder, earlier, now):
    """Refuses data other than the run's record: other splits, other files, other bytes."""
    where = os.fspath(folder.path)
    if earlier and set(earlier) != set(now):
        raise ValueError(
            f"The data has the splits {sorted(now)}; the run in {where!r} began with "
            f"{sorted(earlier)}. Resuming would mix two data sets. Use another output folder."
        )
    for name, split in now.items():
        before = {
            entry["path"]: entry["sha256"] for entry in earlier.get(name, {}).get("files", [])
        }
        paths = [entry["path"] for entry in split["files"]]
        if name in earlier and set(paths) != set(before):
            raise ValueError(
                f"{name} is read from {sorted(paths)}; the run in {where!r} read it from "
                f"{sorted(before)}. Resuming would mix two data sets. Use another output folder."
            )
        for entry in split["files"]:
            if before.get(entry["path"], entry["sha256"]) != entry["sha256"]:
                raise ValueError(
                    f"{entry['path']} changed since the run in {os.fspath(folder.path)!r} began "
                    "(its sha256 differs); resuming would mix two data sets. Use another "
                    "output folder."
                )


def _check_same_model(folder, earlier, now):
    """Refuses model files whose bytes differ from the run's record (None: not recorded)."""
    if earlier is None:
        return
    changed = sorted(path for path in set(earlier) | set(now) if earlier.get(path) != now.get(path))
    if changed:
        raise ValueError(
            f"The model files changed since the run in {os.fspath(folder.path)!r} began "
            f"({', '.join(changed)}: another sha256, or missing); a resumed or finished run "
            "reads its frozen weights from them. Use another output folder."
        )


def _check_same_setup(folder, earlier, jit_compile):
    """Refuses to resume under another package version, backend, compile,
    global dtype policy or distribution: the epochs run so far ran under the
    recorded ones."""
    recorded = {
        "keras_masking": earlier.get("keras_masking"),
        "backend": earlier.get("versions", {}).get("backend"),
        "jit_compile": earlier.get("compile", {}).get("jit_compile"),
        "dtype_policy": earlier.get("compile", {}).get("dtype_policy"),
        "distribution": earlier.get("distribution"),
    }
    now = {
        "keras_masking": __version__,
        "backend": keras.config.backend(),
        "jit_compile": jit_compile,
        "dtype_policy": keras.config.dtype_policy().name,
        "distribution": _distribution_record(),
    }
    changed = [f"{name}: {recorded[name]!r} there, {now[name]!r} now" for name in recorded
               if recorded[name] is not None and recorded[name] != now[name]]  # fmt: skip
    if changed:
        raise ValueError(
            f"{os.fspath(folder.path)!r} holds a run begun under another set-up "
            f"({'; '.join(changed)}); its next epochs would not continue those it ran. Resume "
            "it as it began, or use another output folder."
        )


def _data_line(task, benchmark, splits):
    parts = [f"{name} {len(split.examples)}" for name, split in splits.items()]
    skipped = sum(split.skipped for split in splits.values())
    note = f" ({skipped} '-' labels skipped)" if skipped else ""
    return f"{task.name} ({benchmark}): " + ", ".join(parts) + note


def _encode_options(task, splits, settings):
    if task.kind == "classification":
        return {"labels": splits["train"].labels}
    if task.kind == "idiom":
        most = max(
            len(example.candidates) for split in splits.values() for example in split.examples
        )
        return {"num_choices": most}
    if task.kind == "span" and settings["stride"]:
        return {"stride": settings["stride"]}
    if task.kind == "entity":  # every labelled split's targets: dev may hold more than train
        most = max(
            [len(example.entities or ()) for split in splits.values() for example in split.examples]
            + [1]
        )
        return {"max_entities": -(-most // 8) * 8}
    return {}


def _encode_splits(task, splits, tokenizer, settings, verbose):
    """Every split encoded; a large classification split in chunks, with a progress bar."""
    options = _encode_options(task, splits, settings)
    encode = functools.partial(
        encode_examples, task, tokenizer=tokenizer, max_length=settings["max_length"], **options
    )
    encoded = {}
    for name, split in splits.items():
        examples = split.examples
        if task.kind != "classification" or len(examples) <= ENCODE_CHUNK:
            encoded[name] = encode(examples)
            continue
        bar = keras.utils.Progbar(len(examples), verbose=int(verbose == 1), unit_name="example")
        parts = []
        for start in range(0, len(examples), ENCODE_CHUNK):
            chunk = examples[start : start + ENCODE_CHUNK]
            parts.append(encode(chunk))
            bar.add(len(chunk))
        first = parts[0]
        features = {
            key: np.concatenate([part.features[key] for part in parts]) for key in first.features
        }
        labels = None if first.labels is None else np.concatenate([part.labels for part in parts])
        meta = dict(first.meta, example_index=list(range(len(examples))))
        meta["ids"] = [value for part in parts for value in part.meta["ids"]]
        meta["truncated"] = sum(part.meta["truncated"] for part in parts)  # a count
        encoded[name] = type(first)(features, labels, meta)
    return encoded


# === Records ===
def _distribution_record():
    """The data-parallel engine in scope and its replicas."""
    engine = engine_in_scope()
    return {
        "engine": None if engine is None else type(engine).__name__,
        "replicas": replicas_in_sync(engine),
    }


def _versions():
    import keras_hub

    backend = keras.config.backend()
    module = sys.modules.get(backend)
    return {
        "keras_masking": __version__,
        "keras": keras.__version__,
        "keras_hub": keras_hub.__version__,
        "backend": backend,
        "backend_version": getattr(module, "__version__", None),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
