"""A workaround for slow token-dropping steps under TensorFlow's XLA on CPU.

TensorFlow 2.21's XLA CPU compiler emits fusions with its newer "fusion
emitters". When a training program shortens the sequence (DropToken's
gather, or even a static slice) and the encoder then runs dropout, those
fusions make the step several times slower than the full-length step
(measured: 0.41 s against 0.11 s; with the emitters off, 0.07 s). Turning the
emitters off (``--xla_cpu_use_fusion_emitters=false``) restores the expected
speed-up and leaves plain steps as fast as before. JAX's XLA and TensorFlow
without XLA are not affected.

XLA reads ``XLA_FLAGS`` once, at the first compilation in the process, so the
flag must be set before the first ``jit_compile=True`` step runs.
"""

import os
import warnings

import keras

FUSION_EMITTERS_OFF_FLAG = "--xla_cpu_use_fusion_emitters=false"

_warned = False


def xla_cpu_fusion_emitters_disabled():
    """Whether ``XLA_FLAGS`` already turns the XLA CPU fusion emitters off."""
    return FUSION_EMITTERS_OFF_FLAG in os.environ.get("XLA_FLAGS", "").split()


def disable_xla_cpu_fusion_emitters():
    """Adds ``--xla_cpu_use_fusion_emitters=false`` to ``XLA_FLAGS``.

    Call it before the first XLA compilation of the process (for example right
    after the imports). Compilations already done keep their code. Only XLA's
    CPU backend reads the flag; GPU and TPU compilations are unchanged.

    Returns:
        The new value of ``XLA_FLAGS``.

    Example:
    ```python
    import keras_masking
    keras_masking.utils.disable_xla_cpu_fusion_emitters()
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    ```
    """
    if not xla_cpu_fusion_emitters_disabled():
        flags = os.environ.get("XLA_FLAGS", "").split()
        os.environ["XLA_FLAGS"] = " ".join(flags + [FUSION_EMITTERS_OFF_FLAG])
    return os.environ["XLA_FLAGS"]


def warn_if_slow_token_dropping_under_xla():
    """Warns once when TensorFlow would compile shortened sequences slowly.

    Applies to the TensorFlow backend with no GPU visible and the flag unset;
    silent everywhere else.
    """
    global _warned
    if _warned or keras.config.backend() != "tensorflow" or xla_cpu_fusion_emitters_disabled():
        return
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return
    _warned = True
    warnings.warn(
        "On TensorFlow's XLA CPU backend, training steps that drop tokens run several times "
        "slower than they should unless the XLA CPU fusion emitters are off. Call "
        "keras_masking.utils.disable_xla_cpu_fusion_emitters() before the first "
        "jit_compile=True step (or set XLA_FLAGS=--xla_cpu_use_fusion_emitters=false), or "
        "compile with jit_compile=False.",
        stacklevel=3,
    )
