"""ASA: adversarial self-attention fine-tuning of a user's Keras task model."""

import copy
import logging

import keras
from keras import ops

from keras_masking.distribution.replicas import gather_replicas
from keras_masking.distribution.replicas import replica_share
from keras_masking.layers.attention_adversary import AttentionAdversary
from keras_masking.losses.asa_divergence import ASA_TASKS
from keras_masking.losses.asa_divergence import asa_divergence
from keras_masking.methods.asa_encoders import adversarial_encoder_call
from keras_masking.methods.asa_encoders import find_asa_encoder
from keras_masking.ops.attention_masks import validate_mask_semantics
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

_TRAINING_KEYS = ("adversarial", "clean", "masks", "padding_mask")
TOKEN_DIVERGENCES = ("all", "real")
_LOGGER = logging.getLogger(__name__)


def masked_fraction(mask, padding_mask):
    """Share of real query/key pairs an adversary masked, and their count.

    Args:
        mask: float ``(batch, query, key)``, 1 kept, 0 masked.
        padding_mask: 0/1 ``(batch, sequence)``.

    Returns:
        ``(fraction, pairs)``, two float32 scalars.
    """
    real = ops.cast(padding_mask, "float32")
    pairs = real[:, :, None] * real[:, None, :]
    count = ops.sum(pairs)
    masked = ops.sum((1.0 - ops.cast(mask, "float32")) * pairs)
    return masked / ops.maximum(count, 1.0), count


def _is_training_output(y_pred):
    return isinstance(y_pred, dict) and tuple(sorted(y_pred)) == _TRAINING_KEYS


@keras.saving.register_keras_serializable(package="keras_masking")
class ASATrainer(keras.Model):
    """Fine-tunes a user's task model with adversarial self-attention (ASA).

    Wu et al. (2023), "Adversarial Self-Attention for Language
    Understanding", as its official code trains (``AsaBert*``): every step
    runs the task model twice with dropout on in both, once clean and once
    with each attacked layer's padding mask replaced by an
    `AttentionAdversary`'s binary mask computed from that layer's own input
    (``(1 - M) * -10000``), and minimises

        L = task_loss(clean) + D(clean, adversarial) + tau^2 * sum_l sum_ij M^l_ij / rows

    in one backward pass with one optimizer. The adversaries see their input
    with the gradient stopped, and a gradient reversal makes them ascend
    ``D + tau^2 * kept units`` (they mask what hurts the model most, paying
    ``tau^2`` per masked unit) while the encoder and head descend
    ``task_loss + D``. ``rows`` is the encoder's batch (``B x choices`` for
    multiple choice); padded query rows count, as in the official code.

    Why a trainer model: ASA changes the training step, not the function the
    model computes. `ASATrainer` is the model you ``compile`` and ``fit``;
    ``training=False`` calls (``predict``, ``evaluate``) are the task model
    itself, bit for bit and at the same cost, and the adversaries belong to
    the trainer only, so ``task_model.save(...)`` (or `inference_model`)
    holds no adversary weight while ``trainer.save(...)`` keeps them to
    resume training. The adversarial pass is a second functional graph built
    once from the task model's own layers (``keras.models.clone_model`` with
    the layers shared), so the user's head, pooling and reshapes (multiple
    choice) are reused as they are.

    The ``loss`` in the progress bar is ``task_loss + D``, the value the
    official scripts log; ``mask_term`` is ``tau^2 * kept units / rows``
    (the objective is their sum); ``divergence`` is ``D``; and
    ``masked_fraction_<layer>`` is the share of real query/key pairs the
    adversary of that layer masked (the paper's diagnostic: see
    `plot_masked_fractions`). Evaluation reports the compiled metrics only.

    The divergence ``D`` follows the task kind, as the official scripts:
    symmetric KL of the softmaxes with PyTorch's ``batchmean`` (the sum over
    every axis but the batch, divided by the batch): per example for
    classification and multiple choice, SUMMED over positions for token
    classification; for regression (one output) the softmax is over the
    batch (`keras_masking.losses.batch_softmax_divergence`), the global batch
    when data-parallel (see `divergence`); a batch of one row makes it 0 and
    logs a warning. A head with no official divergence (span or pointer
    logits, several outputs) needs ``divergence=``.

    Args:
        task_model: a functional Keras model (``keras.Model(inputs, outputs)``
            or a keras-hub task) that calls a `TransformerBackbone` once, or a
            DropToken encoder in ``mode="attention"``; its outputs are logits
            (predictions for regression).
        tau: finite float >= 0, the mask penalty's temperature (0.5
            officially).
        layers: layer indices to attack, or None for every layer (official).
        alpha: finite float >= 0, the gradient reversal's strength (1
            officially).
        task: ``"auto"`` (from the output shape: ``(B, 1)`` regression,
            ``(B, C)`` classification or multiple choice, ``(B, T, C)`` token
            classification), or one of `keras_masking.losses.ASA_TASKS`.
        divergence: None, or a callable ``(clean_outputs,
            adversarial_outputs) -> scalar`` that replaces the task kind's
            divergence (required for span or pointer heads).
        mask_semantics: ``"replace"`` (official ``bert.py``: masked logits
            become exactly -10000, a fully masked query row attends uniformly
            to all keys), ``"additive"`` (``roberta.py``: the mask is added to
            the logits) or ``"guarded"`` (replace, but a fully masked row
            attends uniformly to the real keys; not official).
        noise: bool. True adds real logistic noise before each adversary's
            step (a deviation; the official noise cancels).
        token_divergence: ``"all"`` (official: every position, padding and
            special tokens included) or ``"real"`` (real tokens only, a
            deviation) for token classification.
        seed: int or None, for ``noise``.
        **kwargs: `keras.Model` arguments (``name``).

    Example:
    ```python
    outputs = backbone(backbone.input)
    logits = keras.layers.Dense(2)(outputs["pooled_output"])
    classifier = keras.Model(backbone.input, logits)
    trainer = keras_masking.with_asa(classifier, tau=0.5)
    trainer.compile(optimizer=keras.optimizers.AdamW(1e-5),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"], jit_compile=True)
    trainer.fit(features, labels, epochs=3)
    classifier.predict(features)  # the clean model, no adversary
    ```
    """

    def __init__(
        self,
        task_model,
        tau=0.5,
        layers=None,
        alpha=1.0,
        task="auto",
        divergence=None,
        mask_semantics="replace",
        noise=False,
        token_divergence="all",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_float("tau", tau, minimum=0.0)
        check_float("alpha", alpha, minimum=0.0)
        if not isinstance(noise, bool):
            raise ValueError(f"Expected True or False for noise. Received: noise={noise!r}.")
        if seed is not None:
            check_int("seed", seed, minimum=0)
        validate_mask_semantics(mask_semantics)
        if task != "auto" and task not in ASA_TASKS:
            raise ValueError(
                f"`task` must be 'auto' or one of {ASA_TASKS}. Received: task={task!r}"
            )
        if divergence is not None and not callable(divergence):
            raise ValueError(f"`divergence` must be None or a callable. Received: {divergence!r}")
        if token_divergence not in TOKEN_DIVERGENCES:
            raise ValueError(
                f"`token_divergence` must be one of {TOKEN_DIVERGENCES}. "
                f"Received: token_divergence={token_divergence!r}"
            )
        encoder, backbone = find_asa_encoder(task_model)
        self.task_model = task_model
        self.backbone = backbone
        self.tau = float(tau)
        self.alpha = float(alpha)
        self.attacked_layers = backbone.layer_indices(layers)
        self.layers_argument = None if layers is None else list(self.attacked_layers)
        self.mask_semantics = mask_semantics
        self.noise = noise
        self.token_divergence = token_divergence
        self.seed = seed
        self.divergence_fn = divergence
        self.task = (
            "custom" if divergence is not None else _resolve_task(task, task_model, backbone)
        )
        if token_divergence == "real" and self.task != "token_classification":
            raise ValueError(
                "token_divergence='real' applies to token classification only. "
                f"This trainer's task is {self.task!r}."
            )
        self.adversaries = []
        for index in self.attacked_layers:
            adversary = AttentionAdversary(
                alpha=alpha,
                noise=noise,
                seed=None if seed is None else seed + index,
                name=f"adversary_{index}",
            )
            adversary.build((None, None, backbone.hidden_dim))
            self.adversaries.append(adversary)
        self.adversarial_model = self._build_adversarial_model(encoder)
        self.divergence_tracker = keras.metrics.Mean(name="divergence")
        self.mask_term_tracker = keras.metrics.Mean(name="mask_term")
        self.masked_fraction_trackers = [
            keras.metrics.Mean(name=f"masked_fraction_{index}") for index in self.attacked_layers
        ]
        self.built = True

    def _build_adversarial_model(self, encoder):
        """The task graph with the encoder's call replaced by the adversarial one."""
        by_layer = dict(zip(self.attacked_layers, self.adversaries))
        captured = []

        def call_function(layer, *args, **kwargs):
            if layer is not encoder:
                return layer(*args, **kwargs)
            outputs, masks, padding_mask = adversarial_encoder_call(
                encoder, args[0] if args else kwargs["inputs"], by_layer, self.mask_semantics
            )
            captured.append((masks, padding_mask))
            return outputs

        clone = keras.models.clone_model(
            self.task_model, clone_function=lambda layer: layer, call_function=call_function
        )
        if len(captured) != 1:
            raise ValueError(
                f"ASA needs a task model that calls its encoder once; this one calls it "
                f"{len(captured)} times."
            )
        masks, padding_mask = captured[0]
        return keras.Model(
            clone.input,
            {
                "outputs": clone.output,
                "masks": masks,
                "padding_mask": ops.cast(padding_mask, "int32"),
            },
            name="asa_adversarial_pass",
        )

    @property
    def inference_model(self):
        """The task model: what to save, export and serve (no adversary)."""
        return self.task_model

    def call(self, inputs, training=False):
        if not training:
            return self.task_model(inputs, training=False)
        clean = self.task_model(inputs, training=True)
        adversarial = self.adversarial_model(inputs, training=True)
        return {
            "clean": clean,
            "adversarial": adversarial["outputs"],
            "masks": adversarial["masks"],
            "padding_mask": adversarial["padding_mask"],
        }

    # === Loss ===
    def divergence(self, y_pred):
        """``D(clean, adversarial)`` of this trainer's task kind (float32).

        Always over the global batch: under `tf.distribute` every replica
        gathers the outputs of all replicas first (`gather_replicas`), so
        ``D`` is what one device computes on the whole batch whatever its
        form, the regression divergence's softmax over the batch and a
        custom ``divergence=`` included. A regression batch of one row has
        ``D = 0`` exactly (the softmax of one value is 1): that is logged
        as a warning, once per trainer.
        """
        clean, adversarial = gather_replicas((y_pred["clean"], y_pred["adversarial"]))
        if self.divergence_fn is not None:
            return ops.cast(self.divergence_fn(clean, adversarial), "float32")
        if self.task == "regression":
            self._warn_about_a_single_row(clean)
        weights = None
        if self.token_divergence == "real":
            weights = gather_replicas(y_pred["padding_mask"])
        return asa_divergence(clean, adversarial, self.task, weights)

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
        return self.tau**2 * total

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if not _is_training_output(y_pred):
            return super().compute_loss(x, y, y_pred, sample_weight, training)
        task_loss = super().compute_loss(x, y, y_pred["clean"], sample_weight, training)
        # Keras scales its compiled task loss for tf.distribute replicas and
        # adds the replicas' losses. The mask term is a mean over this
        # replica's rows: it enters as its share of the global mean. The
        # divergence is already the global value (gathered): each replica
        # enters it weighted by its share of the rows, the weights summing
        # to 1, and the gathered gradient reaches every replica's rows.
        rows = self._rows(y_pred)
        mask_term = replica_share(self.mask_term(y_pred), rows)
        # The value is task + divergence (the official log); the gradient also
        # carries the mask term, which reaches the adversaries only.
        shown_zero = mask_term - ops.stop_gradient(mask_term)
        divergence = replica_share(self.divergence(y_pred), self._divergence_rows(y_pred))
        return ops.cast(task_loss, "float32") + divergence + shown_zero

    @staticmethod
    def _rows(y_pred):
        """The rows the mask term divides by (the encoder's batch)."""
        return ops.shape(y_pred["masks"][0])[0]

    @staticmethod
    def _divergence_rows(y_pred):
        """The examples the divergence is a mean over (the task outputs' batch)."""
        return ops.shape(keras.tree.flatten(y_pred["clean"])[0])[0]

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if not _is_training_output(y_pred):
            result = super().compute_metrics(x, y, y_pred, sample_weight)
            return {name: value for name, value in result.items() if name not in self._asa_names}
        # Weighted by the rows each averages over: replicas add up exactly
        # (the divergence is the global value on every replica).
        self.divergence_tracker.update_state(
            self.divergence(y_pred), sample_weight=self._divergence_rows(y_pred)
        )
        self.mask_term_tracker.update_state(
            self.mask_term(y_pred), sample_weight=self._rows(y_pred)
        )
        for tracker, mask in zip(self.masked_fraction_trackers, y_pred["masks"]):
            fraction, pairs = masked_fraction(mask, y_pred["padding_mask"])
            tracker.update_state(fraction, sample_weight=pairs)
        return super().compute_metrics(x, y, y_pred["clean"], sample_weight)

    @property
    def _asa_names(self):
        trackers = [self.divergence_tracker, self.mask_term_tracker]
        return {tracker.name for tracker in trackers + list(self.masked_fraction_trackers)}

    def get_config(self):
        return {
            "task_model": keras.saving.serialize_keras_object(self.task_model),
            "tau": self.tau,
            "layers": self.layers_argument,
            "alpha": self.alpha,
            "task": "auto" if self.task == "custom" else self.task,
            "divergence": keras.saving.serialize_keras_object(self.divergence_fn),
            "mask_semantics": self.mask_semantics,
            "noise": self.noise,
            "token_divergence": self.token_divergence,
            "seed": self.seed,
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        # Deserialising a functional model consumes the dict it is given:
        # keep the caller's config as it was.
        config = copy.deepcopy(config)
        config["task_model"] = keras.saving.deserialize_keras_object(config["task_model"])
        config["divergence"] = keras.saving.deserialize_keras_object(config["divergence"])
        return cls(**config)


def _resolve_task(task, task_model, backbone):
    """The task kind, from ``task`` or the task model's output shape."""
    outputs = task_model.outputs
    if len(outputs) != 1:
        raise ValueError(
            f"This task model has {len(outputs)} outputs; ASA's official divergences are "
            "defined for one output of logits. Pass `divergence=` (a callable of the clean and "
            "adversarial outputs)."
        )
    shape = tuple(outputs[0].shape)
    if task != "auto":
        expected_rank = 3 if task == "token_classification" else 2
        if len(shape) != expected_rank:
            raise ValueError(
                f"task={task!r} expects outputs of rank {expected_rank}; this model's output has "
                f"shape {shape}."
            )
        return task
    if len(shape) == 3:
        return "token_classification"
    if len(shape) == 2 and shape[-1] == 1:
        return "regression"
    if len(shape) == 2 and shape[-1] is not None:
        return "classification"
    raise ValueError(
        f"Cannot tell the task kind from an output of shape {shape} (a span or pointer head has "
        "no official ASA divergence). Pass task= or divergence=."
    )


def with_asa(task_model, tau=0.5, layers=None, **options):
    """ASA fine-tuning in one line: an `ASATrainer` around ``task_model``.

    If ``task_model`` is already compiled, the trainer is compiled with the
    same arguments (the same loss, metrics of the same configuration,
    ``jit_compile``, and the task model's optimizer itself, with every
    setting it holds, ``exclude_from_weight_decay`` included; an optimizer
    that was built already is replaced by a new one with the same
    configuration and exclusions), so ``trainer.fit(...)`` works at once;
    otherwise compile the trainer as you would the model.

    Args:
        task_model: see `ASATrainer`.
        tau: float >= 0, the mask penalty's temperature (0.5 officially).
        layers: layer indices to attack, or None for every layer.
        **options: the other `ASATrainer` arguments (``alpha``, ``task``,
            ``divergence``, ``mask_semantics``, ``noise``,
            ``token_divergence``, ``seed``).

    Returns:
        An `ASATrainer`. ``trainer.inference_model`` is ``task_model``.

    Example:
    ```python
    trainer = keras_masking.with_asa(classifier)   # classifier compiled before
    trainer.fit(features, labels, epochs=3)
    classifier.save("classifier.keras")            # no adversary weights
    ```
    """
    trainer = ASATrainer(task_model, tau=tau, layers=layers, **options)
    if getattr(task_model, "compiled", False):
        _compile_like(trainer, task_model)
    return trainer


#: Optimizer settings Keras keeps outside `get_config` (set by
#: ``exclude_from_weight_decay``).
_UNCONFIGURED_OPTIMIZER_SETTINGS = (
    "_exclude_from_weight_decay",
    "_exclude_from_weight_decay_pattern",
)


def _compile_like(trainer, task_model):
    """Compiles ``trainer`` with the arguments ``task_model`` was compiled with.

    The objects themselves, not a copy rebuilt from their configs: an
    optimizer holds settings that its config does not (the variables
    ``exclude_from_weight_decay`` keeps from decay, a loss scale's inner
    optimizer), and a loss may be a function with no config. The trainer
    takes over the task model's optimizer when it has not been built yet (it
    is then built on the trainer's variables, adversaries included). A built
    one (the task model trained already) tracks the task model's variables
    only: the trainer gets a new optimizer from its config with the
    weight-decay exclusions carried over, and its moments start afresh.
    Compiled metric objects are copied (the two models must not share their
    state).
    """
    config = getattr(task_model, "_compile_config", None)
    if config is None:  # a compile that Keras' did not record
        trainer.compile_from_config(task_model.get_compile_config())
        return
    arguments = dict(config.config)
    optimizer = task_model.optimizer
    if optimizer is not None and getattr(optimizer, "built", False):
        _LOGGER.warning(
            "The task model's optimizer was built (trained) already; the ASA trainer gets a new "
            "%s with the same configuration and weight-decay exclusions, whose moments and step "
            "count start from 0.",
            type(optimizer).__name__,
        )
        optimizer = _unbuilt_copy(optimizer)
    arguments["optimizer"] = optimizer
    for key in ("metrics", "weighted_metrics"):
        arguments[key] = keras.tree.map_structure(_fresh_metric, arguments.get(key))
    trainer.compile(**arguments)


def _fresh_metric(metric):
    if isinstance(metric, keras.metrics.Metric):
        return keras.metrics.deserialize(keras.metrics.serialize(metric))
    return metric


def _unbuilt_copy(optimizer):
    """A new optimizer with ``optimizer``'s configuration and exclusions."""
    copy_ = type(optimizer).from_config(optimizer.get_config())
    pairs = [(optimizer, copy_)]
    if hasattr(optimizer, "inner_optimizer"):  # LossScaleOptimizer
        pairs.append((optimizer.inner_optimizer, copy_.inner_optimizer))
    for source, target in pairs:
        for name in _UNCONFIGURED_OPTIMIZER_SETTINGS:
            if hasattr(source, name):
                setattr(target, name, copy.copy(getattr(source, name)))
        target._exclude_from_weight_decay_cache = {}
    return copy_
