"""Multi-head self-attention with position schemes and public hooks."""

import math

import keras
from keras import ops

from keras_masking.distribution.dropout import ReplicaDropout
from keras_masking.layers.initializers import clone_initializer
from keras_masking.layers.lora_dense import LoRADense
from keras_masking.ops.attention_masks import apply_replacing_mask
from keras_masking.ops.attention_masks import padding_mask_to_bias
from keras_masking.ops.relative_position import relative_position_embeddings
from keras_masking.ops.relative_position import relative_position_table
from keras_masking.ops.rotary import apply_interleaved_rotary
from keras_masking.ops.rotary import apply_rotary_2d
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.eager_checks import static_shape

POSITION_SCHEMES = ("absolute", "rotary", "relative", "rotary2d")
_ROTATIONS = {"rotary": apply_interleaved_rotary, "rotary2d": apply_rotary_2d}


def validate_position_scheme(position):
    """Raises a ValueError unless ``position`` is a known scheme name."""
    check_choice("position", position, POSITION_SCHEMES)


@keras.saving.register_keras_serializable(package="keras_masking")
class SelfAttention(keras.layers.Layer):
    """Multi-head self-attention for BERT, RoFormer and NEZHA.

    The position scheme is applied inside attention from ``position_ids``:
    ``"absolute"`` does nothing here (positions were added to the
    embeddings), ``"rotary"`` rotates queries and keys by RoFormer's
    interleaved RoPE, ``"rotary2d"`` by ExLM's 2D RoPE (``position_ids``
    ``(batch, sequence, 2)``: original index and copy index),
    ``"relative"`` adds NEZHA's clipped sinusoidal relative embeddings to
    the logits and to the values.

    Public hooks (call arguments, free when None) let methods change
    attention without touching this layer's internals: ``attention_bias``
    (DropToken's attention mode), ``kv_prefix`` (P-tuning v2),
    ``extra_units`` (MA-tuning) and ``attention_mask_bias`` (ASA).

    Args:
        num_heads: int. Number of attention heads.
        head_dim: int. Size of each head; ``num_heads * head_dim`` is the
            projection width.
        position: one of ``"absolute"``, ``"rotary"``, ``"relative"``,
            ``"rotary2d"``.
        max_relative_position: int. Clipping distance of the ``"relative"``
            scheme (64 in NEZHA's checkpoints).
        rotary_base: float. Wavelength base of the ``"rotary"`` scheme.
        dropout: float. Dropout rate on the attention probabilities.
        kernel_initializer: initializer of the four projections.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float tensor ``(batch, sequence, hidden)``.
        padding_mask: optional 0/1 tensor ``(batch, sequence)``; 0 marks keys
            that no query may attend to.
        position_ids: optional int tensor ``(batch or 1, sequence)``; defaults
            to ``0 .. sequence - 1``. Used by the rotary and relative schemes.
        attention_bias: optional float tensor added to the logits,
            broadcastable to ``(batch, heads, query, key)``.
        kv_prefix: optional pair ``(keys, values)`` of shape ``(batch or 1,
            prefix, heads, head_dim)`` that every query may attend to, with no
            position and no bias.
        extra_units: optional `AttentionUnits` layer whose extra query/key
            dimensions add to the logits and extra values to the output.
        attention_mask_bias: optional mask bias (0 keep, negative drop)
            broadcastable to ``(batch, heads, query, key)`` that replaces the
            padding mask.
        mask_semantics: how ``attention_mask_bias`` applies: ``"replace"``,
            ``"additive"`` or ``"guarded"`` (see
            `keras_masking.ops.apply_replacing_mask`).
        training: bool, whether dropout is active.

    Example:
    >>> attention = SelfAttention(num_heads=4, head_dim=8, position="rotary")
    >>> hidden = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    >>> padding_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    >>> outputs = attention(hidden, padding_mask=padding_mask)
    >>> tuple(outputs.shape)
    (2, 5, 32)

    Keys masked out by ``padding_mask`` do not change any output:

    >>> hidden[1, 3:] = 0.0
    >>> changed = attention(hidden, padding_mask=padding_mask)
    >>> bool(np.allclose(changed[1, :3], outputs[1, :3], atol=1e-5))
    True
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        position="absolute",
        max_relative_position=64,
        rotary_base=10000.0,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_position_scheme(position)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.position = position
        self.max_relative_position = check_int(
            "max_relative_position", max_relative_position, minimum=1
        )
        self.rotary_base = check_float("rotary_base", rotary_base, 0.0, open_minimum=True)
        self.dropout = check_float("dropout", dropout, 0.0, 1.0, open_maximum=True)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        width = self.num_heads * self.head_dim
        # Named like keras-hub's lora targets, so `Backbone.enable_lora`
        # finds "query" and "value" as it is.
        self.query = self._dense(width, "query")
        self.key = self._dense(width, "key")
        self.value = self._dense(width, "value")
        self.attention_output = None
        self.probability_dropout = ReplicaDropout(
            self.dropout, dtype=self.dtype_policy, name="probability_dropout"
        )
        self.relative_table = None
        if position == "relative":
            self.relative_table = relative_position_table(self.max_relative_position, self.head_dim)

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        for projection in (self.query, self.key, self.value):
            projection.build(input_shape)
        self.attention_output = self._dense(hidden_dim, "attention_output")
        self.attention_output.build(tuple(input_shape[:-1]) + (self.num_heads * self.head_dim,))
        self.built = True

    def _dense(self, units, name):
        return LoRADense(
            units,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def _split_heads(self, x, batch, length):
        # The batch and length come from the layer's input, not from ``x``:
        # tf2onnx's optimizer drops a projection's all-zero bias and then
        # reads ``x``'s shape from the flattened matmul before it, so the
        # ONNX file asked for a (tokens, hidden, heads, size) reshape.
        return ops.reshape(x, (batch, length, self.num_heads, self.head_dim))

    def call(
        self,
        hidden,
        padding_mask=None,
        position_ids=None,
        attention_bias=None,
        kv_prefix=None,
        extra_units=None,
        attention_mask_bias=None,
        mask_semantics="replace",
        training=None,
    ):
        batch, length = ops.shape(hidden)[0], ops.shape(hidden)[1]
        if padding_mask is not None:
            _check_mask_shape(padding_mask, hidden)
        if position_ids is None:
            position_ids = ops.arange(length, dtype="int32")[None, :]
        query = self._split_heads(self.query(hidden), batch, length)
        key = self._split_heads(self.key(hidden), batch, length)
        value = self._split_heads(self.value(hidden), batch, length)
        rotate = _ROTATIONS.get(self.position)
        if rotate is not None:
            query = rotate(query, position_ids, self.rotary_base)
            key = rotate(key, position_ids, self.rotary_base)
        scale = 1.0 / math.sqrt(self.head_dim)
        query = query * ops.cast(scale, query.dtype)
        # [B, H, Q, K]
        logits = ops.einsum("bqhd,bkhd->bhqk", query, key)
        extra_value = None
        if extra_units is not None:
            extra_query, extra_key, extra_value = extra_units.projections(hidden)
            extra_query = extra_query * ops.cast(scale, extra_query.dtype)
            logits = logits + ops.einsum("bqhd,bkhd->bhqk", extra_query, extra_key)
        relative = None
        if self.position == "relative":
            relative = relative_position_embeddings(
                position_ids, ops.cast(self.relative_table, query.dtype), self.max_relative_position
            )
            logits = logits + _einsum_table("bqhd,bqkd->bhqk", query, relative)
        if attention_mask_bias is not None:
            logits = apply_replacing_mask(logits, attention_mask_bias, padding_mask, mask_semantics)
        elif padding_mask is not None:
            logits = logits + padding_mask_to_bias(padding_mask, logits.dtype)
        if attention_bias is not None:
            logits = logits + ops.cast(attention_bias, logits.dtype)
        prefix_logits = None
        if kv_prefix is not None:
            prefix_key, prefix_value = kv_prefix
            prefix_key = ops.cast(prefix_key, query.dtype)
            prefix_logits = _einsum_table("bqhd,bphd->bhqp", query, prefix_key)
            prefix_logits = ops.cast(prefix_logits, logits.dtype)
            logits = ops.concatenate([prefix_logits, logits], axis=-1)
        probabilities = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        probabilities = ops.cast(probabilities, value.dtype)
        probabilities = self.probability_dropout(probabilities, training=training)
        if prefix_logits is not None:
            prefix_length = ops.shape(prefix_logits)[-1]
            prefix_probabilities = probabilities[..., :prefix_length]
            probabilities = probabilities[..., prefix_length:]
        context = ops.einsum("bhqk,bkhd->bqhd", probabilities, value)
        if relative is not None:
            context = context + _einsum_table("bhqk,bqkd->bqhd", probabilities, relative)
        if prefix_logits is not None:
            prefix_value = ops.cast(prefix_value, value.dtype)
            context = context + _einsum_table("bhqp,bphd->bqhd", prefix_probabilities, prefix_value)
        context = ops.reshape(context, (batch, length, self.num_heads * self.head_dim))
        output = self.attention_output(context)
        if extra_value is not None:
            extra_context = ops.einsum("bhqk,bkhd->bqhd", probabilities, extra_value)
            output = output + extra_units.project_output(extra_context)
        return output

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        names = ("num_heads", "head_dim", "position", "max_relative_position", "rotary_base")
        config.update({name: getattr(self, name) for name in names + ("dropout",)})
        config["kernel_initializer"] = keras.initializers.serialize(self.kernel_initializer)
        return config


def _einsum_table(equation, tensor, table):
    """``einsum(equation, tensor, table)``; a table of batch 1 is used without a batch axis."""
    if table.shape[0] != 1:
        return ops.einsum(equation, tensor, table)
    operands, output = equation.split("->")
    first, second = operands.split(",")
    return ops.einsum(f"{first},{second[1:]}->{output}", tensor, table[0])


def _check_mask_shape(padding_mask, hidden):
    """A padding mask ``(batch, sequence)`` of ``hidden``'s: a static shape check (a
    mask of another shape would broadcast over the keys without a word)."""
    mask, expected = static_shape(padding_mask), static_shape(hidden)[:2]
    if len(mask) != 2 or any(
        None not in (got, want) and got != want for got, want in zip(mask, expected)
    ):
        raise ValueError(
            f"Expected a padding_mask of shape (batch, sequence) = {expected}. "
            f"Received: padding_mask.shape={mask}."
        )
