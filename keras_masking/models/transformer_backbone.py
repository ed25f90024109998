"""TransformerBackbone: one encoder class for BERT, RoBERTa, RoFormer, NEZHA."""

import contextlib
import json
import logging
import math
import os

import keras
import keras_hub
import numpy as np
from keras import ops

from keras_masking.layers.activations import activation_name
from keras_masking.layers.activations import resolve_activation
from keras_masking.layers.add_ffn import AddFFN
from keras_masking.layers.add_ffn import insert_index
from keras_masking.layers.add_ffn import merge_feed_forward_weights
from keras_masking.layers.add_ffn import split_feed_forward_weights
from keras_masking.layers.attention_adversary import AttentionAdversary
from keras_masking.layers.attention_adversary import attention_adversaries
from keras_masking.layers.attention_units import AttentionUnits
from keras_masking.layers.drop_token import DropToken
from keras_masking.layers.drop_token import RestoreDroppedTokens
from keras_masking.layers.feed_forward import FeedForward
from keras_masking.layers.initializers import bert_initializer
from keras_masking.layers.key_value_prefix import key_value_prefixes
from keras_masking.layers.self_attention import validate_position_scheme
from keras_masking.layers.transformer_block import TransformerBlock
from keras_masking.layers.transformer_embedding import TransformerEmbedding
from keras_masking.models import keras_hub_conversion
from keras_masking.models.mlm_embedding_correction_record import load_folder_record
from keras_masking.models.mlm_embedding_correction_record import mark_loaded_record
from keras_masking.ops.attention_masks import validate_mask_semantics
from keras_masking.ops.pooling import masked_mean
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import check_encoder_inputs
from keras_masking.utils.eager_checks import non_finite_variables
from keras_masking.utils.xla_cpu import warn_if_slow_token_dropping_under_xla

logger = logging.getLogger(__name__)

POOLINGS = ("first", "mean")
FAMILY_POSITIONS = {
    "bert": "absolute",
    "roberta": "absolute",
    "roformer": "rotary",
    "nezha": "relative",
}


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerBackbone(ConcreteInputChecks, keras_hub.models.Backbone):
    """A BERT-family encoder whose stages are public hooks.

    One class builds BERT / RoBERTa (``position="absolute"``, learned
    position embeddings added to the token and segment embeddings), RoFormer
    v1 (``position="rotary"``, interleaved RoPE inside every attention layer)
    and NEZHA (``position="relative"``, sinusoidal relative positions clipped
    at ``max_relative_position``, added to the logits and the values). The
    arguments are named as keras-hub's `BertBackbone` names them, and the
    class is a `keras_hub.models.Backbone`, so `save_to_preset` and
    `from_preset` work from a local folder.

    The functional graph is ``embed -> transformer_layers -> pool``; each
    stage is public so that methods build new graphs from the same layers:
    `embed`, `encode` (with per-layer attention biases, key/value prefixes
    and ASA's mask hook), ``transformer_layers[i]`` (`TransformerBlock`, with
    its two public halves), `pool`, and `forward_stages` (the three in a row
    on any input dict).

    Each fine-tuning method is turned on with one call, as keras-hub's
    `enable_lora(rank)` (the same calls exist on `TransformerTextClassifier`):
    `enable_drop_token`, `enable_asa`, `enable_fl_tuning` (then `merge_fl` /
    `unmerge_fl`), `enable_prefix_tuning` and `enable_lora`. The config
    records what is on, so saving and presets round-trip.

    Args:
        vocabulary_size: int. Size of the token vocabulary.
        num_layers: int. Number of transformer layers.
        num_heads: int. Attention heads per layer.
        hidden_dim: int. Width of the hidden states.
        intermediate_dim: int. FFN hidden units per layer.
        dropout: float. Dropout on embeddings and sublayer outputs.
        max_sequence_length: int. Rows of the absolute position table (the
            longest sequence an ``"absolute"`` model takes).
        num_segments: int. Segment (token type) vocabulary; 0 for none, as in
            RoBERTa, in which case there is no ``segment_ids`` input.
        position: ``"absolute"``, ``"rotary"``, ``"relative"`` or
            ``"rotary2d"`` (ExLM's 2D RoPE, split halves rotated by the
            original index and the copy index; with ``custom_position_ids``
            the ``position_ids`` input is ``(batch, sequence, 2)``).
        max_relative_position: int. NEZHA's clipping distance (64).
        activation: FFN and MLM-head activation. ``"gelu"`` is the exact erf
            GELU (Hugging Face's and bert4keras' reading of Google's configs);
            ``"gelu_approximate"`` is the tanh form keras-hub's BERT uses.
        layer_norm_epsilon: float. 1e-12 for BERT, 1e-5 for RoBERTa.
        attention_dropout: float or None. Dropout on attention probabilities;
            ``dropout`` when None.
        use_pooler: bool. Whether ``pooled_output`` goes through BERT's tanh
            dense pooler; when False it is the pooled state itself.
        pooling: ``"first"`` (the [CLS] state, BERT's) or ``"mean"`` (the
            mean of the real tokens' states, [CLS] and [SEP] included, as
            sentence embedders such as multilingual-e5 pool; tokens that
            DropToken dropped are left out of the mean).
        mlm_embedding_correction: dict or None. The record of an MLM
            embedding correction applied to the token embedding (written by
            `keras_masking.correct_mlm_embeddings`; a second one is refused).
        custom_position_ids: bool. Adds a ``position_ids`` input ``(batch,
            sequence)`` so a shortened or expanded sequence keeps its
            original positions in every scheme; when False positions are
            ``0 .. sequence - 1``.
        add_ffn: dict or None, ``{"units": k, "layers": [...]}``: FL-tuning's
            `AddFFN` branches (`enable_fl_tuning`).
        key_value_prefix: dict or None, the `attach_key_value_prefixes`
            arguments (`enable_prefix_tuning`).
        add_attention_units: dict or None, ``{"units_per_head": u, "layers":
            [...]}``: MA-tuning's `AttentionUnits`.
        frozen_base: bool. Whether every base weight is frozen (`freeze_base`).
        merged_add_ffn: dict or None. The record `merge_fl` leaves for
            `unmerge_fl`.
        drop_token: dict or None, the `enable_drop_token` arguments.
        asa: dict or None, the `enable_asa` arguments.
        dtype: dtype or `keras.DTypePolicy` of computations and weights.
        **kwargs: base `keras_hub.models.Backbone` arguments (``name``...).

    Example:
    ```python
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=21128, num_layers=2, num_heads=4, hidden_dim=64,
        intermediate_dim=128, position="relative",
    )
    outputs = backbone({
        "token_ids": np.array([[101, 2769, 102]]),
        "segment_ids": np.zeros((1, 3), "int32"),
        "padding_mask": np.ones((1, 3), "int32"),
    })
    outputs["sequence_output"].shape  # (1, 3, 64)
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        position="absolute",
        max_relative_position=64,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        attention_dropout=None,
        use_pooler=True,
        pooling="first",
        custom_position_ids=False,
        mlm_embedding_correction=None,
        add_ffn=None,
        key_value_prefix=None,
        add_attention_units=None,
        frozen_base=False,
        merged_add_ffn=None,
        drop_token=None,
        asa=None,
        dtype=None,
        **kwargs,
    ):
        # Everything is checked before the first layer is built.
        checked = _checked_arguments(locals())
        for name in _CONFIG_NAMES:
            setattr(self, name, checked[name])
        # === Layers ===
        self.embeddings = TransformerEmbedding(
            vocabulary_size=self.vocabulary_size,
            hidden_dim=self.hidden_dim,
            num_segments=self.num_segments,
            max_sequence_length=self.max_sequence_length,
            use_position_embedding=position == "absolute",
            dropout=self.dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            embeddings_initializer=bert_initializer(),
            dtype=dtype,
            name="embeddings",
        )
        self.token_embedding = self.embeddings.token_embedding
        self.transformer_layers = [
            TransformerBlock(
                num_heads=self.num_heads,
                intermediate_dim=self.intermediate_dim,
                activation=self.activation,
                position=position,
                max_relative_position=self.max_relative_position,
                dropout=self.dropout,
                attention_dropout=self.attention_dropout,
                layer_norm_epsilon=self.layer_norm_epsilon,
                kernel_initializer=bert_initializer(),
                dtype=dtype,
                name=f"transformer_layer_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.pooled_dense = None
        if self.use_pooler:
            self.pooled_dense = keras.layers.Dense(
                self.hidden_dim,
                activation="tanh",
                kernel_initializer=bert_initializer(),
                dtype=dtype,
                name="pooled_dense",
            )

        # === Functional model ===
        inputs = {"token_ids": keras.Input((None,), dtype="int32", name="token_ids")}
        if self.num_segments > 0:
            inputs["segment_ids"] = keras.Input((None,), dtype="int32", name="segment_ids")
        inputs["padding_mask"] = keras.Input((None,), dtype="int32", name="padding_mask")
        if self.custom_position_ids:
            position_shape = (None, 2) if position == "rotary2d" else (None,)
            inputs["position_ids"] = keras.Input(position_shape, dtype="int32", name="position_ids")
        super().__init__(
            inputs=inputs,
            outputs=self.forward_stages(inputs),
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.mlm_embedding_correction = mlm_embedding_correction
        self.merged_add_ffn = _plain(merged_add_ffn)
        self.cls_token_index = 0
        self.frozen_base = False
        # What the attach_* / enable_* calls below (or later) set.
        for name in (*_RECORDS[:-1], "drop_token", "restore_dropped_tokens", "asa"):
            setattr(self, name, None)
        self.attention_adversaries = None
        if add_ffn:
            self.attach_add_ffn(**add_ffn)
        if add_attention_units:
            self.attach_attention_units(**add_attention_units)
        if key_value_prefix:
            self.attach_key_value_prefixes(**key_value_prefix)
        if checked["frozen_base"]:
            self.freeze_base()
        if drop_token:
            self.enable_drop_token(**drop_token)
        if asa:
            self.enable_asa(**asa)

    def call(self, inputs, training=None, mask=None):
        # The functional graph is the plain encoder; token dropping changes
        # the training graph only (identity at inference).
        if self.drop_token is None or not training:
            return super().call(inputs, training=training, mask=mask)
        self.check_inputs(inputs)
        outputs = self.forward_stages(inputs, training=training, drop_token=self.drop_token)
        return {key: outputs[key] for key in ("sequence_output", "pooled_output")}

    # === Stages (public hooks) ===
    def embed(self, token_ids, segment_ids=None, position_ids=None, training=None):
        """The embedding stage: ``(batch, sequence)`` ids -> hidden states.

        Args:
            token_ids: int tensor ``(batch, sequence)``.
            segment_ids: int tensor or None (zeros).
            position_ids: int tensor ``(batch or 1, sequence)`` or None
                (``0 .. sequence - 1``); only absolute models use it here.
            training: bool, whether dropout is active.
        """
        return self.embeddings(token_ids, segment_ids, position_ids, training=training)

    def encode(
        self,
        hidden,
        padding_mask=None,
        position_ids=None,
        attention_bias=None,
        kv_prefixes=None,
        training=None,
        attention_mask_fn=None,
        mask_semantics="replace",
    ):
        """Runs every transformer layer on ``hidden``.

        Args:
            hidden: float tensor ``(batch, sequence, hidden_dim)``.
            padding_mask: 0/1 tensor ``(batch, sequence)`` or None.
            position_ids: int tensor ``(batch or 1, sequence)`` or None; the
                rotary and relative schemes read it in every layer.
            attention_bias: None, one additive bias for all layers, or a list
                with one bias (or None) per layer; each broadcastable to
                ``(batch, heads, sequence, sequence)``.
            kv_prefixes: None or a list with one ``(keys, values)`` pair (or
                None) per layer; see `SelfAttention`.
            training: bool, whether dropout is active.
            attention_mask_fn: None or a callable ``(layer_index,
                hidden_entering_layer) -> mask bias or None`` whose bias takes
                the place of that layer's padding mask (ASA's adversaries).
            mask_semantics: how that mask applies (see `SelfAttention`).
        """
        biases = _per_layer(attention_bias, self.num_layers, "attention_bias")
        prefixes = _per_layer(kv_prefixes, self.num_layers, "kv_prefixes", shared=False)
        for index, (layer, bias, prefix) in enumerate(
            zip(self.transformer_layers, biases, prefixes)
        ):
            mask_bias = None if attention_mask_fn is None else attention_mask_fn(index, hidden)
            hidden = layer(
                hidden,
                padding_mask=padding_mask,
                position_ids=position_ids,
                attention_bias=bias,
                kv_prefix=prefix,
                attention_mask_bias=mask_bias,
                mask_semantics=mask_semantics,
                training=training,
            )
        return hidden

    def forward_stages(
        self,
        inputs,
        attention_mask_fn=None,
        mask_semantics="replace",
        training=None,
        drop_token=None,
    ):
        """``embed [-> DropToken] -> encode -> pool`` on an input dict.

        The backbone's functional graph is this call on its `keras.Input`s.
        Dropped tokens keep their original positions, and gather mode
        restores ``sequence_output`` to full length (zeros where a token was
        dropped).

        Args:
            inputs: dict with ``token_ids``, ``padding_mask`` and, as the
                backbone takes them, ``segment_ids`` and ``position_ids``.
            attention_mask_fn, mask_semantics: see `encode` (not with a
                gather-mode `DropToken`).
            training: bool, whether dropout (and token dropping) is active.
            drop_token: None or a `DropToken` layer run after the embedding.

        Returns:
            ``{"sequence_output", "pooled_output"}``, and with ``drop_token``
            also ``token_mask`` (1 for real tokens that were kept).
        """
        self.check_inputs(inputs, required=("token_ids", "padding_mask"))
        position_ids, padding_mask = inputs.get("position_ids"), inputs["padding_mask"]
        hidden = self.embed(
            inputs["token_ids"], inputs.get("segment_ids"), position_ids, training=training
        )
        dropped = {"hidden": hidden, "padding_mask": padding_mask, "position_ids": position_ids}
        if drop_token is not None:
            flag = {} if training is None else {"training": training}
            dropped = drop_token(
                hidden,
                padding_mask,
                token_ids=inputs["token_ids"],
                position_ids=position_ids,
                **flag,
            )
        # Attention mode keeps the full sequence and hides dropped keys by a bias.
        sequence = self.encode(
            dropped["hidden"],
            dropped["padding_mask"],
            dropped["position_ids"],
            dropped.get("attention_bias"),
            training=training,
            attention_mask_fn=attention_mask_fn,
            mask_semantics=mask_semantics,
        )
        if drop_token is None:
            pooled = self.pool(sequence, padding_mask)
            return {"sequence_output": sequence, "pooled_output": pooled}
        token_mask = ops.cast(dropped["keep_mask"], "int32") * ops.cast(padding_mask, "int32")
        kept_mask = dropped["padding_mask"] if drop_token.mode == "gather" else token_mask
        pooled = self.pool(sequence, kept_mask)
        if drop_token.mode == "gather":
            restore = self.restore_dropped_tokens
            if restore is None or drop_token is not self.drop_token:
                restore = RestoreDroppedTokens(dtype=drop_token.dtype_policy)
            sequence = restore(sequence, dropped["keep_mask"])
        return {"sequence_output": sequence, "pooled_output": pooled, "token_mask": token_mask}

    def adversarial_forward(
        self, inputs, training=None, adversaries=None, mask_semantics=None, drop_token=None
    ):
        """ASA's adversarial pass: each attacked layer's mask from its adversary.

        Args:
            inputs: the backbone's input dict.
            training: bool, whether dropout (and token dropping) is active.
            adversaries: ``{layer_index: AttentionAdversary}``; None for the
                ones `enable_asa` attached.
            mask_semantics: see `encode`; None for `enable_asa`'s.
            drop_token: a `DropToken` in attention mode, or None (the
                backbone's own when training).

        Returns:
            ``(outputs, masks)``: the output dict and the adversaries' binary
            masks ``(batch, query, key)`` in layer order.

        Example:
        ```python
        backbone.enable_asa(tau=0.5)
        outputs, masks = backbone.adversarial_forward(features, training=True)
        ```
        """
        if adversaries is None:
            if self.asa is None:
                raise ValueError("Call enable_asa() before adversarial_forward().")
            adversaries = dict(zip(self.asa["layers"], self.attention_adversaries))
        if drop_token is None and training:
            drop_token = self.drop_token
        semantics = mask_semantics or (self.asa or {}).get("mask_semantics", "replace")
        masks = []

        def attention_mask_fn(index, hidden):
            if index not in adversaries:
                return None
            masks.append(adversaries[index](hidden, inputs["padding_mask"]))
            return AttentionAdversary.mask_bias(masks[-1])

        outputs = self.forward_stages(
            inputs, attention_mask_fn, semantics, training=training, drop_token=drop_token
        )
        return outputs, masks

    def check_inputs(self, inputs, required=None):
        """Checks an input dict at the backbone's door; raises a ValueError.

        Every entry point runs it (``backbone(inputs)``, `forward_stages`, and
        ``fit`` / ``evaluate`` / ``predict`` on numpy data before a step
        compiles). Shapes and dtypes are checked always; values when
        concrete: ids in range, a 0/1 ``padding_mask``, every input of the
        shape of ``token_ids``. A compiled step cannot raise on values: an
        out-of-range id makes its row NaN (see `TransformerEmbedding`).

        Args:
            inputs: dict of the backbone's inputs.
            required: keys that must be present; None for the backbone's
                own inputs (``segment_ids`` without segments and
                ``position_ids`` without ``custom_position_ids`` are not).

        Example:
        ```python
        backbone.check_inputs(features)  # passes
        half = {**features, "padding_mask": features["padding_mask"] * 0.5}
        try:
            backbone.check_inputs(half)
        except ValueError as error:
            print(error)  # Expected padding_mask of 0s and 1s. Received: ... [0.5].
        ```
        """
        embeddings = self.embeddings
        if required is None:
            required = ["token_ids", "padding_mask"]
            if embeddings.num_segments > 0:
                required.append("segment_ids")
            if self.custom_position_ids:
                required.append("position_ids")
        check_encoder_inputs(
            inputs,
            vocabulary_size=embeddings.vocabulary_size,
            num_segments=embeddings.num_segments,
            required=tuple(required),
            position_ranks=(3,) if self.position == "rotary2d" else (2,),
            max_position=(
                embeddings.max_sequence_length if embeddings.use_position_embedding else None
            ),
        )

    def pool(self, hidden, padding_mask=None):
        """The pooled vector: the [CLS] state or the mean (``pooling``), then the pooler if any.

        Args:
            hidden: float tensor ``(batch, sequence, hidden_dim)``.
            padding_mask: 0/1 tensor ``(batch, sequence)``, the tokens a
                ``"mean"`` pooling averages (None: all of them).
        """
        if self.pooling == "first":
            state = hidden[:, 0, :]
        else:
            state = masked_mean(hidden, padding_mask)
        return state if self.pooled_dense is None else self.pooled_dense(state)

    # === Methods, one call each ===
    def enable_drop_token(
        self, rate, unselectable_token_ids=(), mode="gather", seed=None, slot_multiple=8
    ):
        """Drops tokens after the embedding stage in training (DropToken).

        Training runs ``embed -> DropToken -> encode -> pool``
        (`forward_stages`): [CLS] is always kept and ``sequence_output`` comes
        back at full length. Inference drops nothing. The layer is
        ``backbone.drop_token``; `keras_masking.callbacks.DropTokenRateSchedule`
        changes its rate.

        Args:
            rate: float in [0, 1); 0.10-0.15 did best on CLUE.
            unselectable_token_ids: ids never dropped, e.g. ``(101, 102)``.
            mode: ``"gather"`` (shorter sequence, faster) or ``"attention"``
                (full length, dropped keys hidden; the mode ASA can attack).
            seed: int >= 0 or None.
            slot_multiple: int >= 1, see `DropToken`.

        Example:
        ```python
        backbone.enable_drop_token(0.15, unselectable_token_ids=(101, 102))
        ```
        """
        if self.drop_token is not None:
            raise ValueError(
                "DropToken is already enabled; change its rate with "
                "backbone.drop_token.set_rate(rate)."
            )
        options = dict(unselectable_token_ids=unselectable_token_ids, mode=mode, seed=seed)
        layer = encoder_drop_token(rate, self.dtype_policy, slot_multiple=slot_multiple, **options)
        if self.asa is not None and layer.mode == "gather":
            raise ValueError(_ASA_WITH_GATHER)
        self._track("drop_token", layer)
        if layer.mode == "gather":
            restore = RestoreDroppedTokens(dtype=self.dtype_policy, name="restore_dropped_tokens")
            self._track("restore_dropped_tokens", restore)
            if layer.rate:
                warn_if_slow_token_dropping_under_xla()

    def enable_asa(
        self, tau=0.5, layers=None, alpha=1.0, mask_semantics="replace", noise=False, seed=None
    ):
        """Attaches ASA's adversaries (adversarial self-attention fine-tuning).

        The backbone holds the setting and one `AttentionAdversary` per
        attacked layer; its own outputs stay the clean pass. The objective
        needs the head, so it lives in the model that has one:
        `TransformerTextClassifier` trains with ASA as soon as its backbone
        has it; a user's own head trains with
        ``keras_masking.methods.ASATrainer(task_model)``.

        Args:
            tau: float >= 0, the mask penalty's temperature (0.5).
            layers: layer indices to attack, or None for every layer.
            alpha: float >= 0, the gradient reversal's strength (1).
            mask_semantics: ``"replace"`` (official), ``"additive"`` or
                ``"guarded"`` (see `keras_masking.ops.apply_replacing_mask`).
            noise: bool, logistic noise before each adversary's step (a
                deviation).
            seed: int >= 0 or None, for ``noise``.

        Example:
        ```python
        backbone.enable_asa(tau=0.5)
        ```
        """
        if self.asa is not None:
            raise ValueError(f"ASA is already enabled ({self.asa}).")
        if self.drop_token is not None and self.drop_token.mode == "gather":
            raise ValueError(_ASA_WITH_GATHER)
        tau = check_float("tau", tau, minimum=0.0)
        alpha = check_float("alpha", alpha, minimum=0.0)
        validate_mask_semantics(mask_semantics)
        noise = check_bool("noise", noise)
        seed = check_seed("seed", seed)
        layers = self.layer_indices(layers)
        adversaries = attention_adversaries(layers, self.hidden_dim, alpha, noise, seed)
        self._track("attention_adversaries", list(adversaries.values()))
        self.asa = {
            "tau": tau,
            "layers": layers,
            "alpha": alpha,
            "mask_semantics": mask_semantics,
            "noise": noise,
            "seed": seed,
        }

    def enable_fl_tuning(self, units=160, layers=None, attention_units=0):
        """FL-tuning: `AddFFN` branches on the chosen FFNs, every base weight frozen.

        ``FFN(x) + f(x W1' + b1') W2' + b2'`` with ``units`` new hidden units
        per FFN; only the branches (and a task's head) train.
        ``attention_units`` adds MA-tuning's units per head (they do not
        merge). `merge_fl` folds the branches into plain FFNs afterwards.

        Args:
            units: int >= 0, hidden units added per FFN (160 in the paper);
                0 with ``attention_units`` for MA-tuning alone.
            layers: layer indices, or None for every layer.
            attention_units: int >= 0, MA-tuning units per head (0: none).

        Example:
        ```python
        backbone.enable_fl_tuning(units=160)
        ```
        """
        units = check_int("units", units, minimum=0)
        attention_units = check_int("attention_units", attention_units, minimum=0)
        if not units and not attention_units:
            raise ValueError(
                "Expected units >= 1 (or attention_units >= 1 for MA-tuning alone). "
                f"Received: units={units}, attention_units={attention_units}."
            )
        layers = self.layer_indices(layers)
        if self.add_ffn is not None or self.add_attention_units is not None:
            raise ValueError(
                f"This backbone already has addFFN branches or attention units "
                f"({self.add_ffn or self.add_attention_units}). Merge them "
                "(backbone.merge_fl()) or detach them (backbone.detach_attachments()) first."
            )
        with self.restore_on_error():
            if units:
                self.attach_add_ffn(units, layers)
            if attention_units:
                self.attach_attention_units(attention_units, layers)
            self.freeze_base()
        self._log_trainable(
            f"FL-tuning: {units} units per FFN, {attention_units} attention units per head"
        )

    def enable_prefix_tuning(
        self, length=160, layers=None, dropout=0.1, reparameterize=False, hidden_units=512
    ):
        """P-tuning v2: trainable key/value prefixes in every chosen layer, base frozen.

        Each layer gets ``length`` trainable keys and values per head
        (`KeyValuePrefix`). ``reparameterize=True`` is P-tuning v2's
        ``prefix_projection``: one MLP shared by all tuned layers.

        Args:
            length: int >= 0, prefix length (0 leaves the function unchanged).
            layers: layer indices, or None for every layer.
            dropout: float in [0, 1), dropout on the prefixes.
            reparameterize: bool, the shared MLP reparameterisation.
            hidden_units: int >= 1, width of that MLP.

        Example:
        ```python
        backbone.enable_prefix_tuning(length=160)
        ```
        """
        if self.key_value_prefix is not None:
            raise ValueError(
                f"This backbone already has key/value prefixes ({self.key_value_prefix}); "
                "detach them first (backbone.detach_attachments())."
            )
        with self.restore_on_error():
            self.attach_key_value_prefixes(length, layers, dropout, reparameterize, hidden_units)
            self.freeze_base()
        self._log_trainable(f"P-tuning v2: prefix length {self.key_value_prefix['length']}")

    def merge_fl(self, placement="suffix"):
        """A new backbone whose FFNs carry the addFFN units: same function, no branch.

        Each tuned FFN becomes one FFN with ``m + k`` hidden units
        (`merge_feed_forward_weights`); untuned layers get ``k`` zero units,
        so the result converts to keras-hub. The merged backbone is trainable
        and records the merge for `unmerge_fl`; this one is not changed.

        Args:
            placement: ``"suffix"``, ``"prefix"`` or an int in ``[0, m]``.

        Example:
        ```python
        backbone.enable_fl_tuning(units=8)
        merged = backbone.merge_fl()
        ```
        """
        if self.add_attention_units is not None:
            raise ValueError(
                "MA-tuning's attention units do not merge into a plain attention layer (the "
                "extra dimensions keep the base head's scale); keep them attached."
            )
        if self.add_ffn is None:
            raise ValueError("No addFFN branches to merge: call enable_fl_tuning() first.")
        units, tuned = self.add_ffn["units"], list(self.add_ffn["layers"])
        at = insert_index(placement, self.intermediate_dim)
        record = {
            "units": units,
            "layers": tuned,
            "placement": placement if isinstance(placement, str) else int(placement),
            "base_intermediate_dim": self.intermediate_dim,
        }
        merged = self._copy(intermediate_dim=self.intermediate_dim + units, merged_add_ffn=record)
        for index, (old, new) in enumerate(zip(self.transformer_layers, merged.transformer_layers)):
            base = old.feed_forward.get_weights()
            if index in tuned:
                branch = old.feed_forward_branch.get_weights()
            else:
                branch = [np.zeros((base[0].shape[0], units), base[0].dtype), np.zeros(units)]
                branch += [np.zeros((units, base[0].shape[0]), base[2].dtype), 0 * base[3]]
            new.feed_forward.set_weights(merge_feed_forward_weights(base, branch, at))
        return merged

    def unmerge_fl(self, units=None, placement=None, layers=None):
        """A new FL-tuned backbone: merged FFNs split into base FFN and `AddFFN`.

        The converse of `merge_fl` (its record gives the defaults); this
        backbone is not changed.

        Args:
            units: int >= 1, fewer than the FFNs' hidden units.
            placement: where the units sit (see `merge_fl`); else ``"suffix"``.
            layers: the tuned layers; else every layer.

        Example:
        ```python
        backbone.enable_fl_tuning(units=8)
        tuned_again = backbone.merge_fl().unmerge_fl()
        ```
        """
        if self.add_ffn is not None or self.add_attention_units is not None:
            raise ValueError(
                "This backbone has addFFN branches or attention units attached; unmerge_fl "
                "splits a merged backbone. Merge it first (backbone.merge_fl())."
            )
        record = dict(self.merged_add_ffn or {})
        units = record.get("units") if units is None else check_int("units", units, minimum=1)
        if units is None:
            raise ValueError(
                "This backbone has no merge record; pass `units` (and `placement`, `layers`)."
            )
        total = self.intermediate_dim
        if units >= total:
            raise ValueError(
                f"Expected units < {total} for units (the FFNs have {total} hidden units, and "
                f"at least one must stay in the base FFN). Received: units={units}."
            )
        placement = placement if placement is not None else record.get("placement", "suffix")
        at = insert_index(placement, total - units)
        layers = self.layer_indices(layers if layers is not None else record.get("layers"))
        split = self._copy(intermediate_dim=total - units, merged_add_ffn=None)
        split.attach_add_ffn(units, layers)
        for index, (old, new) in enumerate(zip(self.transformer_layers, split.transformer_layers)):
            base, branch = split_feed_forward_weights(old.feed_forward.get_weights(), units, at)
            new.feed_forward.set_weights(base)
            if index in layers:
                new.feed_forward_branch.set_weights(branch)
            elif np.any(branch[0]) or np.any(branch[2]):
                raise ValueError(
                    f"Layer {index} is not listed as tuned but its units {at}..{at + units} are "
                    "not zero; pass the `layers` that were tuned."
                )
        split.freeze_base()
        return split

    def _copy(self, **changes):
        """A new backbone of this config with ``changes``, without addFFN;
        every weight but the FFNs' copied."""
        config = self.get_config()
        config.update(add_ffn=None, frozen_base=False, **changes)
        target = type(self).from_config(config)
        pairs = list(zip(self.base_layers(), target.base_layers()))
        for old, new in zip(self.transformer_layers, target.transformer_layers):
            pairs.append((old.key_value_prefix, new.key_value_prefix))
        pairs += list(zip(self.attention_adversaries or [], target.attention_adversaries or []))
        for old, new in pairs:
            if old is not None and not isinstance(old, FeedForward):
                new.set_weights(old.get_weights())
        return target

    def _log_trainable(self, message):
        def count(variables):
            return sum(math.prod(v.shape) for v in {id(v): v for v in variables}.values())

        trainable, total = count(self.trainable_weights), count(self.weights)
        logger.info(
            "%s; trainable parameters: %s of %s (%.2f%%)",
            message,
            f"{trainable:,}",
            f"{total:,}",
            100.0 * trainable / max(total, 1),
        )

    def _track(self, name, value):
        """Sets a sublayer attribute after the model is built (an enable_* call)."""
        self._tracker.unlock()
        try:
            setattr(self, name, value)
        finally:
            self._tracker.lock()

    @contextlib.contextmanager
    def restore_on_error(self, variables=()):
        """Puts this backbone back as it was when the block raises.

        Restores the attachments, their records, the ``trainable`` flags and
        the values of ``variables``: a tuning call or an adapter load is all
        or nothing.

        Example:
        ```python
        with backbone.restore_on_error():
            backbone.attach_add_ffn(8)
            backbone.freeze_base()
        ```
        """
        records = {key: _plain(getattr(self, key)) for key in _RECORDS}
        blocks = [
            {attribute: getattr(block, attribute) for attribute in _BLOCK_ATTACHMENTS}
            for block in self.transformer_layers
        ]
        flags = [(layer, layer.trainable) for layer in self._flatten_layers(include_self=True)]
        flags += [(v, v.trainable) for v in self.weights]
        values = [(v, ops.convert_to_numpy(v)) for v in variables]
        try:
            yield
        except BaseException:
            for block, attached in zip(self.transformer_layers, blocks):
                for attribute, layer in attached.items():
                    if getattr(block, attribute) is not layer:
                        if layer is None:
                            getattr(block, f"detach_{attribute}")()
                        else:
                            getattr(block, f"attach_{attribute}")(layer)
            for key, value in records.items():
                setattr(self, key, value)
            for item, trainable in flags:  # parents first: children override
                item.trainable = trainable
            for variable, value in values:
                variable.assign(value)
            raise

    # === Parameter-efficient attachments (public hooks) ===
    def attach_add_ffn(self, units, layers=None):
        """Attaches an `AddFFN` of ``units`` to the chosen layers' FFNs.

        The branch uses this backbone's FFN activation, so merging is exact.

        Args:
            units: int, hidden units added per FFN.
            layers: list of layer indices, or None for every layer.
        """
        units = check_int("units", units, minimum=1)
        layers = self.layer_indices(layers)
        for index in layers:
            self.transformer_layers[index].attach_feed_forward_branch(
                AddFFN(units, activation=self.activation, dtype=self.dtype_policy, name="add_ffn")
            )
        self.add_ffn = {"units": int(units), "layers": layers}

    def attach_key_value_prefixes(
        self, length, layers=None, dropout=0.1, reparameterize=False, hidden_units=512
    ):
        """Attaches trainable `KeyValuePrefix` tables to the chosen layers.

        Args:
            length: int >= 0, prefix length.
            layers: list of layer indices, or None for every layer.
            dropout, reparameterize, hidden_units: see `KeyValuePrefix`.
                Reparameterised prefixes share one `PrefixEncoder` across
                the chosen layers, as in P-tuning v2.
        """
        layers = self.layer_indices(layers)
        # The layers check the other arguments before any is attached.
        prefixes = key_value_prefixes(
            length,
            num_layers=len(layers),
            num_heads=self.num_heads,
            head_dim=self.hidden_dim // self.num_heads,
            dropout=dropout,
            reparameterize=reparameterize,
            hidden_units=hidden_units,
            dtype=self.dtype_policy,
        )
        for index, prefix in zip(layers, prefixes):
            self.transformer_layers[index].attach_key_value_prefix(prefix)
        checked = ("length", "dropout", "reparameterize", "hidden_units")
        record = {key: getattr(prefixes[0], key) for key in checked}
        self.key_value_prefix = {**record, "layers": layers}

    def attach_attention_units(self, units_per_head, layers=None):
        """Attaches MA-tuning's `AttentionUnits` to the chosen layers.

        Args:
            units_per_head: int, extra query/key/value units per head.
            layers: list of layer indices, or None for every layer.
        """
        units_per_head = check_int("units_per_head", units_per_head, minimum=1)
        layers = self.layer_indices(layers)
        for index in layers:
            self.transformer_layers[index].attach_attention_units(
                AttentionUnits(
                    units_per_head,
                    num_heads=self.num_heads,
                    dtype=self.dtype_policy,
                    name="attention_units",
                )
            )
        self.add_attention_units = {"units_per_head": int(units_per_head), "layers": layers}

    def detach_attachments(self):
        """Removes every attached FFN branch, attention unit and prefix."""
        for block in self.transformer_layers:
            for attribute in _BLOCK_ATTACHMENTS:
                getattr(block, f"detach_{attribute}")()
        for name in _RECORDS[:-1]:
            setattr(self, name, None)

    def base_layers(self):
        """The layers holding the pretrained weights (not the attachments)."""
        layers = [self.embeddings]
        for block in self.transformer_layers:
            layers += [
                block.self_attention,
                block.attention_layer_norm,
                block.feed_forward,
                block.feed_forward_layer_norm,
            ]
        if self.pooled_dense is not None:
            layers.append(self.pooled_dense)
        return layers

    def freeze_base(self, frozen=True):
        """Freezes (or unfreezes) every pretrained weight, LayerNorms included.

        Attached branches and prefixes keep their own ``trainable`` flag.

        Args:
            frozen: bool.
        """
        for layer in self.base_layers():
            layer.trainable = not frozen
        self.frozen_base = bool(frozen)

    def layer_indices(self, layers=None):
        """Sorted, checked layer indices: every layer when ``layers`` is None.

        Args:
            layers: distinct ints in ``[0, num_layers)``, or None.
        """
        count = self.num_layers
        if layers is None:
            return list(range(count))
        checked = check_int_list(
            "layers", layers, minimum=0, maximum=count - 1, allow_empty=False, unique=True
        )
        return sorted(checked)

    # === Conversions ===
    @classmethod
    def from_keras_hub(cls, backbone, activation=None, **overrides):
        """A backbone with the weights of a keras-hub BERT / RoBERTa backbone.

        The converse of `to_keras_hub`: the same function as keras-hub's
        model, with every stage open to the methods.

        Args:
            backbone: a `keras_hub.models.BertBackbone` or `RobertaBackbone`.
            activation: None keeps keras-hub's activation (the tanh GELU for
                BERT, exact GELU for RoBERTa) so outputs match keras-hub; pass
                the checkpoint's own (``"gelu"`` for Hugging Face BERT) to
                follow the original model instead.
            **overrides: other arguments to change (``dropout``,
                ``custom_position_ids``, ``attention_dropout``...). The sizes,
                segments, pooler and position scheme come from ``backbone``.

        Raises:
            TypeError: ``backbone`` is not a keras-hub BERT/RoBERTa backbone.
            ValueError: an override of a size the weights fix, or a bad value.

        Example:
        ```python
        hub = keras_hub.models.BertBackbone(
            vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32,
            intermediate_dim=48, max_sequence_length=24,
        )  # or BertBackbone.from_preset(...)
        backbone = keras_masking.models.TransformerBackbone.from_keras_hub(hub)
        hub_again = backbone.to_keras_hub()
        ```
        """
        kwargs = keras_hub_conversion.transformer_backbone_arguments(
            backbone, activation=activation, overrides=overrides
        )
        converted = cls(**kwargs)
        keras_hub_conversion.copy_keras_hub_weights(backbone, converted)
        return converted

    def to_keras_hub(self):
        """Converts to an equivalent keras-hub `BertBackbone` / `RobertaBackbone`.

        The converse of `from_keras_hub`; see `keras_masking.models.to_keras_hub`.

        Example:
        ```python
        hub = backbone.to_keras_hub()
        ```
        """
        return keras_hub_conversion.to_keras_hub(self)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Loads a local preset folder: ours, keras-hub's BERT/RoBERTa, or HF.

        A folder saved by `save_to_preset` loads as usual. A keras-hub
        BERT / RoBERTa preset or a Hugging Face folder is loaded by keras-hub
        and converted with `from_keras_hub`, keeping the activation the
        checkpoint declares; one written by `correct_preset_embeddings` loads
        as corrected.

        Args:
            preset: path (str or path-like) to a local preset folder (named
                presets need the network, which this package never uses by
                itself).
            load_weights: bool. Whether to load the weights.
            **kwargs: passed to the keras-hub loader.
        """
        # keras-hub's generic loader picks the class the preset declares.
        preset = os.fspath(preset)
        _check_preset_json_files(preset)
        try:
            loaded = keras_hub.models.Backbone.from_preset(
                preset, load_weights=load_weights, **kwargs
            )
        except OSError as error:
            weights = _preset_file(preset, _PRESET_WEIGHTS_FILE)
            if not load_weights or weights is None:
                raise
            # h5py's message names no file ("Unable to synchronously open file").
            raise ValueError(
                f"{weights}: cannot read the preset's weights; the file is truncated or corrupt "
                f"({type(error).__name__}: {error}). Expected the {_PRESET_WEIGHTS_FILE} that "
                "save_to_preset wrote: copy it again."
            ) from None
        if load_weights:
            _check_finite_weights(loaded, _preset_file(preset, _PRESET_WEIGHTS_FILE) or preset)
        if isinstance(loaded, cls):
            return loaded
        converted = cls.from_keras_hub(loaded, activation=_declared_activation(preset))
        _mark_preset_record(converted, preset)
        return converted

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in _CONFIG_NAMES})
        records = ("mlm_embedding_correction", "merged_add_ffn", *_RECORDS[:-1], "asa")
        config.update({name: _plain(getattr(self, name)) for name in records})
        config.update(frozen_base=self.frozen_base, drop_token=_drop_token_record(self.drop_token))
        return config


def from_keras_hub(backbone, activation=None, **overrides):
    """A `TransformerBackbone` with the weights of a keras-hub backbone.

    The same as `TransformerBackbone.from_keras_hub`, with the same arguments.

    Example:
    ```python
    hub = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=48
    )
    backbone = keras_masking.models.from_keras_hub(hub, dropout=0.0)
    ```
    """
    return TransformerBackbone.from_keras_hub(backbone, activation=activation, **overrides)


def encoder_drop_token(rate, dtype=None, **options):
    """The `DropToken` an encoder runs after its embedding: [CLS] is always kept.

    Args:
        rate: float in [0, 1).
        dtype: dtype or `keras.DTypePolicy` of the layer.
        **options: `DropToken`'s ``unselectable_token_ids``, ``mode``,
            ``seed`` and ``slot_multiple``.

    Example:
    >>> encoder_drop_token(0.15, unselectable_token_ids=(101, 102)).protected_positions
    (0,)
    """
    return DropToken(rate, protected_positions=(0,), dtype=dtype, name="drop_token", **options)


def _plain(value):
    """A JSON round trip: Keras' tracked containers -> plain dicts/lists."""
    return None if value is None else json.loads(json.dumps(value))


# The keys each method record may hold (the `attach_*` / `enable_*` arguments).
_ATTACHMENT_KEYS = {
    "add_ffn": ("units", "layers"),
    "key_value_prefix": ("length", "layers", "dropout", "reparameterize", "hidden_units"),
    "add_attention_units": ("units_per_head", "layers"),
    "drop_token": ("rate", "unselectable_token_ids", "mode", "seed", "slot_multiple"),
    "asa": ("tau", "layers", "alpha", "mask_semantics", "noise", "seed"),
}
_RECORDS = ("add_ffn", "key_value_prefix", "add_attention_units", "frozen_base")
_INTEGER_MINIMUMS = {
    "vocabulary_size": 1,
    "num_layers": 1,
    "num_heads": 1,
    "hidden_dim": 1,
    "intermediate_dim": 1,
    "max_sequence_length": 1,
    "max_relative_position": 1,
    "num_segments": 0,
}
# The config entries that are constructor arguments kept as they were checked.
_CONFIG_NAMES = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "dropout",
    "max_sequence_length",
    "num_segments",
    "position",
    "max_relative_position",
    "activation",
    "layer_norm_epsilon",
    "attention_dropout",
    "use_pooler",
    "pooling",
    "custom_position_ids",
)
_BLOCK_ATTACHMENTS = ("feed_forward_branch", "key_value_prefix", "attention_units")
_ASA_WITH_GATHER = (
    "ASA cannot attack a backbone that drops tokens in gather mode: the clean and "
    "adversarial passes would run on different sequences. Use "
    "enable_drop_token(..., mode='attention'), where every pass keeps the full length."
)


def _drop_token_record(layer):
    """The `enable_drop_token` arguments of a DropToken layer (None: off)."""
    if layer is None:
        return None
    config = layer.get_config()
    return {key: config[key] for key in _ATTACHMENT_KEYS["drop_token"]}


def _checked_arguments(arguments):
    """The constructor's arguments checked, numbers as Python types."""
    checked = dict(arguments)
    for name, minimum in _INTEGER_MINIMUMS.items():
        checked[name] = check_int(name, arguments[name], minimum=minimum)
    for name in ("dropout", "attention_dropout"):
        if name == "dropout" or arguments[name] is not None:
            checked[name] = check_float(name, arguments[name], 0.0, 1.0, open_maximum=True)
    checked["layer_norm_epsilon"] = check_float(
        "layer_norm_epsilon", arguments["layer_norm_epsilon"], 0.0, open_minimum=True
    )
    for name in ("use_pooler", "custom_position_ids", "frozen_base"):
        checked[name] = check_bool(name, arguments[name])
    check_choice("pooling", arguments["pooling"], POOLINGS)
    position, activation = arguments["position"], arguments["activation"]
    validate_position_scheme(position)
    if not (isinstance(activation, str) or callable(activation)):
        raise ValueError(
            "Expected an activation name or a callable for activation. "
            f"Received: activation={activation!r}."
        )
    try:
        resolve_activation(activation)
    except ValueError as error:
        raise ValueError(f"{error} Received: activation={activation!r}.") from error
    checked["activation"] = activation_name(activation)
    for name in ("mlm_embedding_correction", "merged_add_ffn", *_ATTACHMENT_KEYS):
        value = arguments[name]
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"Expected a dict or None for {name}. Received: {name}={value!r}.")
        keys = _ATTACHMENT_KEYS.get(name, ())
        unknown = sorted(set(value or {}) - set(keys)) if keys else []
        if unknown:
            raise ValueError(
                f"Expected {name} to hold only the keys {list(keys)}. "
                f"Received the keys {unknown} in {name}={value!r}."
            )
    hidden_dim, num_heads = checked["hidden_dim"], checked["num_heads"]
    if hidden_dim % num_heads:
        raise ValueError(
            "Expected hidden_dim divisible by num_heads. "
            f"Received: hidden_dim={hidden_dim}, num_heads={num_heads}."
        )
    multiple = {"rotary": 2, "rotary2d": 4}.get(position, 1)
    if (hidden_dim // num_heads) % multiple:
        raise ValueError(
            f"Expected an even head size (hidden_dim // num_heads) divisible by {multiple} for "
            f"position={position!r}. Received: hidden_dim={hidden_dim}, num_heads={num_heads}."
        )
    return checked


def _per_layer(value, num_layers, name, shared=True):
    """Expands a hook argument to one entry per layer."""
    if value is None:
        return [None] * num_layers
    if isinstance(value, (list, tuple)) and (not shared or len(value) == num_layers):
        if len(value) != num_layers:
            raise ValueError(
                f"Expected one entry per layer ({num_layers}) in {name}. "
                f"Received: {len(value)} entries."
            )
        return list(value)
    if not shared:
        raise ValueError(
            f"Expected a list with one entry per layer ({num_layers}) for {name}. "
            f"Received: {name} of type {type(value).__name__}."
        )
    return [value] * num_layers


def _mark_preset_record(backbone, preset):
    """Marks a converted keras-hub preset as corrected when its folder says so."""
    if os.path.isdir(preset):
        shape = (backbone.vocabulary_size, backbone.hidden_dim)
        record = load_folder_record(preset, backbone.token_embedding.name, shape)
        mark_loaded_record(backbone, record)


_PRESET_WEIGHTS_FILE = "model.weights.h5"
_PRESET_JSON_FILES = ("config.json", "metadata.json")


def _preset_file(preset, name):
    """``preset/name`` when ``preset`` is a local folder holding that file, else None."""
    if not isinstance(preset, (str, os.PathLike)) or not os.path.isdir(preset):
        return None
    path = os.path.join(os.fspath(preset), name)
    return path if os.path.isfile(path) else None


def _check_preset_json_files(preset):
    """Refuses a local preset whose JSON files do not parse, naming the file."""
    for name in _PRESET_JSON_FILES:
        path = _preset_file(preset, name)
        if path is None:
            continue
        try:
            with open(path, encoding="utf-8") as file:
                value = json.load(file)
        except (UnicodeDecodeError, ValueError) as error:
            raise ValueError(
                f"{path}: not valid JSON ({error}); the file is truncated or corrupt. "
                f"Expected the {name} that save_to_preset wrote: copy it again."
            ) from None
        if not isinstance(value, dict):
            raise ValueError(
                f"{path}: expected a JSON object. Received: a JSON {type(value).__name__}."
            )


def _check_finite_weights(model, source):
    """Refuses a model loaded with NaN or infinite weights, naming the variable."""
    for path, count in non_finite_variables(model.weights)[:1]:
        raise ValueError(
            f"{source}: weight {path!r} holds {count} NaN or infinite value(s). "
            "Expected finite weights: the file is corrupt, or the training that wrote it "
            "diverged."
        )


def _declared_activation(preset):
    """The activation a Hugging Face folder declares, or None."""
    config_path = _preset_file(preset, "config.json")
    if config_path is None:
        return None
    with open(config_path, encoding="utf-8") as file:
        config = json.load(file)
    return config.get("hidden_act") if "model_type" in config else None
