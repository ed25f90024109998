"""Translating Google's ``bert_config.json`` to TransformerBackbone arguments."""

import difflib
import json
import logging
import os

from keras_masking.models.transformer_backbone import FAMILY_POSITIONS

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
    """
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"No config file at {config_path!r}.")
    with open(config_path, encoding="utf-8") as file:
        try:
            config = json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f"{config_path}: not valid JSON ({error}).") from error
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object.")
    return config


def backbone_kwargs_from_google_config(config, model, source="config"):
    """``bert_config.json`` keys -> `TransformerBackbone` keyword arguments.

    Args:
        config: dict read from a Google-layout ``bert_config.json``.
        model: one of ``"bert"``, ``"roberta"``, ``"roformer"``, ``"nezha"``.
        source: name of the config (file path) for error messages.

    Returns:
        A dict of constructor arguments (without ``use_pooler``, which the
        loader decides from the checkpoint).
    """
    if model not in FAMILY_POSITIONS:
        raise ValueError(
            f"`model` must be one of {tuple(FAMILY_POSITIONS)}. Received: model={model!r}"
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
    embedding_size = settings["embedding_size"]
    if embedding_size not in (None, settings["hidden_size"]):
        raise ValueError(
            f"{source}: embedding_size={embedding_size} differs from "
            f"hidden_size={settings['hidden_size']}; factorised embeddings "
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
        "vocabulary_size": int(settings["vocab_size"]),
        "num_layers": int(settings["num_hidden_layers"]),
        "num_heads": int(settings["num_attention_heads"]),
        "hidden_dim": int(settings["hidden_size"]),
        "intermediate_dim": int(settings["intermediate_size"]),
        "dropout": float(settings["hidden_dropout_prob"]),
        "attention_dropout": float(settings["attention_probs_dropout_prob"]),
        "max_sequence_length": int(settings["max_position_embeddings"]),
        "num_segments": int(settings["type_vocab_size"]),
        "position": FAMILY_POSITIONS[model],
        "activation": settings["hidden_act"],
        "layer_norm_epsilon": float(settings["layer_norm_eps"]),
    }
    if model == "nezha":
        kwargs["max_relative_position"] = int(settings["max_relative_position"])
    return kwargs


def google_config_from_backbone(backbone):
    """A ``bert_config.json`` dict describing ``backbone``.

    Args:
        backbone: a `TransformerBackbone`.

    Returns:
        A JSON-serialisable dict that `backbone_kwargs_from_google_config`
        reads back to the same architecture.
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
    """The checkpoint family name (``model=``) for a backbone's scheme."""
    return {"absolute": "bert", "rotary": "roformer", "relative": "nezha"}[backbone.position]
