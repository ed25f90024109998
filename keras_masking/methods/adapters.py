"""Adapter files: only the tuned weights (addFFN / prefixes / LoRA) plus the task head.

An adapter file is a ``.npz`` archive: one array per tuned or head variable
and a JSON ``__adapter__`` entry describing the method, the backbone it fits,
the variables' names and shapes, the paths of the layers LoRA adapts, and a
checksum of every base weight (the base it was trained on). A file loads
completely or not at all.
"""

import json
import os
import zipfile
import zlib

import keras
import numpy as np

from keras_masking.methods.fl_tuning import model_backbone
from keras_masking.models.backbone_attachments import lora_trained_variables
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.files import write_atomically

ADAPTER_FORMAT = "keras_masking.adapter"
ADAPTER_VERSION = 3
_ATTACHMENTS = ("add_ffn", "key_value_prefix", "add_attention_units")
_METHODS = (*_ATTACHMENTS, "lora")
_BACKBONE_KEYS = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim", "activation")


def save_adapter(model, path, name=None):
    """Writes the tuned weights and the task head of ``model`` to ``path``.

    The file is written under a temporary name, then renamed.

    Args:
        model: a model with one `TransformerBackbone` tuned with FL-tuning,
            P-tuning v2, MA-tuning or LoRA (`enable_fl_tuning`,
            `enable_prefix_tuning`, `enable_lora`).
        path: file path (str or `os.PathLike`) in an existing folder;
            ``.npz`` is appended when missing.
        name: optional adapter name (a string) stored in the file.

    Returns:
        The path written.

    Example:
    ```python
    keras_masking.methods.save_adapter(classifier, "tnews_fl160.npz", name="tnews")
    ```
    """
    path = _output_path(path)
    if name is not None:
        _check_name(name)
    description, arrays = _adapter_state(model)
    return _write_adapter(path, {**description, "name": name}, arrays)


def load_adapter(model, path, check_base=True):
    """Loads an adapter file into ``model``, attaching the branches if needed.

    A backbone without attachments gets the file's addFFN / prefixes / LoRA
    attached and its base frozen (compile afterwards); one with the same
    attachments has their weights replaced. The file is checked completely
    before the model changes (its LoRA layers by path, its base weights by
    checksum), and the model is put back if anything fails.

    Args:
        model: the model the adapter was trained on, rebuilt from the same
            base weights (a fresh backbone plus the same head architecture).
        path: an adapter file written by `save_adapter` (``.npz`` may be
            left out).
        check_base: bool. Whether the model's base weights must be the ones
            the adapter was trained on (files from keras_masking 0.6 on hold
            their checksums); a different base is refused, naming the first
            weight that differs.

    Returns:
        The adapter's stored name (or None).

    Raises:
        FileNotFoundError: when there is no file at ``path``.
        ValueError: when the file is damaged or not an adapter, or does not
            fit the model (layer count, hidden size, heads, FFN size, units,
            prefix length, head shapes); nothing is changed then.

    Example:
    ```python
    fresh = keras.models.clone_model(classifier)
    fresh.set_weights(classifier.get_weights())  # the same base weights and head
    backbone.enable_fl_tuning(units=8)  # the backbone classifier is built on
    # ... compile and fit classifier ...
    keras_masking.methods.save_adapter(classifier, "tnews.npz", name="tnews")
    keras_masking.methods.load_adapter(fresh, "tnews.npz")  # 'tnews'
    ```
    """
    backbone = model_backbone(model)
    description, arrays = read_adapter(path)
    source = _input_path(path)
    _check_fits(backbone, model, description, source)
    if check_bool("check_base", check_base):
        _check_base(backbone, description, source)
    _load_into(model, backbone, description, arrays, source)
    return description.get("name")


def read_adapter(path):
    """The description and arrays of an adapter file.

    Args:
        path: an adapter file written by `save_adapter` (``.npz`` may be
            left out).

    Returns:
        ``(description, arrays)``: the JSON description (a dict) and the
        list of numpy arrays, in the model's variable order.

    Raises:
        FileNotFoundError: when there is no file at ``path``.
        ValueError: for a damaged file, or one that is not a keras_masking
            adapter; the message names the file.

    Example:
    ```python
    backbone.enable_fl_tuning(units=8)  # the backbone classifier is built on
    keras_masking.methods.save_adapter(classifier, "tnews.npz")
    description, arrays = keras_masking.methods.read_adapter("tnews.npz")
    description["method"]["add_ffn"]  # {'units': 8, 'layers': [0, 1]}
    ```
    """
    path = _input_path(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(
            f"Could not read the adapter file {path}: it is not a readable .npz archive "
            f"({type(error).__name__}: {error})."
        ) from error
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(
            f"{path} is not a keras_masking adapter file: it holds a single numpy array, "
            "not an adapter archive."
        )
    try:
        with loaded as archive:
            files = list(archive.files)
            text = str(archive["__adapter__"]) if "__adapter__" in files else None
            names = [name for name in files if name != "__adapter__"]
            expected = [f"v{i}" for i in range(len(names))]
            arrays = [archive[name] for name in expected if name in files]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as error:
        raise ValueError(
            f"The adapter file {path} is damaged ({type(error).__name__}: {error})."
        ) from error
    if text is None:
        raise ValueError(f"{path} is not a keras_masking adapter file (no __adapter__ entry).")
    if sorted(names) != sorted(expected):
        raise ValueError(
            f"The adapter file {path} is damaged: expected arrays named v0..v{len(names) - 1}. "
            f"Received: {sorted(names)}."
        )
    try:
        description = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"The adapter file {path} is damaged: its __adapter__ entry is not JSON ({error})."
        ) from error
    _check_description(description, arrays, path)
    return description, arrays


class AdapterSet:
    """Several named adapters for one model, switched in place.

    Each adapter is a snapshot of the tuned and head weights; switching
    assigns them (no recompile), all or nothing. The adapters of a set share
    the attachment layout and head architecture.

    Args:
        model: a tuned model (see `TransformerBackbone.enable_fl_tuning`),
            or a fresh one that the first activated adapter file attaches to.

    Example:
    ```python
    adapters = keras_masking.methods.AdapterSet(classifier)
    adapters.add("tnews", "tnews.npz")
    adapters.add("iflytek", "iflytek.npz")
    adapters.activate("tnews")
    ```
    """

    def __init__(self, model):
        self.backbone = model_backbone(model)
        self.model = model
        self._adapters = {}
        self.active = None

    @property
    def names(self):
        """The stored adapter names, in insertion order."""
        return list(self._adapters)

    def add(self, name, path=None):
        """Stores an adapter from ``path``, or from the model's current weights.

        Args:
            name: a new, non-empty string.
            path: an adapter file, or None to snapshot the model's tuned and
                head weights.
        """
        _check_name(name)
        if name in self._adapters:
            raise ValueError(
                f"An adapter named {name!r} is already in this set; remove it first "
                f"(AdapterSet.remove). Known: {self.names}"
            )
        if path is None:
            self._adapters[name] = _adapter_state(self.model)
            return
        description, arrays = read_adapter(path)
        _check_fits(self.backbone, self.model, description, _input_path(path))
        _check_base(self.backbone, description, _input_path(path))
        self._adapters[name] = (description, arrays)

    def remove(self, name):
        """Forgets adapter ``name`` (the model's weights stay as they are)."""
        self._known(name)
        del self._adapters[name]
        if self.active == name:
            self.active = None

    def activate(self, name):
        """Assigns adapter ``name``'s weights to the model (attaching if needed)."""
        self._known(name)
        description, arrays = self._adapters[name]
        _load_into(self.model, self.backbone, description, arrays, f"adapter {name!r}")
        self.active = name

    def save(self, name, path):
        """Writes stored adapter ``name`` to an adapter file; returns the path."""
        self._known(name)
        path = _output_path(path)
        description, arrays = self._adapters[name]
        return _write_adapter(path, {**description, "name": name}, arrays)

    def _known(self, name):
        if not isinstance(name, str) or name not in self._adapters:
            raise KeyError(f"No adapter named {name!r}. Known: {self.names}")


def _check_name(name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"Expected a non-empty string for name. Received: name={name!r}.")


def _as_path(path):
    if isinstance(path, (bytes, bool)) or not isinstance(path, (str, os.PathLike)):
        raise ValueError(
            f"Expected a file path (str or os.PathLike) for path. Received: path={path!r}."
        )
    path = os.fspath(path)
    if not path:
        raise ValueError("Expected a file path for path. Received: path=''.")
    return path


def _input_path(path):
    path = _as_path(path)
    if not os.path.exists(path) and not path.endswith(".npz") and os.path.exists(path + ".npz"):
        path += ".npz"
    if not os.path.exists(path):
        raise FileNotFoundError(f"No adapter file at {path}.")
    if os.path.isdir(path):
        raise ValueError(f"Expected an adapter file for path. Received a folder: {path}.")
    return path


def _output_path(path):
    path = _as_path(path)
    if not path.endswith(".npz"):
        path += ".npz"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Cannot write the adapter {path}: no folder {folder}.")
    if os.path.isdir(path):
        raise ValueError(f"Cannot write the adapter {path}: it is a folder.")
    return path


def _write_adapter(path, description, arrays):
    """Writes one adapter archive under a temporary name, then renames it."""
    numbered = {f"v{i}": value for i, value in enumerate(arrays)}

    def write(file):
        np.savez(file, __adapter__=np.array(json.dumps(description)), **numbered)

    write_atomically(path, write, mode="wb")
    return path


def _check_description(description, arrays, path):
    """Checks an adapter's description and arrays against each other."""

    def damaged(what):
        return ValueError(f"The adapter file {path} is not a valid keras_masking adapter: {what}.")

    if not isinstance(description, dict) or description.get("format") != ADAPTER_FORMAT:
        raise ValueError(f"{path} is not a keras_masking adapter file.")
    version = description.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise damaged(f"expected a positive integer version, received {version!r}")
    if version > ADAPTER_VERSION:
        raise ValueError(
            f"The adapter file {path} has format version {version}; this keras_masking reads "
            f"versions up to {ADAPTER_VERSION}. Upgrade keras_masking to load it."
        )
    method, backbone = description.get("method"), description.get("backbone")
    if not isinstance(method, dict) or not all(
        isinstance(method.get(key), (dict, type(None))) for key in _METHODS
    ):
        raise damaged("its 'method' entry is missing or malformed")
    if all(method.get(key) is None for key in _METHODS):
        raise damaged("it names no addFFN, prefix, attention units or LoRA")
    lora_layers = description.get("lora_layers", [])
    if not isinstance(lora_layers, list) or not all(isinstance(p, str) for p in lora_layers):
        raise damaged("its 'lora_layers' entry must list layer paths")
    if (method.get("lora") is None) != (not lora_layers):
        raise damaged("its LoRA setting and its LoRA layers disagree")
    base = description.get("base", [])
    if not isinstance(base, list) or not all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and _is_int(e[1])
        for e in base
    ):
        raise damaged("its 'base' entry must list [path, checksum] pairs")
    for key, fields in _METHOD_FIELDS.items():
        entry = method.get(key)
        if entry is not None and (
            set(entry) != set(fields) or not all(ok(entry[f]) for f, ok in fields.items())
        ):
            raise damaged(f"its {key} entry {entry} must have the fields {list(fields)}")
    prefix = method.get("key_value_prefix")
    if version < 2 and prefix is not None and prefix.get("reparameterize"):
        raise ValueError(
            f"The adapter file {path} holds reparameterised prefixes with one MLP per layer, "
            "written by an earlier keras_masking; prefixes now share one MLP across layers "
            "as in P-tuning v2, so these weights cannot be loaded."
        )
    if not isinstance(backbone, dict) or any(key not in backbone for key in _BACKBONE_KEYS):
        raise damaged(f"its 'backbone' entry must name {list(_BACKBONE_KEYS)}")
    head = description.get("head")
    if not isinstance(head, list) or not all(_is_name_and_shape(entry) for entry in head):
        raise damaged("its 'head' entry must list [path, shape] pairs")
    if len(head) > len(arrays):
        raise damaged(f"it describes {len(head)} head arrays but holds {len(arrays)} arrays")
    stored = [list(a.shape) for a in arrays[len(arrays) - len(head) :]]
    if stored != [list(shape) for _, shape in head]:
        raise damaged(f"its head arrays have shapes {stored}, its description {head}")
    variables = description.get("variables")
    if variables is not None:
        if not isinstance(variables, list) or not all(map(_is_name_and_shape, variables)):
            raise damaged("its 'variables' entry must list [name, shape] pairs")
        shapes = [list(a.shape) for a in arrays]
        if [list(shape) for _, shape in variables] != shapes:
            raise damaged(f"its arrays have shapes {shapes}, its description {variables}")
    if not all(np.issubdtype(a.dtype, np.floating) for a in arrays):
        dtypes = sorted({str(a.dtype) for a in arrays})
        raise damaged(f"expected floating-point arrays, received dtypes {dtypes}")
    name = description.get("name")
    if name is not None and not isinstance(name, str):
        raise damaged(f"its name must be a string, received {name!r}")


def _is_int(value, minimum=0):
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_layer_list(value):
    return isinstance(value, list) and bool(value) and all(_is_int(v) for v in value)


_METHOD_FIELDS = {
    "add_ffn": {"units": lambda v: _is_int(v, 1), "layers": _is_layer_list},
    "key_value_prefix": {
        "length": _is_int,
        "layers": _is_layer_list,
        "dropout": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1,
        "reparameterize": lambda v: isinstance(v, bool),
        "hidden_units": lambda v: _is_int(v, 1),
    },
    "add_attention_units": {"units_per_head": lambda v: _is_int(v, 1), "layers": _is_layer_list},
    "lora": {
        "rank": lambda v: _is_int(v, 1),
        "target_layer_names": lambda v: (
            isinstance(v, list) and bool(v) and all(isinstance(n, str) for n in v)
        ),
    },
}


def _is_name_and_shape(entry):
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], list)
        and all(_is_int(n) for n in entry[1])
    )


def _adapter_variables(model, backbone):
    """Attachment variables (by layer, each shared one once), LoRA's, then the head's."""
    tuned = {
        id(variable): variable
        for block in backbone.transformer_layers
        for layer in (block.feed_forward_branch, block.key_value_prefix, block.attention_units)
        if layer is not None
        for variable in layer.weights
    }
    lora = [v for layer in backbone.lora_layers() for v in lora_trained_variables(layer)]
    return list(tuned.values()) + lora + _head_variables(model, backbone)


def _base_variables(backbone, lora_layers=None):
    """The pretrained weights that stay frozen: not LoRA's kernels, nor the bias
    of a layer LoRA adapts (``lora_layers``, by default those it adapts now)."""
    lora_layers = backbone.lora_layers() if lora_layers is None else lora_layers
    trained = {id(getattr(layer, "bias", None)) for layer in lora_layers}
    return [
        variable
        for layer in backbone.base_layers()
        for variable in layer.weights
        if not _leaf(variable).startswith("lora_kernel") and id(variable) not in trained
    ]


def _checksum(variable):
    values = np.ascontiguousarray(keras.ops.convert_to_numpy(variable))
    return zlib.crc32(values.tobytes())


def _check_base(backbone, description, source):
    """Refuses a model whose base weights are not the ones the adapter was trained on."""
    stored = description.get("base")
    if not stored:
        return  # written before checksums were stored
    base = _base_variables(backbone, _lora_layers_of(backbone, description))
    mine = [[variable.path, _checksum(variable)] for variable in base]
    for theirs, ours in zip(stored, mine):
        if theirs != ours:
            raise ValueError(
                f"The adapter {source} was trained on another base model: its base weight "
                f"{theirs[0]} (checksum {theirs[1]}) is not this model's {ours[0]} (checksum "
                f"{ours[1]}), the first of {len(stored)} that must be equal. Load the adapter "
                "onto the base it was trained on (load_adapter(..., check_base=False) skips "
                "this check)."
            )
    if len(stored) != len(mine):
        raise ValueError(
            f"The adapter {source} was trained on a base with {len(stored)} weights; this "
            f"model's has {len(mine)}."
        )


def _head_variables(model, backbone):
    backbone_ids = {id(v) for v in backbone.weights}
    return [v for v in model.weights if id(v) not in backbone_ids]


def _leaf(variable):
    return variable.path.rsplit("/", 1)[-1]


def _adapter_state(model):
    backbone = model_backbone(model)
    if all(getattr(backbone, key) is None for key in _METHODS):
        raise ValueError(
            "This model has no adapter: call model.enable_fl_tuning(), enable_prefix_tuning() "
            "or enable_lora()."
        )
    variables = _adapter_variables(model, backbone)
    description = {
        "format": ADAPTER_FORMAT,
        "version": ADAPTER_VERSION,
        "method": {key: getattr(backbone, key) for key in _METHODS},
        "backbone": {key: getattr(backbone, key) for key in _BACKBONE_KEYS},
        "head": [[v.path, list(v.shape)] for v in _head_variables(model, backbone)],
        "variables": [[_leaf(v), list(v.shape)] for v in variables],
        "lora_layers": [layer.path for layer in backbone.lora_layers()],
        "base": [[v.path, _checksum(v)] for v in _base_variables(backbone)],
    }
    description = json.loads(json.dumps(description))
    arrays = [keras.ops.convert_to_numpy(v) for v in variables]
    return description, arrays


def _check_fits(backbone, model, description, source):
    problems = []
    for key, value in description["backbone"].items():
        if key in _BACKBONE_KEYS and getattr(backbone, key) != value:
            problems.append(f"{key}: adapter {value!r}, model {getattr(backbone, key)!r}")
    for key in _METHODS:
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
    _check_lora_layers(backbone, description, source)


def _load_into(model, backbone, description, arrays, source):
    """Attaches what the adapter needs and assigns its arrays, all or nothing."""
    _check_fits(backbone, model, description, source)
    before = _adapter_variables(model, backbone)
    with backbone.restore_on_error(variables=before):
        attached = False
        attaches = (backbone.attach_add_ffn, backbone.attach_key_value_prefixes)
        for key, attach in zip(_ATTACHMENTS, (*attaches, backbone.attach_attention_units)):
            wanted = description["method"].get(key)
            if wanted is not None and getattr(backbone, key) is None:
                attach(**wanted)
                attached = True
        if attached:
            backbone.freeze_base()
        lora = description["method"].get("lora")
        if lora is not None and backbone.lora is None:
            backbone.enable_lora(**lora)
        _assign(_adapter_variables(model, backbone), arrays, description, source)


def _lora_layers_of(backbone, description):
    """The layers LoRA adapts here once the adapter is loaded."""
    lora = description["method"].get("lora")
    if backbone.lora is None and lora is not None:
        return backbone.lora_targets(lora["target_layer_names"])
    return backbone.lora_layers()


def _check_lora_layers(backbone, description, source):
    """The layers LoRA adapts (or would adapt), by path: the file's and the model's must match."""
    stored = description.get("lora_layers", [])
    mine = [layer.path for layer in _lora_layers_of(backbone, description)]
    for theirs, ours in zip(stored, mine):
        if theirs != ours:
            raise ValueError(
                f"The adapter {source} adapts the layer {theirs} where this model's LoRA "
                f"adapts {ours}."
            )
    if len(stored) != len(mine):
        raise ValueError(
            f"The adapter {source} adapts {len(stored)} layers with LoRA; this model {len(mine)}."
        )


def _assign(variables, arrays, description, source):
    """Checks every shape (and stored name), then assigns."""
    problem = None
    if len(variables) != len(arrays):
        problem = f"it holds {len(arrays)} arrays, the model has {len(variables)} variables"
    names = [name for name, _ in description.get("variables") or []]
    for index, (variable, array) in enumerate(zip(variables, arrays)):
        if problem is None and tuple(variable.shape) != array.shape:
            problem = (
                f"array v{index} has shape {array.shape}, the model's variable "
                f"{variable.path} has shape {tuple(variable.shape)}"
            )
        elif problem is None and names and names[index] != _leaf(variable):
            problem = (
                f"array v{index} is a {names[index]!r}, the model's variable "
                f"{variable.path} a {_leaf(variable)!r}"
            )
    if problem:
        raise ValueError(
            f"The adapter {source} does not match the model's tuned variables: {problem}."
        )
    for variable, value in zip(variables, arrays):
        variable.assign(value)
