"""Adapter files: only the tuned weights (addFFN / prefixes) plus the task head.

An adapter file is a ``.npz`` archive: one array per tuned or head variable
and a JSON ``__adapter__`` entry describing the method (units, prefix length,
layers), the backbone it fits (layers, hidden size, heads, FFN size) and the
head variables' paths and shapes. Loading checks all of that before it
assigns anything, so a file either loads completely or not at all.
"""

import json
import os

import numpy as np

from keras_masking.methods.backbone_surgery import transformer_backbones

ADAPTER_FORMAT = "keras_masking.adapter"
ADAPTER_VERSION = 1
_ATTACHMENTS = ("add_ffn", "key_value_prefix", "add_attention_units")
_BACKBONE_KEYS = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim", "activation")


def save_adapter(model, path, name=None):
    """Writes the tuned weights and the task head of ``model`` to ``path``.

    Args:
        model: an FL-tuned or prefix-tuned model (see `keras_masking.fl_tune`,
            `keras_masking.prefix_tune`) with one `TransformerBackbone`.
        path: file path; ``.npz`` is appended when missing.
        name: optional adapter name stored in the file.

    Returns:
        The path written.

    Example:
    ```python
    keras_masking.methods.save_adapter(classifier, "tnews_fl160.npz", name="tnews")
    ```
    """
    description, arrays = _adapter_state(model)
    return _write_adapter(path, {**description, "name": name}, arrays)


def _write_adapter(path, description, arrays):
    """Writes one adapter archive; returns the path (``.npz`` appended)."""
    path = str(path)
    if not path.endswith(".npz"):
        path += ".npz"
    numbered = {f"v{i}": value for i, value in enumerate(arrays)}
    np.savez(path, __adapter__=np.array(json.dumps(description)), **numbered)
    return path


def load_adapter(model, path):
    """Loads an adapter file into ``model``, attaching the branches if needed.

    A backbone without attachments gets the file's addFFN / prefixes attached
    and its base frozen (compile afterwards); a backbone that already has the
    same attachments just has their weights replaced (no recompile).

    Args:
        model: the model the adapter was trained on, rebuilt from the same
            base weights (a fresh backbone plus the same head architecture).
        path: an adapter file written by `save_adapter`.

    Returns:
        The adapter's stored name (or None).

    Raises:
        ValueError: when the file does not fit the model (layer count, hidden
            size, heads, FFN size, units, prefix length, head shapes); nothing
            is changed then.
    """
    description, arrays = read_adapter(path)
    backbone = _single_backbone(model)
    _check_fits(backbone, model, description, path)
    for key, attach in (
        ("add_ffn", backbone.attach_add_ffn),
        ("key_value_prefix", backbone.attach_key_value_prefixes),
        ("add_attention_units", backbone.attach_attention_units),
    ):
        wanted = description["method"].get(key)
        if wanted is not None and getattr(backbone, key) is None:
            attach(**wanted)
            backbone.freeze_base()
    _assign(_adapter_variables(model, backbone), arrays)
    return description.get("name")


def read_adapter(path):
    """The description and arrays of an adapter file.

    Raises:
        ValueError: for a file that is not a keras_masking adapter.
    """
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No adapter file at {path}.")
    with np.load(path, allow_pickle=False) as archive:
        if "__adapter__" not in archive.files:
            raise ValueError(f"{path} is not a keras_masking adapter file (no __adapter__ entry).")
        description = json.loads(str(archive["__adapter__"]))
        count = len(archive.files) - 1
        arrays = [archive[f"v{i}"] for i in range(count)]
    if description.get("format") != ADAPTER_FORMAT:
        raise ValueError(f"{path} is not a keras_masking adapter file.")
    return description, arrays


class AdapterSet:
    """Several named adapters for one model, switched in place.

    Each adapter is a snapshot of the tuned and head weights; switching
    assigns them, so a compiled model keeps running without recompiling. All
    adapters in a set share the attachment layout (units, prefix length,
    layers) and head architecture.

    Args:
        model: a tuned model (see `keras_masking.fl_tune`).

    Example:
    ```python
    adapters = keras_masking.methods.AdapterSet(classifier)
    adapters.add("tnews", "tnews.npz")
    adapters.add("iflytek", "iflytek.npz")
    adapters.activate("tnews")
    ```
    """

    def __init__(self, model):
        self.model = model
        self.backbone = _single_backbone(model)
        self._adapters = {}
        self.active = None

    @property
    def names(self):
        """The stored adapter names, in insertion order."""
        return list(self._adapters)

    def add(self, name, path=None):
        """Stores an adapter from ``path``, or from the model's current weights."""
        if path is None:
            self._adapters[name] = _adapter_state(self.model)
            return
        description, arrays = read_adapter(path)
        _check_fits(self.backbone, self.model, description, path)
        self._adapters[name] = (description, arrays)

    def activate(self, name):
        """Assigns adapter ``name``'s weights to the model."""
        if name not in self._adapters:
            raise KeyError(f"No adapter named {name!r}. Known: {self.names}")
        description, arrays = self._adapters[name]
        _check_fits(self.backbone, self.model, description, name)
        _assign(_adapter_variables(self.model, self.backbone), arrays)
        self.active = name

    def save(self, name, path):
        """Writes stored adapter ``name`` to an adapter file."""
        description, arrays = self._adapters[name]
        return _write_adapter(path, {**description, "name": name}, arrays)


def _single_backbone(model):
    backbones = transformer_backbones(model)
    if len(backbones) != 1:
        raise ValueError(f"Adapters need exactly one backbone; this model has {len(backbones)}.")
    return backbones[0]


def _adapter_variables(model, backbone):
    """Attachment variables (by layer) then the head's, in a fixed order."""
    tuned = []
    for block in backbone.transformer_layers:
        for layer in (block.feed_forward_branch, block.key_value_prefix, block.attention_units):
            if layer is not None:
                tuned += list(layer.weights)
    return tuned + _head_variables(model, backbone)


def _head_variables(model, backbone):
    backbone_ids = {id(v) for v in backbone.weights}
    return [v for v in model.weights if id(v) not in backbone_ids]


def _adapter_state(model):
    backbone = _single_backbone(model)
    attachments = (backbone.add_ffn, backbone.key_value_prefix, backbone.add_attention_units)
    if all(attachment is None for attachment in attachments):
        raise ValueError("This model has no adapter: call keras_masking.fl_tune or prefix_tune.")
    description = {
        "format": ADAPTER_FORMAT,
        "version": ADAPTER_VERSION,
        "method": {key: getattr(backbone, key) for key in _ATTACHMENTS},
        "backbone": {key: getattr(backbone, key) for key in _BACKBONE_KEYS},
        "head": [[v.path, list(v.shape)] for v in _head_variables(model, backbone)],
    }
    description = json.loads(json.dumps(description))
    arrays = [np.asarray(v) for v in _adapter_variables(model, backbone)]
    return description, arrays


def _check_fits(backbone, model, description, source):
    problems = []
    for key, value in description["backbone"].items():
        if getattr(backbone, key) != value:
            problems.append(f"{key}: adapter {value!r}, model {getattr(backbone, key)!r}")
    for key in _ATTACHMENTS:
        wanted, present = description["method"].get(key), getattr(backbone, key)
        if present is not None and wanted is not None and dict(present) != wanted:
            problems.append(f"{key}: adapter {wanted}, model {dict(present)}")
        if present is not None and wanted is None:
            problems.append(f"{key}: the model has {dict(present)}, the adapter none")
    head = [list(v.shape) for v in _head_variables(model, backbone)]
    stored = [shape for _, shape in description["head"]]
    if head != stored:
        problems.append(f"task head: adapter shapes {stored}, model shapes {head}")
    if problems:
        raise ValueError(
            f"The adapter {source} does not fit this model:\n  " + "\n  ".join(problems)
        )


def _assign(variables, arrays):
    if len(variables) != len(arrays) or any(
        tuple(v.shape) != a.shape for v, a in zip(variables, arrays)
    ):
        raise ValueError("The adapter's arrays do not match the model's tuned variables.")
    for variable, value in zip(variables, arrays):
        variable.assign(value)
