"""Value checks that run when inputs are concrete (eager calls).

Inside a compiled step (``tf.function``, ``jax.jit``) values are symbolic and
cannot be inspected without a data-dependent branch, so these checks are
skipped there; eager calls (``model(inputs)``) get a clear error instead of
TensorFlow's gather error or JAX's silent clamping.
"""

import numpy as np
from keras import backend


def concrete_value(x):
    """``x`` as a numpy array if it is concrete, else None.

    Args:
        x: a numpy array, an eager tensor of the active backend, or a
            symbolic/traced tensor.

    Returns:
        A numpy array, or None for symbolic and traced values.
    """
    if x is None:
        return None
    if isinstance(x, (np.ndarray, list, tuple, int)):
        return np.asarray(x)
    name = backend.backend()
    if name == "tensorflow":
        import tensorflow as tf

        if isinstance(x, tf.Tensor) and tf.executing_eagerly() and hasattr(x, "numpy"):
            return x.numpy()
        return None
    if name == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            return None
        if isinstance(x, jax.Array):
            return np.asarray(x)
        return None
    if name == "numpy":
        return np.asarray(x)
    return None


def check_ids_in_range(ids, upper, what, limit_name):
    """Raises ValueError if concrete ``ids`` fall outside ``[0, upper)``.

    Args:
        ids: integer tensor.
        upper: exclusive upper bound.
        what: name of the ids in the message (``"token_ids"``).
        limit_name: name of the bound in the message.
    """
    values = concrete_value(ids)
    if values is None or values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= upper:
        bad = values[(values < 0) | (values >= upper)]
        raise ValueError(
            f"{what} must lie in [0, {upper}) ({limit_name}={upper}). "
            f"Received values {sorted(set(bad.tolist()))[:10]}."
        )
