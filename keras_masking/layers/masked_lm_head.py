"""The masked-LM head, with its output projection tied to the embedding."""

import weakref

import keras
from keras import ops

from keras_masking.layers.activations import resolve_activation
from keras_masking.layers.initializers import clone_initializer
from keras_masking.utils.arguments import check_float

# The heads built on each embedding layer, wherever they live: a correction of
# the embedding through one model finds the heads of the others.
_HEADS_ON_EMBEDDING = weakref.WeakKeyDictionary()


def heads_on_embedding(token_embedding):
    """The live `MaskedLMHead` layers built on ``token_embedding``.

    Args:
        token_embedding: a `keras.layers.Embedding`.

    Example:
    >>> embedding = keras.layers.ReversibleEmbedding(100, 32)
    >>> head = MaskedLMHead(embedding)
    >>> heads_on_embedding(embedding) == [head]
    True
    """
    return list(_HEADS_ON_EMBEDDING.get(token_embedding, ()))


@keras.saving.register_keras_serializable(package="keras_masking")
class MaskedLMHead(keras.layers.Layer):
    """BERT's MLM head: dense + activation + LayerNorm, then tied logits.

    ``logits = LN(f(h W + b)) E^T + output_bias``, where ``E`` is the token
    embedding matrix (a `keras.layers.ReversibleEmbedding`) passed in, so the
    head's output projection is the embedding itself (Google's
    ``cls/predictions``). Only the positions in ``mask_positions`` are
    projected, as in keras-hub, so the cost scales with the masked count.

    The logits are float32 under every dtype policy (only the dense
    transform runs in a 16-bit compute dtype), so a softmax over a large
    vocabulary keeps its precision.

    When the input embedding is corrected in place by an affine map of some
    rows (``E_i -> a E_i + c``, the MLM embedding correction),
    `keep_original_output_rows` makes those rows' logits ``(h . E'_i - h .
    c) / a = h . E_i``: the head keeps predicting with the original rows.

    Its config holds the embedding's config, so ``from_config`` alone gives a
    head with a new embedding of the same shape (`TransformerMaskedLM`
    shares the backbone's when loaded).

    Args:
        token_embedding: the backbone's `keras.layers.ReversibleEmbedding` (or
            its serialized config).
        activation: activation of the transform (``"gelu"`` = exact GELU).
        layer_norm_epsilon: float. LayerNorm epsilon.
        kernel_initializer: initializer of the transform kernel.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float tensor ``(batch, sequence, hidden)``.
        mask_positions: optional int tensor ``(batch, masks)``; every position
            when None. A position outside ``[0, sequence)`` gives NaN logits.

    Returns:
        float32 logits ``(batch, masks, vocabulary)`` (``masks = sequence``
        when ``mask_positions`` is None).

    Example:
    >>> embedding = keras.layers.ReversibleEmbedding(100, 32)
    >>> embedding.build((None, None))
    >>> head = MaskedLMHead(embedding)
    >>> logits = head(keras.ops.ones((2, 5, 32)), keras.ops.zeros((2, 3), "int32"))
    >>> tuple(logits.shape), keras.backend.standardize_dtype(logits.dtype)
    ((2, 3, 100), 'float32')
    """

    def __init__(
        self,
        token_embedding,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(token_embedding, keras.layers.Embedding):
            raise ValueError(
                "Expected a keras.layers.ReversibleEmbedding (the backbone's token embedding) "
                f"for token_embedding. Received: token_embedding={token_embedding!r}."
            )
        self.token_embedding = token_embedding
        _HEADS_ON_EMBEDDING.setdefault(token_embedding, weakref.WeakSet()).add(self)
        self.activation = activation
        self.layer_norm_epsilon = check_float(
            "layer_norm_epsilon", layer_norm_epsilon, 0.0, open_minimum=True
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.transform_dense = None
        self.transform_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy.variable_dtype,
            name="transform_layer_norm",
        )
        # The dense transform computes in the policy's compute dtype; the
        # LayerNorm and the tied product in float32 (a float32 layer reads the
        # embedding's float32 variable unrounded under any autocast scope;
        # the head's own variables are never autocast).
        self.tied_logits = _TiedLogits(
            token_embedding, dtype=self._logits_dtype, name="tied_logits"
        )
        self.output_bias = None

    @property
    def _logits_dtype(self):
        """float32, or float64 under a float64 policy."""
        return "float64" if self.dtype_policy.variable_dtype == "float64" else "float32"

    def build(self, hidden_shape, mask_positions_shape=None):
        hidden_dim = hidden_shape[-1]
        if not self.token_embedding.built:
            self.token_embedding.build((None, None))
        self.transform_dense = keras.layers.Dense(
            hidden_dim,
            activation=resolve_activation(self.activation),
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="transform_dense",
        )
        self.transform_dense.build(hidden_shape)
        self.transform_layer_norm.build(hidden_shape)
        vocabulary_size = self.token_embedding.input_dim
        self.output_bias = self.add_weight(
            shape=(vocabulary_size,), initializer="zeros", autocast=False, name="output_bias"
        )
        # The compensation of a corrected embedding table (identity by default).
        for name, size, initializer in (
            ("output_row_scale", vocabulary_size, "ones"),
            ("output_row_shift_weight", vocabulary_size, "zeros"),
            ("output_shift", hidden_dim, "zeros"),
        ):
            weight = self.add_weight(
                shape=(size,), initializer=initializer, trainable=False, autocast=False, name=name
            )
            setattr(self, name, weight)
        self.built = True

    def keep_original_output_rows(self, row_scale, row_shift_weight, shift):
        """Makes the tied logits use the rows as they were before a correction.

        Args:
            row_scale: ``(vocabulary,)`` array, ``1 / a`` for corrected rows
                and 1 elsewhere.
            row_shift_weight: ``(vocabulary,)`` array, ``1 / a`` for
                corrected rows and 0 elsewhere.
            shift: ``(hidden,)`` array ``c``.
        """
        self.output_row_scale.assign(row_scale)
        self.output_row_shift_weight.assign(row_shift_weight)
        self.output_shift.assign(shift)

    def reset_output_rows(self):
        """Back to plain tied logits (identity compensation)."""
        self.output_row_scale.assign(ops.ones(self.output_row_scale.shape))
        self.output_row_shift_weight.assign(ops.zeros(self.output_row_shift_weight.shape))
        self.output_shift.assign(ops.zeros(self.output_shift.shape))

    def call(self, hidden, mask_positions=None):
        if mask_positions is not None:
            # A position outside the sequence predicts NaN (as an out-of-range id
            # does); a gather would wrap -1, clamp or raise, by backend.
            index = ops.cast(mask_positions, "int32")
            valid = (index >= 0) & (index < ops.shape(hidden)[1])
            hidden = ops.take_along_axis(hidden, ops.where(valid, index, 0)[..., None], axis=1)
            hidden = ops.where(valid[..., None], hidden, ops.cast(float("nan"), hidden.dtype))
        dtype = self._logits_dtype
        hidden = self.transform_layer_norm(self.transform_dense(hidden))
        hidden = ops.cast(hidden, dtype)
        logits = self.tied_logits(hidden)
        shift = ops.einsum("...d,d->...", hidden, ops.cast(self.output_shift, dtype))
        logits = (
            ops.cast(self.output_row_scale, dtype) * logits
            - ops.cast(self.output_row_shift_weight, dtype) * shift[..., None]
        )
        return logits + ops.cast(self.output_bias, dtype)

    def compute_output_shape(self, hidden_shape, mask_positions_shape=None):
        length = hidden_shape[1] if mask_positions_shape is None else mask_positions_shape[1]
        return (hidden_shape[0], length, self.token_embedding.input_dim)

    def compute_output_spec(self, hidden, mask_positions=None):
        shape = self.compute_output_shape(
            hidden.shape, None if mask_positions is None else mask_positions.shape
        )
        return keras.KerasTensor(shape, self._logits_dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "token_embedding": keras.saving.serialize_keras_object(self.token_embedding),
            "activation": self.activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("token_embedding"), dict):
            config["token_embedding"] = keras.saving.deserialize_keras_object(
                config["token_embedding"]
            )
        return super().from_config(config)


class _TiedLogits(keras.layers.Layer):
    """``hidden E^T`` with the token embedding's own (unrounded) weights."""

    def __init__(self, token_embedding, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.built = True

    def call(self, hidden):
        embedding = self.token_embedding
        dtype = self.compute_dtype
        if getattr(embedding, "quantization_mode", None) is not None:
            return ops.cast(embedding(hidden, reverse=True), dtype)
        if getattr(embedding, "tie_weights", True):
            kernel = ops.transpose(ops.cast(embedding.embeddings, dtype))
        else:
            kernel = ops.cast(embedding.reverse_embeddings, dtype)
        logits = ops.matmul(ops.cast(hidden, dtype), kernel)
        soft_cap = getattr(embedding, "logit_soft_cap", None)
        if soft_cap is not None:
            logits = ops.tanh(logits / soft_cap) * soft_cap
        return logits

    def compute_output_shape(self, hidden_shape):
        return tuple(hidden_shape[:-1]) + (self.token_embedding.input_dim,)
