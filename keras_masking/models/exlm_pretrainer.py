"""ExLMPretrainer: masking, [MASK] state expansion, encoder, LM head, DAG loss."""

import math

import keras
from keras import ops

from keras_masking.layers.dag_transition import DAGTransition
from keras_masking.layers.initializers import bert_initializer
from keras_masking.layers.masked_lm_head import MaskedLMHead
from keras_masking.layers.state_expansion import StateExpansion
from keras_masking.losses.dag_loss import dag_alignment_feasible
from keras_masking.losses.dag_loss import dag_alignment_posterior
from keras_masking.losses.dag_loss import dag_loss
from keras_masking.models.exlm_encoder import ExLMEncoder
from keras_masking.models.exlm_encoder import plain_position_ids
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.ops.token_dropping import kept_indices


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


def prediction_entropy(logits, weights):
    """Mean entropy (nats) of ``softmax(logits)`` over the weighted rows."""
    return _weighted_mean(state_entropy(logits), weights)


@keras.saving.register_keras_serializable(package="keras_masking")
class ExLMPretrainer(keras.Model):
    """ExLM pretraining (or plain MLM on the same masking) as a Keras model.

    In each step: pick ``mask_rate`` of the real, non-special tokens (at
    most ``ceil(mask_rate * L)``); replace them by [MASK] (the official
    recipe) or by BERT's 80/10/10; expand every picked token and every
    special token into ``k`` states (`StateExpansion`, 2D positions); run the
    backbone (``position="rotary2d"``); on the expanded states only, compute
    the LM head's emission log-probs of the targets ``[CLS], the picked tokens
    in order, [SEP]...`` and the `DAGTransition` log transition matrix; the
    loss is ``-mean_b(log P(Y_b) / |Y_b|)`` from `dag_loss`. With
    ``objective="mlm"`` the same masking trains a plain MLM (no expansion,
    ``pos2 = 0``), for comparison.

    Metrics: ``entropy`` (mean entropy of the predicted distributions at the
    masked positions; for ExLM over every [MASK] state), ``aligned_entropy``
    (for ExLM, each masked target's state entropy weighted by the alignment
    posterior, see `aligned_entropy`; for MLM equal to ``entropy``) and
    ``impossible`` (share of examples whose alignment is impossible; their
    loss is 0, as in the official code).

    Args:
        backbone: a `TransformerBackbone` with ``position="rotary2d"`` and
            ``custom_position_ids=True``.
        k: int, states per expanded token (4).
        mask_rate: float, share of tokens picked (0.15).
        mask_token_id: int, the [MASK] id.
        special_token_ids: ids never picked and always expanded ([CLS], [SEP]).
        replacement: ``"mask"`` (all [MASK], official) or ``"bert"`` (80/10/10).
        objective: ``"exlm"`` or ``"mlm"``.
        transition_heads: int, heads of `DAGTransition`.
        seed: int or None.
        **kwargs: `keras.Model` arguments.

    Example:
    ```python
    pretrainer = keras_masking.models.ExLMPretrainer(backbone, k=4, mask_token_id=103,
                                                     special_token_ids=(101, 102))
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
        special_token_ids=(101, 102),
        replacement="mask",
        objective="exlm",
        transition_heads=4,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if getattr(backbone, "position", None) != "rotary2d" or not backbone.custom_position_ids:
            raise ValueError(
                "ExLM needs a TransformerBackbone with position='rotary2d' and "
                "custom_position_ids=True."
            )
        if replacement not in ("mask", "bert"):
            raise ValueError(f"`replacement` must be 'mask' or 'bert'. Received: {replacement!r}")
        if objective not in ("exlm", "mlm"):
            raise ValueError(f"`objective` must be 'exlm' or 'mlm'. Received: {objective!r}")
        if not 0 < mask_rate < 1:
            raise ValueError(f"`mask_rate` must be in (0, 1). Received: {mask_rate}")
        self.backbone = backbone
        self.k = int(k)
        self.mask_rate = float(mask_rate)
        self.mask_token_id = int(mask_token_id)
        self.special_token_ids = tuple(int(i) for i in special_token_ids)
        self.replacement = replacement
        self.objective = objective
        self.transition_heads = int(transition_heads)
        self.seed = seed
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

    # === Sizes (static, from the input length) ===
    def max_picked(self, length):
        """The most tokens picked in a sequence of ``length``."""
        return max(1, math.ceil(self.mask_rate * length))

    def max_targets(self, length):
        """Targets: picked tokens plus [CLS] and up to two [SEP]s."""
        return min(self.max_picked(length) + 3, length)

    def expansion(self, length):
        """The `StateExpansion` used for input length ``length``."""
        return StateExpansion(
            k=self.k,
            mask_token_id=self.mask_token_id,
            expand_token_ids=self.special_token_ids,
            max_expanded_tokens=self.max_targets(length),
        )

    def build(self, input_shape):
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
    def pick_tokens(self, token_ids, padding_mask):
        """bool ``(B, L)``: the tokens to predict, stochastic count per row."""
        real = ops.cast(padding_mask, "bool")
        never_picked = self.special_token_ids + (self.mask_token_id,)
        candidates = real & ~_any_equal(token_ids, never_picked)
        length = token_ids.shape[1]
        count = ops.sum(ops.cast(candidates, "float32"), axis=1)
        batch = ops.shape(token_ids)[0]
        rounding = keras.random.uniform((batch,), seed=self.seed_generator)
        picks = ops.floor(self.mask_rate * count + rounding)
        picks = ops.clip(picks, ops.minimum(count, 1.0), float(self.max_picked(length)))
        noise = keras.random.uniform(ops.shape(token_ids), seed=self.seed_generator)
        score = ops.where(candidates, noise, 2.0)
        rank = ops.argsort(ops.argsort(score, axis=1), axis=1)
        return candidates & (ops.cast(rank, "float32") < picks[:, None])

    def corrupt(self, token_ids, picked):
        """Replaces the picked tokens ([MASK], or BERT's 80/10/10)."""
        masked = ops.where(picked, self.mask_token_id, token_ids)
        if self.replacement == "mask":
            return masked
        draw = keras.random.uniform(ops.shape(token_ids), seed=self.seed_generator)
        vocabulary = self.backbone.vocabulary_size
        random_ids = keras.random.randint(
            ops.shape(token_ids), 0, vocabulary, dtype="int32", seed=self.seed_generator
        )
        replaced = ops.where(draw < 0.8, self.mask_token_id, token_ids)
        replaced = ops.where(draw >= 0.9, random_ids, replaced)
        return ops.where(picked, replaced, token_ids)

    # === Forward ===
    def call(self, inputs, training=False):
        token_ids = ops.cast(inputs["token_ids"], "int32")
        padding_mask = ops.cast(inputs["padding_mask"], "int32")
        segment_ids = inputs.get("segment_ids")
        if segment_ids is None:
            segment_ids = ops.zeros_like(token_ids)
        picked = self.pick_tokens(token_ids, padding_mask)
        corrupted = self.corrupt(token_ids, picked)
        if self.objective == "mlm":
            return self._mlm_outputs(token_ids, corrupted, segment_ids, padding_mask, picked)
        return self._exlm_outputs(token_ids, corrupted, segment_ids, padding_mask, picked)

    def _mlm_outputs(self, token_ids, corrupted, segment_ids, padding_mask, picked):
        length = token_ids.shape[1]
        positions = plain_position_ids(token_ids)
        hidden = self.backbone.embed(corrupted, segment_ids, positions)
        hidden = self.backbone.encode(hidden, padding_mask, positions)
        count = self.max_picked(length)
        mask_positions = kept_indices(picked, count)
        label_mask = ops.take_along_axis(picked, mask_positions, axis=1)
        logits = ops.cast(self.lm_head(hidden, mask_positions), "float32")
        labels = ops.take_along_axis(token_ids, mask_positions, axis=1)
        return {"logits": logits, "labels": labels, "label_mask": label_mask}

    def _exlm_outputs(self, token_ids, corrupted, segment_ids, padding_mask, picked):
        length = token_ids.shape[1]
        real = ops.cast(padding_mask, "bool")
        expand = (picked | _any_equal(token_ids, self.special_token_ids)) & real
        expansion = self.expansion(length)
        if expansion.output_length(length) > self.transition.max_vertices:
            raise ValueError(
                f"Sequences of {length} tokens expand to {expansion.output_length(length)} "
                f"slots, more than this pretrainer was built for "
                f"({self.transition.max_vertices}). Build it on the longest length first."
            )
        expanded = expansion(corrupted, padding_mask, expand_mask=expand)
        segments = ops.take_along_axis(segment_ids, expanded["source_index"], axis=1)
        hidden = self.backbone.embed(expanded["token_ids"], segments, expanded["position_ids"])
        hidden = self.backbone.encode(hidden, expanded["padding_mask"], expanded["position_ids"])
        # DAG vertices: the expanded states, in order.
        targets_count = self.max_targets(length)
        vertices = self.k * targets_count
        vertex_slots = kept_indices(expanded["expanded_mask"], vertices)
        output_length = ops.minimum(
            ops.sum(ops.cast(expanded["expanded_mask"], "int32"), axis=1), vertices
        )
        vertex_mask = ops.arange(vertices, dtype="int32")[None, :] < output_length[:, None]
        vertex_hidden = batched_gather(hidden, vertex_slots)
        logits = ops.cast(self.lm_head(hidden, vertex_slots), "float32")  # (B, N, V)
        # Targets: the expanded tokens' original ids, in order.
        target_index = kept_indices(expand, targets_count)
        targets = ops.take_along_axis(token_ids, target_index, axis=1)
        target_length = ops.minimum(ops.sum(ops.cast(expand, "int32"), axis=1), targets_count)
        normaliser = ops.logsumexp(logits, axis=-1)  # (B, N), once
        target_logits = batched_gather(ops.transpose(logits, (0, 2, 1)), targets)  # (B, T, N)
        match = target_logits - normaliser[:, None, :]
        log_transitions = self.transition(vertex_hidden, vertex_mask, slot_index=vertex_slots)
        source = batched_gather(expanded["source_index"][..., None], vertex_slots)[..., 0]
        mask_state = ops.take_along_axis(picked, source, axis=1) & vertex_mask
        entropies = state_entropy(logits)  # (B, N)
        live_target = ops.arange(targets_count, dtype="int32")[None, :] < target_length[:, None]
        return {
            "match": match,
            "log_transitions": log_transitions,
            "output_length": output_length,
            "target_length": target_length,
            "entropy": _weighted_mean(entropies, mask_state),
            "state_entropy": entropies,
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
            max_expanded_tokens: int, the most [CLS]/[SEP] (and [MASK]) tokens
                in one fine-tuning example.
        """
        return ExLMEncoder(
            self.backbone,
            k=self.k if self.objective == "exlm" else 1,
            mask_token_id=self.mask_token_id,
            special_token_ids=self.special_token_ids,
            max_expanded_tokens=max_expanded_tokens,
        )

    # === Loss and metrics ===
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if self.objective == "mlm":
            weights = ops.cast(y_pred["label_mask"], "float32")
            losses = keras.losses.sparse_categorical_crossentropy(
                y_pred["labels"], y_pred["logits"], from_logits=True
            )
            return ops.sum(losses * weights) / ops.maximum(ops.sum(weights), 1.0)
        log_likelihood = dag_loss(
            y_pred["match"],
            y_pred["log_transitions"],
            y_pred["output_length"],
            y_pred["target_length"],
        )
        lengths = ops.cast(ops.maximum(y_pred["target_length"], 1), "float32")
        return -ops.mean(log_likelihood / lengths)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if self.objective == "mlm":
            entropy = prediction_entropy(y_pred["logits"], y_pred["label_mask"])
            aligned, impossible = entropy, 0.0
        else:
            entropy = y_pred["entropy"]
            feasible = dag_alignment_feasible(y_pred["output_length"], y_pred["target_length"])
            impossible = ops.mean(ops.cast(~feasible, "float32"))
            aligned = self.aligned_entropy(y_pred)
        self.entropy_tracker.update_state(entropy)
        self.aligned_entropy_tracker.update_state(aligned)
        self.impossible_tracker.update_state(impossible)
        return super().compute_metrics(x, y, y_pred, sample_weight)

    def aligned_entropy(self, y_pred):
        """Mean entropy of the states that emit the masked targets.

        Each masked target's expected state entropy under the DAG alignment
        posterior (`dag_alignment_posterior`), averaged over masked targets of
        feasible examples: ExLM's counterpart of MLM's per-mask entropy, which
        the ``entropy`` metric (every state of every [MASK]) is not, since a
        target is emitted by one of its ``k`` states.
        """
        posterior = dag_alignment_posterior(
            y_pred["match"],
            y_pred["log_transitions"],
            y_pred["output_length"],
            y_pred["target_length"],
        )
        per_target = ops.sum(posterior * y_pred["state_entropy"][:, None, :], axis=2)
        feasible = ops.sum(posterior, axis=(1, 2)) > 0
        return _weighted_mean(per_target, y_pred["target_is_mask"] & feasible[:, None])

    def get_config(self):
        return {
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "k": self.k,
            "mask_rate": self.mask_rate,
            "mask_token_id": self.mask_token_id,
            "special_token_ids": list(self.special_token_ids),
            "replacement": self.replacement,
            "objective": self.objective,
            "transition_heads": self.transition_heads,
            "seed": self.seed,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        return cls(**config)
