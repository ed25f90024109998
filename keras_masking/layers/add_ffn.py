"""FL-tuning's addFFN: a small trainable FFN in parallel with a frozen one."""

import keras

from keras_masking.layers.activations import activation_name
from keras_masking.layers.activations import resolve_activation
from keras_masking.layers.initializers import bert_initializer


@keras.saving.register_keras_serializable(package="keras_masking")
class AddFFN(keras.layers.Layer):
    """``f(x W1' + b1') W2' + b2'``: k extra hidden units for one FFN.

    Its output is added to the frozen FFN's output before dropout, residual
    and LayerNorm (`TransformerBlock.attach_feed_forward_branch`). With ``f``
    equal to the base FFN's activation, base FFN plus addFFN is exactly a
    plain FFN with ``m + k`` hidden units (`keras_masking.merge_fl`).

    Kernels start from ``TruncatedNormal(0.02)`` (``W2'`` is not zero), biases
    from zeros, as in the FL-tuning paper.

    Args:
        units: int, the number of added hidden units ``k`` (160 in the paper).
        activation: the base FFN's activation (name or callable).
        kernel_initializer: initializer of both kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> branch = AddFFN(units=8, activation="gelu")
    >>> branch(keras.ops.ones((2, 5, 32))).shape
    (2, 5, 32)
    """

    def __init__(self, units, activation="gelu", kernel_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(units, int) or isinstance(units, bool) or units < 1:
            raise ValueError(f"`units` must be a positive integer. Received: units={units!r}")
        self.units = units
        self.activation = activation_name(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer or bert_initializer())
        self.intermediate_dense = keras.layers.Dense(
            units,
            activation=resolve_activation(self.activation),
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="intermediate_dense",
        )
        self.output_dense = None

    def build(self, input_shape):
        self.intermediate_dense.build(input_shape)
        self.output_dense = keras.layers.Dense(
            input_shape[-1],
            kernel_initializer=self.kernel_initializer.__class__.from_config(
                self.kernel_initializer.get_config()
            ),
            dtype=self.dtype_policy,
            name="output_dense",
        )
        self.output_dense.build(tuple(input_shape[:-1]) + (self.units,))
        self.built = True

    def call(self, hidden):
        return self.output_dense(self.intermediate_dense(hidden))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "activation": self.activation,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
