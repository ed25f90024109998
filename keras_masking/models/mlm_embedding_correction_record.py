"""The record of an MLM embedding correction, as a corrected model carries it.

`keras_masking.correct_mlm_embeddings` says what it did in a record, kept in a
`TransformerBackbone`'s config and, beside files, in
``mlm_embedding_correction.json``. The models read it back when they load such
files, so that a corrected model is never corrected twice.
"""

import dataclasses
import json
import os

from keras_masking.utils.arguments import check_path
from keras_masking.utils.files import write_json_atomically

RECORD_FILE = "mlm_embedding_correction.json"


@dataclasses.dataclass
class MLMEmbeddingCorrectionRecord:
    """What `correct_mlm_embeddings` did (JSON-able via `to_config`).

    Attributes:
        mask_token_id, mask_rate, mask_token_rate, random_token_rate,
        unselectable_token_ids: the masking configuration used.
        tied_output: ``"keep"`` or ``"correct"`` (see `correct_mlm_embeddings`).
        vocabulary_size: rows of the table.
        corrected_rows: how many rows changed.
        scale: ``a = 1 - r (p_m + p_r)``.
        shift: ``c = r (p_m E[MASK] + p_r mean E)`` as a list of floats.
        embedding: name of the corrected layer (or checkpoint variable).

    Example:
    ```python
    record = keras_masking.correct_mlm_embeddings(backbone, mask_token_id=103)
    assert MLMEmbeddingCorrectionRecord.from_config(record.to_config()) == record
    ```
    """

    mask_token_id: int
    mask_rate: float
    mask_token_rate: float
    random_token_rate: float
    unselectable_token_ids: list | None
    tied_output: str
    vocabulary_size: int
    corrected_rows: int
    scale: float
    shift: list
    embedding: str

    def to_config(self):
        """A plain JSON-able dict."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_config(cls, config):
        """Inverse of `to_config`.

        Args:
            config: a dict as `to_config` returns.

        Returns:
            An `MLMEmbeddingCorrectionRecord`.

        Raises:
            ValueError: not a dict, or missing or unknown keys.
        """
        if not isinstance(config, dict):
            raise ValueError(
                "Expected a dict for the MLM embedding correction record. "
                f"Received: config of type {type(config).__name__}."
            )
        fields = [field.name for field in dataclasses.fields(cls)]
        missing = [name for name in fields if name not in config]
        unknown = sorted(set(config) - set(fields))
        problems = [f"missing {missing}", f"unknown keys {unknown}"]
        problems = [problem for problem, found in zip(problems, (missing, unknown)) if found]
        if problems:
            raise ValueError(f"Not an MLM embedding correction record: {'; '.join(problems)}.")
        return cls(**config)


# The keys a record file must hold: the record's, less the layer name.
RECORD_KEYS = tuple(f.name for f in dataclasses.fields(MLMEmbeddingCorrectionRecord))[:-1]


def read_correction_record(folder):
    """The ``mlm_embedding_correction.json`` record of a folder, or None.

    Args:
        folder: a folder written by `correct_checkpoint_embeddings`,
            `correct_preset_embeddings` or `save_tf_checkpoint`.

    Returns:
        The record as a dict (the keys of `MLMEmbeddingCorrectionRecord`,
        ``embedding`` optional, plus ``source``), or None.

    Raises:
        ValueError: not a JSON object with those keys (the file is named).

    Example:
    ```python
    keras_masking.models.save_tf_checkpoint(backbone, "bert/bert_model.ckpt")
    read_correction_record("bert")  # None: the backbone was not corrected
    ```
    """
    path = os.path.join(check_path("folder", folder), RECORD_FILE)
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


def write_correction_record(folder, config, source):
    """Writes (or, for None, removes) the record file of a folder.

    Args:
        folder: the folder holding the corrected files.
        config: a record config (`MLMEmbeddingCorrectionRecord.to_config`),
            or None for files that are not corrected: a stale record would
            mark them corrected.
        source: what the files were written from (a path, a function name).

    Example:
    ```python
    write_correction_record("bert", backbone.mlm_embedding_correction, "save_tf_checkpoint")
    ```
    """
    path = os.path.join(folder, RECORD_FILE)
    if config:
        write_json_atomically(path, {**config, "source": source})
    elif os.path.exists(path):
        os.remove(path)


def load_folder_record(folder, embedding, table_shape):
    """The record config a model loaded from ``folder``'s files should carry.

    Args:
        folder: the folder of a TF checkpoint or a preset.
        embedding: the name of the model's token embedding layer.
        table_shape: ``(vocabulary_size, hidden_dim)`` of the loaded table.

    Returns:
        A record config, or None when the folder holds no record.

    Raises:
        ValueError: a bad record, or one that does not fit the table.

    Example:
    ```python
    config = load_folder_record("bert_corrected", "token_embedding", (21128, 768))
    ```
    """
    record = read_correction_record(folder)
    if record is None:
        return None
    where = os.path.join(folder, RECORD_FILE)
    config = {key: value for key, value in record.items() if key != "source"}
    try:
        config = MLMEmbeddingCorrectionRecord.from_config({**config, "embedding": embedding})
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    shape = (config.vocabulary_size, len(config.shift))
    if shape != tuple(table_shape):
        raise ValueError(
            f"{where}: the record is for a {shape[0]} x {shape[1]} table, but the loaded "
            f"token embedding is {tuple(table_shape)}."
        )
    return config.to_config()


def mark_loaded_record(model, config):
    """Sets (or clears) the record of a model whose token embedding was just loaded.

    The compensation of its tied MLM head is reset.

    Args:
        model: a `TransformerBackbone` or `TransformerMaskedLM`.
        config: the files' record config (see `load_folder_record`), or None
            for uncorrected files.

    Example:
    ```python
    mark_loaded_record(backbone, None)
    ```
    """
    backbone = getattr(model, "backbone", model)
    backbone.mlm_embedding_correction = config
    backbone.token_embedding.mlm_embedding_correction = config
    head = getattr(model, "masked_lm_head", None)
    if head is not None:
        head.reset_output_rows()
