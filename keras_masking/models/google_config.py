"""Translating Google's ``bert_config.json`` to TransformerBackbone arguments."""

import difflib
import json
import logging
import numbers
import os

from keras_masking.layers.activations import resolve_activation
from keras_masking.models.transformer_backbone import FAMILY_POSITIONS
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


def _described(value):
    """``value`` as the JSON file spells it, and its JSON type."""
    kinds = ((bool, "a boolean"), (str, "a string"), (numbers.Integral, "an integer"))
    kinds += ((numbers.Real, "a number"), (list, "a list"), (dict, "an object"))
    kind = next((name for cls, name in kinds if isinstance(value, cls)), None)
    if value is None:
        kind = "null"
    kind = kind or f"a {type(value).__name__}"
    return f"{json.dumps(value) if _jsonable(value) else repr(value)} ({kind})"


def _jsonable(value):
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


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
    if model not in FAMILY_POSITIONS:
        raise ValueError(
            f"`model` must be one of {tuple(FAMILY_POSITIONS)}. Received: model={model!r}"
        )
    if not isinstance(config, dict):
        raise ValueError(
            f"{source}: expected a dict of settings. Received: {type(config).__name__}."
        )
    known = set(REQUIRED_KEYS) | set(OPTIONAL_KEYS) | set(IGNORED_KEYS)
    unknown = sorted(set(config) - known)
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        hints = []
        for key in missing:
            close = difflib.get_close_matches(key, unknown, n=1)
            if close:
                hints.append(f"{close[0]!r} -> {key!r}?")
        raise ValueError(
            f"{source}: missing required key(s) {missing}. "
            f"Unrecognised keys: {unknown}. "
            + (f"Did you mean: {', '.join(hints)}" if hints else "")
        )
    if unknown:
        logger.warning("%s: ignoring unrecognised config keys %s", source, unknown)
    settings = {**OPTIONAL_KEYS, **{k: config[k] for k in config if k in known}}
    sizes = {
        key: _config_value(settings, key, source, check_int, minimum=minimum)
        for key, minimum in (
            ("vocab_size", 1),
            ("hidden_size", 1),
            ("num_hidden_layers", 1),
            ("num_attention_heads", 1),
            ("intermediate_size", 1),
            ("max_position_embeddings", 1),
            ("type_vocab_size", 0),
            ("max_relative_position", 1),
        )
    }
    rate = dict(check=check_float, minimum=0.0, maximum=1.0, open_maximum=True)
    rates = {
        key: _config_value(settings, key, source, **rate)
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob")
    }
    layer_norm_eps = _config_value(
        settings, "layer_norm_eps", source, check_float, minimum=0.0, open_minimum=True
    )
    _config_value(settings, "initializer_range", source, check_float, minimum=0.0)
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
    if sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise ValueError(
            f"{source}: expected 'hidden_size' divisible by 'num_attention_heads'. Received: "
            f"'hidden_size': {sizes['hidden_size']}, "
            f"'num_attention_heads': {sizes['num_attention_heads']}."
        )
    embedding_size = settings["embedding_size"]
    if embedding_size is not None:
        embedding_size = _config_value(settings, "embedding_size", source, check_int, minimum=1)
    if embedding_size not in (None, sizes["hidden_size"]):
        raise ValueError(
            f"{source}: embedding_size={embedding_size} differs from "
            f"hidden_size={sizes['hidden_size']}; factorised embeddings "
            "(ALBERT, small RoFormer/ELECTRA variants) are not supported."
        )
    if config.get("use_relative_position") and model != "nezha":
        raise ValueError(
            f"{source}: `use_relative_position` is set, a NEZHA setting, but "
            f"model={model!r}. Is this a NEZHA config (model='nezha')?"
        )
    if "max_relative_position" in config and model != "nezha":
        raise ValueError(
            f"{source}: `max_relative_position` is a NEZHA setting, but "
            f"model={model!r}. Is this a NEZHA config (model='nezha')?"
        )
    kwargs = {
        "vocabulary_size": sizes["vocab_size"],
        "num_layers": sizes["num_hidden_layers"],
        "num_heads": sizes["num_attention_heads"],
        "hidden_dim": sizes["hidden_size"],
        "intermediate_dim": sizes["intermediate_size"],
        "dropout": rates["hidden_dropout_prob"],
        "attention_dropout": rates["attention_probs_dropout_prob"],
        "max_sequence_length": sizes["max_position_embeddings"],
        "num_segments": sizes["type_vocab_size"],
        "position": FAMILY_POSITIONS[model],
        "activation": activation,
        "layer_norm_epsilon": layer_norm_eps,
    }
    if model == "nezha":
        kwargs["max_relative_position"] = sizes["max_relative_position"]
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
    attention_dropout = backbone.attention_dropout
    if attention_dropout is None:
        attention_dropout = backbone.dropout
    config = {
        "vocab_size": backbone.vocabulary_size,
        "hidden_size": backbone.hidden_dim,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_heads,
        "intermediate_size": backbone.intermediate_dim,
        "hidden_act": backbone.activation,
        "hidden_dropout_prob": backbone.dropout,
        "attention_probs_dropout_prob": attention_dropout,
        "max_position_embeddings": backbone.max_sequence_length,
        "type_vocab_size": backbone.num_segments,
        "layer_norm_eps": backbone.layer_norm_epsilon,
        "initializer_range": 0.02,
    }
    if backbone.position == "relative":
        config["max_relative_position"] = backbone.max_relative_position
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
