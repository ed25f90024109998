"""The callbacks of a `finetune` run, one concern each, in the order they run at
the end of each epoch: `TrainingFailure`, `DevScore` (an epoch that failed gets
no ``dev_score``, and the callbacks after it skip it), `MethodEvidence`,
`BestWeights`, `ResumeState`, `RunRecord`.
"""

import logging
import math
import time

import keras
import numpy as np

from keras_masking.methods import asa_training_pass
from keras_masking.methods import parameter_report
from keras_masking.utils.eager_checks import non_finite_variables

logger = logging.getLogger("keras_masking.clue.runner")

# An epoch whose mean training loss exceeds this many times the untrained
# model's (the first batch's loss, at least 1) has diverged: the run fails.
DIVERGENCE_FACTOR = 10.0
SEQUENCE_INPUTS = ("token_ids", "segment_ids", "padding_mask")


class TrainingFailure(keras.callbacks.Callback):
    """Stops training when an epoch's loss or weights turn bad; says why.

    An epoch fails when its loss or a weight is non-finite, or its mean loss
    exceeds ``DIVERGENCE_FACTOR`` times the untrained model's (at least 1).

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


class MethodEvidence(keras.callbacks.Callback):
    """Adds the methods' measured effect to each epoch's logs: evidence that each is on.

    A method that is silently off is a known failure of adversarial-training
    recipes: ``drop_share`` (DropToken's, measured on a training batch in
    training mode) and ``masked_fraction`` (ASA's mean over layers) go into
    the logs before the progress bar prints them; the trainable count into
    the record.

    Args:
        plan: the run's `MethodPlan`.
        task_model: the task model (its trainable count is reported).
        encoder: the encoder inside it (the backbone, whose ``token_mask``
            output shows what DropToken kept).
        sample: a dict of encoded training features to measure DropToken on
            (its first ``batch_size`` rows are used).
        batch_size: rows to measure on.
        correction: the run's `MLMEmbeddingCorrection` callback (its record
            goes into the run record), or None.

    Example:
    ```python
    from keras_masking.clue import MethodPlan
    backbone.enable_drop_token(0.5, unselectable_token_ids=(101, 102))
    evidence = MethodEvidence(MethodPlan(drop_token=0.5), backbone, backbone, features, 2)
    share = evidence.drop_share()  # the share of real tokens dropped in training mode
    assert 0.0 < share < 1.0
    # In fit: model.fit(..., callbacks=[evidence]) adds `drop_share` to the logs.
    ```
    """

    def __init__(self, plan, task_model, encoder, sample, batch_size, correction=None):
        super().__init__()
        self.plan = plan
        self.encoder = encoder
        self.correction = correction
        self.trainable = parameter_report(task_model)
        rows = {name: np.asarray(sample[name][:batch_size]) for name in SEQUENCE_INPUTS}
        self.sample = {name: value.reshape((-1, value.shape[-1])) for name, value in rows.items()}

    def drop_share(self):
        """The share of real tokens DropToken drops, measured in training mode."""
        with asa_training_pass():  # a measurement, not a step: ASA may be on
            outputs = self.encoder(self.sample, training=True)
        kept = np.asarray(keras.ops.convert_to_numpy(outputs["token_mask"]), "float64")
        real = self.sample["padding_mask"].astype("float64")
        return float(1.0 - kept.sum() / max(real.sum(), 1.0))

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        if self.plan.drop_token:
            logs["drop_share"] = self.drop_share()
        fractions = [value for name, value in logs.items() if name.startswith("masked_fraction_")]
        if fractions:
            logs["masked_fraction"] = float(np.mean([float(value) for value in fractions]))

    def summary(self, logs):
        """The evidence of one epoch, from its logs (JSON-ready)."""
        evidence = {
            "trainable_parameters": self.trainable.trainable,
            "trainable_share": round(self.trainable.ratio, 6),
        }
        for name, value in logs.items():
            if name == "drop_share" or name.startswith("masked_fraction"):
                evidence[name] = round(float(value), 6)
        return evidence


class DevScore(keras.callbacks.Callback):
    """Scores dev after each epoch that did not fail; adds ``dev_score`` to the logs.

    With a run folder, the epoch's dev predictions are saved there too
    (`RunFolder.save_dev_predictions`), so an epoch can be chosen afterwards
    on part of dev (`keras_masking.clue.compare`). With ``split``
    ``"dev_noised"`` (or ``"test_file"``), it scores the noised copy of dev
    (or the labelled test file) instead and adds ``dev_noised_score`` (or
    ``test_file_score``), which chooses nothing.

    Args:
        predict: a callable returning the dev predictions (id -> prediction).
        score: a callable taking them, returning the dev scores (a dict with
            ``score``).
        failure: the run's `TrainingFailure`.
        folder: the run's `RunFolder`, or None (the predictions are not saved).
        split: the split scored, ``"dev"``, ``"dev_noised"`` or ``"test_file"``.

    Attributes:
        scores: the last epoch's dev scores.
        log_name: the logs' key, ``<split>_score``.
    """

    def __init__(self, predict, score, failure, folder=None, split="dev"):
        super().__init__()
        self.predict = predict
        self.score = score
        self.failure = failure
        self.folder = folder
        self.split = split
        self.log_name = f"{split}_score"
        self.scores = None

    def on_epoch_end(self, epoch, logs=None):
        if self.failure.failure is None and logs is not None:
            predictions = self.predict()
            if self.folder is not None:
                self.folder.save_dev_predictions(epoch + 1, predictions, self.split)
            self.scores = self.score(predictions)
            logs[self.log_name] = self.scores["score"]


class BestWeights(keras.callbacks.Callback):
    """Saves ``variables`` to the run folder when ``dev_score`` is the best yet.

    Unlike `keras.callbacks.ModelCheckpoint` (the whole trainer's weights, in
    place): the task model's trainable variables, through a temporary file.

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

    Unlike `keras.callbacks.BackupAndRestore`, the random generators' states
    are saved too (dropout, DropToken and ASA draw the same numbers after a
    resume), through a temporary file.

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
        noised: the `DevScore` of the noised dev, or None.
        tested: the `DevScore` of the labelled test file, or None.
    """

    def __init__(self, folder, record, dev, best, evidence, noised=None, tested=None):
        super().__init__()
        self.folder = folder
        self.record = record
        self.dev = dev
        self.best = best
        self.evidence = evidence
        self.also = [score for score in (noised, tested) if score is not None]

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.time()
        logger.info("Epoch %d/%d", epoch + 1, self.record["arguments"]["epochs"])

    def on_epoch_end(self, epoch, logs=None):
        if (logs or {}).get("dev_score") is None:
            return
        seconds = time.time() - self.started
        scored = {score.log_name for score in (self.dev, *self.also)}
        metrics = {name: float(value) for name, value in logs.items() if name not in scored}
        entry = {
            "epoch": epoch + 1,
            "loss": metrics["loss"],
            "train_metrics": {k: v for k, v in metrics.items() if k != "loss"},
            "dev": self.dev.scores,
            "methods": self.evidence.summary(metrics),
            "seconds": round(seconds, 3),
        }
        for score in self.also:  # "dev_noised", "test_file": they choose nothing
            entry[score.split] = score.scores
        correction = self.evidence.correction
        if correction is not None and correction.record is not None:
            corrected = correction.record.to_config()
            self.record["model"]["embedding_correction"] = corrected
            backbone = self.record["model"]["backbone"]
            if "mlm_embedding_correction" in backbone:  # its config as trained (corrected)
                backbone["mlm_embedding_correction"] = corrected
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
        + (f"noised dev {entry['dev_noised']['score']:.2f}, " if "dev_noised" in entry else "")
        + (f"test file {entry['test_file']['score']:.2f}, " if "test_file" in entry else "")
        + f"{entry['seconds']:.1f} s"
    )
    return line + (f"; {shown}" if shown else "")
