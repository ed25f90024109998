"""Converting between keras-hub's BERT / RoBERTa backbones and ours.

Behind `TransformerBackbone.from_keras_hub` and `backbone.to_keras_hub()`
(this module never imports `TransformerBackbone`). Both directions pair the
weights by their Google checkpoint names (`google_checkpoint_layout`),
keras-hub's found by their variable paths, and reshape them between
keras-hub's per-head ``EinsumDense`` shapes and the checkpoint's 2D ones.
"""

import itertools
import logging

import keras
import keras_hub
import numpy as np

from keras_masking.models.google_checkpoint_layout import backbone_variables_by_name
from keras_masking.models.mlm_embedding_correction_record import mark_loaded_record
from keras_masking.ops.lora_merge import merged_kernel
from keras_masking.utils.eager_checks import non_finite_variables

logger = logging.getLogger("keras_masking")

# keras-hub's fixed choices per class.
_HUB_SETTINGS = {
    "BertBackbone": {
        "activation": "gelu_approximate",
        "layer_norm_epsilon": 1e-12,
        "use_pooler": True,
    },
    "RobertaBackbone": {
        "activation": "gelu",
        "layer_norm_epsilon": 1e-5,
        "use_pooler": False,
        "num_segments": 0,
    },
}


def _hub_kind(backbone):
    for kind in ("RobertaBackbone", "BertBackbone"):
        if isinstance(backbone, getattr(keras_hub.models, kind)):
            return kind
    raise TypeError(
        "TransformerBackbone.from_keras_hub converts a keras_hub.models.BertBackbone or "
        f"RobertaBackbone. Received: backbone of type {type(backbone).__name__}"
    )


def _hub_variables_by_name(backbone, kind):
    """Google checkpoint names -> keras-hub variables (by variable path)."""
    own_prefix = backbone.name + "/"
    by_path = {variable.path.removeprefix(own_prefix): variable for variable in backbone.weights}
    for path, count in non_finite_variables(backbone.weights)[:1]:
        raise ValueError(
            f"The keras-hub {kind}'s weight {path!r} holds {count} NaN or infinite value(s); "
            "expected finite weights (the training that wrote them diverged)."
        )
    for layer in backbone._flatten_layers(include_self=False):
        if getattr(layer, "quantization_mode", None) is not None:
            raise ValueError(
                f"The keras-hub {kind}'s layer {layer.path!r} is quantized "
                f"({layer.quantization_mode}); convert a float model."
            )
        if getattr(layer, "lora_enabled", False):
            # keras-hub's LoRA: the kernel converts merged, W + (alpha / rank) A B.
            (kernel,) = [v for v in layer.weights if v.name == "kernel"]
            by_path[kernel.path.removeprefix(own_prefix)] = merged_kernel(layer)
    # RoBERTa's token and position tables sit in its `embeddings` layer; BERT adds
    # segments and a pooler.
    inside = "embeddings/" if kind == "RobertaBackbone" else ""
    pairs = {
        "bert/embeddings/word_embeddings": f"{inside}token_embedding/embeddings",
        "bert/embeddings/position_embeddings": f"{inside}position_embedding/embeddings",
        "bert/embeddings/LayerNorm/gamma": "embeddings_layer_norm/gamma",
        "bert/embeddings/LayerNorm/beta": "embeddings_layer_norm/beta",
    }
    if kind == "BertBackbone":
        pairs["bert/embeddings/token_type_embeddings"] = "segment_embedding/embeddings"
        pairs["bert/pooler/dense/kernel"] = "pooled_dense/kernel"
        pairs["bert/pooler/dense/bias"] = "pooled_dense/bias"
    per_layer = {
        "attention/self/query": "self_attention_layer/query",
        "attention/self/key": "self_attention_layer/key",
        "attention/self/value": "self_attention_layer/value",
        "attention/output/dense": "self_attention_layer/attention_output",
        "intermediate/dense": "feedforward_intermediate_dense",
        "output/dense": "feedforward_output_dense",
    }
    per_layer_norm = {
        "attention/output/LayerNorm": "self_attention_layer_norm",
        "output/LayerNorm": "feedforward_layer_norm",
    }
    for i in range(backbone.num_layers):
        for table, parts in ((per_layer, ("kernel", "bias")), (per_layer_norm, ("gamma", "beta"))):
            for (ours, theirs), part in itertools.product(table.items(), parts):
                pairs[f"bert/encoder/layer_{i}/{ours}/{part}"] = (
                    f"transformer_layer_{i}/{theirs}/{part}"
                )
    missing = sorted(path for path in pairs.values() if path not in by_path)
    if missing:
        raise ValueError(
            f"The keras-hub {kind} has no variables at {missing}; this keras-hub "
            "version lays its weights out differently."
        )
    return {name: by_path[path] for name, path in pairs.items()}


# The sizes keras-hub's backbones and ours name alike.
_SIZES = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim")
_SIZES += ("max_sequence_length",)


def _shared_arguments(backbone):
    """Constructor arguments that keras-hub's backbones and ours name alike."""
    arguments = {name: getattr(backbone, name) for name in (*_SIZES, "dropout")}
    arguments["dtype"] = backbone.dtype_policy
    return arguments


def _copy(source_by_name, target_by_name):
    """Copies values by name, reshaping per-head layouts; all or nothing."""
    if set(source_by_name) != set(target_by_name):
        raise ValueError(
            "The two models hold different weights: only in source "
            f"{sorted(set(source_by_name) - set(target_by_name))}, only in "
            f"target {sorted(set(target_by_name) - set(source_by_name))}."
        )
    values = {}
    for name, source in source_by_name.items():
        target = target_by_name[name]
        value = keras.ops.convert_to_numpy(source)
        if value.size != int(np.prod(target.shape)):
            raise ValueError(f"{name}: {tuple(value.shape)} cannot become {tuple(target.shape)}.")
        values[name] = value.reshape(target.shape)
    for name, target in target_by_name.items():
        target.assign(values[name])


# Arguments `from_keras_hub` takes from the keras-hub backbone: overriding
# them would give a model that cannot hold its weights.
ARCHITECTURE_ARGUMENTS = (*_SIZES, "num_segments", "position", "use_pooler")


def transformer_backbone_arguments(backbone, activation=None, overrides=None):
    """`TransformerBackbone` arguments describing a keras-hub backbone.

    Args:
        backbone: a `keras_hub.models.BertBackbone` or `RobertaBackbone`.
        activation: None for keras-hub's own activation, or the one to use.
        overrides: dict of other `TransformerBackbone` arguments to change
            (``dropout``, ``custom_position_ids``...), or None.

    Returns:
        A dict of constructor arguments.

    Raises:
        TypeError: ``backbone`` is not a keras-hub BERT/RoBERTa backbone.
        ValueError: an override of an argument the weights fix.

    Example:
    ```python
    hub = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32,
        intermediate_dim=48, max_sequence_length=24,
    )
    kwargs = transformer_backbone_arguments(hub, overrides={"dropout": 0.0})
    kwargs["activation"], kwargs["num_segments"]  # ("gelu_approximate", 2)
    ```
    """
    kind = _hub_kind(backbone)
    overrides = dict(overrides or {})
    fixed = sorted(set(overrides) & set(ARCHITECTURE_ARGUMENTS))
    if fixed:
        raise ValueError(
            "TransformerBackbone.from_keras_hub takes the architecture from the keras-hub "
            f"backbone, whose weights fix it; it cannot override {fixed}. Received: "
            + ", ".join(f"{key}={overrides[key]!r}" for key in fixed)
        )
    settings = dict(_HUB_SETTINGS[kind])
    if activation is not None:
        settings["activation"] = activation
    return {
        **_shared_arguments(backbone),
        "num_segments": getattr(backbone, "num_segments", 0),
        "position": "absolute",
        **settings,
        **overrides,
    }


def copy_keras_hub_weights(source, target):
    """Copies every weight of a keras-hub backbone into a `TransformerBackbone`.

    All or nothing: names and sizes are checked before the first assignment.

    Args:
        source: a `keras_hub.models.BertBackbone` or `RobertaBackbone`.
        target: a `TransformerBackbone` built by `transformer_backbone_arguments`.

    Example:
    ```python
    hub = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32,
        intermediate_dim=48, max_sequence_length=24,
    )
    ours = keras_masking.models.TransformerBackbone(**transformer_backbone_arguments(hub))
    copy_keras_hub_weights(hub, ours)
    ```
    """
    _copy(_hub_variables_by_name(source, _hub_kind(source)), backbone_variables_by_name(target))
    record = getattr(source.token_embedding, "mlm_embedding_correction", None)
    if record:  # corrected once: a second correction would change nothing
        mark_loaded_record(target, {**record, "embedding": target.token_embedding.name})


def to_keras_hub(backbone):
    """A keras-hub backbone with the weights of a `TransformerBackbone`.

    A model with a pooler (over the first token) and segments becomes a
    `BertBackbone`, one with neither a `RobertaBackbone` (absolute positions
    only). keras-hub fixes the activation and LayerNorm epsilon per class: a
    model with the other GELU form or another epsilon converts with a warning
    that its outputs change slightly; one with another activation is refused.

    Args:
        backbone: a `keras_masking.models.TransformerBackbone`.

    Returns:
        A `keras_hub.models.BertBackbone` or `RobertaBackbone`.

    Example:
    ```python
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32,
        intermediate_dim=48, activation="gelu_approximate",
    )
    hub = keras_masking.models.to_keras_hub(backbone)  # or backbone.to_keras_hub()
    ```
    """
    needed = ("position", "use_pooler", "num_segments", "transformer_layers", "attached_methods")
    if not all(hasattr(backbone, name) for name in needed):
        raise TypeError(
            "to_keras_hub converts a keras_masking.models.TransformerBackbone. "
            f"Received: backbone of type {type(backbone).__name__}"
        )
    attached = backbone.attached_methods()
    if attached:
        raise ValueError(
            f"keras-hub's layers have no place for {' and '.join(attached)}. FL-tuning's "
            "branches merge into wider FFNs (convert backbone.merge_fl()); prefixes and "
            "attention units do not merge: keep them with save_to_preset() or model.save()."
        )
    if backbone.position != "absolute":
        raise ValueError(
            f"keras-hub's BERT/RoBERTa backbones have absolute positions only; "
            f"this backbone uses position={backbone.position!r}."
        )
    kind = "BertBackbone" if backbone.use_pooler else "RobertaBackbone"
    settings = _HUB_SETTINGS[kind]
    if kind == "BertBackbone" and backbone.pooling != "first":
        raise ValueError(
            "keras-hub's BertBackbone pools the first token; this backbone pools with "
            f"pooling={backbone.pooling!r}, so its pooled_output would change. Expected "
            f"pooling='first'. Received: pooling={backbone.pooling!r}."
        )
    if kind == "BertBackbone" and backbone.num_segments < 1:
        raise ValueError("A BertBackbone needs segments (num_segments >= 1).")
    if kind == "RobertaBackbone" and backbone.num_segments:
        raise ValueError(
            "A backbone without a pooler converts to RobertaBackbone, which has "
            f"no segments; this one has num_segments={backbone.num_segments}."
        )
    if backbone.activation not in ("gelu", "gelu_approximate"):
        raise ValueError(
            f"keras-hub's {kind} computes {settings['activation']}; this backbone's "
            f"activation={backbone.activation!r} is another function, so every output would "
            "change. Expected activation='gelu' or 'gelu_approximate'."
        )
    for key in ("activation", "layer_norm_epsilon"):  # GELU's two forms, epsilon: 1e-4 or less
        if getattr(backbone, key) != settings[key]:
            logger.warning(
                "keras-hub's %s fixes %s=%r; this backbone has %r, so the "
                "converted model's outputs will differ slightly.",
                kind,
                key,
                settings[key],
                getattr(backbone, key),
            )
    kwargs = _shared_arguments(backbone)
    if kind == "BertBackbone":
        kwargs["num_segments"] = backbone.num_segments
    hub = getattr(keras_hub.models, kind)(**kwargs)
    _copy(backbone_variables_by_name(backbone), _hub_variables_by_name(hub, kind))
    record = backbone.mlm_embedding_correction
    if record:  # where correction_record reads a keras-hub model's
        hub.token_embedding.mlm_embedding_correction = {
            **record,
            "embedding": hub.token_embedding.name,
        }
    return hub
