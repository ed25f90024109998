"""MLM embedding correction on files: TF checkpoints and preset folders.

The input is never modified: a corrected copy is written to a new folder,
with a ``mlm_embedding_correction.json`` record beside it (a folder holding
one is refused as input, so files are not corrected twice either).
"""

import json
import os
import shutil
import uuid

import numpy as np

from keras_masking.models import google_checkpoint_layout as layout
from keras_masking.ops.embedding_correction import apply_correction
from keras_masking.ops.embedding_correction import check_embedding_table
from keras_masking.ops.embedding_correction import correction_coefficients
from keras_masking.ops.embedding_correction import selectable_rows

RECORD_FILE = "mlm_embedding_correction.json"
WORD_EMBEDDINGS = f"{layout.EMBEDDINGS}/word_embeddings"
RECORD_KEYS = (
    "mask_token_id",
    "mask_rate",
    "mask_token_rate",
    "random_token_rate",
    "unselectable_token_ids",
    "tied_output",
    "vocabulary_size",
    "corrected_rows",
    "scale",
    "shift",
)
SETTING_KEYS = (
    "mask_token_id",
    "mask_rate",
    "mask_token_rate",
    "random_token_rate",
    "unselectable_token_ids",
)


def _check_path(name, value):
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"`{name}` must be a path (str or os.PathLike). Received: {name}={value!r}")
    return os.fspath(value)


def read_correction_record(folder):
    """The ``mlm_embedding_correction.json`` record of a folder, or None.

    Args:
        folder: a folder written by `correct_checkpoint_embeddings`,
            `correct_preset_embeddings` or `save_tf_checkpoint`.

    Returns:
        The record as a dict (the keys of `MLMEmbeddingCorrection` except
        ``embedding``, plus ``source``), or None when the folder has none.

    Raises:
        ValueError: the record file is not a JSON object with those keys;
            the message names the file.

    Example:
    ```python
    keras_masking.models.save_tf_checkpoint(backbone, "bert/bert_model.ckpt")
    correct_checkpoint_embeddings("bert", "corrected", mask_token_id=103)
    read_correction_record("corrected")["mask_token_id"]  # 103
    ```
    """
    path = os.path.join(_check_path("folder", folder), RECORD_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON record ({error}).") from error
    missing = [key for key in RECORD_KEYS if not isinstance(record, dict) or key not in record]
    if missing:
        raise ValueError(
            f"{path}: not an MLM embedding correction record (missing {missing}). "
            "Remove the file if the embeddings in this folder were not corrected."
        )
    return record


def _check_folders(input_dir, output_dir):
    """Refuses corrected inputs and outputs that would overwrite anything."""
    input_dir = os.path.abspath(_check_path("input", input_dir))
    output_dir = os.path.abspath(_check_path("output_dir", output_dir))
    if os.path.exists(os.path.join(input_dir, RECORD_FILE)):
        raise ValueError(f"{input_dir} holds {RECORD_FILE}: its embeddings were already corrected.")
    if input_dir == output_dir:
        raise ValueError(
            "The output folder must differ from the input: the input is never modified. "
            f"Received: output_dir={output_dir}"
        )
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"output_dir={output_dir} exists and is a file; choose a new folder.")
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise ValueError(f"output_dir={output_dir} exists and is not empty; choose a new folder.")
    return output_dir


def _write_folder(output_dir, write):
    """Calls ``write(folder)`` on a temporary folder, then renames it.

    A failure (a full disk, an error while writing) leaves no output folder,
    only what was there before (nothing, or an empty folder).
    """
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(
        parent, f".{os.path.basename(output_dir)}.partial-{uuid.uuid4().hex[:8]}"
    )
    os.makedirs(temporary)
    try:
        write(temporary)
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # empty: checked by `_check_folders`
        os.rename(temporary, output_dir)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as file:
        json.dump(value, file, indent=2)


def _check_settings(settings):
    """The masking settings of the file functions, without the model."""
    unknown = sorted(set(settings) - set(SETTING_KEYS))
    if unknown:
        raise TypeError(
            f"Unknown masking settings {unknown}; expected some of {list(SETTING_KEYS)}."
        )
    if "mask_token_id" not in settings:
        raise ValueError("Pass `mask_token_id`, the [MASK] id of the pretraining vocabulary.")


def correct_checkpoint_embeddings(
    checkpoint_path,
    output_dir,
    mask_token_id,
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    unselectable_token_ids=None,
    tied_output="keep",
    drop_mlm_head=False,
):
    """Writes a corrected copy of a Google-layout TF checkpoint.

    Every variable is copied unchanged except
    ``bert/embeddings/word_embeddings``; files beside the checkpoint
    (``bert_config.json``, ``vocab.txt``) are copied too, and a
    ``mlm_embedding_correction.json`` record is added, which
    `from_tf_checkpoint` reads (the loaded model counts as corrected). The
    result loads with `from_tf_checkpoint` and bert4keras-style loaders. The
    output is written to a temporary folder and renamed when complete.

    Args:
        checkpoint_path: prefix, folder or ``.index`` of the input checkpoint.
        output_dir: new (or empty) folder for the output.
        mask_token_id, mask_rate, mask_token_rate, random_token_rate,
        unselectable_token_ids: see `keras_masking.correct_mlm_embeddings`.
        tied_output: ``"keep"`` or ``"correct"``. Google checkpoints tie the
            MLM output to ``word_embeddings``, so the original output rows
            cannot be kept in the file: with ``"keep"``, a checkpoint that has
            an MLM head (``cls/predictions``) is refused unless
            ``drop_mlm_head``.
        drop_mlm_head: bool. Leave ``cls/predictions/*`` out of the output.

    Returns:
        The output checkpoint prefix.

    Raises:
        ValueError: bad settings, an already corrected input, an output
            folder that is the input or not empty, a table with NaN or inf;
            nothing is written.

    Example:
    ```python
    keras_masking.models.save_tf_checkpoint(backbone, "bert/bert_model.ckpt")
    correct_checkpoint_embeddings(
        "bert/bert_model.ckpt", "bert_corrected", mask_token_id=103,
        unselectable_token_ids=[0, 100, 101, 102, 103], drop_mlm_head=True)
    corrected = keras_masking.models.from_tf_checkpoint(
        "bert_corrected/bert_config.json", "bert_corrected")
    keras_masking.methods.correction_record(corrected).mask_token_id  # 103
    ```
    """
    from keras_masking.methods.mlm_embedding_correction import check_correction_settings
    from keras_masking.models.tf_checkpoint import read_tf_checkpoint
    from keras_masking.models.tf_checkpoint import resolve_checkpoint_prefix
    from keras_masking.models.tf_checkpoint import write_tf_checkpoint

    settings = dict(
        mask_token_id=mask_token_id,
        mask_rate=mask_rate,
        mask_token_rate=mask_token_rate,
        random_token_rate=random_token_rate,
        unselectable_token_ids=unselectable_token_ids,
    )
    check_correction_settings(**settings, tied_output=tied_output)
    if not isinstance(drop_mlm_head, (bool, np.bool_)):
        raise ValueError(
            f"`drop_mlm_head` must be a bool. Received: drop_mlm_head={drop_mlm_head!r}"
        )
    _check_path("output_dir", output_dir)
    prefix = resolve_checkpoint_prefix(checkpoint_path)
    input_dir = os.path.dirname(os.path.abspath(prefix))
    output_dir = _check_folders(input_dir, output_dir)
    values = read_tf_checkpoint(prefix)
    if WORD_EMBEDDINGS not in values:
        raise ValueError(
            f"{prefix}: no {WORD_EMBEDDINGS} variable, so there is nothing to correct "
            f"(variables: {sorted(values)[:8]}...)."
        )
    has_head = any(name.startswith(layout.MLM + "/") for name in values)
    if tied_output == "keep" and has_head and not drop_mlm_head:
        raise ValueError(
            f"{prefix} has an MLM head tied to word_embeddings; a Google checkpoint "
            "cannot keep its original output rows. Use tied_output='correct' (the "
            "head then predicts with the corrected rows) or drop_mlm_head=True."
        )
    table = values[WORD_EMBEDDINGS]
    settings = check_correction_settings(
        **settings, tied_output=tied_output, vocabulary_size=int(np.shape(table)[0])
    )
    scale, shift = correction_coefficients(
        check_embedding_table(table, f"{prefix}: {WORD_EMBEDDINGS}"),
        settings["mask_token_id"],
        settings["mask_rate"],
        settings["mask_token_rate"],
        settings["random_token_rate"],
    )
    rows = selectable_rows(table.shape[0], settings["unselectable_token_ids"])
    record = {
        **settings,
        "vocabulary_size": int(table.shape[0]),
        "corrected_rows": int(rows.sum()),
        "scale": float(scale),
        "shift": shift.tolist(),
        "source": os.path.abspath(prefix),
    }
    values[WORD_EMBEDDINGS] = apply_correction(table, scale, shift, rows)
    if drop_mlm_head:
        values = {k: v for k, v in values.items() if not k.startswith(layout.MLM + "/")}
    base = os.path.basename(prefix)
    checkpoint_files = (base + ".", "checkpoint", RECORD_FILE)

    def write(folder):
        for name in os.listdir(input_dir):
            source = os.path.join(input_dir, name)
            if os.path.isfile(source) and not name.startswith(checkpoint_files):
                shutil.copy2(source, os.path.join(folder, name))
        write_tf_checkpoint(values, os.path.join(folder, base))
        _write_json(os.path.join(folder, RECORD_FILE), record)

    _write_folder(output_dir, write)
    return os.path.join(output_dir, base)


def correct_preset_embeddings(preset_dir, output_dir, tied_output="keep", **settings):
    """Writes a corrected copy of a keras-hub preset folder.

    Loads the task (if the folder holds one) or the backbone, applies
    `keras_masking.correct_mlm_embeddings`, and saves a preset to
    ``output_dir``, keeping the input's other files (tokenizer assets). The
    output is written to a temporary folder and renamed when complete.

    Args:
        preset_dir: a local preset folder (ours or keras-hub's).
        output_dir: new (or empty) folder for the output.
        tied_output: see `keras_masking.correct_mlm_embeddings`.
        **settings: ``mask_token_id`` and the masking rates.

    Returns:
        The `MLMEmbeddingCorrection` record.

    Raises:
        ValueError: bad settings, not a preset folder, already corrected, or
            an output folder that is the input or not empty; nothing is
            written.

    Example:
    ```python
    backbone.save_to_preset("bert_preset")
    correct_preset_embeddings("bert_preset", "bert_corrected", mask_token_id=103)
    ```
    """
    import keras_hub

    from keras_masking.methods.mlm_embedding_correction import check_correction_settings
    from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings

    _check_settings(settings)
    check_correction_settings(**settings, tied_output=tied_output)
    preset_dir = _check_path("preset_dir", preset_dir)
    if not os.path.exists(os.path.join(preset_dir, "config.json")):
        raise ValueError(f"{preset_dir}: not a preset folder (no config.json).")
    output_dir = _check_folders(preset_dir, output_dir)
    has_task = os.path.exists(os.path.join(preset_dir, "task.json"))
    loader = keras_hub.models.Task if has_task else keras_hub.models.Backbone
    model = loader.from_preset(str(preset_dir))
    record = correct_mlm_embeddings(model, tied_output=tied_output, **settings)
    if record is None:
        raise ValueError(f"{preset_dir}: its embeddings were already corrected.")

    def write(folder):
        shutil.copytree(preset_dir, folder, dirs_exist_ok=True)
        model.save_to_preset(folder)
        _write_json(
            os.path.join(folder, RECORD_FILE),
            {**record.to_config(), "source": os.path.abspath(preset_dir)},
        )

    _write_folder(output_dir, write)
    return record


def is_preset_folder(path):
    """True for a keras-hub preset folder (as opposed to a TF checkpoint).

    Args:
        path: a path.

    Returns:
        bool.

    Example:
    ```python
    backbone.save_to_preset("bert_preset")
    is_preset_folder("bert_preset")  # True
    ```
    """
    path = _check_path("path", path)
    return (
        os.path.isdir(path)
        and os.path.exists(os.path.join(path, "config.json"))
        and any(
            name.endswith(".weights.h5") or name == "model.weights.json"
            for name in os.listdir(path)
        )
    )
