"""MLM embedding correction on files: TF checkpoints and preset folders.

The input is never modified: a corrected copy is written to a new folder,
with a ``mlm_embedding_correction.json`` record beside it (a folder holding
one is refused as input, so files are not corrected twice either).
"""

import logging
import os
import re
import shutil

from keras_masking.methods.mlm_embedding_correction import check_correction_settings
from keras_masking.methods.mlm_embedding_correction import correct_embedding_table
from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings
from keras_masking.models import google_checkpoint_layout as layout
from keras_masking.models.backbone_loading import declared_task_class
from keras_masking.models.backbone_loading import read_keras_hub_preset
from keras_masking.models.google_config import read_google_config
from keras_masking.models.mlm_embedding_correction_record import RECORD_FILE
from keras_masking.models.mlm_embedding_correction_record import write_correction_record
from keras_masking.models.tf_checkpoint import read_tf_checkpoint
from keras_masking.models.tf_checkpoint import resolve_checkpoint_prefix
from keras_masking.models.tf_checkpoint import write_tf_checkpoint
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_path
from keras_masking.utils.files import is_same_or_inside
from keras_masking.utils.files import read_json_object
from keras_masking.utils.files import write_folder_atomically

WORD_EMBEDDINGS = f"{layout.EMBEDDINGS}/word_embeddings"

logger = logging.getLogger("keras_masking")


def _check_folders(input_dir, output_dir):
    """Refuses corrected inputs and outputs that would overwrite anything."""
    input_dir = os.path.abspath(input_dir)
    output_dir = os.path.abspath(check_path("output_dir", output_dir))
    if os.path.exists(os.path.join(input_dir, RECORD_FILE)):
        raise ValueError(f"{input_dir} holds {RECORD_FILE}: its embeddings were already corrected.")
    if is_same_or_inside(output_dir, input_dir):
        raise ValueError(
            "Expected an output folder outside the input: the input is never modified. "
            f"Received: output_dir={output_dir}, in the input {input_dir}."
        )
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"output_dir={output_dir} exists and is a file; choose a new folder.")
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise ValueError(f"output_dir={output_dir} exists and is not empty; choose a new folder.")
    return output_dir


def correct_checkpoint_embeddings(
    checkpoint_path,
    output_dir,
    mask_token_id,
    *,
    drop_mlm_head=False,
    **settings,
):
    """Writes a corrected copy of a Google-layout TF checkpoint, atomically.

    Every variable but ``bert/embeddings/word_embeddings`` and every file
    beside the checkpoint (``bert_config.json``, ``vocab.txt``) is copied
    unchanged, and a ``mlm_embedding_correction.json`` record is added, so
    that `from_tf_checkpoint` loads the model as corrected.

    Args:
        checkpoint_path: prefix, folder or ``.index`` of the input checkpoint.
        output_dir: new (or empty) folder for the output.
        mask_token_id: see `keras_masking.correct_mlm_embeddings`.
        drop_mlm_head: bool. Leave ``cls/predictions/*`` out of the output.
        **settings: the other arguments of `keras_masking.correct_mlm_embeddings`.
            With ``tied_output="keep"`` (the default), a checkpoint with an
            MLM head (``cls/predictions``, tied to ``word_embeddings``, so its
            original rows cannot be kept) is refused unless ``drop_mlm_head``.

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
    settings = check_correction_settings(mask_token_id, **settings)
    drop_mlm_head = check_bool("drop_mlm_head", drop_mlm_head)
    prefix = resolve_checkpoint_prefix(checkpoint_path)
    input_dir = os.path.dirname(os.path.abspath(prefix))
    output_dir = _check_folders(input_dir, output_dir)
    values = read_tf_checkpoint(prefix)
    if WORD_EMBEDDINGS not in values:
        raise ValueError(
            f"{prefix}: no {WORD_EMBEDDINGS} variable, so there is nothing to correct "
            f"(variables: {sorted(values)[:8]}...)."
        )
    head = [name for name in values if name.startswith(layout.MLM + "/")]
    if settings["tied_output"] == "keep" and head and not drop_mlm_head:
        raise ValueError(
            f"{prefix} has an MLM head tied to word_embeddings; a Google checkpoint "
            "cannot keep its original output rows. Use tied_output='correct' (the "
            "head then predicts with the corrected rows) or drop_mlm_head=True."
        )
    try:
        values[WORD_EMBEDDINGS], record = correct_embedding_table(
            values[WORD_EMBEDDINGS], WORD_EMBEDDINGS, **settings,
            random_token_mean=_pruned_table_mean(input_dir),
        )  # fmt: skip
    except ValueError as error:
        raise ValueError(f"{prefix}: {error}") from None
    for name in head if drop_mlm_head else ():
        del values[name]
    base = os.path.basename(prefix)
    checkpoint_files = (base + ".", "checkpoint", RECORD_FILE)
    # Another checkpoint of the folder (model.ckpt-100 beside model.ckpt-200) is
    # not corrected: copied, the folder's record would mark it corrected.
    others = sorted(
        name for name in os.listdir(input_dir)
        if not name.startswith(checkpoint_files) and _CHECKPOINT_FILE.fullmatch(name)
    )  # fmt: skip
    if others:
        logger.warning(
            "%s: left out of %s, the other checkpoint files %s (only %s is corrected).",
            input_dir, output_dir, others, base,
        )  # fmt: skip

    def write(folder):
        for name in os.listdir(input_dir):
            source = os.path.join(input_dir, name)
            copied = not name.startswith(checkpoint_files) and name not in others
            if os.path.isfile(source) and copied:
                shutil.copy2(source, os.path.join(folder, name))
        write_tf_checkpoint(values, os.path.join(folder, base))
        write_correction_record(folder, record.to_config(), os.path.abspath(prefix))

    write_folder_atomically(output_dir, write)
    return os.path.join(output_dir, base)


# The files of a TF checkpoint: PREFIX.index, PREFIX.data-00000-of-00001, PREFIX.meta.
_CHECKPOINT_FILE = re.compile(r".+\.(index|meta|data-\d+-of-\d+)")


def _pruned_table_mean(folder):
    """The full table's row mean a pruned checkpoint's ``bert_config.json`` records
    (``pruned_from``: its random tokens were drawn from that table), or None."""
    path = os.path.join(folder, "bert_config.json")
    if not os.path.isfile(path):
        logger.warning(
            "%s: no bert_config.json beside the checkpoint, so a pruned table's full mean "
            "(pruned_from) cannot be read: mean E is this table's own. Put the config beside "
            "the checkpoint if save_tf_checkpoint wrote it elsewhere.", folder,
        )  # fmt: skip
        return None
    pruned_from = read_google_config(path).get("pruned_from")
    return (pruned_from or {}).get("token_embedding_mean")


def correct_preset_embeddings(
    preset_dir, output_dir, tied_output="keep", *, mask_token_id, **settings
):
    """Writes a corrected copy of a keras-hub preset folder, atomically.

    The task (if the folder holds one) or the backbone is loaded, corrected
    with `keras_masking.correct_mlm_embeddings` and saved, with the input's
    other files (tokenizer assets).

    Args:
        preset_dir: a local preset folder (ours or keras-hub's).
        output_dir: new (or empty) folder for the output.
        tied_output, mask_token_id: see `keras_masking.correct_mlm_embeddings`.
        **settings: the masking rates and ``unselectable_token_ids``.

    Returns:
        The `MLMEmbeddingCorrectionRecord`.

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

    settings = check_correction_settings(mask_token_id, **settings, tied_output=tied_output)
    preset_dir = check_path("preset_dir", preset_dir)
    if not os.path.exists(os.path.join(preset_dir, "config.json")):
        raise ValueError(f"{preset_dir}: not a preset folder (no config.json).")
    output_dir = _check_folders(preset_dir, output_dir)
    model = read_keras_hub_preset(_preset_loader(preset_dir), str(preset_dir))
    record = correct_mlm_embeddings(model, **settings)
    if record is None:
        raise ValueError(f"{preset_dir}: its embeddings were already corrected.")

    def write(folder):
        shutil.copytree(preset_dir, folder, dirs_exist_ok=True)
        model.save_to_preset(folder)
        write_correction_record(folder, record.to_config(), os.path.abspath(preset_dir))

    write_folder_atomically(output_dir, write)
    return record


def _preset_loader(preset_dir):
    """The class whose ``from_preset`` loads the folder: the task ``task.json`` declares
    (keras-hub refuses ``Task.from_preset`` itself), else any backbone."""
    import keras_hub

    task_file = os.path.join(preset_dir, "task.json")
    if not os.path.exists(task_file):
        return keras_hub.models.Backbone
    config = read_json_object(task_file, "the task.json that save_to_preset wrote")
    task = declared_task_class(config)
    if not (task and issubclass(task, keras_hub.models.Task)):
        raise ValueError(
            f"{task_file}: declares the task {config.get('registered_name')!r}, which is not a "
            "keras-hub task class known here (import the package that defines it)."
        )
    return task


def is_preset_folder(path):
    """True for a keras-hub preset folder (as opposed to a TF checkpoint).

    Args:
        path: a path.

    Example:
    ```python
    backbone.save_to_preset("bert_preset")
    is_preset_folder("bert_preset")  # True
    ```
    """
    path = check_path("path", path)
    return (
        os.path.isdir(path)
        and os.path.exists(os.path.join(path, "config.json"))
        and any(
            name.endswith(".weights.h5") or name == "model.weights.json"
            for name in os.listdir(path)
        )
    )
