"""Where a step runs among data-parallel replicas, and sums over them.

Keras runs a data-parallel step in one of two ways. Under JAX's
`keras.distribution.DataParallel` the step is ONE program over the global
batch, sharded by XLA: every value a layer computes is already global, so
nothing here changes anything. Under `tf.distribute` (`MirroredStrategy`,
`MultiWorkerMirroredStrategy`, `TPUStrategy`) each replica runs the step on
its own slice of the batch; a loss or metric a model computes by hand must
then say how its replica's part adds up to the global value, which is what
these functions do. Outside a replica context (eager calls, the symbolic
build, one device) they are the identity.
"""

import keras
from keras import ops


def replica_position():
    """The running replica's index and the number of replicas in sync.

    Returns:
        ``(index, count)``: ``(0, 1)`` outside a `tf.distribute` replica
        context with more than one replica (JAX's DataParallel runs one
        global program, so it is ``(0, 1)`` there too). The index may be a
        scalar tensor.

    Example:

    >>> replica_position()
    (0, 1)
    """
    if keras.config.backend() != "tensorflow":
        return 0, 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    # No context: the cross-replica context of a strategy's scope.
    if context is None or context.num_replicas_in_sync == 1:
        return 0, 1
    return context.replica_id_in_sync_group, context.num_replicas_in_sync


def in_tf_distribute_scope():
    """Whether a `tf.distribute` strategy (not the default one) is in scope.

    Returns:
        bool; False on JAX.

    Example:

    >>> in_tf_distribute_scope()
    False
    """
    if keras.config.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return tf.distribute.has_strategy()


def replica_sum(value):
    """``value`` summed over the replicas in sync, with no gradient.

    For the normalisers of a loss (token counts, batch sizes): the global
    count, so that each replica's share of a mean is exact whatever the
    split.

    Args:
        value: a tensor (the same shape on every replica).

    Returns:
        The sum over replicas (``value`` itself outside `tf.distribute`).

    Example:

    >>> float(replica_sum(keras.ops.convert_to_tensor(3.0)))
    3.0
    """
    _, count = replica_position()
    if count == 1:
        return value
    import tensorflow as tf

    return tf.distribute.get_replica_context().all_reduce("sum", tf.stop_gradient(value))


def gather_replicas(structure):
    """Tensors of every replica of a `tf.distribute` step, concatenated on axis 0.

    Under `tf.distribute` each replica holds its own slice of the batch; a
    value that couples the examples of a batch (ASA's regression divergence
    takes a softmax over the batch) must see the global batch. Each replica
    gets the global tensors in replica order (the rows one device would hold),
    and the gradient flows back to every replica's own rows. Outside a
    replica context with several replicas (one device, eager calls, JAX,
    whose data-parallel step is one program over the global batch) the
    structure is returned as it is.

    Args:
        structure: a nested structure of tensors (batch first) or None.

    Returns:
        The same structure over the global batch.

    Example:

    >>> tuple(gather_replicas({"x": keras.ops.ones((2, 3))})["x"].shape)
    (2, 3)
    """
    _, replicas = replica_position()
    if replicas == 1 or structure is None:
        return structure
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return keras.tree.map_structure(lambda value: context.all_gather(value, axis=0), structure)


def replica_share(mean, count):
    """A replica's share of a global mean, from its own mean over ``count`` items.

    Keras adds the losses of the replicas of a `tf.distribute` step (it
    scales its own compiled losses by ``1 / replicas`` for that). A loss
    computed by hand as a mean over the replica's ``count`` items (examples,
    rows, tokens) becomes ``mean * count / global count``, whose sum over the
    replicas is the mean over the global batch, even when the replicas hold
    different numbers of items.

    Args:
        mean: float tensor, the mean over this replica's items.
        count: the number of items (a number or a scalar tensor).

    Returns:
        The share (``mean`` itself outside `tf.distribute`).

    Example:

    >>> float(replica_share(keras.ops.convert_to_tensor(0.5), 4))
    0.5
    """
    _, replicas = replica_position()
    if replicas == 1:
        return mean
    count = ops.cast(count, mean.dtype)
    return mean * count / ops.maximum(replica_sum(count), ops.cast(1, mean.dtype))
