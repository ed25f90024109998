"""AdamW with exact updates of embedding rows on TensorFlow."""

import keras

from keras_masking.optimizers.dense_gradients import densify_gradients


@keras.saving.register_keras_serializable(package="keras_masking")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` whose embedding-row updates are exact on TensorFlow.

    The same arguments and the same update as Keras' AdamW, except that on
    TensorFlow the gradients of embedding lookups are summed per row before
    the update (see `densify_gradients`): Keras' AdamW squares them slice by
    slice, which changes the update of every row looked up more than once in
    a batch (repeated tokens, and under `tf.distribute` every position and
    token that several replicas saw), so TensorFlow's single-device,
    TensorFlow's data-parallel and JAX's runs all differ. With this class
    they agree to float rounding. On JAX it is Keras' AdamW.

    Args:
        **kwargs: `keras.optimizers.AdamW`'s arguments (``learning_rate``,
            ``weight_decay``, ``beta_1``, ``beta_2``, ``epsilon``,
            ``gradient_accumulation_steps``, ...).

    Example:

    >>> optimizer = AdamW(learning_rate=1e-3, weight_decay=0.01)
    >>> float(optimizer.weight_decay)
    0.01
    """

    def apply(self, grads, trainable_variables=None):
        return super().apply(densify_gradients(grads), trainable_variables)
