"""TransformerBackbone's loaders: keras-hub backbones, presets (ours, keras-hub's, HF), weights."""

import inspect
import json
import os
import pathlib
import re

import keras
import keras_hub
import numpy as np

from keras_masking.models import keras_hub_conversion
from keras_masking.models.backbone_config import plain_record
from keras_masking.models.mlm_embedding_correction_record import load_folder_record
from keras_masking.models.mlm_embedding_correction_record import mark_loaded_record
from keras_masking.models.model_card import model_card
from keras_masking.models.model_card import write_model_card
from keras_masking.utils.eager_checks import non_finite_variables
from keras_masking.utils.files import read_json_object
from keras_masking.utils.files import replace_folder_atomically


class BackboneLoading:
    """`TransformerBackbone`'s conversions from and to keras-hub, its preset loader, and
    the method layout its weights files carry.

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
        accepted = set(inspect.signature(cls.__init__).parameters) | {"name", "trainable"}
        unknown = sorted(set(overrides) - accepted)
        if unknown:
            raise ValueError(
                f"Unknown TransformerBackbone argument(s) {unknown} for from_keras_hub. "
                f"Expected overrides among {sorted(accepted - {'self', 'kwargs'})}."
            )
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

    # === Weights files: the method layout travels with the weights ===
    def method_layout(self):
        """Which layers each method changes: what a weights file must match.

        Keras loads a weights file (``load_weights``) by the order of the
        layers, so weights saved with ASA's adversaries (or addFFN units,
        prefixes, LoRA) on other layers would load into the wrong ones
        silently; the backbone saves this record with its weights and
        refuses a file whose record differs.

        Example:
        ```python
        backbone.method_layout()["asa_layers"]  # None, or the attacked layers
        ```
        """
        return {
            "asa_layers": None if self.asa is None else list(self.asa["layers"]),
            "add_ffn": plain_record(self.add_ffn),
            "key_value_prefix": plain_record(self.key_value_prefix),
            "add_attention_units": plain_record(self.add_attention_units),
            "lora": plain_record(self.lora),
        }

    def save_own_variables(self, store):
        super().save_own_variables(store)
        layout = json.dumps(self.method_layout(), sort_keys=True).encode("utf-8")
        store[_LAYOUT_KEY] = np.frombuffer(layout, "uint8")

    def load_own_variables(self, store):
        keys = list(store.keys())
        if _LAYOUT_KEY not in keys:
            # Older files carry no record. Keras visits a backbone under each
            # of its paths (a task's ``backbone`` too): a mismatch seen under one
            # is not forgotten under another.
            if getattr(self, "_layout_mismatch", None):
                raise ValueError(self._layout_mismatch)
            return
        saved = json.loads(bytes(np.asarray(store[_LAYOUT_KEY], "uint8")).decode("utf-8"))
        own = self.method_layout()
        differing = sorted(key for key in own if saved.get(key) != own[key])
        self._layout_mismatch = None
        if differing:
            details = "; ".join(f"{k}: file {saved.get(k)}, model {own[k]}" for k in differing)
            self._layout_mismatch = (
                "These weights were saved from a backbone whose methods sit on other layers "
                f"({details}); Keras would load them by position into the wrong layers. Build "
                "the model with the same methods (or load the whole model with "
                "keras.saving.load_model, which restores them)."
            )
            raise ValueError(self._layout_mismatch)

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's ``save_to_preset``, plus a model card (``README.md``), whole or not at all.

        The card says what the model is and which methods are on
        (`keras_masking.models.model_card.model_card`). The preset is written
        in a temporary folder, then swapped in: a failure (a full disk) leaves
        an existing preset as it was. Other files of the folder are kept, but
        not old weights files (`kept_across_preset_saves`).

        Args:
            preset_dir: the preset folder.
            max_shard_size: keras-hub's shard size in GB.

        Example:
        ```python
        backbone.save_to_preset("my_preset")  # config, weights, README.md
        ```
        """
        save = super().save_to_preset

        def write(folder):
            save(folder, max_shard_size=max_shard_size)
            write_model_card(folder, model_card(self))

        replace_folder_atomically(preset_dir, write, keep_other_files=kept_across_preset_saves)


def kept_across_preset_saves(name):
    """Whether a file of a preset folder stays when another preset is saved there.

    The weights are one set: an old ``model.weights.h5`` beside new shards
    (``model.weights.json``, ``model_00000.weights.h5``, ...) is what keras-hub
    would load. Every other file stays (a tokenizer saved there, your notes).

    Args:
        name: a file or folder name in the preset folder.

    Example:
    >>> kept_across_preset_saves("model.weights.h5"), kept_across_preset_saves("notes.txt")
    (False, True)
    """
    return not re.fullmatch(r"model(_\d+)?\.weights\.(h5|json)", name)


def declared_task_class(task_config):
    """The class a preset's ``task.json`` names (its ``registered_name``), or None.

    Args:
        task_config: the dict ``task.json`` holds.

    Example:
    ```python
    import json
    classifier = keras_masking.models.TransformerTextClassifier(backbone, num_classes=2)
    classifier.save_to_preset("preset")
    declared_task_class(json.load(open("preset/task.json")))  # TransformerTextClassifier
    ```
    """
    name = task_config.get("registered_name")
    declared = keras.saving.get_registered_object(name) if isinstance(name, str) else None
    return declared if isinstance(declared, type) else None


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
    loaded = read_keras_hub_preset(
        keras_hub.models.Backbone, preset, load_weights=load_weights, **kwargs
    )
    if isinstance(loaded, cls):
        return loaded
    declared = _declared_settings(preset)
    use_pooler = declared.pop("use_pooler", True)
    converted = cls.from_keras_hub(loaded, **declared)
    if not use_pooler and converted.use_pooler:
        converted = _without_pooler(converted)
    _fold_roberta_token_type(converted, preset)
    if os.path.isdir(preset):  # marked as corrected when its folder says so
        shape = (converted.vocabulary_size, converted.hidden_dim)
        record = load_folder_record(preset, converted.token_embedding.name, shape)
        mark_loaded_record(converted, record)
    return converted


_LAYOUT_KEY = "method_layout"

_PRESET_WEIGHTS_FILES = ("model.weights.h5", "task.weights.h5")

_PRESET_JSON_FILES = ("config.json", "metadata.json", "task.json", "preprocessor.json")


def read_keras_hub_preset(loader, preset, load_weights=True, **kwargs):
    """``loader.from_preset(preset)`` with every problem naming its file.

    A JSON file that does not parse, a truncated or corrupt weights file
    (h5py's message names none) and NaN or infinite weights are refused with
    the file's path.

    Args:
        loader: `keras_hub.models.Backbone` or `keras_hub.models.Task` (or a
            subclass).
        preset: a local preset folder.
        load_weights: bool. Whether to load the weights.
        **kwargs: passed to ``loader.from_preset``.

    Example:
    ```python
    backbone.save_to_preset("preset")
    loaded = read_keras_hub_preset(keras_hub.models.Backbone, "preset")
    ```
    """
    preset = os.fspath(preset)
    for name in _PRESET_JSON_FILES:
        path = _preset_file(preset, name)
        if path is not None:
            read_json_object(path, f"the {name} that save_to_preset wrote: copy it again")
    try:
        loaded = loader.from_preset(preset, load_weights=load_weights, **kwargs)
    except OSError as error:
        weights = [path for path in map(lambda n: _preset_file(preset, n), _PRESET_WEIGHTS_FILES)
                   if path is not None]  # fmt: skip
        if not load_weights or not weights:
            raise
        # h5py's message names no file ("Unable to synchronously open file").
        raise ValueError(
            f"{' or '.join(weights)}: cannot read the preset's weights; the file is truncated or "
            f"corrupt ({type(error).__name__}: {error}). Expected the file that save_to_preset "
            "wrote: copy it again."
        ) from None
    if load_weights:
        weights = _preset_file(preset, _PRESET_WEIGHTS_FILES[0]) or preset
        for path, count in non_finite_variables(loaded.weights)[:1]:
            raise ValueError(
                f"{weights}: weight {path!r} holds {count} NaN or infinite value(s). "
                "Expected finite weights: the file is corrupt, or the training that wrote it "
                "diverged."
            )
    return loaded


def _preset_file(preset, name):
    """``preset/name`` when ``preset`` is a local folder holding that file, else None."""
    if not isinstance(preset, (str, os.PathLike)) or not os.path.isdir(preset):
        return None
    path = os.path.join(os.fspath(preset), name)
    return path if os.path.isfile(path) else None


def _hugging_face_config(preset):
    """A Hugging Face folder's ``config.json`` (it names a ``model_type``), or None."""
    config_path = _preset_file(preset, "config.json")
    if config_path is None:
        return None
    config = read_json_object(config_path, "the preset's config.json")
    return config if "model_type" in config else None


def _declared_settings(preset):
    """`from_keras_hub` overrides from what a Hugging Face folder declares.

    keras-hub's converters keep their own activation and LayerNorm epsilon,
    and read no ``position_embedding_type``: the folder's own ones are used
    (transformers' defaults, ``"gelu"`` and 1e-12, where it names none), and
    relative positions (weights keras-hub would leave unused) refused. The
    ``pooling``, ``pruned_from`` and ``use_pooler`` that
    `export_to_transformers` writes are read back.
    """
    config = _hugging_face_config(preset)
    if config is None:
        return {"activation": None}
    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(
            f"{_preset_file(preset, 'config.json')}: 'position_embedding_type': "
            f"{position_type!r} (relative attention, with weights of its own) is not "
            "supported; expected 'absolute'."
        )
    # transformers' own defaults (BERT, RoBERTa, XLM-R) where the folder leaves them out.
    settings = {
        "activation": config.get("hidden_act", "gelu"),
        "layer_norm_epsilon": float(config.get("layer_norm_eps", 1e-12)),
    }
    # What export_to_transformers writes for this package alone (keras-hub reads
    # none): e5's mean pooling, a pruned table's record, no pooler of its own.
    for name in ("pooling", "pruned_from", "use_pooler"):
        if config.get(name) is not None:
            settings[name] = config[name]
    return settings


def _without_pooler(backbone):
    """The same backbone without its pooler (every other weight copied): a Hugging
    Face BERT folder holds a zero pooler where the exported model had none."""
    plain = type(backbone).from_config({**backbone.get_config(), "use_pooler": False})
    values = {variable.path: variable for variable in backbone.weights}
    for variable in plain.weights:
        variable.assign(values[variable.path])
    return plain


def _fold_roberta_token_type(backbone, preset):
    """Adds a Hugging Face RoBERTa's token-type row to its position table.

    RoBERTa adds ``token_type_embeddings[0]`` to every token; keras-hub's
    RoBERTa converter drops it (a fine-tuned model's row is not zero).
    Added to every position row, the sum the embeddings' LayerNorm sees is
    the same.
    """
    config = _hugging_face_config(preset)
    if config is None or config.get("model_type") != "roberta":
        return
    name = "roberta.embeddings.token_type_embeddings.weight"
    row = None
    for path in sorted(pathlib.Path(preset).glob("*.safetensors")):
        import safetensors  # keras-hub read the folder with it

        with safetensors.safe_open(str(path), framework="np") as file:
            for key in (name, name.removeprefix("roberta.")):
                if key in file.keys():
                    row = file.get_tensor(key)[0]
    if row is None or not np.any(row):
        return
    table = backbone.embeddings.position_embedding.embeddings
    table.assign(keras.ops.convert_to_numpy(table) + row.astype("float32"))
