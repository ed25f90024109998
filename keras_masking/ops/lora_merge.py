"""A LoRA layer's kernel with its adapters merged, at the variables' precision."""

import numpy as np
from keras import backend
from keras import ops


def merged_kernel(layer):
    """``W + (alpha / rank) A B`` of a LoRA-enabled `Dense`, as float32 numpy.

    Keras' `Dense.kernel` returns the merged kernel cast to the layer's
    compute dtype: under a mixed policy, bfloat16 or float16 values in what
    a merge or an export then stores as float32. This sum is taken in
    float64 from the float32 variables and stored at their dtype. A layer
    without LoRA gives its kernel variable.

    Args:
        layer: a built `keras.layers.Dense` (or `EinsumDense`).

    Returns:
        A numpy array of the kernel's shape and dtype, or the kernel variable.

    Example:
    ```python
    dense = keras.layers.Dense(4, dtype="mixed_bfloat16")
    dense.build((None, 3))
    dense.enable_lora(2)
    kernel = merged_kernel(dense)  # float32 values, where dense.kernel is bfloat16
    ```
    """
    (base,) = [variable for variable in layer.weights if variable.name == "kernel"]
    if not getattr(layer, "lora_enabled", False):
        return base
    a, b, w = (
        np.asarray(ops.convert_to_numpy(v), "float64")
        for v in (layer.lora_kernel_a, layer.lora_kernel_b, base)
    )
    merged = w + (layer.lora_alpha / layer.lora_rank) * np.matmul(a, b)
    return merged.astype(backend.standardize_dtype(base.dtype))
