"""transformer_layout_map: which TransformerBackbone weights shard on which mesh axis."""

import keras

# (variable path pattern, layout with "model" for the sharded axis), in the
# Megatron-LM split: the first matrix of each pair (query/key/value, the FFN's
# input) is split by columns, the second (attention output, the FFN's output)
# by rows, so a layer needs one all-reduce per pair; vocabulary-sized weights
# (the token table, the tied MLM head's vocabulary vectors) by vocabulary.
_RULES = (
    (r"(.*/)?embeddings/token_embedding/embeddings", ("model", None)),
    (r"(.*/)?transformer_layer_\d+/self_attention/(query|key|value)/kernel", (None, "model")),
    (r"(.*/)?transformer_layer_\d+/self_attention/(query|key|value)/bias", ("model",)),
    (r"(.*/)?transformer_layer_\d+/self_attention/attention_output/kernel", ("model", None)),
    (r"(.*/)?transformer_layer_\d+/feed_forward/intermediate_dense/kernel", (None, "model")),
    (r"(.*/)?transformer_layer_\d+/feed_forward/intermediate_dense/bias", ("model",)),
    (r"(.*/)?transformer_layer_\d+/feed_forward/output_dense/kernel", ("model", None)),
    (r"(.*/)?mlm_head/output_(bias|row_scale|row_shift_weight)", ("model",)),
)


def transformer_layout_map(device_mesh, model_parallel_dim_name="model"):
    """A `keras.distribution.LayoutMap` for a `TransformerBackbone` and its tasks.

    For `keras.distribution.ModelParallel` (JAX). Sharded on the mesh axis
    ``model_parallel_dim_name``, in the Megatron-LM split (one all-reduce per
    attention and per FFN in each direction):

    | weight | shape | layout |
    |---|---|---|
    | ``embeddings/token_embedding/embeddings`` | ``(V, d)`` | ``("model", None)`` |
    | ``self_attention/{query,key,value}/kernel`` | ``(d, d)`` | ``(None, "model")`` |
    | ``self_attention/{query,key,value}/bias`` | ``(d,)`` | ``("model",)`` |
    | ``self_attention/attention_output/kernel`` | ``(d, d)`` | ``("model", None)`` |
    | ``feed_forward/intermediate_dense/kernel`` | ``(d, f)`` | ``(None, "model")`` |
    | ``feed_forward/intermediate_dense/bias`` | ``(f,)`` | ``("model",)`` |
    | ``feed_forward/output_dense/kernel`` | ``(f, d)`` | ``("model", None)`` |
    | ``mlm_head/output_bias`` (and the head's other ``(V,)`` vectors) | ``(V,)`` | ``("model",)`` |

    Everything else is replicated: LayerNorms, the output biases, segment
    and position tables, the pooler, and the methods' small weights
    (FL-tuning's branches, prefixes, LoRA factors, ASA's adversaries, ExLM's
    transition head). The split needs ``V``, ``d`` and ``f`` divisible by the
    axis size, and whole heads per device (``num_heads`` divisible by it).
    Data is split on the mesh's other axis (the batch axis you give
    `ModelParallel`).

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` with an axis named
            ``model_parallel_dim_name``.
        model_parallel_dim_name: str, the axis the weights are split on.

    Returns:
        A `keras.distribution.LayoutMap`.

    Raises:
        ValueError: ``device_mesh`` is not a `DeviceMesh`, or has no such
            axis.

    Example:
    ```python
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "model"), devices)
    layout_map = keras_masking.distribution.transformer_layout_map(mesh)
    distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    with distribution.scope():
        backbone = keras_masking.models.TransformerBackbone(
            vocabulary_size=128, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
        )
    ```
    """
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            "Expected a keras.distribution.DeviceMesh for device_mesh. "
            f"Received: device_mesh={device_mesh!r}."
        )
    if model_parallel_dim_name not in device_mesh.axis_names:
        raise ValueError(
            f"Expected model_parallel_dim_name to be an axis of the mesh "
            f"{list(device_mesh.axis_names)}. Received: "
            f"model_parallel_dim_name={model_parallel_dim_name!r}."
        )
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for pattern, axes in _RULES:
        layout_map[pattern] = tuple(
            model_parallel_dim_name if axis == "model" else axis for axis in axes
        )
    return layout_map
