"""Evidence that each chosen method is really on, for the progress bar and the record.

A method that is silently off is a known failure of adversarial-training
recipes, so a run shows, every epoch: DropToken's measured drop share (on a
training batch, in training mode), ASA's masked share per attacked layer and
its mean, and the trainable parameter count (FL-tuning, P-tuning v2, LoRA).
"""

import keras
import numpy as np

from keras_masking.methods import parameter_report

SEQUENCE_INPUTS = ("token_ids", "segment_ids", "padding_mask")


class MethodEvidence(keras.callbacks.Callback):
    """Adds the methods' measured effect to each epoch's logs.

    As a callback of ``fit``, it writes ``drop_share`` (DropToken) and
    ``masked_fraction`` (ASA's mean over layers) into the epoch's logs
    before the progress bar prints them.

    Args:
        plan: the run's `MethodPlan`.
        task_model: the task model (its trainable count is reported).
        encoder: the encoder inside it (a `DropTokenEncoder` when DropToken
            is on).
        sample: a dict of encoded training features to measure DropToken on
            (its first ``batch_size`` rows are used).
        batch_size: rows to measure on.

    Example:
    ```python
    from keras_masking.clue import MethodPlan

    encoder = keras_masking.with_drop_token(backbone, 0.5, protected_token_ids=(101, 102))
    evidence = MethodEvidence(MethodPlan(drop_token=0.5), encoder, encoder, features, 2)
    share = evidence.drop_share()  # the share of real tokens dropped in training mode
    assert 0.0 < share < 1.0
    # In fit: model.fit(..., callbacks=[evidence]) adds `drop_share` to the logs.
    ```
    """

    def __init__(self, plan, task_model, encoder, sample, batch_size):
        super().__init__()
        self.plan = plan
        self.encoder = encoder
        self.trainable = parameter_report(task_model)
        self.sample = {name: np.asarray(sample[name][:batch_size]) for name in SEQUENCE_INPUTS}

    def drop_share(self):
        """The share of real tokens DropToken drops, measured in training mode."""
        features = {
            name: value.reshape((-1, value.shape[-1])) for name, value in self.sample.items()
        }
        outputs = self.encoder(features, training=True)
        kept = np.asarray(keras.ops.convert_to_numpy(outputs["token_mask"]), "float64")
        real = features["padding_mask"].astype("float64")
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
