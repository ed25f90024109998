"""FL-tuning's addFFN: a small trainable FFN in parallel with a frozen one."""

import keras

from keras_masking.layers.activations import activation_name
from keras_masking.layers.feed_forward import FeedForward
from keras_masking.layers.initializers import bert_initializer
from keras_masking.utils.arguments import check_int


@keras.saving.register_keras_serializable(package="keras_masking")
class AddFFN(FeedForward):
    """``f(x W1' + b1') W2' + b2'``: k extra hidden units for one FFN.

    A `FeedForward` with ``units`` hidden units whose output is added to the
    frozen FFN's output before dropout, residual and LayerNorm
    (`TransformerBlock.attach_feed_forward_branch`). With ``f`` equal to the
    base FFN's activation, base FFN plus addFFN is exactly a plain FFN with
    ``m + k`` hidden units (`keras_masking.merge_fl`).

    Kernels start from ``TruncatedNormal(0.02)`` (``W2'`` is not zero), biases
    from zeros, as in the FL-tuning paper.

    Args:
        units: int >= 1, the number of added hidden units ``k`` (160 in the
            paper).
        activation: the base FFN's activation (name or callable).
        kernel_initializer: initializer of both kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> branch = AddFFN(units=8, activation="gelu")
    >>> tuple(branch(keras.ops.ones((2, 5, 32))).shape)
    (2, 5, 32)
    """

    def __init__(self, units, activation="gelu", kernel_initializer=None, **kwargs):
        units = check_int("units", units, minimum=1)
        super().__init__(
            intermediate_dim=units,
            activation=activation_name(activation),
            kernel_initializer=kernel_initializer or bert_initializer(),
            **kwargs,
        )

    @property
    def units(self):
        """The number of added hidden units."""
        return self.intermediate_dim

    def get_config(self):
        config = super().get_config()
        config["units"] = config.pop("intermediate_dim")
        return config
