"""TransformerBackbone's constructor arguments and method records, checked."""

import json

from keras_masking.layers.activations import activation_name
from keras_masking.layers.activations import resolve_activation
from keras_masking.layers.self_attention import validate_position_scheme
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

POOLINGS = ("first", "mean")

FAMILY_POSITIONS = {
    "bert": "absolute",
    "roberta": "absolute",
    "roformer": "rotary",
    "nezha": "relative",
}


# The keys each method record may hold (the `attach_*` / `enable_*` arguments).
METHOD_RECORD_KEYS = {
    "add_ffn": ("units", "layers"),
    "key_value_prefix": ("length", "layers", "dropout", "reparameterize", "hidden_units"),
    "add_attention_units": ("units_per_head", "layers"),
    "drop_token": ("rate", "unselectable_token_ids", "mode", "seed", "slot_multiple"),
    "asa": ("tau", "layers", "alpha", "mask_semantics", "noise", "seed"),
    "lora": ("rank", "target_layer_names"),
}

ATTACHMENT_RECORDS = ("add_ffn", "key_value_prefix", "add_attention_units", "frozen_base")

_INTEGER_MINIMUMS = {
    "vocabulary_size": 1,
    "num_layers": 1,
    "num_heads": 1,
    "hidden_dim": 1,
    "intermediate_dim": 1,
    "max_sequence_length": 1,
    "max_relative_position": 1,
    "num_segments": 0,
}

# The config entries that are constructor arguments kept as they were checked.
CONFIG_NAMES = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "dropout",
    "max_sequence_length",
    "num_segments",
    "position",
    "max_relative_position",
    "activation",
    "layer_norm_epsilon",
    "attention_dropout",
    "use_pooler",
    "pooling",
    "custom_position_ids",
)

ASA_WITH_GATHER = (
    "ASA cannot attack a backbone that drops tokens in gather mode: the clean and "
    "adversarial passes would run on different sequences. Use "
    "enable_drop_token(..., mode='attention'), where every pass keeps the full length."
)


def plain_record(value):
    """A JSON round trip: Keras' tracked containers -> plain dicts/lists."""
    return None if value is None else json.loads(json.dumps(value))


def drop_token_record(layer):
    """The `enable_drop_token` arguments of a DropToken layer (None: off)."""
    if layer is None:
        return None
    config = layer.get_config()
    return {key: config[key] for key in METHOD_RECORD_KEYS["drop_token"]}


def checked_backbone_arguments(arguments):
    """The constructor's arguments checked, numbers as Python types."""
    checked = dict(arguments)
    for name, minimum in _INTEGER_MINIMUMS.items():
        checked[name] = check_int(name, arguments[name], minimum=minimum)
    for name in ("dropout", "attention_dropout"):
        if name == "dropout" or arguments[name] is not None:
            checked[name] = check_float(name, arguments[name], 0.0, 1.0, open_maximum=True)
    checked["layer_norm_epsilon"] = check_float(
        "layer_norm_epsilon", arguments["layer_norm_epsilon"], 0.0, open_minimum=True
    )
    for name in ("use_pooler", "custom_position_ids", "frozen_base"):
        checked[name] = check_bool(name, arguments[name])
    check_choice("pooling", arguments["pooling"], POOLINGS)
    position, activation = arguments["position"], arguments["activation"]
    validate_position_scheme(position)
    if not (isinstance(activation, str) or callable(activation)):
        raise ValueError(
            "Expected an activation name or a callable for activation. "
            f"Received: activation={activation!r}."
        )
    try:
        resolve_activation(activation)
    except ValueError as error:
        raise ValueError(f"{error} Received: activation={activation!r}.") from error
    checked["activation"] = activation_name(activation)
    for name in ("mlm_embedding_correction", "merged_add_ffn", *METHOD_RECORD_KEYS):
        value = arguments[name]
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"Expected a dict or None for {name}. Received: {name}={value!r}.")
        keys = METHOD_RECORD_KEYS.get(name, ())
        unknown = sorted(set(value or {}) - set(keys)) if keys else []
        if unknown:
            raise ValueError(
                f"Expected {name} to hold only the keys {list(keys)}. "
                f"Received the keys {unknown} in {name}={value!r}."
            )
    hidden_dim, num_heads = checked["hidden_dim"], checked["num_heads"]
    if hidden_dim % num_heads:
        raise ValueError(
            "Expected hidden_dim divisible by num_heads. "
            f"Received: hidden_dim={hidden_dim}, num_heads={num_heads}."
        )
    multiple = {"rotary": 2, "rotary2d": 4}.get(position, 1)
    if (hidden_dim // num_heads) % multiple:
        raise ValueError(
            f"Expected an even head size (hidden_dim // num_heads) divisible by {multiple} for "
            f"position={position!r}. Received: hidden_dim={hidden_dim}, num_heads={num_heads}."
        )
    checked["pruned_from"] = _checked_pruned_from(
        arguments["pruned_from"], checked["vocabulary_size"], hidden_dim
    )
    return checked


def _checked_pruned_from(value, vocabulary_size, hidden_dim):
    """``{"vocabulary_size": N, "token_embedding_mean": [hidden_dim floats]}``
    of the table a pruned one was cut from (N above ``vocabulary_size``), or None."""
    if value is None:
        return None
    keys = ("vocabulary_size", "token_embedding_mean")
    mean = value.get("token_embedding_mean") if isinstance(value, dict) else None
    try:
        mean = [float(number) for number in mean]
    except (TypeError, ValueError):
        mean = None
    if sorted(value) != sorted(keys) or mean is None or len(mean) != hidden_dim:
        raise ValueError(
            f"Expected pruned_from to be None or a dict of {list(keys)} (an int and "
            f"hidden_dim={hidden_dim} floats), as prune_token_embeddings writes it. "
            f"Received: pruned_from={value!r:.200}."
        )
    size = check_int("pruned_from vocabulary_size", value["vocabulary_size"], vocabulary_size)
    return {"vocabulary_size": size, "token_embedding_mean": mean}


def per_layer(value, num_layers, name, shared=True):
    """Expands a hook argument to one entry per layer."""
    if value is None:
        return [None] * num_layers
    if isinstance(value, (list, tuple)) and (not shared or len(value) == num_layers):
        if len(value) != num_layers:
            raise ValueError(
                f"Expected one entry per layer ({num_layers}) in {name}. "
                f"Received: {len(value)} entries."
            )
        return list(value)
    if not shared:
        raise ValueError(
            f"Expected a list with one entry per layer ({num_layers}) for {name}. "
            f"Received: {name} of type {type(value).__name__}."
        )
    return [value] * num_layers
