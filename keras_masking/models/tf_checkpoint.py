"""Reading and writing Google-layout TensorFlow checkpoints.

This is an edge module: it uses TensorFlow's checkpoint reader and writer
(TensorFlow is a dependency of the package), whatever the Keras backend.
Models are filled all-or-nothing: every name and shape is checked before the
first variable is assigned.
"""

import collections
import json
import logging
import os

import keras
import numpy as np

from keras_masking.models import google_checkpoint_layout as layout
from keras_masking.models.google_config import backbone_kwargs_from_google_config
from keras_masking.models.google_config import family_of
from keras_masking.models.google_config import google_config_from_backbone
from keras_masking.models.google_config import read_google_config

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
    """A checkpoint prefix from a prefix, a folder, or an ``.index`` file."""
    import tensorflow as tf

    path = str(checkpoint_path)
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            indexes = sorted(p for p in os.listdir(path) if p.endswith(".index"))
            if len(indexes) != 1:
                raise FileNotFoundError(
                    f"{path}: expected one TF checkpoint (a '*.index' file), "
                    f"found {indexes or 'none'}."
                )
            latest = os.path.join(path, indexes[0][: -len(".index")])
        path = latest
    if path.endswith(".index"):
        path = path[: -len(".index")]
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
    """
    import tensorflow as tf

    prefix = resolve_checkpoint_prefix(checkpoint_path)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as error:  # TF raises several error types here.
        raise ValueError(f"{prefix}: not a readable TF checkpoint ({error}).") from error
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def _family_hint(missing, unexpected, family):
    position_name = f"{layout.EMBEDDINGS}/position_embeddings"
    if position_name in missing:
        return (
            " The checkpoint has no absolute position table: is it a RoFormer "
            "or NEZHA checkpoint (model='roformer' or model='nezha')?"
        )
    if position_name in unexpected:
        return (
            f" The checkpoint has absolute position embeddings, which a "
            f"{family} model does not use: is it a BERT/RoBERTa checkpoint "
            "(model='bert')?"
        )
    return ""


def load_tf_checkpoint_weights(model, checkpoint_path, strict=True, source=None):
    """Assigns a Google-layout checkpoint to a model, all or nothing.

    Args:
        model: a `TransformerBackbone` or `TransformerMaskedLM`.
        checkpoint_path: checkpoint prefix, folder or ``.index`` file, or a
            dict ``{name: array}`` already read.
        strict: bool. When True, a checkpoint variable that the model does
            not use (other than optimizer state and known pretraining heads)
            is an error; when False it is skipped and reported.
        source: name used in messages (defaults to the path).

    Returns:
        A `CheckpointLoadReport`.

    Raises:
        ValueError: missing variables, mismatched shapes, or (strict) extra
            variables; the message lists the names. Nothing is assigned.
    """
    if isinstance(checkpoint_path, dict):
        values = checkpoint_path
        source = source or "checkpoint"
    else:
        values = read_tf_checkpoint(checkpoint_path)
        source = source or str(checkpoint_path)
    expected = layout.model_variables_by_name(model)
    backbone = getattr(model, "backbone", model)
    family = family_of(backbone)

    missing = sorted(set(expected) - set(values))
    mismatched = sorted(
        f"{name}: checkpoint {tuple(values[name].shape)} vs model {tuple(expected[name].shape)}"
        for name in set(expected) & set(values)
        if tuple(values[name].shape) != tuple(expected[name].shape)
    )
    extras = sorted(set(values) - set(expected))
    tolerated = [
        name
        for name in extras
        if layout.is_training_state(name)
        or name.startswith(layout.KNOWN_EXTRA_PREFIXES)
        or name.startswith(layout.MLM + "/")
        or name.startswith(layout.POOLER + "/")
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
        raise ValueError(
            f"{source}: cannot load into {type(model).__name__} "
            f"(nothing was loaded); "
            + "; ".join(problems)
            + "."
            + _family_hint(missing, unexpected, family)
        )
    if unexpected:
        logger.warning("%s: skipped variables not used by the model: %s", source, unexpected)
    skipped_heads = [n for n in tolerated if not layout.is_training_state(n)]
    if skipped_heads:
        logger.info("%s: skipped heads the model does not have: %s", source, skipped_heads)
    for name, variable in expected.items():
        variable.assign(np.asarray(values[name], dtype=variable.dtype))
    return CheckpointLoadReport(loaded=sorted(expected), skipped=sorted(unexpected + tolerated))


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
            ``dropout=0.0``, ``custom_position_ids=True``, ``dtype``.

    Returns:
        A `TransformerBackbone`, or a `TransformerMaskedLM` when ``with_mlm``.

    Example:
    ```python
    backbone = keras_masking.models.from_tf_checkpoint(
        "chinese_L-12_H-768_A-12/bert_config.json",
        "chinese_L-12_H-768_A-12/bert_model.ckpt",
        model="bert",
    )
    ```
    """
    from keras_masking.models.transformer_backbone import TransformerBackbone
    from keras_masking.models.transformer_masked_lm import TransformerMaskedLM

    config = read_google_config(config_path)
    kwargs = backbone_kwargs_from_google_config(config, model, source=str(config_path))
    values = read_tf_checkpoint(checkpoint_path)
    has_pooler = f"{layout.POOLER}/kernel" in values
    if with_pool == "auto":
        use_pooler = has_pooler
    elif with_pool in (True, False):
        use_pooler = with_pool
    else:
        raise ValueError(f"`with_pool` must be 'auto', True or False. Received: {with_pool!r}")
    kwargs["use_pooler"] = use_pooler
    kwargs.update(backbone_kwargs)
    backbone = TransformerBackbone(**kwargs)
    result = TransformerMaskedLM(backbone) if with_mlm else backbone
    load_tf_checkpoint_weights(result, values, strict=strict, source=str(checkpoint_path))
    return result


def save_tf_checkpoint(model, checkpoint_prefix, config_path=None):
    """Writes a model as a Google-layout TF checkpoint (+ ``bert_config.json``).

    The result is what `from_tf_checkpoint` and bert4keras-style loaders
    read: the ``bert/...`` names (and ``cls/predictions/...`` for a
    `TransformerMaskedLM`).

    Args:
        model: a `TransformerBackbone` or `TransformerMaskedLM`.
        checkpoint_prefix: e.g. ``"out/bert_model.ckpt"``; writes
            ``.index`` and ``.data-00000-of-00001`` files and a ``checkpoint``
            file in that folder.
        config_path: where to write ``bert_config.json``; next to the
            checkpoint when None.

    Returns:
        The checkpoint prefix written.
    """
    variables = layout.model_variables_by_name(model)
    values = {name: keras.ops.convert_to_numpy(variable) for name, variable in variables.items()}
    write_tf_checkpoint(values, checkpoint_prefix)
    backbone = getattr(model, "backbone", model)
    folder = os.path.dirname(os.path.abspath(checkpoint_prefix))
    config_path = config_path or os.path.join(folder, "bert_config.json")
    with open(config_path, "w", encoding="utf-8") as file:
        json.dump(google_config_from_backbone(backbone), file, indent=2)
    return checkpoint_prefix


def write_tf_checkpoint(values, checkpoint_prefix):
    """Writes ``{name: array}`` as a TF checkpoint with exactly those names.

    Args:
        values: dict of numpy arrays.
        checkpoint_prefix: output prefix; its folder is created.
    """
    import tensorflow as tf

    folder = os.path.dirname(os.path.abspath(checkpoint_prefix))
    os.makedirs(folder, exist_ok=True)
    names = sorted(values)
    tf.raw_ops.SaveV2(
        prefix=str(checkpoint_prefix),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.convert_to_tensor(values[name]) for name in names],
    )
    with open(os.path.join(folder, "checkpoint"), "w", encoding="utf-8") as file:
        base = os.path.basename(str(checkpoint_prefix))
        file.write(f'model_checkpoint_path: "{base}"\n')
        file.write(f'all_model_checkpoint_paths: "{base}"\n')
