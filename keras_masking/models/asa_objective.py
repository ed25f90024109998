"""ASA's training objective, shared by the text classifier and `ASATrainer`."""

import contextlib
import logging
import threading

import keras
from keras import ops

from keras_masking.distribution.replicas import gather_replicas
from keras_masking.distribution.replicas import replica_share
from keras_masking.losses.asa_divergence import asa_divergence

_TRAINING_KEYS = ("adversarial", "clean", "masks", "padding_mask")
TOKEN_DIVERGENCES = ("all", "real")
_LOGGER = logging.getLogger(__name__)
_ASA_PASS = threading.local()  # per thread: tf.distribute runs a replica per thread


@contextlib.contextmanager
def asa_training_pass():
    """Marks the calls made inside as ASA's training passes.

    A backbone with ``enable_asa`` refuses a training call made outside one
    (`TransformerBackbone.call`): such a step would train without the
    adversaries, silently. `TransformerTextClassifier` and `ASATrainer` run
    their clean and adversarial passes inside it; so can a training-mode
    call that is not a training step (a measurement of DropToken's share).

    Example:
    ```python
    with asa_training_pass():
        clean = model(features, training=True)
    ```
    """
    depth = getattr(_ASA_PASS, "depth", 0)
    _ASA_PASS.depth = depth + 1
    try:
        yield
    finally:
        _ASA_PASS.depth = depth


def in_asa_training_pass():
    """Whether the current call runs inside `asa_training_pass` (this thread).

    Example:
    >>> in_asa_training_pass()
    False
    """
    return getattr(_ASA_PASS, "depth", 0) > 0


def masked_fraction(mask, padding_mask):
    """Share of real query/key pairs an adversary masked, and their count.

    Args:
        mask: float ``(batch, query, key)``, 1 kept, 0 masked.
        padding_mask: 0/1 ``(batch, sequence)``.

    Returns:
        ``(fraction, pairs)``, two float32 scalars.

    Example:
    >>> fraction, pairs = masked_fraction(np.zeros((1, 2, 2)), np.array([[1, 1]]))
    >>> float(fraction), float(pairs)
    (1.0, 4.0)
    """
    real = ops.cast(ops.cast(padding_mask, "bool"), "float32")
    pairs = real[:, :, None] * real[:, None, :]
    count = ops.sum(pairs)
    masked = ops.sum((1.0 - ops.cast(mask, "float32")) * pairs)
    return masked / ops.maximum(count, 1.0), count


def is_asa_training_output(y_pred):
    """Whether ``y_pred`` is the dict a model returns in an ASA training step."""
    return isinstance(y_pred, dict) and tuple(sorted(y_pred)) == _TRAINING_KEYS


class ASAObjective:
    """Mixin: a model whose training step minimises ASA's objective.

    ``L = task_loss(clean) + D(clean, adversarial) + tau^2 * sum_l sum_ij
    M^l_ij / rows`` (Wu et al. 2023; see `keras_masking.methods.ASATrainer`).
    A model's ``call`` in training returns `asa_training_outputs`;
    `compute_loss` and `compute_metrics` then add the divergence and the mask
    penalty and log them. Any other output goes to the base class unchanged.

    The class using it sets ``asa_tau``, ``asa_task`` (one of
    `keras_masking.losses.ASA_TASKS` or ``"custom"``), ``divergence_fn``
    (None or a callable) and ``token_divergence``, and calls
    `build_asa_trackers` with the attacked layers.
    """

    divergence_fn = None
    token_divergence = "all"

    def build_asa_trackers(self, layers):
        """Creates the ASA metrics (``divergence``, ``mask_term``, per layer)."""
        self.divergence_tracker = keras.metrics.Mean(name="divergence")
        self.mask_term_tracker = keras.metrics.Mean(name="mask_term")
        self.masked_fraction_trackers = [
            keras.metrics.Mean(name=f"masked_fraction_{index}") for index in layers
        ]

    @staticmethod
    def asa_training_outputs(clean, adversarial, masks, padding_mask):
        """The training output `compute_loss` reads: a dict of the four parts."""
        return {
            "clean": clean,
            "adversarial": adversarial,
            "masks": masks,
            "padding_mask": ops.cast(padding_mask, "int32"),
        }

    def divergence(self, y_pred):
        """``D(clean, adversarial)`` of this model's task kind (float32).

        Always over the global batch: under `tf.distribute` every replica
        gathers the outputs of all replicas first (`gather_replicas`). A
        regression batch of one row has ``D = 0`` exactly: that is logged as
        a warning, once per model.
        """
        clean, adversarial = gather_replicas((y_pred["clean"], y_pred["adversarial"]))
        if self.divergence_fn is not None:
            return ops.cast(self.divergence_fn(clean, adversarial), "float32")
        if self.asa_task == "regression":
            self._warn_about_a_single_row(clean)
        weights = None
        if self.token_divergence == "real":
            weights = gather_replicas(y_pred["padding_mask"])
        return asa_divergence(clean, adversarial, self.asa_task, weights)

    def _warn_about_a_single_row(self, predictions):
        rows = tuple(predictions.shape)[0]
        if rows != 1 or getattr(self, "_warned_single_row", False):
            return
        self._warned_single_row = True
        _LOGGER.warning(
            "ASA's regression divergence takes the softmax over the batch (as the official "
            "code); on a batch of 1 row it is exactly 0, so that step trains the model on the "
            "task loss only and the adversaries on the mask penalty only (they learn to mask "
            "nothing). Train with batches of 2 rows or more (a batch size that leaves no "
            "last batch of 1)."
        )

    def mask_term(self, y_pred):
        """``tau^2 * sum_l sum_ij M^l_ij / rows`` (float32)."""
        total = 0.0
        for mask in y_pred["masks"]:
            rows = ops.cast(ops.shape(mask)[0], "float32")
            total = total + ops.sum(ops.cast(mask, "float32")) / rows
        return self.asa_tau**2 * total

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if not is_asa_training_output(y_pred):
            return super().compute_loss(x, y, y_pred, sample_weight, training)
        task_loss = super().compute_loss(x, y, y_pred["clean"], sample_weight, training)
        # Keras scales its compiled task loss for tf.distribute replicas and
        # adds the replicas' losses. The mask term is a mean over this
        # replica's rows: it enters as its share of the global mean. The
        # divergence is already the global value (gathered): each replica
        # enters it weighted by its share of the rows, the weights summing
        # to 1, and the gathered gradient reaches every replica's rows.
        mask_term = replica_share(self.mask_term(y_pred), _rows(y_pred))
        # The value is task + divergence (the official log); the gradient also
        # carries the mask term, which reaches the adversaries only.
        shown_zero = mask_term - ops.stop_gradient(mask_term)
        divergence = replica_share(self.divergence(y_pred), _divergence_rows(y_pred))
        return ops.cast(task_loss, "float32") + divergence + shown_zero

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if not is_asa_training_output(y_pred):
            result = super().compute_metrics(x, y, y_pred, sample_weight)
            return {name: value for name, value in result.items() if name not in self._asa_names}
        # Weighted by the rows each averages over: replicas add up exactly
        # (the divergence is the global value on every replica).
        self.divergence_tracker.update_state(
            self.divergence(y_pred), sample_weight=_divergence_rows(y_pred)
        )
        self.mask_term_tracker.update_state(self.mask_term(y_pred), sample_weight=_rows(y_pred))
        for tracker, mask in zip(self.masked_fraction_trackers, y_pred["masks"]):
            fraction, pairs = masked_fraction(mask, y_pred["padding_mask"])
            tracker.update_state(fraction, sample_weight=pairs)
        return super().compute_metrics(x, y, y_pred["clean"], sample_weight)

    @property
    def _asa_names(self):
        trackers = [getattr(self, "divergence_tracker", None)]
        trackers += [getattr(self, "mask_term_tracker", None)]
        trackers += list(getattr(self, "masked_fraction_trackers", None) or [])
        return {tracker.name for tracker in trackers if tracker is not None}


def _rows(y_pred):
    """The rows the mask term divides by (the encoder's batch)."""
    return ops.shape(y_pred["masks"][0])[0]


def _divergence_rows(y_pred):
    """The examples the divergence is a mean over (the task outputs' batch)."""
    return ops.shape(keras.tree.flatten(y_pred["clean"])[0])[0]
