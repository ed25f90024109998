"""GradientReversal: identity forward, gradient times -alpha backward."""

import keras

from keras_masking.ops.gradient_reversal import reverse_gradient
from keras_masking.utils.arguments import check_float


@keras.saving.register_keras_serializable(package="keras_masking")
class GradientReversal(keras.layers.Layer):
    """The gradient reversal layer (GRL).

    Passes its input through unchanged and multiplies the gradient flowing
    back by ``-alpha``, so that what sits before it ascends the loss that
    what sits after it descends (ASA's adversaries; domain-adversarial
    training, Ganin & Lempitsky, 2015). No weights.

    Args:
        alpha: float >= 0, the strength of the reversal (0 stops the gradient,
            1 reverses it unscaled).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: a float tensor.

    Example:
    >>> layer = GradientReversal(alpha=0.5)
    >>> keras.ops.convert_to_numpy(layer(keras.ops.ones((1, 3))))
    array([[1., 1., 1.]], dtype=float32)
    """

    def __init__(self, alpha=1.0, **kwargs):
        super().__init__(**kwargs)
        self.alpha = check_float("alpha", alpha, minimum=0.0)
        self.supports_masking = True
        self.built = True

    def call(self, inputs):
        return reverse_gradient(inputs, self.alpha)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha}
