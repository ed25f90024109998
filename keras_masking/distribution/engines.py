"""data_parallel_engine: the backend's own data-parallel engine, one per process."""

import contextlib
import json
import os

import keras

_ENGINES = {}


def data_parallel_engine():
    """Keras' data-parallel engine of the running backend, over every device.

    * JAX: `keras.distribution.DataParallel` over
      `keras.distribution.list_devices()` (every process's devices after
      ``jax.distributed.initialize``).
    * TensorFlow: `tf.distribute.MultiWorkerMirroredStrategy` when
      ``TF_CONFIG`` names a cluster, else `tf.distribute.MirroredStrategy`
      over the local GPUs (without one, over every logical CPU device:
      one unless ``tf.config.set_logical_device_configuration`` made more).

    The engine is made once per process and returned again on later calls
    (TensorFlow's collectives take one strategy per process). Enter its
    ``scope()`` to build, compile and fit; Keras splits each global batch.

    Returns:
        A `keras.distribution.DataParallel` or a `tf.distribute.Strategy`.

    Raises:
        ValueError: on a backend without a data-parallel engine here (torch).

    Example:

    >>> engine = data_parallel_engine()
    >>> engine is data_parallel_engine()
    True
    """
    backend = keras.config.backend()
    if backend in _ENGINES:
        return _ENGINES[backend]
    if backend == "jax":
        engine = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    elif backend == "tensorflow":
        import tensorflow as tf

        if tf_config_cluster():
            engine = tf.distribute.MultiWorkerMirroredStrategy()
        else:
            devices = tf.config.list_logical_devices("GPU")
            devices = devices or tf.config.list_logical_devices("CPU")
            engine = tf.distribute.MirroredStrategy([device.name for device in devices])
    else:
        raise ValueError(
            "Expected the jax or tensorflow backend for data-parallel training. "
            f"Received: backend={backend!r}."
        )
    _ENGINES[backend] = engine
    return engine


def tf_config_cluster():
    """The ``cluster`` that the ``TF_CONFIG`` environment variable names, or None.

    Returns:
        The ``cluster`` dict of ``TF_CONFIG`` (``{"worker": [...], ...}``),
        or None when the variable is unset, empty or names no cluster.

    Raises:
        ValueError: ``TF_CONFIG`` is not a JSON object, or its ``cluster``
            is not an object of address lists; nothing is built then.

    Example:

    >>> cluster = tf_config_cluster()  # None on a single machine
    """
    text = os.environ.get("TF_CONFIG", "")
    if not text.strip():
        return None
    try:
        config = json.loads(text)
    except ValueError as error:
        raise ValueError(
            "Expected the TF_CONFIG environment variable to hold a JSON object such as "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
            f'"index": 0}}}}. It is not JSON ({error}). Received: TF_CONFIG={text!r:.200}.'
        ) from None
    if not isinstance(config, dict):
        raise ValueError(
            "Expected the TF_CONFIG environment variable to hold a JSON object. "
            f"Received: TF_CONFIG={text!r:.200}."
        )
    cluster = config.get("cluster")
    if not cluster:
        return None
    if not isinstance(cluster, dict) or not all(
        isinstance(addresses, (list, dict)) for addresses in cluster.values()
    ):
        raise ValueError(
            "Expected the cluster of TF_CONFIG to map each job name to a list of "
            f'"host:port" addresses. Received: TF_CONFIG={text!r:.200}.'
        )
    return cluster


def engine_scope(engine):
    """``engine.scope()``, or a scope that does nothing when ``engine`` is None.

    Args:
        engine: a `keras.distribution.Distribution`, a `tf.distribute.Strategy`
            or None.

    Returns:
        A context manager.

    Example:

    >>> with engine_scope(None):
    ...     pass
    """
    if engine is None:
        return contextlib.nullcontext()
    _check_engine(engine)
    return engine.scope()


def engine_in_scope():
    """The data-parallel engine whose scope is entered, or None.

    Returns:
        `keras.distribution.distribution()` on JAX; on TensorFlow the
        `tf.distribute` strategy in scope (None for the default strategy).

    Example:

    >>> engine_in_scope() is None
    True
    """
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        return tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    return keras.distribution.distribution()


def replicas_in_sync(engine=None):
    """How many replicas a step runs on under ``engine`` (or the one in scope).

    Args:
        engine: a `keras.distribution.Distribution`, a `tf.distribute.Strategy`
            or None (the engine in scope, `engine_in_scope`).

    Returns:
        int >= 1.

    Example:

    >>> replicas_in_sync() >= 1
    True
    """
    if engine is None:
        engine = engine_in_scope()
    if engine is None:
        return 1
    _check_engine(engine)
    if hasattr(engine, "num_replicas_in_sync"):
        return int(engine.num_replicas_in_sync)
    mesh = getattr(engine, "device_mesh", None)
    if mesh is None:
        return 1
    batch_axis = getattr(engine, "batch_dim_name", mesh.axis_names[0])
    return int(mesh.shape[list(mesh.axis_names).index(batch_axis)])


def _check_engine(engine):
    """Refuses what is not a data-parallel engine (a Distribution or a Strategy)."""
    if not callable(getattr(engine, "scope", None)):
        raise ValueError(
            "Expected a keras.distribution.Distribution, a tf.distribute.Strategy or None "
            f"for engine. Received: engine={engine!r} of type {type(engine).__name__}."
        )
