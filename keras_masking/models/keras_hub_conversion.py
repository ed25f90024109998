"""Converting between keras-hub's BERT / RoBERTa backbones and ours.

Both directions go through the Google checkpoint names of
`google_checkpoint_layout`: keras-hub's weights are found by their public
variable paths (``transformer_layer_0/self_attention_layer/query/kernel``)
and reshaped between keras-hub's per-head ``EinsumDense`` shapes and the
checkpoint's 2D ones.
"""

import logging

import keras
import keras_hub
import numpy as np

from keras_masking.models.google_checkpoint_layout import backbone_variables_by_name

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
    if isinstance(backbone, keras_hub.models.RobertaBackbone):
        return "RobertaBackbone"
    if isinstance(backbone, keras_hub.models.BertBackbone):
        return "BertBackbone"
    raise TypeError(
        "from_keras_hub converts keras_hub.models.BertBackbone and "
        f"RobertaBackbone. Received: {type(backbone).__name__}"
    )


def _hub_variables_by_name(backbone, kind):
    """Google checkpoint names -> keras-hub variables (by variable path)."""
    own_prefix = backbone.name + "/"
    by_path = {variable.path.removeprefix(own_prefix): variable for variable in backbone.weights}
    if kind == "RobertaBackbone":
        pairs = {
            "bert/embeddings/word_embeddings": "embeddings/token_embedding/embeddings",
            "bert/embeddings/position_embeddings": "embeddings/position_embedding/embeddings",
        }
    else:
        pairs = {
            "bert/embeddings/word_embeddings": "token_embedding/embeddings",
            "bert/embeddings/position_embeddings": "position_embedding/embeddings",
            "bert/embeddings/token_type_embeddings": "segment_embedding/embeddings",
            "bert/pooler/dense/kernel": "pooled_dense/kernel",
            "bert/pooler/dense/bias": "pooled_dense/bias",
        }
    pairs["bert/embeddings/LayerNorm/gamma"] = "embeddings_layer_norm/gamma"
    pairs["bert/embeddings/LayerNorm/beta"] = "embeddings_layer_norm/beta"
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
        for ours, theirs in per_layer.items():
            for part in ("kernel", "bias"):
                pairs[f"bert/encoder/layer_{i}/{ours}/{part}"] = (
                    f"transformer_layer_{i}/{theirs}/{part}"
                )
        for ours, theirs in per_layer_norm.items():
            for part in ("gamma", "beta"):
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


def _shared_arguments(backbone):
    """Constructor arguments that keras-hub's backbones and ours name alike."""
    names = (
        "vocabulary_size",
        "num_layers",
        "num_heads",
        "hidden_dim",
        "intermediate_dim",
        "dropout",
        "max_sequence_length",
    )
    arguments = {name: getattr(backbone, name) for name in names}
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


def from_keras_hub(backbone, activation=None, **overrides):
    """A `TransformerBackbone` with the weights of a keras-hub backbone.

    Args:
        backbone: a `keras_hub.models.BertBackbone` or `RobertaBackbone`.
        activation: None keeps keras-hub's activation (the tanh GELU for
            BERT, exact GELU for RoBERTa) so outputs match keras-hub; pass the
            checkpoint's own (``"gelu"`` for Hugging Face BERT) to follow the
            original model instead.
        **overrides: other `TransformerBackbone` arguments to change
            (``dropout``, ``custom_position_ids``...).

    Returns:
        A `keras_masking.models.TransformerBackbone` (position
        ``"absolute"``) whose outputs equal keras-hub's on the same inputs.

    Example:
    ```python
    hub = keras_hub.models.BertBackbone.from_preset("./my_bert_preset")
    backbone = keras_masking.models.from_keras_hub(hub)
    ```
    """
    from keras_masking.models.transformer_backbone import TransformerBackbone

    kind = _hub_kind(backbone)
    settings = dict(_HUB_SETTINGS[kind])
    if activation is not None:
        settings["activation"] = activation
    kwargs = {
        **_shared_arguments(backbone),
        "num_segments": getattr(backbone, "num_segments", 0),
        "position": "absolute",
        **settings,
        **overrides,
    }
    converted = TransformerBackbone(**kwargs)
    _copy(_hub_variables_by_name(backbone, kind), backbone_variables_by_name(converted))
    return converted


def to_keras_hub(backbone):
    """A keras-hub backbone with the weights of a `TransformerBackbone`.

    A model with a pooler and segments becomes a `BertBackbone`; one with
    neither (and LayerNorm epsilon 1e-5) a `RobertaBackbone`. Only absolute
    positions exist in those classes. keras-hub fixes the activation per
    class (tanh GELU for BERT); converting a model that uses another one
    changes its outputs slightly, and a warning says so.

    Args:
        backbone: a `keras_masking.models.TransformerBackbone`.

    Returns:
        A `keras_hub.models.BertBackbone` or `RobertaBackbone`.
    """
    attachments = (backbone.add_ffn, backbone.key_value_prefix, backbone.add_attention_units)
    if any(attachment is not None for attachment in attachments):
        raise ValueError(
            "This backbone has tuning attachments (addFFN / key-value prefixes / attention "
            "units) that keras-hub's "
            "layers cannot hold. Merge addFFN first (keras_masking.merge_fl)."
        )
    if backbone.position != "absolute":
        raise ValueError(
            f"keras-hub's BERT/RoBERTa backbones have absolute positions only; "
            f"this backbone uses position={backbone.position!r}."
        )
    kind = "BertBackbone" if backbone.use_pooler else "RobertaBackbone"
    settings = _HUB_SETTINGS[kind]
    if kind == "BertBackbone" and backbone.num_segments < 1:
        raise ValueError("A BertBackbone needs segments (num_segments >= 1).")
    if kind == "RobertaBackbone" and backbone.num_segments:
        raise ValueError(
            "A backbone without a pooler converts to RobertaBackbone, which has "
            f"no segments; this one has num_segments={backbone.num_segments}."
        )
    for key in ("activation", "layer_norm_epsilon"):
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
        hub = keras_hub.models.BertBackbone(**kwargs)
    else:
        hub = keras_hub.models.RobertaBackbone(**kwargs)
    _copy(backbone_variables_by_name(backbone), _hub_variables_by_name(hub, kind))
    return hub
