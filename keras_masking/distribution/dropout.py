"""ReplicaDropout: Keras' Dropout with a different mask on every replica."""

import keras

from keras_masking.distribution.random import replica_dropout


@keras.saving.register_keras_serializable(package="keras_masking")
class ReplicaDropout(keras.layers.Dropout):
    """`keras.layers.Dropout` whose replicas draw different masks.

    Identical to `keras.layers.Dropout` (same arguments, same seed state, the
    same masks) on one device and under JAX's
    `keras.distribution.DataParallel`, where a step draws for the global
    batch. Under `tf.distribute`, Keras' `Dropout` gives every replica the
    same mask (the seed state is shared); this layer folds the replica's
    index into the seed (see `replica_dropout`), so each replica draws its
    own mask, reproducibly. The encoder layers of this package use it.

    Args:
        rate: float in [0, 1], the share of units dropped.
        noise_shape: None or a tuple, as `keras.layers.Dropout`'s.
        seed: int or None.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: a tensor.
        training: bool; identity when False.

    Example:

    >>> layer = ReplicaDropout(0.5, seed=1)
    >>> tuple(layer(keras.ops.ones((2, 4)), training=True).shape)
    (2, 4)
    """

    def call(self, inputs, training=False):
        if training and self.rate > 0:
            return replica_dropout(
                inputs, self.rate, self.seed_generator, noise_shape=self.noise_shape
            )
        return inputs
