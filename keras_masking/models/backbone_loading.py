"""TransformerBackbone's loaders: keras-hub backbones, local presets (ours, keras-hub's, HF)."""

import json
import os

import keras_hub

from keras_masking.models import keras_hub_conversion
from keras_masking.models.mlm_embedding_correction_record import load_folder_record
from keras_masking.models.mlm_embedding_correction_record import mark_loaded_record
from keras_masking.utils.eager_checks import non_finite_variables


class BackboneLoading:
    """`TransformerBackbone`'s conversions from and to keras-hub, and its preset loader.

    Example:
    ```python
    hub = backbone.to_keras_hub()
    again = keras_masking.models.TransformerBackbone.from_keras_hub(hub)
    ```
    """

    @classmethod
    def from_keras_hub(cls, backbone, activation=None, **overrides):
        """A backbone with the weights of a keras-hub BERT / RoBERTa backbone.

        The converse of `to_keras_hub`: the same function as keras-hub's
        model, with every stage open to the methods.

        Args:
            backbone: a `keras_hub.models.BertBackbone` or `RobertaBackbone`.
            activation: None keeps keras-hub's activation (the tanh GELU for
                BERT, exact GELU for RoBERTa) so outputs match keras-hub; pass
                the checkpoint's own (``"gelu"`` for Hugging Face BERT) to
                follow the original model instead.
            **overrides: other arguments to change (``dropout``,
                ``custom_position_ids``, ``attention_dropout``...). The sizes,
                segments, pooler and position scheme come from ``backbone``.

        Raises:
            TypeError: ``backbone`` is not a keras-hub BERT/RoBERTa backbone.
            ValueError: an override of a size the weights fix, or a bad value.

        Example:
        ```python
        hub = keras_hub.models.BertBackbone(
            vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32,
            intermediate_dim=48, max_sequence_length=24,
        )  # or BertBackbone.from_preset(...)
        backbone = keras_masking.models.TransformerBackbone.from_keras_hub(hub)
        hub_again = backbone.to_keras_hub()
        ```
        """
        kwargs = keras_hub_conversion.transformer_backbone_arguments(
            backbone, activation=activation, overrides=overrides
        )
        converted = cls(**kwargs)
        keras_hub_conversion.copy_keras_hub_weights(backbone, converted)
        return converted

    def to_keras_hub(self):
        """Converts to an equivalent keras-hub `BertBackbone` / `RobertaBackbone`.

        The converse of `from_keras_hub`; see `keras_masking.models.to_keras_hub`.

        Example:
        ```python
        hub = backbone.to_keras_hub()
        ```
        """
        return keras_hub_conversion.to_keras_hub(self)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Loads a local preset folder: ours, keras-hub's BERT/RoBERTa, or HF.

        A folder saved by `save_to_preset` loads as usual. A keras-hub
        BERT / RoBERTa preset or a Hugging Face folder is loaded by keras-hub
        and converted with `from_keras_hub`, keeping the activation the
        checkpoint declares; one written by `correct_preset_embeddings` loads
        as corrected.

        Args:
            preset: path (str or path-like) to a local preset folder (named
                presets need the network, which this package never uses by
                itself).
            load_weights: bool. Whether to load the weights.
            **kwargs: passed to the keras-hub loader.
        """
        return load_backbone_preset(cls, preset, load_weights, **kwargs)


def load_backbone_preset(cls, preset, load_weights=True, **kwargs):
    """`TransformerBackbone.from_preset`'s body: ``cls`` is the class asked for.

    Args:
        cls: `TransformerBackbone` (or a subclass).
        preset: path to a local preset folder.
        load_weights: bool. Whether to load the weights.
        **kwargs: passed to the keras-hub loader.

    Example:
    ```python
    backbone.save_to_preset("preset")
    loaded = load_backbone_preset(type(backbone), "preset")
    ```
    """
    # keras-hub's generic loader picks the class the preset declares.
    preset = os.fspath(preset)
    _check_preset_json_files(preset)
    try:
        loaded = keras_hub.models.Backbone.from_preset(preset, load_weights=load_weights, **kwargs)
    except OSError as error:
        weights = _preset_file(preset, _PRESET_WEIGHTS_FILE)
        if not load_weights or weights is None:
            raise
        # h5py's message names no file ("Unable to synchronously open file").
        raise ValueError(
            f"{weights}: cannot read the preset's weights; the file is truncated or corrupt "
            f"({type(error).__name__}: {error}). Expected the {_PRESET_WEIGHTS_FILE} that "
            "save_to_preset wrote: copy it again."
        ) from None
    if load_weights:
        _check_finite_weights(loaded, _preset_file(preset, _PRESET_WEIGHTS_FILE) or preset)
    if isinstance(loaded, cls):
        return loaded
    converted = cls.from_keras_hub(loaded, activation=_declared_activation(preset))
    _mark_preset_record(converted, preset)
    return converted


_PRESET_WEIGHTS_FILE = "model.weights.h5"

_PRESET_JSON_FILES = ("config.json", "metadata.json")


def _mark_preset_record(backbone, preset):
    """Marks a converted keras-hub preset as corrected when its folder says so."""
    if os.path.isdir(preset):
        shape = (backbone.vocabulary_size, backbone.hidden_dim)
        record = load_folder_record(preset, backbone.token_embedding.name, shape)
        mark_loaded_record(backbone, record)


def _preset_file(preset, name):
    """``preset/name`` when ``preset`` is a local folder holding that file, else None."""
    if not isinstance(preset, (str, os.PathLike)) or not os.path.isdir(preset):
        return None
    path = os.path.join(os.fspath(preset), name)
    return path if os.path.isfile(path) else None


def _check_preset_json_files(preset):
    """Refuses a local preset whose JSON files do not parse, naming the file."""
    for name in _PRESET_JSON_FILES:
        path = _preset_file(preset, name)
        if path is None:
            continue
        try:
            with open(path, encoding="utf-8") as file:
                value = json.load(file)
        except (UnicodeDecodeError, ValueError) as error:
            raise ValueError(
                f"{path}: not valid JSON ({error}); the file is truncated or corrupt. "
                f"Expected the {name} that save_to_preset wrote: copy it again."
            ) from None
        if not isinstance(value, dict):
            raise ValueError(
                f"{path}: expected a JSON object. Received: a JSON {type(value).__name__}."
            )


def _check_finite_weights(model, source):
    """Refuses a model loaded with NaN or infinite weights, naming the variable."""
    for path, count in non_finite_variables(model.weights)[:1]:
        raise ValueError(
            f"{source}: weight {path!r} holds {count} NaN or infinite value(s). "
            "Expected finite weights: the file is corrupt, or the training that wrote it "
            "diverged."
        )


def _declared_activation(preset):
    """The activation a Hugging Face folder declares, or None."""
    config_path = _preset_file(preset, "config.json")
    if config_path is None:
        return None
    with open(config_path, encoding="utf-8") as file:
        config = json.load(file)
    return config.get("hidden_act") if "model_type" in config else None
