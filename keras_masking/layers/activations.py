"""Activation names as checkpoints spell them, resolved to Keras functions."""

import contextlib

import keras

# Google's configs say "gelu"; Hugging Face and bert4keras read it as the
# exact (erf) GELU, and so do we. The tanh approximation has its own names.
_APPROXIMATE_GELU_NAMES = ("gelu_approximate", "gelu_new", "gelu_pytorch_tanh")
_EXACT_GELU_NAMES = ("gelu", "gelu_erf")


@keras.saving.register_keras_serializable(package="keras_masking")
def gelu_approximate(x):
    """GELU with the tanh approximation (keras-hub's BERT activation)."""
    return keras.activations.gelu(x, approximate=True)


_ERF_GELU = [False]


@contextlib.contextmanager
def gelu_as_erf():
    """Within the block, `gelu_exact` traces as ``x * (1 + erf(x / sqrt(2))) / 2``.

    TensorFlow's fused exact ``Gelu`` lowers to an ``Erfc`` that ONNX has no
    operator for; an ONNX export traces the model inside this block. The two
    forms agree within 1e-6 in float32; outside the block the fused op runs.

    Example:
    ```python
    with keras_masking.layers.activations.gelu_as_erf():
        y = keras_masking.layers.gelu_exact(np.ones((2,), "float32"))
    ```
    """
    before = _ERF_GELU[0]
    _ERF_GELU[0] = True
    try:
        yield
    finally:
        _ERF_GELU[0] = before


@keras.saving.register_keras_serializable(package="keras_masking")
def gelu_exact(x):
    """GELU with the exact erf form (Hugging Face's and bert4keras' "gelu")."""
    if not _ERF_GELU[0]:
        return keras.activations.gelu(x, approximate=False)
    x = keras.ops.convert_to_tensor(x)
    half = keras.ops.cast(0.5, x.dtype)
    return half * x * (1.0 + keras.ops.erf(x * keras.ops.cast(0.7071067811865476, x.dtype)))


def resolve_activation(name):
    """Maps a checkpoint's ``hidden_act`` to a Keras activation.

    Args:
        name: a string such as ``"gelu"``, ``"gelu_new"``, ``"relu"``, or a
            callable (returned as is).

    Returns:
        A callable activation.
    """
    if callable(name):
        return name
    key = str(name).lower()
    if key in _EXACT_GELU_NAMES:
        return gelu_exact
    if key in _APPROXIMATE_GELU_NAMES:
        return gelu_approximate
    try:
        return keras.activations.get(key)
    except ValueError as error:
        raise ValueError(
            f"Unknown activation {name!r}. Use a Keras activation name, "
            f"one of {_EXACT_GELU_NAMES + _APPROXIMATE_GELU_NAMES}, or a "
            "callable."
        ) from error


def activation_name(activation):
    """The serializable name of an activation given by name or callable."""
    return activation if isinstance(activation, str) else keras.activations.serialize(activation)
