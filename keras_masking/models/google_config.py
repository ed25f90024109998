"""Translating Google's ``bert_config.json`` to TransformerBackbone arguments."""

import difflib
import json
import logging
import numbers
import os

from keras_masking.layers.activations import resolve_activation
from keras_masking.models.backbone_config import POOLINGS
from keras_masking.models.transformer_backbone import FAMILY_POSITIONS
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

logger = logging.getLogger("keras_masking")

REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)
# Keys we read when present, with the default Google's code assumes.
OPTIONAL_KEYS = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "max_relative_position": 64,
    "initializer_range": 0.02,
    "embedding_size": None,
    # Ours, written only for a backbone that does not pool the first token
    # (multilingual-e5's mean), and for a pruned table (the full table's size
    # and row mean, which the MLM correction reads): Google's code has neither.
    "pooling": "first",
    "pruned_from": None,
}
_SIZE = {"check": check_int, "minimum": 1}
_RATE = {"check": check_float, "minimum": 0.0, "maximum": 1.0, "open_maximum": True}
_POSITIVE = {"check": check_float, "minimum": 0.0}
# The numeric keys, in the order they are checked: the `TransformerBackbone`
# argument each one is (None: only checked) and the check of its value.
NUMERIC_KEYS = {
    "vocab_size": ("vocabulary_size", _SIZE),
    "hidden_size": ("hidden_dim", _SIZE),
    "num_hidden_layers": ("num_layers", _SIZE),
    "num_attention_heads": ("num_heads", _SIZE),
    "intermediate_size": ("intermediate_dim", _SIZE),
    "max_position_embeddings": ("max_sequence_length", _SIZE),
    "type_vocab_size": ("num_segments", {"check": check_int, "minimum": 0}),
    "max_relative_position": ("max_relative_position", _SIZE),
    "hidden_dropout_prob": ("dropout", _RATE),
    "attention_probs_dropout_prob": ("attention_dropout", _RATE),
    "layer_norm_eps": ("layer_norm_epsilon", {**_POSITIVE, "open_minimum": True}),
    "initializer_range": (None, _POSITIVE),
}
# Keys found in released configs that change nothing for an encoder.
IGNORED_KEYS = (
    "directionality",
    "pooler_fc_size",
    "pooler_num_attention_heads",
    "pooler_num_fc_layers",
    "pooler_size_per_head",
    "pooler_type",
    "use_relative_position",
    "model_type",
    "architectures",
    "output_past",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "transformers_version",
    "gradient_checkpointing",
    "position_embedding_type",
    "use_cache",
    "classifier_dropout",
    "torch_dtype",
    "dtype",
    "shared_type",
    "rotary_value",
)


def read_google_config(config_path):
    """Reads a ``bert_config.json``-style file into a dict.

    Args:
        config_path: path to the JSON file.

    Returns:
        The parsed dict.

    Raises:
        FileNotFoundError: no file at ``config_path``.
        ValueError: a folder, a file that is not UTF-8 JSON, or JSON that is
            not an object; the message names the file.

    Example:
    ```python
    with open("bert_config.json", "w", encoding="utf-8") as file:
        file.write('{"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, '
                   '"num_attention_heads": 4, "intermediate_size": 64}')
    config = read_google_config("bert_config.json")
    config["num_hidden_layers"]  # 2
    ```
    """
    config_path = os.fspath(config_path)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"No config file at {config_path!r}.")
    if os.path.isdir(config_path):
        raise ValueError(
            f"{config_path}: expected a config file (bert_config.json), received a folder."
        )
    try:
        with open(config_path, encoding="utf-8") as file:
            config = json.load(file)
    except UnicodeDecodeError as error:
        raise ValueError(f"{config_path}: not a UTF-8 text file ({error}).") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path}: not valid JSON ({error}).") from error
    if not isinstance(config, dict):
        raise ValueError(
            f"{config_path}: expected a JSON object of settings. "
            f"Received a JSON {type(config).__name__}."
        )
    return config


# The JSON type of a value, for messages; the first that fits.
_JSON_KINDS = ((bool, "a boolean"), (str, "a string"), (numbers.Integral, "an integer"))
_JSON_KINDS += ((numbers.Real, "a number"), (list, "a list"), (dict, "an object"))
_JSON_KINDS += ((type(None), "null"), (object, None))


def _described(value):
    """``value`` as the JSON file spells it, and its JSON type."""
    kind = next(name for cls, name in _JSON_KINDS if isinstance(value, cls))
    try:
        spelled = json.dumps(value)
    except (TypeError, ValueError):
        spelled = repr(value)
    return f"{spelled} ({kind or 'a ' + type(value).__name__})"


def _config_value(settings, key, source, check, **bounds):
    """``settings[key]`` through ``check`` (`check_int`, `check_float`); the
    error names the file and the key, and spells the value as the JSON file does."""
    try:
        return check(f"'{key}'", settings[key], **bounds)
    except ValueError as error:
        expected = str(error).split(" Received: ")[0]
        raise ValueError(
            f"{source}: {expected} Received: {key!r}: {_described(settings[key])}."
        ) from None


def backbone_kwargs_from_google_config(config, model, source="config"):
    """``bert_config.json`` keys -> `TransformerBackbone` keyword arguments.

    Args:
        config: dict read from a Google-layout ``bert_config.json``.
        model: one of ``"bert"``, ``"roberta"``, ``"roformer"``, ``"nezha"``.
        source: name of the config (file path) for error messages.

    Returns:
        A dict of constructor arguments (without ``use_pooler``, which the
        loader decides from the checkpoint).

    Raises:
        ValueError: a missing key, or a value of the wrong type or range (a
            string, a fraction or a negative number of layers...); the
            message names the key and ``source``.

    Example:
    ```python
    config = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 64}
    kwargs = backbone_kwargs_from_google_config(config, "nezha", source="bert_config.json")
    backbone = keras_masking.models.TransformerBackbone(**kwargs)  # position="relative"
    ```
    """
    check_choice("model", model, tuple(FAMILY_POSITIONS))
    if not isinstance(config, dict):
        raise ValueError(
            f"{source}: expected a dict of settings. Received: {type(config).__name__}."
        )
    known = set(REQUIRED_KEYS) | set(OPTIONAL_KEYS) | set(IGNORED_KEYS)
    unknown = sorted(set(config) - known)
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        closest = {key: difflib.get_close_matches(key, unknown, n=1) for key in missing}
        hints = [f"{close[0]!r} -> {key!r}?" for key, close in closest.items() if close]
        raise ValueError(
            f"{source}: missing required key(s) {missing}. Unrecognised keys: {unknown}. "
            + (f"Did you mean: {', '.join(hints)}" if hints else "")
        )
    if unknown:
        logger.warning("%s: ignoring unrecognised config keys %s", source, unknown)
    settings = {**OPTIONAL_KEYS, **{k: config[k] for k in config if k in known}}
    values = {
        key: _config_value(settings, key, source, **check)
        for key, (_, check) in NUMERIC_KEYS.items()
    }
    activation = settings["hidden_act"]
    if not isinstance(activation, str):
        raise ValueError(
            f"{source}: expected an activation name (a string) for 'hidden_act'. "
            f"Received: 'hidden_act': {_described(activation)}."
        )
    try:
        resolve_activation(activation)
    except ValueError as error:
        raise ValueError(f"{source}: 'hidden_act': {error}") from error
    if values["hidden_size"] % values["num_attention_heads"]:
        raise ValueError(
            f"{source}: expected 'hidden_size' divisible by 'num_attention_heads'. Received: "
            f"'hidden_size': {values['hidden_size']}, "
            f"'num_attention_heads': {values['num_attention_heads']}."
        )
    embedding_size = settings["embedding_size"]
    if embedding_size is not None:
        embedding_size = _config_value(settings, "embedding_size", source, check_int, minimum=1)
    if embedding_size not in (None, values["hidden_size"]):
        raise ValueError(
            f"{source}: embedding_size={embedding_size} differs from "
            f"hidden_size={values['hidden_size']}; factorised embeddings "
            "(ALBERT, small RoFormer/ELECTRA variants) are not supported."
        )
    relative = "use_relative_position" if config.get("use_relative_position") else None
    relative = relative or ("max_relative_position" if "max_relative_position" in config else None)
    if relative and model != "nezha":
        raise ValueError(
            f"{source}: `{relative}` is a NEZHA setting, but model={model!r}. "
            "Is this a NEZHA config (model='nezha')?"
        )
    if config.get("rotary_value"):
        raise ValueError(
            f"{source}: 'rotary_value': true rotates the values as well as the queries and keys "
            "(a RoFormer option); this package's RoFormer rotates queries and keys only, so the "
            "model would compute other outputs. Not supported."
        )
    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute" and model in ("bert", "roberta"):
        raise ValueError(
            f"{source}: 'position_embedding_type': {position_type!r} (Hugging Face's relative "
            "attention, with weights of its own) is not supported; expected 'absolute'."
        )
    kwargs = {argument: values[key] for key, (argument, _) in NUMERIC_KEYS.items() if argument}
    if model != "nezha":
        del kwargs["max_relative_position"]
    kwargs.update(position=FAMILY_POSITIONS[model], activation=activation)
    if "pooling" in config:
        kwargs["pooling"] = check_choice("pooling", config["pooling"], POOLINGS)
    if config.get("pruned_from") is not None:
        kwargs["pruned_from"] = config["pruned_from"]  # checked by TransformerBackbone
    return kwargs


def google_config_from_backbone(backbone):
    """A ``bert_config.json`` dict describing ``backbone``.

    Args:
        backbone: a `TransformerBackbone`.

    Returns:
        A JSON-serialisable dict that `backbone_kwargs_from_google_config`
        reads back to the same architecture.

    Example:
    ```python
    config = google_config_from_backbone(backbone)
    config["num_hidden_layers"] == backbone.num_layers  # True
    ```
    """
    config = {
        key: getattr(backbone, argument) for key, (argument, _) in NUMERIC_KEYS.items() if argument
    }
    config.update(hidden_act=backbone.activation, initializer_range=0.02)
    if backbone.attention_dropout is None:
        config["attention_probs_dropout_prob"] = backbone.dropout
    if backbone.position != "relative":
        del config["max_relative_position"]
    if backbone.pooling != "first":
        config["pooling"] = backbone.pooling
    pruned_from = backbone.get_config()["pruned_from"]
    if pruned_from is not None:
        config["pruned_from"] = pruned_from
    return config


def family_of(backbone):
    """The checkpoint family name (``model=``) for a backbone's scheme.

    Args:
        backbone: a `TransformerBackbone`.

    Returns:
        ``"bert"``, ``"roformer"`` or ``"nezha"``.

    Example:
    ```python
    family_of(backbone)  # "bert" for position="absolute"
    ```
    """
    if backbone.position not in ("absolute", "rotary", "relative"):
        raise ValueError(
            "Google-layout checkpoints hold absolute, rotary or relative positions only; "
            f"this backbone has position={backbone.position!r}."
        )
    return {"absolute": "bert", "rotary": "roformer", "relative": "nezha"}[backbone.position]
