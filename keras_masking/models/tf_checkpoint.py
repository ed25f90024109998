"""Reading and writing Google-layout TensorFlow checkpoints.

This is an edge module: it uses TensorFlow's checkpoint reader and writer
(TensorFlow is a dependency of the package), whatever the Keras backend.
Models are filled all-or-nothing: every name and shape is checked before the
first variable is assigned.
"""

import collections
import glob
import logging
import math
import os
import re
import shutil
import uuid

import keras
import numpy as np

from keras_masking.layers.activations import resolve_activation
from keras_masking.models import google_checkpoint_layout as layout
from keras_masking.models.google_config import OPTIONAL_KEYS
from keras_masking.models.google_config import backbone_kwargs_from_google_config
from keras_masking.models.google_config import family_of
from keras_masking.models.google_config import google_config_from_backbone
from keras_masking.models.google_config import read_google_config
from keras_masking.models.mlm_embedding_correction_record import load_folder_record
from keras_masking.models.mlm_embedding_correction_record import mark_loaded_record
from keras_masking.models.mlm_embedding_correction_record import write_correction_record
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.models.transformer_masked_lm import TransformerMaskedLM
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_path
from keras_masking.utils.files import write_atomically
from keras_masking.utils.files import write_json_atomically

logger = logging.getLogger("keras_masking")

CheckpointLoadReport = collections.namedtuple("CheckpointLoadReport", ["loaded", "skipped"])
CheckpointLoadReport.__doc__ = """What a checkpoint load did.

Attributes:
    loaded: sorted names of the checkpoint variables assigned to the model.
    skipped: sorted names present in the checkpoint and not loaded (training
        state, pretraining heads the model lacks, and with ``strict=False``
        any other extra).
"""


def resolve_checkpoint_prefix(checkpoint_path):
    """A checkpoint prefix from a prefix, a folder, or an ``.index`` file.

    Args:
        checkpoint_path: str or path-like.

    Returns:
        The prefix (``.../bert_model.ckpt``) as a str.

    Raises:
        TypeError: not a path.
        FileNotFoundError: no ``.index`` file there.

    Example:
    ```python
    save_tf_checkpoint(backbone, "my_bert/bert_model.ckpt")
    resolve_checkpoint_prefix("my_bert")  # "my_bert/bert_model.ckpt"
    ```
    """
    import tensorflow as tf

    path = check_path("checkpoint_path", checkpoint_path)
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            indexes = sorted(p for p in os.listdir(path) if p.endswith(".index"))
            if len(indexes) != 1:
                raise FileNotFoundError(
                    f"{path}: expected one TF checkpoint (a '*.index' file), "
                    f"found {indexes or 'none'}."
                )
            latest = os.path.join(path, indexes[0].removesuffix(".index"))
        path = latest
    path = path.removesuffix(".index")
    if not os.path.exists(path + ".index"):
        raise FileNotFoundError(
            f"No TF checkpoint at {checkpoint_path!r} (looked for {path}.index)."
        )
    return path


def read_tf_checkpoint(checkpoint_path):
    """Reads every variable of a TF checkpoint into numpy arrays.

    Args:
        checkpoint_path: checkpoint prefix (``.../bert_model.ckpt``), its
            folder, or its ``.index`` file.

    Returns:
        A dict ``{name: np.ndarray}``.

    Raises:
        FileNotFoundError: no index, or a missing data shard.
        ValueError: an unreadable index, or a truncated or corrupt data file.

    Example:
    ```python
    save_tf_checkpoint(backbone, "my_bert/bert_model.ckpt")
    values = read_tf_checkpoint("my_bert/bert_model.ckpt")
    values["bert/embeddings/word_embeddings"].shape  # (vocabulary_size, hidden_dim)
    ```
    """
    import tensorflow as tf

    prefix = resolve_checkpoint_prefix(checkpoint_path)
    index = prefix + ".index"
    try:
        reader = tf.train.load_checkpoint(prefix)
        names = sorted(reader.get_variable_to_shape_map())
    except Exception as error:  # TF raises several error types here.
        raise ValueError(f"{index}: not a readable TF checkpoint index ({error}).") from None
    # The ``.data-XXXXX-of-NNNNN`` shards beside the index, and any missing.
    base, folder = os.path.basename(prefix), os.path.dirname(os.path.abspath(prefix))
    pattern = re.compile(re.escape(base) + r"\.data-(\d{5})-of-(\d{5})$")
    found = sorted(name for name in os.listdir(folder) if pattern.match(name))
    counts = {int(pattern.match(name).group(2)) for name in found} or {1}
    expected = {f"{base}.data-{i:05d}-of-{count:05d}" for count in counts for i in range(count)}
    missing = [os.path.join(folder, name) for name in sorted(expected - set(found))]
    found = [os.path.join(folder, name) for name in found]
    if names and missing:
        raise FileNotFoundError(
            f"{index}: its data file(s) {missing} are missing (found {found or 'none'}); "
            "copy every file of the checkpoint."
        )
    data = found[0] if len(found) == 1 else f"{prefix}.data-*"
    values = {}
    for name in names:
        try:
            values[name] = reader.get_tensor(name)
        except Exception as error:  # truncated or corrupt shards: several types
            raise ValueError(
                f"{data}: cannot read variable {name!r}; the file is truncated or corrupt "
                f"({type(error).__name__}: {error})."
            ) from None
    return values


def _family_hint(missing, unexpected, family):
    position_name = f"{layout.EMBEDDINGS}/position_embeddings"
    if position_name in missing:
        return (
            " The checkpoint has no absolute position table: is it a RoFormer "
            "or NEZHA checkpoint (model='roformer' or model='nezha')?"
        )
    if position_name in unexpected:
        return (
            f" The checkpoint has absolute position embeddings, which a {family} model does "
            "not use: is it a BERT/RoBERTa checkpoint (model='bert')?"
        )
    return ""


# Config files that may sit beside a checkpoint: Google's and Hugging Face's.
_FOLDER_CONFIGS = ("bert_config.json", "config.json")
# Arguments a checkpoint's config fixes: weights trained with one value give
# wrong outputs with another, and most (the head count, the position scheme)
# cannot be seen in the shapes.
_FIXED_BY_CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "num_segments",
    "position",
    "max_relative_position",
)


def _declared_family(config):
    """The family a config declares by its own keys, or None when it does not."""
    model_type = config.get("model_type")
    if model_type in ("bert", "roberta", "roformer", "nezha"):
        return model_type
    if "rotary_value" in config:
        return "roformer"
    if "max_relative_position" in config or config.get("use_relative_position"):
        return "nezha"
    return None


def _check_family(values, config, model, source, overrides=()):
    """Refuses a family that the checkpoint and its config contradict."""
    # The position table tells BERT/RoBERTa (absolute) from RoFormer and NEZHA,
    # which hold the same variables: only the config can tell those two apart.
    has_table = f"{layout.EMBEDDINGS}/position_embeddings" in values
    declared = _declared_family(config)
    if declared == "roformer" and model != "roformer":
        raise ValueError(
            f"{source}: the config declares a RoFormer model, so cannot load it as "
            f"model={model!r} (nothing was loaded). Expected model='roformer'. "
            f"Received: model={model!r}."
        )
    stated = declared == "nezha" or "max_relative_position" in overrides
    if model == "nezha" and not has_table and not stated:
        raise ValueError(
            f"{source}: cannot tell this checkpoint from a RoFormer one, so it is not "
            "loaded as model='nezha': it has no absolute position table (as RoFormer and "
            "NEZHA checkpoints both have) and its config declares no NEZHA setting "
            "(max_relative_position or use_relative_position, which NEZHA's configs hold). "
            "Expected model='roformer' for a RoFormer checkpoint, or a NEZHA config "
            "(add max_relative_position=64 to it, as in NEZHA's release, or pass "
            "max_relative_position=64). Received: model='nezha'."
        )


def _check_folder_configs(prefix, backbone, skip=None):
    """Refuses a backbone that a config beside the checkpoint contradicts
    (`_check_config`). ``skip``: the config that built ``backbone``."""
    folder = os.path.dirname(os.path.abspath(prefix))
    for name in _FOLDER_CONFIGS:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if skip is not None and os.path.exists(skip) and os.path.samefile(path, skip):
            continue
        try:
            config = read_google_config(path)
        except ValueError as error:
            raise ValueError(f"{error} Nothing was loaded: fix or remove the file.") from None
        _check_config(config, path, backbone)


def _check_config(config, path, backbone, family=True):
    """Refuses a backbone whose head count, activation, LayerNorm epsilon, NEZHA
    clipping or (``family``) position family differs from the checkpoint's config."""
    # The head count cannot be read from the weights' shapes (8 heads of 4 and
    # 4 heads of 8 have the same kernels), nor can RoFormer be told from NEZHA.
    heads = config.get("num_attention_heads")
    if isinstance(heads, int) and not isinstance(heads, bool) and heads != backbone.num_heads:
        raise ValueError(
            f"{path}: the checkpoint was trained with num_attention_heads={heads}, but the "
            f"model has num_heads={backbone.num_heads} (nothing was loaded; the head count "
            "is not visible in the weights' shapes). Expected num_heads="
            f"{heads}. Received: num_heads={backbone.num_heads}."
        )
    for key, argument, declared, built in _invisible_settings(config, backbone):
        raise ValueError(
            f"{path}: the checkpoint was trained with {key}={declared!r}, but the model has "
            f"{argument}={built!r} (nothing was loaded; this setting is not visible in the "
            f"weights' shapes). Expected {argument}={declared!r}. Received: "
            f"{argument}={built!r}."
        )
    _check_pruned_from(config.get("pruned_from"), path, backbone)
    if not family or backbone.position not in ("rotary", "relative"):
        return  # absolute positions: the position table's presence tells
    built = "roformer" if backbone.position == "rotary" else "nezha"
    declared = _declared_family(config)
    if declared == built or (declared is None and built == "roformer"):
        return
    stated = f"declares a {declared} model" if declared else "declares no NEZHA setting"
    raise ValueError(
        f"{path}: the config {stated}, so the checkpoint is not loaded into a model with "
        f"position={backbone.position!r} ({built}; nothing was loaded). RoFormer and NEZHA "
        "checkpoints hold the same variables: only the config tells them apart (NEZHA's "
        "holds max_relative_position or use_relative_position). Expected a "
        f"{declared or 'RoFormer'} model. Received: position={backbone.position!r}."
    )


def _check_pruned_from(declared, path, backbone):
    """Refuses a backbone without the pruned table's record the config declares (the
    MLM correction would average the kept rows, not the full table's)."""
    if not isinstance(declared, dict):
        return  # none declared (Google's configs), or a bad one: the reader names it
    built = backbone.get_config()["pruned_from"] or {}
    size = declared.get("vocabulary_size")
    mean = declared.get("token_embedding_mean")
    same = built.get("vocabulary_size") == size and np.allclose(
        built.get("token_embedding_mean", np.nan), mean, rtol=1e-6, atol=0
    )
    if not same:
        raise ValueError(
            f"{path}: the checkpoint's table was pruned from {size} rows (the config's "
            "pruned_from holds that table's size and row mean, which the MLM correction "
            "reads), but the model's pruned_from is "
            f"{'for ' + str(built['vocabulary_size']) + ' rows' if built else 'None'} "
            "(nothing was loaded). Expected the config's pruned_from: load with "
            "from_tf_checkpoint, or build the backbone with pruned_from=<the config's>."
        )


def _invisible_settings(config, backbone):
    """``(config key, argument, declared, built)`` of each setting the weights cannot show
    (activation, LayerNorm epsilon, NEZHA's clipping) that differs from the config's."""
    differing = []
    activation = config.get("hidden_act", OPTIONAL_KEYS["hidden_act"])
    if isinstance(activation, str) and isinstance(backbone.activation, str):
        try:
            same = resolve_activation(activation) is resolve_activation(backbone.activation)
        except ValueError:
            same = True  # an unknown name: the config's own reader names it
        if not same:
            differing.append(("hidden_act", "activation", activation, backbone.activation))
    epsilon = config.get("layer_norm_eps", OPTIONAL_KEYS["layer_norm_eps"])
    if isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool):
        if not math.isclose(epsilon, backbone.layer_norm_epsilon, rel_tol=1e-6):
            differing.append(
                ("layer_norm_eps", "layer_norm_epsilon", epsilon, backbone.layer_norm_epsilon)
            )
    clipping = config.get("max_relative_position")
    if backbone.position == "relative" and isinstance(clipping, int):
        if clipping != backbone.max_relative_position:
            differing.append(
                ("max_relative_position", "max_relative_position", clipping,
                 backbone.max_relative_position)
            )  # fmt: skip
    return differing


def _converted_values(values, expected, source):
    """Each checkpoint value as the dtype of its model variable, all finite (all checked first)."""
    converted = {}
    for name, variable in expected.items():
        try:
            converted[name] = np.asarray(values[name], dtype=variable.dtype)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{source}: variable {name!r} cannot be read as {variable.dtype} "
                f"(nothing was loaded): {error}"
            ) from None
    for name in sorted(converted):
        array = converted[name]
        if array.dtype.kind not in "fc":
            continue
        finite = np.isfinite(array)
        if not finite.all():
            count = int(array.size - np.count_nonzero(finite))
            first = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ValueError(
                f"{source}: variable {name!r} holds {count} NaN or infinite value(s) "
                f"(first at index {first}); nothing was loaded. Expected finite weights: "
                "the file is corrupt, or the training that wrote it diverged."
            )
    return converted


def _check_model(model, function):
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, TransformerBackbone):
        raise TypeError(
            f"`{function}` expects a keras_masking TransformerBackbone or TransformerMaskedLM. "
            f"Received: model of type {type(model).__name__} (convert a keras-hub model with "
            "keras_masking.models.from_keras_hub)."
        )
    return backbone


def _load_values(model, values, strict, source, prefix=None):
    """Checks ``values`` against the model, then assigns them all; ``prefix``: the files'."""
    folder = prefix and os.path.dirname(os.path.abspath(prefix))
    expected = layout.model_variables_by_name(model)
    backbone = getattr(model, "backbone", model)
    family = family_of(backbone)
    if not isinstance(values, dict) or not all(isinstance(name, str) for name in values):
        raise TypeError(
            "Expected a path or a dict {variable name: array} for checkpoint_path. "
            f"Received: a {type(values).__name__} with keys {list(values)[:3]}."
        )

    missing = sorted(set(expected) - set(values))
    mismatched = sorted(
        f"{name}: checkpoint {tuple(np.shape(values[name]))} vs model {tuple(expected[name].shape)}"
        for name in set(expected) & set(values)
        if tuple(np.shape(values[name])) != tuple(expected[name].shape)
    )
    extras = sorted(set(values) - set(expected))
    # A head the model does not have is skipped whole; one it has takes only its own variables.
    heads_not_built = tuple(
        head + "/" for head in (layout.MLM, layout.POOLER)
        if not any(name.startswith(head + "/") for name in expected)
    )  # fmt: skip
    tolerated = [
        name
        for name in extras
        if layout.is_training_state(name)
        or name.startswith((*layout.KNOWN_EXTRA_PREFIXES, *heads_not_built))
    ]
    unexpected = sorted(set(extras) - set(tolerated))
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {missing}")
    if mismatched:
        problems.append(f"shape mismatches: {mismatched}")
    if unexpected and strict:
        problems.append(
            f"not used by a {family} model: {unexpected} (pass strict=False to skip them)"
        )
    if problems:
        hint = _family_hint(missing, unexpected, family)
        raise ValueError(
            f"{source}: cannot load into {type(model).__name__} (nothing was loaded); "
            f"{'; '.join(problems)}.{hint}"
        )
    converted = _converted_values(values, expected, source)
    shape = (backbone.vocabulary_size, backbone.hidden_dim)
    record = folder and load_folder_record(folder, backbone.token_embedding.name, shape)
    if unexpected:
        logger.warning("%s: skipped variables not used by the model: %s", source, unexpected)
    skipped_heads = [n for n in tolerated if not layout.is_training_state(n)]
    if skipped_heads:
        logger.info("%s: skipped heads the model does not have: %s", source, skipped_heads)
    for name, variable in expected.items():
        variable.assign(converted[name])
    mark_loaded_record(model, record)
    return CheckpointLoadReport(loaded=sorted(expected), skipped=sorted(unexpected + tolerated))


def load_tf_checkpoint_weights(model, checkpoint_path, strict=True, source=None):
    """Assigns a Google-layout checkpoint to a model, all or nothing.

    The model counts as MLM-corrected afterwards exactly when the
    checkpoint's folder holds a ``mlm_embedding_correction.json`` record
    (written by `correct_checkpoint_embeddings`).

    Args:
        model: a `TransformerBackbone` or `TransformerMaskedLM`.
        checkpoint_path: checkpoint prefix, folder or ``.index`` file, or a
            dict ``{name: array}`` already read.
        strict: bool. When True, a checkpoint variable that the model does
            not use (other than optimizer state and the pretraining heads
            the model does not have) is an error; when False it is skipped
            and reported.
        source: name used in messages (defaults to the path).

    Returns:
        A `CheckpointLoadReport`.

    Raises:
        ValueError: missing variables, mismatched shapes, (strict) extra
            variables, or a ``bert_config.json`` / ``config.json`` beside
            the checkpoint whose head count, ``hidden_act``,
            ``layer_norm_eps``, NEZHA ``max_relative_position`` or family
            differs from the model's (the weights' shapes do not show them:
            a NEZHA model needs a config that declares NEZHA, as its release
            does); the message names them. Without such a config a RoFormer
            checkpoint and a NEZHA one cannot be told apart. A backbone with
            LoRA enabled is refused (load before ``enable_lora``). Nothing is
            assigned.
        TypeError: ``model`` is not a keras-masking model.

    Example:
    ```python
    save_tf_checkpoint(backbone, "my_bert/bert_model.ckpt")
    report = load_tf_checkpoint_weights(backbone, "my_bert/bert_model.ckpt", strict=False)
    report.skipped  # checkpoint variables the model does not use
    ```
    """
    backbone = _check_model(model, "load_tf_checkpoint_weights")
    strict = check_bool("strict", strict)
    if backbone.lora is not None:
        raise ValueError(
            "load_tf_checkpoint_weights cannot load into a backbone with LoRA enabled "
            f"({backbone.lora}; nothing was loaded): its attention kernels are the frozen "
            "base plus the adapters, and a checkpoint's kernels would not say which they "
            "replace. Load the checkpoint before enable_lora, or load it into "
            "backbone.merge_lora()."
        )
    if source is not None and not isinstance(source, str):
        raise ValueError(f"Expected a str or None for source. Received: source={source!r}.")
    if isinstance(checkpoint_path, dict):
        return _load_values(model, checkpoint_path, strict, source or "checkpoint")
    prefix = resolve_checkpoint_prefix(checkpoint_path)
    _check_folder_configs(prefix, backbone)
    values = read_tf_checkpoint(prefix)
    return _load_values(model, values, strict, source or str(checkpoint_path), prefix)


def from_tf_checkpoint(
    config_path,
    checkpoint_path,
    model="bert",
    with_mlm=False,
    with_pool="auto",
    strict=True,
    **backbone_kwargs,
):
    """Builds a model from a Google-layout TF checkpoint, as bert4keras did.

    Args:
        config_path: path to ``bert_config.json``.
        checkpoint_path: checkpoint prefix (``.../bert_model.ckpt``), its
            folder, or its ``.index`` file.
        model: ``"bert"``, ``"roberta"`` (HFL's RoBERTa-wwm: BERT's
            architecture), ``"roformer"`` or ``"nezha"``.
        with_mlm: bool. When True, returns a `TransformerMaskedLM` with the
            checkpoint's ``cls/predictions`` head (required then).
        with_pool: ``"auto"`` (use the pooler if the checkpoint has one),
            True (require it) or False (no pooler; ``pooled_output`` is the
            [CLS] state).
        strict: bool. See `load_tf_checkpoint_weights`.
        **backbone_kwargs: overrides of `TransformerBackbone` arguments, e.g.
            ``dropout=0.0``, ``custom_position_ids=True``, ``dtype``; one
            that differs from what the config fixes for the weights (sizes,
            heads, positions, activation, LayerNorm epsilon) is refused.

    Returns:
        A `TransformerBackbone`, or a `TransformerMaskedLM` when ``with_mlm``;
        corrected when the files are (see `load_tf_checkpoint_weights`).

    Raises:
        FileNotFoundError: a missing config, index or data file (named).
        ValueError: bad arguments, an unreadable file, or weights that do
            not fit the configuration (the variables are named).

    Example:
    ```python
    backbone = keras_masking.models.from_tf_checkpoint(
        "chinese_L-12_H-768_A-12/bert_config.json",
        "chinese_L-12_H-768_A-12/bert_model.ckpt",
        model="bert",
    )
    ```
    """
    with_mlm = check_bool("with_mlm", with_mlm)
    strict = check_bool("strict", strict)
    with_pool = check_choice("with_pool", with_pool, ("auto", True, False))
    config = read_google_config(check_path("config_path", config_path))
    kwargs = backbone_kwargs_from_google_config(config, model, source=str(config_path))
    for name in _FIXED_BY_CONFIG:
        if name in backbone_kwargs and name in kwargs and backbone_kwargs[name] != kwargs[name]:
            raise ValueError(
                f"{config_path} fixes {name}={kwargs[name]!r} for these weights; an "
                "override would load them into a different architecture. Expected "
                f"{name}={kwargs[name]!r} or no {name} argument. "
                f"Received: {name}={backbone_kwargs[name]!r}."
            )
    prefix = resolve_checkpoint_prefix(checkpoint_path)
    values = read_tf_checkpoint(prefix)
    _check_family(values, config, model, str(config_path), backbone_kwargs)
    has_pooler = f"{layout.POOLER}/kernel" in values
    kwargs["use_pooler"] = has_pooler if with_pool == "auto" else bool(with_pool)
    kwargs.update(backbone_kwargs)
    backbone = TransformerBackbone(**kwargs)
    # An override of a setting the weights cannot show (activation, epsilon) is refused.
    _check_config(config, str(config_path), backbone, family=False)
    _check_folder_configs(prefix, backbone, skip=config_path)
    result = TransformerMaskedLM(backbone) if with_mlm else backbone
    _load_values(result, values, strict, str(checkpoint_path), prefix)
    return result


def save_tf_checkpoint(model, checkpoint_prefix, config_path=None):
    """Writes a model as a Google-layout TF checkpoint (+ ``bert_config.json``).

    The result is what `from_tf_checkpoint` and bert4keras-style loaders
    read (``cls/predictions/...`` too for a `TransformerMaskedLM`). A
    corrected model also gets ``mlm_embedding_correction.json`` beside it, so
    that it loads as corrected, and a pruned one its ``pruned_from`` in the
    config. Each file is written atomically; a failed config write takes the
    checkpoint back.

    Args:
        model: a `TransformerBackbone` or `TransformerMaskedLM`.
        checkpoint_prefix: e.g. ``"out/bert_model.ckpt"``; writes
            ``.index`` and ``.data-00000-of-00001`` files and a ``checkpoint``
            file in that folder.
        config_path: where to write ``bert_config.json``; next to the
            checkpoint when None.

    Returns:
        The checkpoint prefix written.

    Raises:
        TypeError: ``model`` is not a keras-masking model, or a path is not
            a path.
        ValueError: a folder that holds a checkpoint or a ``bert_config.json``
            already (nothing is overwritten), a `TransformerMaskedLM` corrected with
            ``tied_output="keep"`` (the Google layout cannot hold the head's
            compensation: save ``model.backbone``), or a backbone with
            addFFN branches, prefixes or attention units (save its
            ``serving_copy()``, which merges FL-tuning).

    Example:
    ```python
    save_tf_checkpoint(backbone, "out/bert_model.ckpt")
    ```
    """
    backbone = _check_model(model, "save_tf_checkpoint")
    checkpoint_prefix = check_path("checkpoint_prefix", checkpoint_prefix)
    if config_path is not None:
        config_path = check_path("config_path", config_path)
    record = backbone.mlm_embedding_correction
    head = getattr(model, "masked_lm_head", None)
    if record and record.get("tied_output") == "keep" and head is not None:
        raise ValueError(
            "This model's MLM head keeps the original output rows of a corrected "
            "embedding (tied_output='keep'), which a Google checkpoint cannot hold: "
            "save `model.backbone`, or correct with tied_output='correct'."
        )
    attached = backbone.attached_methods()
    if attached:
        raise ValueError(
            f"A Google checkpoint has no place for {' and '.join(attached)}; they would be left "
            "out. Save backbone.serving_copy() (FL-tuning merged into wider FFNs), or keep the "
            "methods with model.save() or save_to_preset()."
        )
    folder = os.path.dirname(os.path.abspath(checkpoint_prefix))
    config_path = config_path or os.path.join(folder, "bert_config.json")
    # A folder's bert_config.json and correction record describe one checkpoint.
    held = sorted(glob.glob(os.path.join(glob.escape(folder), "*.index")))
    if held or os.path.exists(config_path):
        raise ValueError(
            "Expected a folder without a checkpoint and a config_path that does not exist (its "
            "bert_config.json and MLM-correction record describe one checkpoint), so that "
            "nothing is overwritten. Received: "
            + (f"{folder!r} holding {[os.path.basename(path) for path in held]}." if held
               else f"config_path {config_path!r}, which exists.")
        )  # fmt: skip
    config = google_config_from_backbone(backbone)
    variables = layout.model_variables_by_name(model)
    values = {name: keras.ops.convert_to_numpy(variable) for name, variable in variables.items()}
    os.makedirs(os.path.dirname(os.path.abspath(config_path)), exist_ok=True)
    state_file = os.path.join(folder, "checkpoint")
    state = _read_bytes(state_file)
    write_tf_checkpoint(values, checkpoint_prefix)
    written = []
    try:
        written.append(write_json_atomically(config_path, config))
        write_correction_record(folder, record, "save_tf_checkpoint")
    except BaseException:
        # Half a save (a checkpoint without its config) would be refused by the
        # next call: take it back, so that the same call can be made again.
        prefix = glob.escape(os.path.abspath(checkpoint_prefix))
        for path in written + glob.glob(prefix + ".index") + glob.glob(prefix + ".data-*"):
            os.remove(path)
        _restore_bytes(state_file, state)
        raise
    return checkpoint_prefix


def _read_bytes(path):
    """A file's bytes, or None when there is none."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


def _restore_bytes(path, data):
    """Puts back what `_read_bytes` read (None: no file)."""
    if data is None:
        if os.path.exists(path):
            os.remove(path)
    else:
        write_atomically(path, lambda file: file.write(data), mode="wb")


def write_tf_checkpoint(values, checkpoint_prefix):
    """Writes ``{name: array}`` as a TF checkpoint with exactly those names, atomically.

    Args:
        values: dict of numpy arrays.
        checkpoint_prefix: output prefix; its folder is created.

    Raises:
        ValueError: ``values`` is not a non-empty dict of str names to
            numeric or string arrays, or a checkpoint with that prefix
            exists (nothing is overwritten).

    Example:
    ```python
    table = np.zeros((128, 32), "float32")
    write_tf_checkpoint({"bert/embeddings/word_embeddings": table}, "out/bert_model.ckpt")
    ```
    """
    import tensorflow as tf

    if not isinstance(values, dict) or not values:
        raise ValueError(
            "Expected a non-empty dict {name: array} for values. "
            f"Received: {'an empty dict' if values == {} else 'a ' + type(values).__name__}."
        )
    bad_names = [name for name in values if not isinstance(name, str) or not name]
    if bad_names:
        raise ValueError(
            f"Expected non-empty str names in values. Received: the names {bad_names[:5]!r}."
        )
    checkpoint_prefix = check_path("checkpoint_prefix", checkpoint_prefix)
    names = sorted(values)
    tensors = []
    for name in names:
        try:
            tensors.append(tf.convert_to_tensor(np.asarray(values[name])))
        except (TypeError, ValueError) as error:
            raise ValueError(f"Expected an array for values[{name!r}]. Received: {error}") from None
    folder = os.path.dirname(os.path.abspath(checkpoint_prefix))
    base = os.path.basename(checkpoint_prefix)
    prefix = glob.escape(os.path.abspath(checkpoint_prefix))
    existing = glob.glob(prefix + ".index") + glob.glob(prefix + ".data-*")
    if existing:
        raise ValueError(
            "Expected a checkpoint_prefix with no checkpoint yet (one is written file by file, "
            f"so overwriting could leave it half old). Received: {checkpoint_prefix!r}, which "
            f"has {sorted(os.path.basename(path) for path in existing)}."
        )
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{base}.partial-{uuid.uuid4().hex[:8]}")
    os.makedirs(temporary)
    try:
        tf.raw_ops.SaveV2(
            prefix=os.path.join(temporary, base),
            tensor_names=names,
            shape_and_slices=[""] * len(names),
            tensors=tensors,
        )
        written = sorted(os.listdir(temporary))
        # Data shards first, the index last: a reader never sees an index
        # whose data is not there yet.
        for name in sorted(written, key=lambda n: n.endswith(".index")):
            os.replace(os.path.join(temporary, name), os.path.join(folder, name))
    finally:
        shutil.rmtree(temporary, ignore_errors=True)

    lines = f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n'
    write_atomically(os.path.join(folder, "checkpoint"), lambda file: file.write(lines))
