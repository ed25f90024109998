"""LoRADense: a Dense whose saved LoRA-merged kernel keeps float32."""

import keras

from keras_masking.ops.lora_merge import merged_kernel


@keras.saving.register_keras_serializable(package="keras_masking")
class LoRADense(keras.layers.Dense):
    """`keras.layers.Dense` that saves its LoRA-merged kernel at the variables' precision.

    Keras saves a LoRA layer's kernel with ``A B`` merged in, taken from
    `Dense.kernel`, which is cast to the compute dtype: under a mixed policy
    a ``.keras`` file or a preset held the merged kernels in bfloat16 or
    float16 (2e-3 off after loading). This layer stores the float32 sum
    (`merged_kernel`); it is `Dense` in every other way. The backbone's
    attention and FFN projections (LoRA's targets) are this layer.

    Args:
        units, **kwargs: as `keras.layers.Dense`.

    Example:
    >>> layer = LoRADense(4, dtype="mixed_bfloat16")
    >>> layer.build((None, 3))
    >>> layer.enable_lora(2)
    >>> store = {}
    >>> layer.save_own_variables(store)
    >>> str(store["0"].dtype)
    'float32'
    """

    def get_config(self):
        # Every constructor argument, LoRA's when off too (Keras' Dense leaves them out).
        return {
            **super().get_config(),
            "lora_rank": self.lora_rank,
            "lora_alpha": self.lora_alpha,
            "activity_regularizer": keras.regularizers.serialize(self.activity_regularizer),
        }

    def save_own_variables(self, store):
        if not (self.built and self.lora_enabled and self.quantization_mode is None):
            return super().save_own_variables(store)
        written = {}  # Keras' entries ("0" the kernel, "1" the bias), the kernel replaced
        super().save_own_variables(written)
        written["0"] = merged_kernel(self)
        for key, value in written.items():
            store[key] = value
