"""TransformerBackbone: one encoder class for BERT, RoBERTa, RoFormer, NEZHA."""

import keras
import keras_hub
from keras import ops

from keras_masking.layers.drop_token import DropToken
from keras_masking.layers.drop_token import RestoreDroppedTokens
from keras_masking.layers.initializers import bert_initializer
from keras_masking.layers.transformer_block import TransformerBlock
from keras_masking.layers.transformer_embedding import TransformerEmbedding
from keras_masking.models.asa_objective import in_asa_training_pass
from keras_masking.models.backbone_attachments import BackboneAttachments
from keras_masking.models.backbone_config import ATTACHMENT_RECORDS
from keras_masking.models.backbone_config import CONFIG_NAMES
from keras_masking.models.backbone_config import FAMILY_POSITIONS  # noqa: F401 (public)
from keras_masking.models.backbone_config import checked_backbone_arguments
from keras_masking.models.backbone_config import drop_token_record
from keras_masking.models.backbone_config import per_layer
from keras_masking.models.backbone_config import plain_record
from keras_masking.models.backbone_loading import BackboneLoading
from keras_masking.models.backbone_methods import BackboneMethods
from keras_masking.ops.attention_masks import padding_mask_to_bias
from keras_masking.ops.pooling import masked_mean
from keras_masking.utils.arguments import check_model_keywords
from keras_masking.utils.eager_checks import ConcreteInputChecks
from keras_masking.utils.eager_checks import check_encoder_inputs
from keras_masking.utils.training_state import CallerRecord
from keras_masking.utils.training_state import outermost_caller

ASA_OUTSIDE_ITS_PASS = (
    "This backbone has ASA (enable_asa) and was called in training outside ASA's training "
    "pass, so its adversaries would not train: a model with your own head trains ASA "
    "through keras_masking.methods.ASATrainer(model) (fit the trainer, not the model); "
    "TransformerTextClassifier trains it itself. A training-mode call that is no training "
    "step (a measurement) goes inside `with keras_masking.methods.asa_training_pass():`."
)


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerBackbone(
    BackboneMethods,
    BackboneAttachments,
    BackboneLoading,
    ConcreteInputChecks,
    keras_hub.models.Backbone,
):
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
        pruned_from: dict or None. A table cut by `prune_token_embeddings`:
            the vocabulary size and row mean of the table it was cut from
            (the ``mean E`` an MLM embedding correction uses).
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
        lora: dict or None, the `enable_lora` arguments (``rank``,
            ``target_layer_names``).
        dtype: dtype or `keras.DTypePolicy` of computations and weights.
        **kwargs: base `keras_hub.models.Backbone` arguments (``name``...).

    Example:
    ```python
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=21128, num_layers=1, num_heads=2, hidden_dim=32,
        intermediate_dim=64, position="relative",
    )
    outputs = backbone({
        "token_ids": np.array([[101, 2769, 102]]),
        "segment_ids": np.zeros((1, 3), "int32"),
        "padding_mask": np.ones((1, 3), "int32"),
    })
    outputs["sequence_output"].shape  # (1, 3, 32)
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
        pruned_from=None,
        add_ffn=None,
        key_value_prefix=None,
        add_attention_units=None,
        frozen_base=False,
        merged_add_ffn=None,
        drop_token=None,
        asa=None,
        lora=None,
        dtype=None,
        **kwargs,
    ):
        # Everything is checked before the first layer is built.
        check_model_keywords(type(self), kwargs)
        checked = checked_backbone_arguments(locals())
        for name in CONFIG_NAMES:
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
        # DropToken's place in the graph, the identity until enable_drop_token.
        # A fixed seed here draws nothing from Python's random state, so
        # building a backbone leaves every later seeded draw as it was;
        # enable_drop_token draws the layer's seed then (see reconfigure).
        self.token_dropping = DropToken(
            0.0, protected_positions=(0,), seed=0, dtype=dtype, name="drop_token"
        )
        self.restore_dropped_tokens = RestoreDroppedTokens(
            gathering=False, dtype=dtype, name="restore_dropped_tokens"
        )
        self.drop_token_enabled = False
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

        # The models whose steps called this backbone: an enable_* call
        # refreshes their traced steps and optimizers (refresh_training).
        self.callers = CallerRecord()

        # === Config ===
        self.mlm_embedding_correction = mlm_embedding_correction
        self.token_embedding.pruned_from = checked["pruned_from"]
        self.merged_add_ffn = plain_record(merged_add_ffn)
        self.cls_token_index = 0
        self.frozen_base = False
        # What the attach_* / enable_* calls below (or later) set.
        for name in (*ATTACHMENT_RECORDS[:-1], "asa", "lora"):
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
        if lora:
            self.enable_lora(**lora)

    def call(self, inputs, training=None, mask=None):
        self.callers.add(outermost_caller(default=self))
        if training and self.asa is not None and not in_asa_training_pass():
            raise ValueError(ASA_OUTSIDE_ITS_PASS)
        return super().call(inputs, training=training, mask=mask)

    @property
    def drop_token(self):
        """The graph's `DropToken` once `enable_drop_token` turned it on, else None."""
        return self.token_dropping if self.drop_token_enabled else None

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
        biases = per_layer(attention_bias, self.num_layers, "attention_bias")
        prefixes = per_layer(kv_prefixes, self.num_layers, "kv_prefixes", shared=False)
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
        self, inputs, attention_mask_fn=None, mask_semantics="replace", training=None
    ):
        """``embed -> DropToken -> encode -> RestoreDroppedTokens -> pool`` on an input dict.

        The backbone's functional graph is this call on its `keras.Input`s,
        for training and inference alike: `DropToken` and the restore are
        the identity at inference and until `enable_drop_token` configures
        them. Dropped tokens keep their original positions, and gather mode
        restores ``sequence_output`` to full length (zeros where a token
        was dropped).

        Args:
            inputs: dict with ``token_ids``, ``padding_mask`` and, as the
                backbone takes them, ``segment_ids`` and ``position_ids``.
            attention_mask_fn, mask_semantics: see `encode` (ASA's
                adversarial pass; not with a gather-mode `DropToken`).
            training: bool, whether dropout (and token dropping) is active.

        Returns:
            ``{"sequence_output", "pooled_output", "token_mask"}``;
            ``token_mask`` is 1 for the real tokens the encoder read (every
            real token at inference).
        """
        self.check_inputs(inputs, required=("token_ids", "padding_mask"))
        # A compiled step cannot raise on values: any nonzero marks a real token.
        padding_mask = ops.cast(ops.not_equal(inputs["padding_mask"], 0), "int32")
        position_ids = inputs.get("position_ids")
        hidden = self.embed(
            inputs["token_ids"], inputs.get("segment_ids"), position_ids, training=training
        )
        flag = {} if training is None else {"training": training}
        dropped = self.token_dropping(
            hidden, padding_mask, token_ids=inputs["token_ids"], position_ids=position_ids, **flag
        )
        encoder_mask, attention_bias = dropped["padding_mask"], None
        if attention_mask_fn is not None:
            # An adversary's mask takes the padding mask's place ("replace"
            # semantics ignore it), so dropped keys (if any) are hidden by a bias.
            encoder_mask = padding_mask
            attention_bias = padding_mask_to_bias(dropped["keep_mask"], hidden.dtype)
        sequence = self.encode(
            dropped["hidden"],
            encoder_mask,
            dropped["position_ids"],
            attention_bias,
            training=training,
            attention_mask_fn=attention_mask_fn,
            mask_semantics=mask_semantics,
        )
        pooled = self.pool(sequence, dropped["padding_mask"])
        sequence = self.restore_dropped_tokens(sequence, dropped["keep_mask"], **flag)
        token_mask = ops.cast(dropped["keep_mask"], "int32") * ops.cast(padding_mask, "int32")
        return {"sequence_output": sequence, "pooled_output": pooled, "token_mask": token_mask}

    def check_inputs(self, inputs, required=None, allowed=None):
        """Checks an input dict at the backbone's door; raises a ValueError.

        Every entry point runs it (``backbone(inputs)``, `forward_stages`, and
        ``fit`` / ``evaluate`` / ``predict`` on numpy data before a step
        compiles). Shapes and dtypes are checked always; values when
        concrete: ids in range, a 0/1 ``padding_mask``, every input of the
        shape of ``token_ids``. A compiled step cannot raise on values: an
        out-of-range id makes its row NaN (see `TransformerEmbedding`), and
        any nonzero ``padding_mask`` value marks a real token.

        Args:
            inputs: dict of the backbone's inputs.
            required: keys that must be present; None for the backbone's
                own inputs (``segment_ids`` without segments and
                ``position_ids`` without ``custom_position_ids`` are not).
            allowed: the keys the calling model takes; None for the
                backbone's own inputs. Any other key is refused: Keras would
                match it to another input by position, silently.

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
        own = ["token_ids", "padding_mask"]
        if embeddings.num_segments > 0:
            own.append("segment_ids")
        if self.custom_position_ids:
            own.append("position_ids")
        required = own if required is None else required
        check_encoder_inputs(
            inputs,
            vocabulary_size=embeddings.vocabulary_size,
            num_segments=embeddings.num_segments,
            required=tuple(required),
            position_ranks=(3,) if self.position == "rotary2d" else (2,),
            max_position=(
                embeddings.max_sequence_length if embeddings.use_position_embedding else None
            ),
            allowed=own if allowed is None else allowed,
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

    @property
    def mlm_embedding_correction(self):
        """The record (a dict) of the MLM embedding correction applied, or None.

        Kept on the token embedding layer, which the correction changes: a
        correction through a model built on this backbone's layers (with
        ``backbone.output``) is this backbone's too, and its config carries it.
        """
        return getattr(self.token_embedding, "mlm_embedding_correction", None)

    @mlm_embedding_correction.setter
    def mlm_embedding_correction(self, record):
        self.token_embedding.mlm_embedding_correction = record

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in CONFIG_NAMES})
        records = ("mlm_embedding_correction", "merged_add_ffn", *ATTACHMENT_RECORDS[:-1])
        records += ("asa", "lora")
        config.update({name: plain_record(getattr(self, name)) for name in records})
        config.update(frozen_base=self.frozen_base, drop_token=drop_token_record(self.drop_token))
        config.update(pruned_from=plain_record(self.token_embedding.pruned_from))
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
