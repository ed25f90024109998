"""MLM embedding correction on files: TF checkpoints and preset folders.

The input is never modified: a corrected copy is written to a new folder,
with a ``mlm_embedding_correction.json`` record beside it (a folder holding
one is refused as input, so files are not corrected twice either).
"""

import json
import os
import shutil

from keras_masking.models import google_checkpoint_layout as layout
from keras_masking.ops.embedding_correction import apply_correction
from keras_masking.ops.embedding_correction import correction_coefficients
from keras_masking.ops.embedding_correction import selectable_rows

RECORD_FILE = "mlm_embedding_correction.json"
WORD_EMBEDDINGS = f"{layout.EMBEDDINGS}/word_embeddings"


def _check_folders(input_dir, output_dir):
    """Refuses corrected inputs and outputs that would overwrite anything."""
    input_dir, output_dir = os.path.abspath(input_dir), os.path.abspath(output_dir)
    if os.path.exists(os.path.join(input_dir, RECORD_FILE)):
        raise ValueError(f"{input_dir} holds {RECORD_FILE}: its embeddings were already corrected.")
    if input_dir == output_dir:
        raise ValueError(
            "The output folder must differ from the input: the input is never modified."
        )
    if os.path.exists(output_dir) and os.listdir(output_dir):
        raise ValueError(f"{output_dir} exists and is not empty; choose a new folder.")
    return output_dir


def _record(settings, table, rows, tied_output, source):
    scale, shift = correction_coefficients(
        table,
        settings["mask_token_id"],
        settings["mask_rate"],
        settings["mask_token_rate"],
        settings["random_token_rate"],
    )
    record = {
        **settings,
        "unselectable_token_ids": None
        if settings["unselectable_token_ids"] is None
        else sorted(int(i) for i in settings["unselectable_token_ids"]),
        "tied_output": tied_output,
        "vocabulary_size": int(table.shape[0]),
        "corrected_rows": int(rows.sum()),
        "scale": float(scale),
        "shift": shift.tolist(),
        "source": source,
    }
    return record, scale, shift


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
    (``bert_config.json``, ``vocab.txt``) are copied too. The result loads
    with `from_tf_checkpoint` and bert4keras-style loaders.

    Args:
        checkpoint_path: prefix, folder or ``.index`` of the input checkpoint.
        output_dir: new folder for the output.
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
    """
    from keras_masking.models.tf_checkpoint import read_tf_checkpoint
    from keras_masking.models.tf_checkpoint import resolve_checkpoint_prefix
    from keras_masking.models.tf_checkpoint import write_tf_checkpoint

    prefix = resolve_checkpoint_prefix(checkpoint_path)
    input_dir = os.path.dirname(prefix)
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
    if tied_output not in ("keep", "correct"):
        raise ValueError(f"`tied_output` must be 'keep' or 'correct'. Received: {tied_output!r}")
    table = values[WORD_EMBEDDINGS]
    rows = selectable_rows(table.shape[0], unselectable_token_ids)
    settings = dict(
        mask_token_id=int(mask_token_id),
        mask_rate=float(mask_rate),
        mask_token_rate=float(mask_token_rate),
        random_token_rate=float(random_token_rate),
        unselectable_token_ids=unselectable_token_ids,
    )
    record, scale, shift = _record(settings, table, rows, tied_output, prefix)
    values[WORD_EMBEDDINGS] = apply_correction(table, scale, shift, rows)
    if drop_mlm_head:
        values = {k: v for k, v in values.items() if not k.startswith(layout.MLM + "/")}
    os.makedirs(output_dir, exist_ok=True)
    base = os.path.basename(prefix)
    checkpoint_files = (base + ".", "checkpoint")
    for name in os.listdir(input_dir):
        source = os.path.join(input_dir, name)
        if os.path.isfile(source) and not name.startswith(checkpoint_files):
            shutil.copy2(source, os.path.join(output_dir, name))
    output_prefix = os.path.join(output_dir, base)
    write_tf_checkpoint(values, output_prefix)  # creates the folder
    with open(os.path.join(output_dir, RECORD_FILE), "w", encoding="utf-8") as file:
        json.dump(record, file, indent=2)
    return output_prefix


def correct_preset_embeddings(preset_dir, output_dir, tied_output="keep", **settings):
    """Writes a corrected copy of a keras-hub preset folder.

    Loads the task (if the folder holds one) or the backbone, applies
    `keras_masking.correct_mlm_embeddings`, and saves a preset to
    ``output_dir``, keeping the input's other files (tokenizer assets).

    Args:
        preset_dir: a local preset folder (ours or keras-hub's).
        output_dir: new folder for the output.
        tied_output: see `keras_masking.correct_mlm_embeddings`.
        **settings: ``mask_token_id`` and the masking rates.

    Returns:
        The `MLMEmbeddingCorrection` record.
    """
    import keras_hub

    from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings

    if not os.path.exists(os.path.join(preset_dir, "config.json")):
        raise ValueError(f"{preset_dir}: not a preset folder (no config.json).")
    output_dir = _check_folders(preset_dir, output_dir)
    has_task = os.path.exists(os.path.join(preset_dir, "task.json"))
    loader = keras_hub.models.Task if has_task else keras_hub.models.Backbone
    model = loader.from_preset(str(preset_dir))
    record = correct_mlm_embeddings(model, tied_output=tied_output, **settings)
    if record is None:
        raise ValueError(f"{preset_dir}: its embeddings were already corrected.")
    shutil.copytree(preset_dir, output_dir, dirs_exist_ok=True)
    model.save_to_preset(output_dir)
    with open(os.path.join(output_dir, RECORD_FILE), "w", encoding="utf-8") as file:
        json.dump({**record.to_config(), "source": os.path.abspath(preset_dir)}, file, indent=2)
    return record


def is_preset_folder(path):
    """True for a keras-hub preset folder (as opposed to a TF checkpoint)."""
    return (
        os.path.isdir(path)
        and os.path.exists(os.path.join(path, "config.json"))
        and any(
            name.endswith(".weights.h5") or name == "model.weights.json"
            for name in os.listdir(path)
        )
    )
