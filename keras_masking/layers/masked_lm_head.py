"""The masked-LM head, with its output projection tied to the embedding."""

import keras
from keras import ops

from keras_masking.layers.activations import resolve_activation
from keras_masking.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="keras_masking")
class MaskedLMHead(keras.layers.Layer):
    """BERT's MLM head: dense + activation + LayerNorm, then tied logits.

    ``logits = LN(f(h W + b)) E^T + output_bias``, where ``E`` is the token
    embedding matrix (a `keras.layers.ReversibleEmbedding`) passed in, so the
    head's output projection is the embedding itself (Google's
    ``cls/predictions``). Only the positions in ``mask_positions`` are
    projected, as in keras-hub, so the cost scales with the masked count.

    Args:
        token_embedding: the backbone's `keras.layers.ReversibleEmbedding`.
        activation: activation of the transform (``"gelu"`` = exact GELU).
        layer_norm_epsilon: float. LayerNorm epsilon.
        kernel_initializer: initializer of the transform kernel.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float tensor ``(batch, sequence, hidden)``.
        mask_positions: optional int tensor ``(batch, masks)``; every position
            when None.

    Example:
    >>> embedding = keras.layers.ReversibleEmbedding(100, 32)
    >>> embedding.build((None, None))
    >>> head = MaskedLMHead(embedding)
    >>> head(keras.ops.ones((2, 5, 32)), keras.ops.zeros((2, 3), "int32")).shape
    (2, 3, 100)
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
        self.token_embedding = token_embedding
        self.activation = activation
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.transform_dense = None
        self.transform_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy,
            name="transform_layer_norm",
        )
        self.output_bias = None

    def build(self, hidden_shape, mask_positions_shape=None):
        hidden_dim = hidden_shape[-1]
        self.transform_dense = keras.layers.Dense(
            hidden_dim,
            activation=resolve_activation(self.activation),
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="transform_dense",
        )
        self.transform_dense.build(hidden_shape)
        self.transform_layer_norm.build(hidden_shape)
        self.output_bias = self.add_weight(
            shape=(self.token_embedding.input_dim,),
            initializer="zeros",
            name="output_bias",
        )
        self.built = True

    def call(self, hidden, mask_positions=None):
        if mask_positions is not None:
            index = ops.cast(mask_positions, "int32")[..., None]
            hidden = ops.take_along_axis(hidden, index, axis=1)
        hidden = self.transform_layer_norm(self.transform_dense(hidden))
        logits = self.token_embedding(hidden, reverse=True)
        return logits + ops.cast(self.output_bias, logits.dtype)

    def compute_output_shape(self, hidden_shape, mask_positions_shape=None):
        length = hidden_shape[1]
        if mask_positions_shape is not None:
            length = mask_positions_shape[1]
        return (hidden_shape[0], length, self.token_embedding.input_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        raise ValueError(
            "MaskedLMHead shares its output projection with a token embedding "
            "and is rebuilt by its owner (TransformerMaskedLM), not from its "
            "config alone."
        )
