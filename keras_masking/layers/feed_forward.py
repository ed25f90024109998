"""The position-wise feed-forward network of a transformer layer."""

import keras

from keras_masking.layers.activations import resolve_activation
from keras_masking.layers.initializers import clone_initializer
from keras_masking.layers.lora_dense import LoRADense
from keras_masking.utils.arguments import check_int


@keras.saving.register_keras_serializable(package="keras_masking")
class FeedForward(keras.layers.Layer):
    """``f(x W1 + b1) W2 + b2``: the FFN of a BERT-family layer.

    The output is the raw FFN output, before dropout, residual and
    LayerNorm; `TransformerBlock.feed_forward_sublayer` adds extra branches
    (FL-tuning's addFFN) to it at that point.

    Args:
        intermediate_dim: int. Number of hidden units ``m``.
        activation: activation name (``"gelu"`` is the exact erf GELU,
            ``"gelu_approximate"`` the tanh form) or callable.
        kernel_initializer: initializer of both kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> ffn = FeedForward(intermediate_dim=64, activation="gelu")
    >>> tuple(ffn(keras.ops.ones((2, 5, 32))).shape)
    (2, 5, 32)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="gelu",
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_int("intermediate_dim", intermediate_dim, minimum=1)
        self.activation = activation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.intermediate_dense = LoRADense(
            self.intermediate_dim,
            activation=resolve_activation(activation),
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="intermediate_dense",
        )
        self.output_dense = None

    def build(self, input_shape):
        self.intermediate_dense.build(input_shape)
        self.output_dense = LoRADense(
            input_shape[-1],
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="output_dense",
        )
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        self.built = True

    def call(self, hidden):
        return self.output_dense(self.intermediate_dense(hidden))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(intermediate_dim=self.intermediate_dim, activation=self.activation)
        config["kernel_initializer"] = keras.initializers.serialize(self.kernel_initializer)
        return config
