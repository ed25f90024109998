"""The callbacks of a `finetune` run, one concern each.

A run trains with one ``fit`` over all its epochs; at the end of each epoch,
in this order:

* `TrainingFailure` stops the run when the loss turned non-finite or
  diverged, or a weight turned non-finite;
* `DevScore` scores dev with the task's metric and adds ``dev_score`` to the
  logs (an epoch that failed gets none: the callbacks below skip it);
* `BestWeights` saves the trainable variables when ``dev_score`` is the best
  so far (as `keras.callbacks.ModelCheckpoint` with ``save_best_only``);
* `ResumeState` saves every variable for an exact resume (as
  `keras.callbacks.BackupAndRestore`, see its docstring for why it is not);
* `RunRecord` adds the epoch to ``run.json`` and logs its line.
"""

import logging
import math
import time

import keras

from keras_masking.utils.eager_checks import non_finite_variables

logger = logging.getLogger("keras_masking.clue.runner")

# An epoch whose mean training loss exceeds this many times the untrained
# model's (the first batch's loss, at least 1) has diverged: the run fails.
DIVERGENCE_FACTOR = 10.0


class TrainingFailure(keras.callbacks.Callback):
    """Stops training when an epoch's loss or weights turn bad; says why.

    Args:
        record: the run record: its ``initial_loss`` (the first batch's loss
            of the run, before any update) is read, or set by this callback,
            and ``best`` says whether any epoch finished.

    Attributes:
        failure: why the run failed (a sentence), or None.
    """

    def __init__(self, record):
        super().__init__()
        self.record = record
        self.failure = None

    def on_train_batch_end(self, batch, logs=None):
        if self.record.get("initial_loss") is None and logs and "loss" in logs:
            self.record["initial_loss"] = float(logs["loss"])

    def on_epoch_end(self, epoch, logs=None):
        self.failure = self._why(epoch + 1, float((logs or {}).get("loss", math.nan)))
        if self.failure:
            self.model.stop_training = True

    def _why(self, epoch, loss):
        kept = "training stopped and the best weights of the finished epochs were kept"
        if self.record.get("best") is None:
            kept = "training stopped; no epoch finished, so no submission was written"
        if not math.isfinite(loss):
            return f"the training loss became {loss} in epoch {epoch}; {kept}"
        bad = non_finite_variables(self.model.trainable_variables)
        if bad:
            first = bad[0][0]
            return (
                f"{len(bad)} weight(s) became non-finite in epoch {epoch} (first: {first}); {kept}"
            )
        initial = self.record.get("initial_loss")
        if initial is not None and math.isfinite(initial):
            limit = DIVERGENCE_FACTOR * max(initial, 1.0)
            if loss > limit:
                return (
                    f"the training loss diverged in epoch {epoch}: {loss:.4g}, above {limit:.4g} "
                    f"({DIVERGENCE_FACTOR:g} times the untrained model's {initial:.4g}, taken "
                    f"as at least 1; is the learning rate too high?); {kept}"
                )
        return None


class DevScore(keras.callbacks.Callback):
    """Scores dev after each epoch that did not fail; adds ``dev_score`` to the logs.

    Args:
        evaluate: a callable returning the dev scores (a dict with ``score``).
        failure: the run's `TrainingFailure`.

    Attributes:
        scores: the last epoch's dev scores.
    """

    def __init__(self, evaluate, failure):
        super().__init__()
        self.evaluate = evaluate
        self.failure = failure
        self.scores = None

    def on_epoch_end(self, epoch, logs=None):
        if self.failure.failure is None and logs is not None:
            self.scores = self.evaluate()
            logs["dev_score"] = self.scores["score"]


class BestWeights(keras.callbacks.Callback):
    """Saves ``variables`` to the run folder when ``dev_score`` is the best yet.

    `keras.callbacks.ModelCheckpoint` saves the whole trained model's weights
    (ASA's adversaries included) in place; this saves the task model's
    trainable variables (for FL-tuning, P-tuning v2 and LoRA: the adapter and
    the head) through a temporary file.

    Args:
        folder: the run's `RunFolder`.
        variables: the variables to save (the task model's trainable ones).
        best: ``{"epoch", "score"}`` of a resumed run's best epoch, or None.
    """

    def __init__(self, folder, variables, best=None):
        super().__init__()
        self.folder = folder
        self.variables = variables
        self.best = best

    def on_epoch_end(self, epoch, logs=None):
        score = (logs or {}).get("dev_score")
        if score is not None and (self.best is None or score > self.best["score"]):
            self.best = {"epoch": epoch + 1, "score": score}
            self.folder.save_best(self.variables, epoch + 1, score)


class ResumeState(keras.callbacks.Callback):
    """Saves every variable after each finished epoch, for an exact resume.

    `keras.callbacks.BackupAndRestore` does not resume exactly: Keras' weight
    files leave out the random generators' states (dropout, DropToken and ASA
    would draw other numbers after a resume), and it writes in place. This
    saves the trainer's variables (seed states included) and the optimizer's
    through a temporary file; the runner restores them and passes
    ``initial_epoch`` to ``fit``.

    Args:
        folder: the run's `RunFolder`.
        variables: every variable the run needs to continue.
    """

    def __init__(self, folder, variables):
        super().__init__()
        self.folder = folder
        self.variables = variables

    def on_epoch_end(self, epoch, logs=None):
        if (logs or {}).get("dev_score") is not None:
            self.folder.save_state(self.variables, epoch + 1)


class RunRecord(keras.callbacks.Callback):
    """Adds each finished epoch to the run record, writes it and logs its line.

    Args:
        folder: the run's `RunFolder`.
        record: the run record (its ``epochs``, ``best`` and ``seconds`` are
            updated).
        dev: the run's `DevScore`; best: its `BestWeights`.
        evidence: the run's `MethodEvidence`.
        correction: the `MLMEmbeddingCorrection` callback of the run, or None.
    """

    def __init__(self, folder, record, dev, best, evidence, correction=None):
        super().__init__()
        self.folder = folder
        self.record = record
        self.dev = dev
        self.best = best
        self.evidence = evidence
        self.correction = correction
        self.started = None

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.time()
        logger.info("Epoch %d/%d", epoch + 1, self.record["arguments"]["epochs"])

    def on_epoch_end(self, epoch, logs=None):
        if (logs or {}).get("dev_score") is None:
            return
        seconds = time.time() - self.started
        metrics = {name: float(value) for name, value in logs.items() if name != "dev_score"}
        entry = {
            "epoch": epoch + 1,
            "loss": metrics["loss"],
            "train_metrics": {k: v for k, v in metrics.items() if k != "loss"},
            "dev": self.dev.scores,
            "methods": self.evidence.summary(metrics),
            "seconds": round(seconds, 3),
        }
        if self.correction is not None and self.correction.record is not None:
            self.record["model"]["embedding_correction"] = self.correction.record.to_config()
        self.record["epochs"].append(entry)
        self.record["best"] = self.best.best
        self.record["seconds"] = round(self.record["seconds"] + seconds, 3)
        self.folder.write_record(self.record)
        logger.info(_epoch_line(entry, self.best.best))


def _epoch_line(entry, best):
    dev = entry["dev"]
    shown = ", ".join(
        f"{key} {value:.3f}"
        for key, value in entry["methods"].items()
        if not key.startswith("trainable")
    )
    line = (
        f"epoch {entry['epoch']}: loss {entry['loss']:.4f}, dev {dev['metric']} "
        f"{dev['score']:.2f} (best {best['score']:.2f} at epoch {best['epoch']}), "
        f"{entry['seconds']:.1f} s"
    )
    return line + (f"; {shown}" if shown else "")
