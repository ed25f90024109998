"""`finetune`: one CLUE / FewCLUE task from a checkpoint to a submission file.

The run reads the task's splits, loads the encoder, applies the chosen
methods, trains with AdamW (linear warmup and decay, no weight decay on
biases and LayerNorm, gradient accumulation where the task needs it),
scores dev after every epoch with the task's CLUE metric, keeps the best
weights, writes the test predictions as CLUE's submission file and scores
FewCLUE's labelled ``test_public``. Everything lands in one folder
(`keras_masking.clue.run_folder`), and an interrupted run resumes from its
last finished epoch with the result an uninterrupted run gives.
"""

import dataclasses
import logging
import math
import os
import pathlib
import platform
import sys
import time

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
from keras_masking.clue.method_evidence import MethodEvidence
from keras_masking.clue.method_plan import MethodPlan
from keras_masking.clue.model_source import ModelSource
from keras_masking.clue.model_source import check_max_length
from keras_masking.clue.optimization import fine_tuning_optimizer
from keras_masking.clue.readers import detect_benchmark
from keras_masking.clue.readers import read_task_splits
from keras_masking.clue.run_folder import RunFolder
from keras_masking.clue.submission import write_submission
from keras_masking.clue.tasks import get_task
from keras_masking.distribution.engines import data_parallel_engine
from keras_masking.distribution.engines import engine_in_scope
from keras_masking.distribution.engines import engine_scope
from keras_masking.distribution.engines import replicas_in_sync
from keras_masking.distribution.replicas import in_tf_distribute_scope
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.eager_checks import non_finite_variables
from keras_masking.utils.xla_cpu import disable_xla_cpu_fusion_emitters
from keras_masking.version import __version__

logger = logging.getLogger(__name__)

# Rows encoded at a time (a progress bar step); large training files never
# become one tokenisation call.
ENCODE_CHUNK = 4096
# Tokens a kind's encoding needs besides [CLS], [SEP], [PAD], [UNK], [MASK].
TASK_TOKENS = {"idiom": ("[unused1]",)}
# An epoch whose mean training loss exceeds this many times the untrained
# model's (the first batch's loss, at least 1) has diverged: the run fails.
DIVERGENCE_FACTOR = 10.0


@dataclasses.dataclass
class FinetuneResult:
    """What a `finetune` run returns.

    Attributes:
        status: ``"finished"`` or ``"failed"`` (NaN loss: training stopped,
            the best weights were kept, ``record["failure"]`` says why).
        history: a dict per finished epoch (``epoch``, ``loss``, ``dev``
            scores, ``seconds``, the methods' evidence).
        best_epoch: the epoch (from 1) whose dev score was best, or None.
        best_score: that dev score (the task's metric, x100), or None.
        model: the task model with the best weights (the clean model: no
            ASA adversary).
        submission_path: the test predictions in CLUE's format, or None
            when the data has no unlabelled test split.
        test_public: FewCLUE's labelled test scores, or None.
        record_path: the run record, ``run.json``.
        record: its content.
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


def finetune(
    task,
    data_dir,
    output_dir,
    *,
    checkpoint=None,
    model="bert",
    preset=None,
    config=None,
    vocab=None,
    correct_embeddings=False,
    drop_token=0.0,
    asa=None,
    fl_tuning=0,
    prefix_tuning=0,
    lora=0,
    exlm_k=0,
    epochs=None,
    batch_size=None,
    learning_rate=None,
    max_length=None,
    accumulation=None,
    warmup_proportion=0.1,
    weight_decay=0.01,
    seed=0,
    benchmark=None,
    few_shot="all",
    verbose=1,
    callbacks=None,
    jit_compile=True,
    data_parallel=False,
):
    """Fine-tunes a CLUE or FewCLUE task and writes its submission file.

    Args:
        task: a task name (``"tnews"``, ``"afqmc"``, ``"c3"``, ``"chid"``,
            ``"cmrc2018"``, ``"cluener"``, ``"eprstmt"``...) or `ClueTask`.
        data_dir: the folder with the task's folder (CLUE 1.1 or FewCLUE
            layout, detected from the files).
        output_dir: the run's folder: new or empty, or an earlier run of the
            same arguments (resumed, or returned as it is when finished).
        checkpoint: a Google-layout TF checkpoint (prefix, folder or
            ``.index``); or
        preset: a preset folder (this package's, keras-hub's, Hugging Face).
        model: the checkpoint's family: ``"bert"``, ``"roberta"``
            (RoBERTa-wwm), ``"roformer"`` or ``"nezha"``.
        config: ``bert_config.json`` (default: next to the checkpoint).
        vocab: ``vocab.txt`` (default: next to the model, or the preset's).
        correct_embeddings: MLM embedding correction, by the one-line
            `keras_masking.callbacks.MLMEmbeddingCorrection` callback in the
            first epoch's ``fit`` (a resumed run is corrected as it is built,
            before its saved weights are restored).
        drop_token: DropToken's rate in [0, 1) ([CLS] and [SEP] kept). On
            TensorFlow's CPU backend its steps are fast only with XLA's CPU
            fusion emitters off: the run turns them off, which takes effect
            if nothing in the process compiled with XLA before (else call
            `keras_masking.utils.disable_xla_cpu_fusion_emitters` first).
        asa: ASA's tau (None: off).
        fl_tuning: FL-tuning's addFFN units (0: off).
        prefix_tuning: P-tuning v2's prefix length (0: off).
        lora: LoRA's rank on the query and value projections (0: off).
        exlm_k: fine-tune an ExLM-pretrained (``rotary2d``) backbone through
            its expanding encoder with ``k`` states (0: off).
        epochs, batch_size, learning_rate, max_length, accumulation: the
            training settings; None takes the task's defaults
            (``get_task(task).defaults``). With ``accumulation`` k, every
            optimizer update averages the gradients of k batches, and an
            update never spans two epochs: an epoch whose batch count is not
            a multiple of k (or is below k) has its last group completed with
            the first examples of its order, as its last batch is, so every
            epoch ends on an update (``ceil(examples / (batch_size * k))``
            updates). The learning-rate schedule counts updates. The record's
            ``schedule`` gives the batches and updates per epoch.
        warmup_proportion: share of the steps with a rising learning rate.
        weight_decay: AdamW's decay (biases and LayerNorm excluded).
        seed: int >= 0; the same seed gives the same run.
        benchmark: None (detect), ``"clue"`` or ``"fewclue"``.
        few_shot: FewCLUE's ``"all"`` (``*_few_all``) or a split index 0..4.
        verbose: 0 silent, 1 progress bars and a line per epoch, 2 a line per
            epoch only.
        callbacks: extra Keras callbacks for every epoch's ``fit``.
        jit_compile: True (XLA, one compile per run) or False (no XLA:
            TensorFlow's graph mode, JAX's op-by-op execution; a faster start
            for tiny models). On JAX results agree to float rounding. On
            TensorFlow, XLA and graph mode draw different random numbers
            from the same seed (TensorFlow's stateless generators pick
            another algorithm under XLA), so runs with random draws
            (dropout, DropToken, ASA's noise) differ between the two, each
            reproducible; the record's ``compile`` says which ran. Under a
            `tf.distribute` strategy the steps are compiled without XLA
            whatever it says (TensorFlow cannot XLA-compile a step over
            mirrored variables).
        data_parallel: True: build and train under the backend's own
            data-parallel engine over every device (`keras.distribution`'s
            DataParallel on JAX; `tf.distribute`'s MirroredStrategy on
            TensorFlow, MultiWorkerMirroredStrategy when ``TF_CONFIG`` is
            set): see `keras_masking.distribution.data_parallel_engine`.
            ``batch_size`` stays the global batch. A run also trains under an
            engine whose scope the caller entered. The record's
            ``distribution`` says which engine and how many replicas ran.

    Returns:
        A `FinetuneResult`. A run whose training loss turns non-finite, or
        diverges (an epoch's mean loss above ``DIVERGENCE_FACTOR`` times the
        untrained model's loss on the first batch, at least 1), or whose
        weights turn non-finite, stops: its status is ``"failed"`` and
        ``record["failure"]`` says why (`keras-masking clue` exits with 1).

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
    if not isinstance(data_parallel, bool):
        raise ValueError(
            f"Expected data_parallel to be True or False. Received: {data_parallel!r}."
        )
    if data_parallel:
        options = dict(locals(), data_parallel=False)
        with engine_scope(data_parallel_engine()):
            return finetune(**options)
    task = get_task(task)
    plan = MethodPlan(
        correct_embeddings=correct_embeddings,
        drop_token=drop_token,
        asa=asa,
        fl_tuning=fl_tuning,
        prefix_tuning=prefix_tuning,
        lora=lora,
        exlm_k=exlm_k,
    )
    plan.check(task)
    settings = _settings(
        task,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        max_length=max_length,
        accumulation=accumulation,
        warmup_proportion=warmup_proportion,
        weight_decay=weight_decay,
        seed=seed,
    )
    verbose = check_int("verbose", verbose, 0, 2)
    if not isinstance(jit_compile, bool):
        raise ValueError(f"Expected jit_compile to be True or False. Received: {jit_compile!r}.")
    source = ModelSource(
        checkpoint=_optional_path(checkpoint),
        preset=_optional_path(preset),
        model=model,
        config=_optional_path(config),
        vocabulary=_optional_path(vocab),
    )
    files = source.check()
    benchmark, _ = detect_benchmark(data_dir, task, benchmark)
    arguments = {
        "task": task.name,
        "benchmark": benchmark,
        "few_shot": few_shot,
        "data_dir": os.path.abspath(data_dir),
        "checkpoint": _absolute(files["model"]) if checkpoint is not None else None,
        "preset": _absolute(files["model"]) if preset is not None else None,
        "model": model if checkpoint is not None else None,
        "config": _absolute(files["config"]),
        "vocab": _absolute(files["vocabulary"]),
        **plan.describe(),
        **settings,
    }
    folder = RunFolder(output_dir)
    earlier = folder.read_record(arguments)
    if earlier is not None:
        _check_resumable(folder, earlier)

    splits = read_task_splits(arguments["data_dir"], task, benchmark, few_shot)
    data_record = {name: _split_record(split) for name, split in splits.items()}
    if earlier is not None:
        _check_same_data(folder, earlier.get("data", {}), data_record)
    _say(verbose, _data_line(task, benchmark, splits))

    if plan.drop_token:
        # Fast token dropping under TensorFlow's XLA on CPU (no effect elsewhere).
        disable_xla_cpu_fusion_emitters()
    keras.utils.set_random_seed(settings["seed"])
    backbone, tokenizer = source.load(required_tokens=TASK_TOKENS.get(task.kind, ()))
    check_max_length(backbone, settings["max_length"])
    encoded = _encode_splits(task, splits, tokenizer, settings, verbose)
    # A new run corrects the embeddings with the one-line callback in its first
    # fit; a resumed or finished one is corrected when built (its saved weights
    # then replace the trained ones).
    fresh = earlier is None or (
        earlier.get("status") != "finished" and not folder.state_path.exists()
    )
    # TensorFlow cannot XLA-compile a step over mirrored variables (Keras'
    # "auto" turns XLA off under tf.distribute too).
    jit_compile = jit_compile and not in_tf_distribute_scope()
    run = _build(task, plan, backbone, tokenizer, splits, encoded, settings, fresh, jit_compile)
    record = {
        "keras_masking": __version__,
        "arguments": arguments,
        "versions": _versions(),
        "distribution": _distribution_record(),
        "compile": {"jit_compile": jit_compile},
        "data": data_record,
        "model": {
            "backbone": backbone.get_config() | {"name": backbone.name},
            "trainable_parameters": run.evidence.trainable.trainable,
            "total_parameters": run.evidence.trainable.total,
            "embedding_correction": run.correction,
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
        _say(verbose, f"{os.fspath(folder.path)}: finished earlier; nothing to redo.")
        return _result(earlier, run.task_model, folder)

    state_variables = run.state_variables()
    start = 0
    history, best = [], None
    if earlier is not None and folder.state_path.exists():
        meta_epoch = folder.load_state(state_variables)
        history = [dict(entry) for entry in earlier.get("epochs", [])][:meta_epoch]
        if len(history) != meta_epoch:
            raise ValueError(
                f"{os.fspath(folder.record_path)}: the record lists {len(history)} epochs but the "
                f"resume state holds {meta_epoch}; the folder is inconsistent."
            )
        best = earlier.get("best")
        start = meta_epoch
        record["seconds"] = float(earlier.get("seconds", 0.0))
        record["initial_loss"] = earlier.get("initial_loss")
        _say(verbose, f"Resuming {os.fspath(folder.path)} after epoch {start}.")
    elif earlier is not None:
        history = []  # an earlier run stopped before its first epoch ended
    record["epochs"], record["best"] = history, best
    folder.write_record(record)
    _say(verbose, f"{', '.join(plan.active()) or 'plain fine-tuning'}; {run.evidence.trainable}")

    failure = None
    train = encoded["train"]
    for epoch in range(start, settings["epochs"]):
        epoch_started = time.time()
        first = [run.correction_callback] if run.correction_callback and epoch == 0 else []
        _say(verbose, f"Epoch {epoch + 1}/{settings['epochs']}")
        batches = ArrayBatches(
            train.features,
            train.labels,
            settings["batch_size"],
            order=_grouped_order(epoch_order(len(train), settings["seed"], epoch), settings),
        )
        first_loss = _FirstLoss()
        fitted = run.trainer.fit(
            batches,
            epochs=1,
            shuffle=False,  # the order is epoch_order's, which a resumed run repeats
            verbose=1 if verbose == 1 else 0,
            callbacks=[
                *first,
                keras.callbacks.TerminateOnNaN(),
                first_loss,
                run.evidence,
                *(callbacks or []),
            ],
        )
        if first and run.correction_callback.record is not None:
            record["model"]["embedding_correction"] = run.correction_callback.record.to_config()
        logs = {name: float(values[-1]) for name, values in fitted.history.items()}
        if record.get("initial_loss") is None and first_loss.loss is not None:
            record["initial_loss"] = first_loss.loss
        failure = _training_failure(logs, run, record.get("initial_loss"), epoch, best)
        if failure:
            break
        dev = _evaluate(task, run, encoded["dev"], splits["dev"], settings)
        entry = {
            "epoch": epoch + 1,
            "loss": logs["loss"],
            "train_metrics": {k: v for k, v in logs.items() if k != "loss"},
            "dev": dev,
            "methods": run.evidence.summary(logs),
            "seconds": round(time.time() - epoch_started, 3),
        }
        history.append(entry)
        if best is None or dev["score"] > best["score"]:
            best = {"epoch": epoch + 1, "score": dev["score"]}
            folder.save_best(run.task_model.trainable_variables, epoch + 1, dev["score"])
        folder.save_state(state_variables, epoch + 1)
        record["epochs"], record["best"] = history, best
        record["seconds"] = round(record["seconds"] + time.time() - epoch_started, 3)
        folder.write_record(record)
        _say(verbose, _epoch_line(task, entry, best))

    if best is not None:
        folder.load_best(run.task_model.trainable_variables)
    submission, test_public = None, None
    if best is not None and "test" in splits:
        predictions = _predict(task, run, encoded["test"], splits["test"], settings)
        submission = write_submission(folder.path, task, benchmark, predictions, splits["test"])
        record["submission"] = submission.name
    if best is not None and "test1.0" in splits:  # CLUE 1.0's test file too, as CLUE's baselines
        predictions = _predict(task, run, encoded["test1.0"], splits["test1.0"], settings)
        older = write_submission(folder.path, task, benchmark, predictions, splits["test1.0"])
        record["submission_1.0"] = older.name
    if best is not None and "test_public" in splits:
        test_public = _evaluate(task, run, encoded["test_public"], splits["test_public"], settings)
        record["test_public"] = test_public
    record["status"] = "failed" if failure else "finished"
    record["failure"] = failure
    folder.write_record(record)
    if failure:
        logger.warning("%s: %s", os.fspath(folder.path), failure)
        _say(verbose, f"Failed: {failure}.")
    elif submission is not None:
        _say(verbose, f"Wrote {os.fspath(submission)}")
    return _result(record, run.task_model, folder)


# === Settings ===
def _settings(task, **given):
    defaults = task.defaults
    values = {
        name: defaults[name] if given[name] is None else given[name]
        for name in ("epochs", "batch_size", "learning_rate", "max_length", "accumulation")
    }
    return {
        "epochs": check_int("epochs", values["epochs"], minimum=1),
        "batch_size": check_int("batch_size", values["batch_size"], minimum=1),
        "learning_rate": check_float(
            "learning_rate", values["learning_rate"], minimum=0.0, open_minimum=True
        ),
        "max_length": check_int("max_length", values["max_length"], minimum=8),
        "accumulation": check_int("accumulation", values["accumulation"], minimum=1),
        "warmup_proportion": check_float(
            "warmup_proportion", given["warmup_proportion"], 0.0, 1.0, open_maximum=True
        ),
        "weight_decay": check_float("weight_decay", given["weight_decay"], minimum=0.0),
        "seed": check_int("seed", given["seed"], minimum=0),
        "stride": defaults.get("stride"),
    }


def _schedule_record(examples, settings):
    """Batches and optimizer updates per epoch (`_grouped_order`'s epochs)."""
    group = settings["batch_size"] * settings["accumulation"]
    updates = math.ceil(examples / group)
    return {
        "batches_per_epoch": updates * settings["accumulation"],
        "updates_per_epoch": updates,
        "updates": updates * settings["epochs"],
    }


def _grouped_order(order, settings):
    """An epoch's order completed to whole accumulation groups.

    With ``accumulation`` k, Keras applies an update every k batches. An
    epoch of ``n`` batches, ``n`` not a multiple of k, would leave its last
    batches' gradients waiting for the next epoch (or, in the last epoch, for
    nothing: ``n < k`` once trained nothing at all). Cycling the order up to
    whole groups, as `ArrayBatches` completes the last batch, makes every
    epoch end on an update with the weights that dev is scored on.
    """
    group = settings["batch_size"] * settings["accumulation"]
    missing = -len(order) % group
    return np.concatenate([order, np.resize(order, missing)]) if missing else order


def _check_resumable(folder, earlier):
    """Refuses a run folder whose record lists epochs its files lack."""
    finished = len(earlier.get("epochs") or [])
    missing = []
    if earlier.get("status") != "finished" and finished and not folder.state_path.is_file():
        missing.append(folder.state_path.name)
    if earlier.get("best") and not folder.best_path.is_file():
        missing.append(folder.best_path.name)
    if missing:
        raise ValueError(
            f"{os.fspath(folder.path)!r}: its {folder.record_path.name} records {finished} "
            f"finished epoch(s) but {' and '.join(missing)} is missing, so the run can neither "
            "resume nor use its best weights (it would silently start again from epoch 0). "
            "Restore the file, or remove the folder (or use another --output-dir) to start again."
        )


def _absolute(path):
    return None if path is None else os.path.abspath(path)


def _optional_path(path):
    return None if path is None else os.fspath(path)


# === Failures ===
class _FirstLoss(keras.callbacks.Callback):
    """The training loss of an epoch's first batch (before any update)."""

    def __init__(self):
        super().__init__()
        self.loss = None

    def on_train_batch_end(self, batch, logs=None):
        if self.loss is None and logs and "loss" in logs:
            self.loss = float(logs["loss"])


def _training_failure(logs, run, initial_loss, epoch, best):
    """Why an epoch's training failed (non-finite or diverged), or None."""
    loss = logs.get("loss", math.nan)
    kept = "training stopped and the best weights of the finished epochs were kept"
    if best is None:
        kept = "training stopped; no epoch finished, so no submission was written"
    if not math.isfinite(loss) or run.trainer.stop_training:
        return f"the training loss became {logs.get('loss')} in epoch {epoch + 1}; {kept}"
    bad = non_finite_variables(run.trainer.trainable_variables)
    if bad:
        return (
            f"{len(bad)} weight(s) became non-finite in epoch {epoch + 1} (first: {bad[0][0]}); "
            f"{kept}"
        )
    if initial_loss is not None and math.isfinite(initial_loss):
        limit = DIVERGENCE_FACTOR * max(initial_loss, 1.0)
        if loss > limit:
            return (
                f"the training loss diverged in epoch {epoch + 1}: {loss:.4g}, above {limit:.4g} "
                f"({DIVERGENCE_FACTOR:g} times the untrained model's {initial_loss:.4g}, taken "
                f"as at least 1; is the learning rate too high?); {kept}"
            )
    return None


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


def _check_same_data(folder, earlier, now):
    for name, split in now.items():
        before = {
            entry["path"]: entry["sha256"] for entry in earlier.get(name, {}).get("files", [])
        }
        for entry in split["files"]:
            if before.get(entry["path"], entry["sha256"]) != entry["sha256"]:
                raise ValueError(
                    f"{entry['path']} changed since the run in {os.fspath(folder.path)!r} began "
                    "(its sha256 differs); resuming would mix two data sets. Use another "
                    "--output-dir."
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
    if task.kind == "entity":
        most = max([len(example.entities or ()) for example in splits["train"].examples] + [1])
        return {"max_entities": -(-most // 8) * 8}
    return {}


def _encode_splits(task, splits, tokenizer, settings, verbose):
    options = _encode_options(task, splits, settings)
    encoded = {}
    for name, split in splits.items():
        examples = split.examples
        if task.kind == "classification" and len(examples) > ENCODE_CHUNK:
            encoded[name] = _encode_in_chunks(
                task, examples, tokenizer, settings["max_length"], options, name, verbose
            )
        else:
            encoded[name] = encode_examples(
                task, examples, tokenizer, settings["max_length"], **options
            )
    return encoded


def _encode_in_chunks(task, examples, tokenizer, max_length, options, name, verbose):
    bar = keras.utils.Progbar(len(examples), verbose=1 if verbose == 1 else 0, unit_name="example")
    parts = []
    for start in range(0, len(examples), ENCODE_CHUNK):
        chunk = examples[start : start + ENCODE_CHUNK]
        parts.append(encode_examples(task, chunk, tokenizer, max_length, **options))
        bar.update(start + len(chunk))
    features = {
        key: np.concatenate([part.features[key] for part in parts]) for key in parts[0].features
    }
    labels = None
    if parts[0].labels is not None:
        labels = np.concatenate([part.labels for part in parts])
    meta = dict(parts[0].meta)
    offset = 0
    for key in ("ids", "example_index", "truncated"):
        if key in meta:
            meta[key] = []
    for part in parts:
        for key in ("ids", "truncated"):
            if key in part.meta:
                meta[key] = list(meta[key]) + list(part.meta[key])
        meta["example_index"] = list(meta["example_index"]) + [
            index + offset for index in part.meta["example_index"]
        ]
        offset += len(part.meta["example_index"])
    return type(parts[0])(features, labels, meta)


# === The model ===
@dataclasses.dataclass
class _Run:
    task_model: keras.Model
    trainer: keras.Model
    evidence: MethodEvidence
    correction: dict | None
    correction_callback: object = None

    def state_variables(self):
        """Every variable a resumed run needs: the trainer's (seeds included)
        and the optimizer's."""
        optimizer = self.trainer.optimizer
        if not optimizer.built:
            optimizer.build(self.trainer.trainable_variables)
        return list(self.trainer.variables) + list(optimizer.variables)


def _build(task, plan, backbone, tokenizer, splits, encoded, settings, fresh=True,
           jit_compile=True):  # fmt: skip
    import keras_masking

    correction, correction_callback = None, None
    if plan.correct_embeddings:
        correction_settings = dict(
            mask_token_id=tokenizer.mask_token_id,
            unselectable_token_ids=tokenizer.special_token_ids,
        )
        if fresh:
            correction_callback = keras_masking.callbacks.MLMEmbeddingCorrection(
                **correction_settings
            )
        else:
            applied = keras_masking.correct_mlm_embeddings(backbone, **correction_settings)
            correction = None if applied is None else applied.to_config()
    if plan.fl_tuning:
        keras_masking.fl_tune(backbone, units=plan.fl_tuning)
    if plan.prefix_tuning:
        keras_masking.prefix_tune(backbone, length=plan.prefix_tuning)
    if plan.lora:
        backbone.enable_lora(plan.lora)
    if task.kind in ("span", "entity") and backbone.pooled_dense is not None:
        backbone.pooled_dense.trainable = False  # token-level heads never read the pooler
    special = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    encoder = backbone
    if plan.drop_token:
        encoder = keras_masking.with_drop_token(
            backbone,
            plan.drop_token,
            protected_token_ids=special,
            mode=plan.drop_token_mode(task),
            seed=settings["seed"],
        )
    elif plan.exlm_k:
        encoder = keras_masking.models.ExLMEncoder(
            backbone,
            k=plan.exlm_k,
            mask_token_id=tokenizer.mask_token_id,
            special_token_ids=special,
            max_expanded_tokens=_most_expanded(encoded, special + (tokenizer.mask_token_id,)),
        )
    head_options = {}
    if task.kind in ("multiple_choice", "idiom"):
        head_options["num_choices"] = encoded["train"].features["token_ids"].shape[1]
    num_labels = len(splits["train"].labels) if task.kind == "classification" else None
    task_model = build_task_model(
        task, encoder, num_labels=num_labels, max_length=settings["max_length"], **head_options
    )
    trainer = task_model
    if plan.asa is not None:
        divergence = None
        if task.kind == "span":
            from keras_masking.losses.asa_divergence import span_position_divergence

            divergence = span_position_divergence
        trainer = keras_masking.with_asa(
            task_model, tau=plan.asa, seed=settings["seed"], divergence=divergence
        )
    total_steps = _schedule_record(len(encoded["train"]), settings)["updates"]
    trainer.compile(
        optimizer=fine_tuning_optimizer(
            settings["learning_rate"],
            total_steps,
            warmup_proportion=settings["warmup_proportion"],
            weight_decay=settings["weight_decay"],
            accumulation=settings["accumulation"],
        ),
        loss=task_loss(task),
        jit_compile=jit_compile,
    )
    if trainer is not task_model:
        task_model.compile(jit_compile=jit_compile)  # predicts, never trains
    evidence = MethodEvidence(
        plan, task_model, encoder, encoded["train"].features, settings["batch_size"]
    )
    return _Run(task_model, trainer, evidence, correction, correction_callback)


def _most_expanded(encoded, expanded_ids):
    most = 1
    for split in encoded.values():
        ids = split.features["token_ids"]
        counts = np.isin(ids, expanded_ids).sum(axis=-1)
        most = max(most, int(counts.max()))
    return most


# === Evaluation ===
def _predict(task, run, encoded, split, settings):
    outputs = predict_in_batches(run.task_model, encoded.features, settings["batch_size"])
    return decode_predictions(task, outputs, encoded, split.examples)


def _evaluate(task, run, encoded, split, settings):
    predictions = _predict(task, run, encoded, split, settings)
    return score(task, predictions, split.examples)


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


def _epoch_line(task, entry, best):
    dev = entry["dev"]
    methods = entry["methods"]
    shown = ", ".join(
        f"{key} {value:.3f}" for key, value in methods.items() if not key.startswith("trainable")
    )
    line = (
        f"epoch {entry['epoch']}: loss {entry['loss']:.4f}, dev {dev['metric']} "
        f"{dev['score']:.2f} (best {best['score']:.2f} at epoch {best['epoch']}), "
        f"{entry['seconds']:.1f} s"
    )
    return line + (f"; {shown}" if shown else "")


def _say(verbose, message):
    logger.info(message)
    if verbose:
        print(message, flush=True)


def _result(record, task_model, folder):
    best = record.get("best") or {}
    submission = record.get("submission")
    return FinetuneResult(
        status=record["status"],
        history=record.get("epochs", []),
        best_epoch=best.get("epoch"),
        best_score=best.get("score"),
        model=task_model,
        submission_path=None if submission is None else folder.path / submission,
        test_public=record.get("test_public"),
        record_path=folder.record_path,
        record=record,
    )
