"""ExLMPretrainer: masking, [MASK] state expansion, encoder, LM head, DAG loss."""

import math

import keras
import numpy as np
from keras import ops

from keras_masking.distribution.random import batch_randint
from keras_masking.distribution.random import batch_uniform
from keras_masking.distribution.replicas import replica_share
from keras_masking.layers.dag_transition import DAGTransition
from keras_masking.layers.initializers import bert_initializer
from keras_masking.layers.masked_lm_head import MaskedLMHead
from keras_masking.layers.state_expansion import StateExpansion
from keras_masking.losses.dag_loss import dag_alignment_feasible
from keras_masking.losses.dag_loss import dag_alignment_posterior
from keras_masking.losses.dag_loss import dag_loss
from keras_masking.models.exlm_encoder import ExLMEncoder
from keras_masking.models.exlm_encoder import ExLMModel
from keras_masking.models.exlm_encoder import plain_position_ids
from keras_masking.ops.label_range import nan_for_labels_out_of_range
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.ops.token_dropping import kept_indices
from keras_masking.ops.token_selection import select_tokens
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.eager_checks import concrete_value
from keras_masking.utils.eager_checks import non_finite_variables

# The constructor arguments `get_config` adds to `ExLMModel`'s.
_CONFIG_NAMES = ("mask_rate", "replacement", "objective", "transition_heads", "seed")
_CONFIG_NAMES += ("max_special_tokens",)
SAMPLE_WEIGHTS_REFUSED = (
    "ExLMPretrainer does not weight examples: its loss and metrics average every masked "
    "token (objective='mlm') or every example's alignment (objective='exlm'). Expected no "
    "sample_weight or class_weight (and a dataset of inputs only); repeat or drop examples "
    "to change their share instead."
)


def _refuse_sample_weights(kwargs):
    """Raises before anything runs if ``fit``/``evaluate`` got example weights."""
    if any(kwargs.get(name) is not None for name in ("sample_weight", "class_weight")):
        raise ValueError(SAMPLE_WEIGHTS_REFUSED)


def _any_equal(token_ids, ids):
    """bool ``(B, L)``: the token is one of ``ids``."""
    found = ops.zeros_like(token_ids, dtype="bool")
    for token_id in ids:
        found = found | ops.equal(token_ids, token_id)
    return found


def state_entropy(logits):
    """Entropy (nats) of ``softmax(logits)`` per row: ``(..., V)`` -> ``(...)``."""
    logits = ops.cast(logits, "float32")
    log_p = logits - ops.logsumexp(logits, axis=-1, keepdims=True)
    return -ops.sum(ops.exp(log_p) * log_p, axis=-1)


def _weighted_mean(values, weights):
    weights = ops.cast(weights, "float32")
    return ops.sum(values * weights) / ops.maximum(ops.sum(weights), 1.0)


def _masked_cross_entropy(y_pred):
    """``(mean cross-entropy over the masked tokens, their count)`` of a batch."""
    weights = ops.cast(y_pred["label_mask"], "float32")
    labels, vocabulary = y_pred["labels"], ops.shape(y_pred["logits"])[-1]
    # An out-of-range id picked as a label: NaN, not a kernel error or a clamped read.
    safe = ops.where((labels >= 0) & (labels < vocabulary), labels, 0)
    losses = keras.losses.sparse_categorical_crossentropy(safe, y_pred["logits"], from_logits=True)
    count = ops.sum(weights)
    mean = ops.sum(losses * weights) / ops.maximum(count, 1.0)
    return nan_for_labels_out_of_range(mean, labels, vocabulary), count


def prediction_entropy(logits, weights):
    """Mean entropy (nats) of ``softmax(logits)`` over the weighted rows."""
    return _weighted_mean(state_entropy(logits), weights)


@keras.saving.register_keras_serializable(package="keras_masking")
class ExLMPretrainer(ExLMModel):
    """ExLM pretraining (or plain MLM on the same masking) as a Keras model.

    In each step: pick ``mask_rate`` of the real, non-special tokens (at
    most ``ceil(mask_rate * L)``); replace them by [MASK] (the official
    recipe) or by BERT's 80/10/10; expand every picked and every special
    token into ``k`` states (`StateExpansion`, 2D positions); run the
    ``rotary2d`` backbone; on the expanded states only, compute the LM
    head's emission log-probs of the targets ``[CLS], the picked tokens in
    order, [SEP]...`` and the `DAGTransition` log transition matrix; the
    loss is ``-mean_b(log P(Y_b) / |Y_b|)`` from `dag_loss`. With
    ``objective="mlm"`` the same masking trains a plain MLM (no expansion,
    ``pos2 = 0``), for comparison. Padding may sit anywhere in a row: the
    positions and the masking draws count the real tokens only.

    A step compiles once: the expanded sequence has room for ``E =
    min(ceil(mask_rate * L) + max_special_tokens, L)`` expanded tokens (None:
    every token); a row with more raises in eager calls and, in compiled
    steps, adds 0 to the loss (it still counts in the mean over the batch's
    rows, as an impossible alignment does) and is counted in ``overflow``.
    The metrics
    ``entropy``, ``aligned_entropy``, ``impossible`` (alignments that cannot
    exist, loss 0 as in the official code) and ``overflow`` are weighted so
    that a data-parallel step reports what one device reports
    (docs/exlm.md).

    Outputs of a call (ExLM): ``match`` ``(B, T, N)`` (the emission
    log-probs ``log P_u(y_i)``), ``log_transitions`` ``(B, N, N)``,
    ``output_length`` and ``target_length`` ``(B,)``, ``targets`` ``(B, T)``,
    ``vertex_slots`` ``(B, N)`` (each vertex's slot in the expanded
    sequence), ``picked`` ``(B, L)``, ``target_is_mask`` ``(B, T)``,
    ``overflow`` ``(B,)``, ``state_entropy`` ``(B, N)``, ``state_is_mask``
    ``(B, N)`` and ``entropy``. MLM: ``logits``, ``labels``, ``label_mask``,
    ``picked`` and ``overflow``.

    Args:
        backbone: a `TransformerBackbone` with ``position="rotary2d"`` and
            ``custom_position_ids=True``.
        k: int >= 1, states per expanded token (4).
        mask_rate: float in (0, 1), share of tokens picked (0.15).
        mask_token_id: int, the [MASK] id.
        unselectable_token_ids: ids never picked and always expanded ([CLS],
            [SEP]).
        replacement: ``"mask"`` (all [MASK], official) or ``"bert"`` (80/10/10).
        objective: ``"exlm"`` or ``"mlm"``.
        transition_heads: int >= 1, heads of `DAGTransition`; must divide the
            backbone's hidden width.
        seed: int or None.
        max_special_tokens: int >= 0 or None, the most always-expanded tokens
            in one row (see above).
        **kwargs: `keras.Model` arguments.

    Example:
    ```python
    pretrainer = keras_masking.models.ExLMPretrainer(backbone, k=4, mask_token_id=103,
                                                     unselectable_token_ids=(101, 102))
    pretrainer.compile(optimizer=keras.optimizers.AdamW(1e-4), jit_compile=True)
    pretrainer.fit({"token_ids": ids, "segment_ids": segments, "padding_mask": mask})
    ```
    """

    def __init__(
        self,
        backbone,
        k=4,
        mask_rate=0.15,
        mask_token_id=103,
        unselectable_token_ids=(101, 102),
        replacement="mask",
        objective="exlm",
        transition_heads=4,
        seed=None,
        max_special_tokens=3,
        **kwargs,
    ):
        super().__init__(backbone, k, mask_token_id, unselectable_token_ids, **kwargs)
        self.mask_rate = check_float("mask_rate", mask_rate, 0.0, 1.0, True, True)
        self.replacement = check_choice("replacement", replacement, ("mask", "bert"))
        self.objective = check_choice("objective", objective, ("exlm", "mlm"))
        self.transition_heads = check_int("transition_heads", transition_heads, minimum=1)
        if backbone.hidden_dim % self.transition_heads:
            raise ValueError(
                "Expected transition_heads to divide the backbone's hidden width "
                f"{backbone.hidden_dim}. Received: transition_heads={transition_heads}."
            )
        self.seed = check_seed("seed", seed)
        if max_special_tokens is not None:
            max_special_tokens = check_int("max_special_tokens", max_special_tokens, minimum=0)
        self.max_special_tokens = max_special_tokens
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.lm_head = MaskedLMHead(
            backbone.token_embedding,
            activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            kernel_initializer=bert_initializer(),
            name="mlm_head",
        )
        self.transition = None
        self.entropy_tracker = keras.metrics.Mean(name="entropy")
        self.aligned_entropy_tracker = keras.metrics.Mean(name="aligned_entropy")
        self.impossible_tracker = keras.metrics.Mean(name="impossible")
        self.overflow_tracker = keras.metrics.Mean(name="overflow")
        # objective "mlm": the loss over every masked token (`get_metrics_result`).
        self.token_loss_tracker = keras.metrics.Mean(name="token_loss")

    # === Sizes (static, from the input length) ===
    def max_picked(self, length):
        """The most tokens picked in a sequence of ``length``."""
        return max(1, math.ceil(self.mask_rate * length))

    def max_targets(self, length):
        """Expanded tokens (targets) a row of ``length`` has room for."""
        if self.max_special_tokens is None:
            return length
        return min(self.max_picked(length) + self.max_special_tokens, length)

    def expansion(self, length):
        """The `StateExpansion` used for input length ``length``."""
        return StateExpansion(
            k=self.k,
            mask_token_id=self.mask_token_id,
            expand_token_ids=self.unselectable_token_ids,
            max_expanded_tokens=self.max_targets(length),
        )

    def build(self, input_shape):
        if not isinstance(input_shape, dict) or "token_ids" not in input_shape:
            raise ValueError(
                "Expected inputs with the keys ['token_ids', 'padding_mask'] (and optionally "
                f"'segment_ids'). Received: {input_shape!r}."
            )
        length = input_shape["token_ids"][1]
        self.lm_head.build((None, None, self.backbone.hidden_dim), (None, None))
        if self.objective == "exlm":
            # The slot embedding reads each state's position in the expanded
            # sequence, as the official code's link positions do.
            self.transition = DAGTransition(
                self.transition_heads,
                max_vertices=self.expansion(length or 512).output_length(length or 512),
                name="dag_transition",
            )
            self.transition.build((None, None, self.backbone.hidden_dim))
        self.built = True

    # === Masking ===
    def special_mask(self, token_ids, padding_mask):
        """bool ``(B, L)``: real tokens that are always expanded.

        Those in ``unselectable_token_ids`` and any [MASK] already in the input;
        ``max_special_tokens`` bounds their count per row.
        """
        always = _any_equal(token_ids, self.unselectable_token_ids + (self.mask_token_id,))
        return always & ops.cast(padding_mask, "bool")

    def pick_tokens(self, token_ids, padding_mask):
        """bool ``(B, L)``: the tokens to predict, stochastic count per row.

        The draws are made per real token (in order), so the picks do not
        depend on where the padding sits.
        """
        candidates = self.special_mask(token_ids, padding_mask)
        candidates = ops.cast(padding_mask, "bool") & ~candidates
        batch = ops.shape(token_ids)[0]
        # Per-example draws: replicas of a data-parallel step draw their own
        # rows of the global batch's draws (see `batch_uniform`).
        rounding = batch_uniform((batch,), self.seed_generator)
        noise = batch_uniform(ops.shape(token_ids), self.seed_generator)
        rank = plain_position_ids(token_ids, padding_mask)[..., 0]
        noise = ops.take_along_axis(noise, rank, axis=1)
        return select_tokens(
            candidates,
            self.mask_rate,
            noise,
            rounding,
            min_count=1,
            max_count=self.max_picked(token_ids.shape[1]),
        )

    def corrupt(self, token_ids, picked, padding_mask=None):
        """Replaces the picked tokens ([MASK], or BERT's 80/10/10)."""
        masked = ops.where(picked, self.mask_token_id, token_ids)
        if self.replacement == "mask":
            return masked
        draw = batch_uniform(ops.shape(token_ids), self.seed_generator)
        vocabulary = self.backbone.vocabulary_size
        random_ids = batch_randint(ops.shape(token_ids), 0, vocabulary, self.seed_generator)
        if padding_mask is not None:  # per real token, as the picks
            rank = plain_position_ids(token_ids, padding_mask)[..., 0]
            draw = ops.take_along_axis(draw, rank, axis=1)
            random_ids = ops.take_along_axis(random_ids, rank, axis=1)
        replaced = ops.where(draw < 0.8, self.mask_token_id, token_ids)
        replaced = ops.where(draw >= 0.9, random_ids, replaced)
        return ops.where(picked, replaced, token_ids)

    # === Forward ===
    def call(self, inputs, training=False):
        token_ids, padding_mask, segment_ids = self.checked_inputs(inputs)
        if self.objective == "exlm":
            self._check_expanded_length(token_ids.shape[1])
            self._check_special_count(token_ids, padding_mask)
        picked = self.pick_tokens(token_ids, padding_mask)
        corrupted = self.corrupt(token_ids, picked, padding_mask)
        args = (token_ids, corrupted, segment_ids, padding_mask, picked, training)
        if self.objective == "mlm":
            return self._mlm_outputs(*args)
        return self._exlm_outputs(*args)

    def _special_count(self, token_ids, padding_mask):
        return ops.sum(ops.cast(self.special_mask(token_ids, padding_mask), "int32"), axis=1)

    def _special_overflow(self, token_ids, padding_mask):
        """bool ``(B,)``: rows with more than ``max_special_tokens`` special tokens."""
        if self.max_special_tokens is None:
            return ops.zeros((ops.shape(token_ids)[0],), "bool")
        return self._special_count(token_ids, padding_mask) > self.max_special_tokens

    def _check_expanded_length(self, length):
        expanded = self.expansion(length).output_length(length)
        if expanded > self.transition.max_vertices:
            raise ValueError(
                f"Sequences of {length} tokens expand to {expanded} slots, more than this "
                f"pretrainer was built for ({self.transition.max_vertices}). Build it on the "
                "longest length first."
            )

    def _check_special_count(self, token_ids, padding_mask):
        if self.max_special_tokens is None or concrete_value(token_ids) is None:
            return
        count = concrete_value(self._special_count(token_ids, padding_mask))
        rows = [] if count is None else np.flatnonzero(count > self.max_special_tokens).tolist()
        if rows:
            raise ValueError(
                f"Rows {rows} hold {count[rows].tolist()} special tokens (ids "
                f"{list(self.unselectable_token_ids)}, or [MASK] {self.mask_token_id}), more than "
                f"max_special_tokens={self.max_special_tokens}: their expansion would not "
                "fit. Raise `max_special_tokens`, or set it to None to size the expansion "
                "for any input."
            )

    def _mlm_outputs(self, token_ids, corrupted, segment_ids, padding_mask, picked, training):
        length = token_ids.shape[1]
        positions = plain_position_ids(token_ids, padding_mask)
        hidden = self.backbone.embed(corrupted, segment_ids, positions, training=training)
        hidden = self.backbone.encode(hidden, padding_mask, positions, training=training)
        mask_positions = kept_indices(picked, self.max_picked(length))
        label_mask = ops.take_along_axis(picked, mask_positions, axis=1)
        logits = ops.cast(self.lm_head(hidden, mask_positions), "float32")
        labels = ops.take_along_axis(token_ids, mask_positions, axis=1)
        return {
            "logits": logits,
            "labels": labels,
            "label_mask": label_mask,
            "picked": picked,
            "overflow": ops.zeros((ops.shape(token_ids)[0],), "bool"),
        }

    def _exlm_outputs(self, token_ids, corrupted, segment_ids, padding_mask, picked, training):
        length = token_ids.shape[1]
        real = ops.cast(padding_mask, "bool")
        expand = (picked | _any_equal(token_ids, self.unselectable_token_ids)) & real
        expansion = self.expansion(length)
        expanded = expansion(corrupted, padding_mask, expand_mask=expand)
        segments = ops.take_along_axis(segment_ids, expanded["source_index"], axis=1)
        positions = expanded["position_ids"]
        hidden = self.backbone.embed(expanded["token_ids"], segments, positions, training=training)
        hidden = self.backbone.encode(
            hidden, expanded["padding_mask"], positions, training=training
        )
        # DAG vertices: the expanded states, in order.
        targets_count = self.max_targets(length)
        vertices = self.k * targets_count
        vertex_slots = kept_indices(expanded["expanded_mask"], vertices)
        output_length = ops.minimum(
            ops.sum(ops.cast(expanded["expanded_mask"], "int32"), axis=1), vertices
        )
        vertex_mask = ops.arange(vertices, dtype="int32")[None, :] < output_length[:, None]
        vertex_slots = ops.where(vertex_mask, vertex_slots, 0)
        vertex_hidden = batched_gather(hidden, vertex_slots)
        logits = ops.cast(self.lm_head(hidden, vertex_slots), "float32")  # (B, N, V)
        # Targets: the expanded tokens' original ids, in order.
        target_index = kept_indices(expand, targets_count)
        target_length = ops.minimum(ops.sum(ops.cast(expand, "int32"), axis=1), targets_count)
        live_target = ops.arange(targets_count, dtype="int32")[None, :] < target_length[:, None]
        targets = ops.where(live_target, ops.take_along_axis(token_ids, target_index, axis=1), 0)
        normaliser = ops.logsumexp(logits, axis=-1)  # (B, N), once
        target_logits = batched_gather(ops.transpose(logits, (0, 2, 1)), targets)  # (B, T, N)
        match = target_logits - normaliser[:, None, :]
        log_transitions = self.transition(vertex_hidden, vertex_mask, slot_index=vertex_slots)
        source = batched_gather(expanded["source_index"][..., None], vertex_slots)[..., 0]
        mask_state = ops.take_along_axis(picked, source, axis=1) & vertex_mask
        entropies = state_entropy(logits)  # (B, N)
        return {
            "match": match,
            "log_transitions": log_transitions,
            "output_length": output_length,
            "target_length": target_length,
            "targets": targets,
            "vertex_slots": vertex_slots,
            "picked": picked,
            "overflow": self._special_overflow(token_ids, padding_mask),
            "entropy": _weighted_mean(entropies, mask_state),
            "state_entropy": entropies,
            "state_is_mask": mask_state,
            "target_is_mask": ops.take_along_axis(picked, target_index, axis=1) & live_target,
        }

    # === Fine-tuning ===
    def fine_tuning_encoder(self, max_expanded_tokens=3):
        """The backbone as fine-tuning runs it, an `ExLMEncoder`.

        For ``objective="exlm"``: [CLS]/[SEP] expanded into ``k`` copies,
        the first [CLS] copy pooled, no transition head. For
        ``objective="mlm"``: no expansion, ``(index, 0)`` positions, as in
        its pretraining.

        Args:
            max_expanded_tokens: int >= 0 or None, the most [CLS]/[SEP] (and
                [MASK]) tokens in one fine-tuning example; None for any
                number.

        Returns:
            An `ExLMEncoder` sharing this pretrainer's backbone.

        Example:
        ```python
        # backbone: a TransformerBackbone(position="rotary2d", custom_position_ids=True)
        pretrainer = keras_masking.models.ExLMPretrainer(backbone, k=2, transition_heads=2)
        encoder = pretrainer.fine_tuning_encoder()
        pooled = encoder(features)["pooled_output"]
        ```
        """
        return ExLMEncoder(
            self.backbone,
            k=self.k if self.objective == "exlm" else 1,
            mask_token_id=self.mask_token_id,
            unselectable_token_ids=self.unselectable_token_ids,
            max_expanded_tokens=max_expanded_tokens,
            objective=self.objective,
        )

    # === Loss and metrics ===
    @staticmethod
    def _dag_arguments(y_pred):
        """`dag_loss`'s arguments; overflowing rows get target length 0 (left out)."""
        target_length = y_pred["target_length"]
        if "overflow" in y_pred:
            target_length = ops.where(y_pred["overflow"], 0, ops.cast(target_length, "int32"))
        return y_pred["match"], y_pred["log_transitions"], y_pred["output_length"], target_length

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if sample_weight is not None:  # a dataset that yields weights
            raise ValueError(SAMPLE_WEIGHTS_REFUSED)
        if self.objective == "mlm":
            # Under tf.distribute, this replica's share of the global mean
            # (NaN for an out-of-range label: `_masked_cross_entropy`).
            return replica_share(*_masked_cross_entropy(y_pred))
        arguments = self._dag_arguments(y_pred)
        log_likelihood = dag_loss(*arguments)
        lengths = ops.cast(ops.maximum(arguments[3], 1), "float32")
        loss = replica_share(-ops.mean(log_likelihood / lengths), ops.shape(lengths)[0])
        # A picked out-of-range id is masked in the input but read as a target
        # (a gather that clamps): NaN, as the backbone's row for it.
        return nan_for_labels_out_of_range(loss, x["token_ids"], self.backbone.vocabulary_size)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        # Each mean is weighted by what it averages over (masked states,
        # masked targets, examples), so that the means of the replicas of a
        # tf.distribute step add up to the mean over the global batch.
        overflow = ops.cast(y_pred["overflow"], "float32")
        examples = ops.cast(ops.shape(overflow)[0], "float32")
        if self.objective == "mlm":
            entropy = prediction_entropy(y_pred["logits"], y_pred["label_mask"])
            entropy_count = ops.sum(ops.cast(y_pred["label_mask"], "float32"))
            aligned, aligned_count, impossible = entropy, entropy_count, 0.0
            self.token_loss_tracker.update_state(*_masked_cross_entropy(y_pred))
        else:
            entropy = y_pred["entropy"]
            entropy_count = ops.sum(ops.cast(y_pred["state_is_mask"], "float32"))
            feasible = dag_alignment_feasible(y_pred["output_length"], y_pred["target_length"])
            impossible = ops.mean(ops.cast(~feasible, "float32") * (1.0 - overflow))
            aligned, aligned_count = self._aligned_entropy_and_count(y_pred)
        self.entropy_tracker.update_state(entropy, sample_weight=entropy_count)
        self.aligned_entropy_tracker.update_state(aligned, sample_weight=aligned_count)
        self.impossible_tracker.update_state(impossible, sample_weight=examples)
        self.overflow_tracker.update_state(ops.mean(overflow), sample_weight=examples)
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def get_metrics_result(self):
        """Keras' results; for objective ``"mlm"``, ``loss`` is the mean over
        every masked token of the batches so far (Keras averages the
        batches' losses by their number of rows)."""
        results = super().get_metrics_result()
        token_loss = results.pop("token_loss", None)
        if self.objective == "mlm" and token_loss is not None and "loss" in results:
            results["loss"] = token_loss
        return results

    def aligned_entropy(self, y_pred):
        """Mean entropy of the states that emit the masked targets.

        Each masked target's expected state entropy under the DAG alignment
        posterior (`dag_alignment_posterior`), averaged over masked targets of
        feasible examples: ExLM's counterpart of MLM's per-mask entropy, which
        the ``entropy`` metric (every state of every [MASK]) is not, since a
        target is emitted by one of its ``k`` states.

        Args:
            y_pred: the outputs of a call (``match``, ``log_transitions``,
                ``output_length``, ``target_length``, ``state_entropy``,
                ``target_is_mask``; ``overflow`` optional).

        Returns:
            A float32 scalar.

        Example:
        ```python
        pretrainer = keras_masking.models.ExLMPretrainer(backbone, k=2, transition_heads=2)
        y_pred = pretrainer(features)  # token_ids, padding_mask (, segment_ids)
        value = pretrainer.aligned_entropy(y_pred)
        ```
        """
        return self._aligned_entropy_and_count(y_pred)[0]

    def _aligned_entropy_and_count(self, y_pred):
        """`aligned_entropy` and the number of masked targets it averages."""
        posterior = dag_alignment_posterior(*self._dag_arguments(y_pred))
        per_target = ops.sum(posterior * y_pred["state_entropy"][:, None, :], axis=2)
        feasible = ops.sum(posterior, axis=(1, 2)) > 0
        weights = y_pred["target_is_mask"] & feasible[:, None]
        return _weighted_mean(per_target, weights), ops.sum(ops.cast(weights, "float32"))

    # === Training ===
    def evaluate(self, *args, **kwargs):
        """`keras.Model.evaluate`; refuses ``sample_weight`` (see `fit`)."""
        _refuse_sample_weights(kwargs)
        return super().evaluate(*args, **kwargs)

    def fit(self, *args, **kwargs):
        """`keras.Model.fit`, stopped with an error at the first non-finite loss.

        A NaN or infinite weight makes every later step NaN, so ``fit``
        refuses a model that already holds one (naming the weight), and
        raises a `FloatingPointError` naming the epoch and batch at the first
        non-finite loss (Keras' `TerminateOnNaN` would stop silently).
        Example weights (``sample_weight``, ``class_weight``) are refused:
        the objectives average every masked token or example.

        Args:
            *args, **kwargs: `keras.Model.fit` arguments.

        Returns:
            The `keras.callbacks.History`.
        """
        _refuse_sample_weights(kwargs)
        for path, count in non_finite_variables(self.variables)[:1]:
            raise ValueError(
                f"Expected finite weights to train {type(self).__name__}. Received: "
                f"{path!r} holds {count} NaN or infinite value(s); a step on it gives "
                "NaN everywhere. Reload the weights from a good checkpoint."
            )
        stop = StopOnNonFiniteLoss(type(self).__name__)
        if len(args) > 5:  # callbacks passed by position
            args = list(args)
            args[5] = [*(args[5] or []), stop]
        else:
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), stop]
        return super().fit(*args, **kwargs)

    def get_config(self):
        return {**super().get_config(), **{name: getattr(self, name) for name in _CONFIG_NAMES}}


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops ``fit`` with a `FloatingPointError` at the first non-finite loss.

    Args:
        who: the model's name in the message.

    Example:

    >>> callback = StopOnNonFiniteLoss("ExLMPretrainer")  # fit(..., callbacks=[callback])
    >>> callback.who
    'ExLMPretrainer'
    """

    def __init__(self, who="model"):
        super().__init__()
        self.who = who
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        loss = float(np.asarray(keras.ops.convert_to_numpy(loss)))
        if not math.isfinite(loss):
            self.model.stop_training = True
            raise FloatingPointError(
                f"{self.who}.fit stopped: the loss is {loss} at epoch {self.epoch + 1}, batch "
                f"{batch + 1}, so the weights now hold NaN or infinite values. Expected a finite "
                "loss: lower the learning rate, clip gradients (the optimizer's clipnorm), or "
                "look for a bad batch; then reload the weights from before this step."
            )
