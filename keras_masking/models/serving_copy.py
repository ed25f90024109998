"""The plain inference model of a backbone trained with the package's methods."""

import keras
import keras_hub
import numpy as np
from keras import ops

from keras_masking.ops.lora_merge import merged_kernel

#: Settings that act in training only: at inference the model is the same without them.
TRAINING_ONLY = {"drop_token": None, "asa": None}


def serving_backbone(backbone):
    """A new `TransformerBackbone` with ``backbone``'s inference outputs and nothing left over.

    What each method leaves at serving:

    * DropToken and ASA act in training only: the copy has neither (no
      adversaries' weights, no dropping settings in its config).
    * FL-tuning's addFFN branches are merged into wider FFNs (`merge_fl`),
      so the copy is a plain backbone of ``intermediate_dim + units``.
    * LoRA's low-rank kernels are merged into the kernels they adapt.
    * P-tuning v2's prefixes and MA-tuning's attention units stay: inference
      reads them.

    Nothing is frozen in the copy, and ``backbone`` is not changed.

    Args:
        backbone: a `TransformerBackbone`.

    Returns:
        A `TransformerBackbone` whose outputs equal ``backbone``'s at
        inference (within float rounding of the merged sums).

    Example:
    ```python
    backbone.enable_fl_tuning(units=4)
    backbone.enable_drop_token(0.1)
    plain = keras_masking.models.serving_backbone(backbone)
    assert plain.add_ffn is None and plain.drop_token is None
    ```
    """
    # LoRA first: it may adapt the FFNs that merging addFFN widens.
    plain = copy_with_lora_merged(backbone, **TRAINING_ONLY, frozen_base=False)
    return plain.merge_fl() if plain.add_ffn else plain


def copy_with_lora_merged(backbone, **changes):
    """A new backbone of ``backbone``'s config with ``changes`` and LoRA merged into its kernels.

    Every weight is copied by its path (unique in a backbone); each LoRA
    layer's kernel becomes the base kernel plus its scaled low-rank
    product, and the LoRA kernels go.

    Args:
        backbone: a `TransformerBackbone` (not changed).
        **changes: config entries to change (``drop_token=None``...).

    Example:
    ```python
    backbone.enable_lora(2)
    merged = keras_masking.models.serving_copy.copy_with_lora_merged(backbone)
    assert merged.lora is None
    ```
    """
    config = backbone.get_config()
    config.update(changes, lora=None)
    target = type(backbone).from_config(config)
    values = {variable.path: variable for variable in backbone.weights}
    for layer in backbone.lora_layers():
        values[f"{layer.path}/kernel"] = merged_kernel(layer)  # W + (alpha / rank) A B
    missing = [variable.path for variable in target.weights if variable.path not in values]
    if missing:
        raise ValueError(
            f"Cannot copy the backbone: the weights {missing[:3]} have no counterpart in it."
        )
    for variable in target.weights:
        # A copy, not the source's buffer (JAX may donate one model's buffers).
        value = np.array(ops.convert_to_numpy(values[variable.path]))
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
    return target


def serving_task_model(task_model):
    """A functional task model's plain inference copy: its backbone's `serving_backbone`.

    The task model's graph is cloned with each of its layers shared (the
    head's weights too), except the `TransformerBackbone` it calls, which
    becomes its serving copy. A model that calls no such backbone directly
    (an ExLM encoder around one) is returned as it is: its training-only
    parts are none.

    Args:
        task_model: a functional Keras model (a CLUE task model, your own head).

    Returns:
        A functional `keras.Model` with the same inputs and outputs.

    Example:
    ```python
    plain = keras_masking.models.serving_task_model(model)  # model: a head on a backbone
    ```
    """
    # A TransformerBackbone (by its serving_copy: this module sits below it).
    backbones = [
        layer
        for layer in task_model.layers
        if isinstance(layer, keras_hub.models.Backbone) and hasattr(layer, "serving_copy")
    ]
    if len(backbones) != 1:
        return task_model
    serving = serving_backbone(backbones[0])

    def clone(layer):
        return serving if layer is backbones[0] else layer

    return keras.models.clone_model(task_model, clone_function=clone)
