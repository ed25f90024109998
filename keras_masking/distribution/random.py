"""Random draws that differ across data-parallel replicas, reproducibly.

Keras' `SeedGenerator` holds one state for all replicas. Under JAX's
`keras.distribution.DataParallel` that is right: a step is one program over
the global batch and draws for all of it. Under `tf.distribute` every
replica runs the step with the same seed state, so `keras.random` gives
every replica the same numbers: the same tokens dropped, the same tokens
masked, the same dropout mask on different examples.

Two remedies, by cost:

* `batch_uniform` / `batch_randint` (draws with one value per example or
  per token: DropToken, ExLM's masking, ASA's noise): each replica draws
  the values of the GLOBAL batch and keeps its own rows. A step on ``n``
  replicas then draws exactly what one device draws on the same global
  batch, on both engines, whatever ``n``, when the replicas split the
  global batch evenly (as every data-parallel step here must: see
  docs/distributed.md).
* `replica_dropout` (dropout on hidden states, whose draws are as large as
  the activations): each replica folds its index into the seed, a
  different stream per replica from the same seed.

Outside a replica context with several replicas every function here is the
`keras.random` call it replaces, value for value.
"""

import keras

from keras_masking.distribution.replicas import replica_position


def _global_rows(draw, shape, **kwargs):
    """``draw(global_shape, **kwargs)`` sliced to this replica's rows of axis 0."""
    index, count = replica_position()
    if count == 1:
        return draw(tuple(shape), **kwargs)
    import tensorflow as tf

    batch = shape[0]
    values = draw((batch * count,) + tuple(shape[1:]), **kwargs)
    start = tf.cast(index, "int32") * tf.cast(batch, "int32")
    return values[start : start + batch]


def batch_uniform(shape, seed, minval=0.0, maxval=1.0, dtype="float32"):
    """`keras.random.uniform` for a draw whose axis 0 is the batch.

    Under `tf.distribute`, every replica draws the uniform values of the
    global batch (``replicas x`` its rows) from the shared seed and keeps its
    own slice, so replicas differ and the step draws what one device draws
    on the global batch split evenly (the slices follow the replica order,
    as `tf.distribute` splits a batch). Elsewhere it is
    ``keras.random.uniform(shape, minval, maxval, dtype, seed)``.

    Args:
        shape: tuple, axis 0 the batch (an int or a scalar tensor).
        seed: a `keras.random.SeedGenerator` (or an int).
        minval, maxval: floats, the range.
        dtype: the float dtype.

    Returns:
        A tensor of ``shape``.

    Example:

    >>> seed = keras.random.SeedGenerator(1)
    >>> tuple(batch_uniform((2, 3), seed).shape)
    (2, 3)
    """
    return _global_rows(
        keras.random.uniform, shape, minval=minval, maxval=maxval, dtype=dtype, seed=seed
    )


def batch_randint(shape, minval, maxval, seed, dtype="int32"):
    """`keras.random.randint` for a draw whose axis 0 is the batch.

    The same replica handling as `batch_uniform`.

    Args:
        shape: tuple, axis 0 the batch.
        minval, maxval: ints, the range ``[minval, maxval)``.
        seed: a `keras.random.SeedGenerator` (or an int).
        dtype: the integer dtype.

    Returns:
        A tensor of ``shape``.

    Example:

    >>> seed = keras.random.SeedGenerator(1)
    >>> tuple(batch_randint((2, 3), 0, 10, seed).shape)
    (2, 3)
    """
    return _global_rows(
        keras.random.randint, shape, minval=minval, maxval=maxval, dtype=dtype, seed=seed
    )


def replica_dropout(inputs, rate, seed, noise_shape=None):
    """`keras.random.dropout` with a different stream on every replica.

    Under `tf.distribute`, the seed generator's next seed is folded with the
    replica's index (``tf.random.experimental.stateless_fold_in``): replicas
    draw different masks, reproducibly from the same seed, at the cost of
    one draw per replica. Elsewhere (JAX's DataParallel draws for the global
    batch already) it is ``keras.random.dropout``.

    Args:
        inputs: the tensor to drop from.
        rate: float in [0, 1).
        seed: a `keras.random.SeedGenerator`.
        noise_shape: None or a tuple, as `keras.random.dropout`'s.

    Returns:
        A tensor like ``inputs``.

    Example:

    >>> seed = keras.random.SeedGenerator(1)
    >>> tuple(replica_dropout(keras.ops.ones((2, 3)), 0.5, seed).shape)
    (2, 3)
    """
    index, count = replica_position()
    if count == 1:
        return keras.random.dropout(inputs, rate, noise_shape=noise_shape, seed=seed)
    import tensorflow as tf

    if rate == 0.0:
        return inputs
    if rate >= 1.0:
        return tf.zeros_like(inputs)
    state = seed.next() if isinstance(seed, keras.random.SeedGenerator) else seed
    # As Keras' TensorFlow backend turns a seed state into an int32 pair.
    state = tf.cast(tf.math.floormod(tf.cast(state, "int64"), tf.int32.max - 1), "int32")
    folded = tf.random.experimental.stateless_fold_in(state, tf.cast(index, "int32"))
    if noise_shape is not None:
        shape = tf.shape(inputs)
        noise_shape = [shape[i] if value is None else value for i, value in enumerate(noise_shape)]
    return tf.nn.experimental.stateless_dropout(
        inputs, rate=rate, noise_shape=noise_shape, seed=folded
    )
