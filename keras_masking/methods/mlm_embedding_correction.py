"""MLM embedding correction: feed each token its expected input embedding.

After MLM pretraining, fine-tuning sees no [MASK] and no random tokens: the
dropout that masking was is turned off, and the consistent input is the
expectation of what pretraining fed (see `keras_masking.ops.embedding_correction`
for the formula). For BERT's defaults, every selectable row becomes
``0.85 E + 0.15 (0.8 E[MASK] + 0.1 E + 0.1 mean E)``.
"""

import dataclasses
import json
import logging
import weakref

import keras
import numpy as np

from keras_masking.methods.token_embedding_lookup import find_tied_heads
from keras_masking.methods.token_embedding_lookup import find_token_embedding
from keras_masking.ops.embedding_correction import apply_correction
from keras_masking.ops.embedding_correction import correction_coefficients
from keras_masking.ops.embedding_correction import invert_expected_input_embeddings
from keras_masking.ops.embedding_correction import selectable_rows

logger = logging.getLogger("keras_masking")
TIED_OUTPUT_CHOICES = ("keep", "correct")
# Exact original rows of corrections made in this process, for `undo`.
_ORIGINAL_TABLES = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class MLMEmbeddingCorrection:
    """What `correct_mlm_embeddings` did (JSON-able via `to_config`).

    Attributes:
        mask_token_id, mask_rate, mask_token_rate, random_token_rate,
        unselectable_token_ids: the masking configuration used.
        tied_output: ``"keep"`` or ``"correct"`` (see `correct_mlm_embeddings`).
        vocabulary_size: rows of the table.
        corrected_rows: how many rows changed.
        scale: ``a = 1 - r (p_m + p_r)``.
        shift: ``c = r (p_m E[MASK] + p_r mean E)`` as a list of floats.
        embedding: name of the corrected layer.
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
        """Inverse of `to_config`."""
        return cls(**dict(config))


def _owner_backbone(model):
    """The TransformerBackbone whose config records corrections, if any."""
    from keras_masking.models.transformer_backbone import TransformerBackbone

    for candidate in (model, getattr(model, "backbone", None)):
        if isinstance(candidate, TransformerBackbone):
            return candidate
    return None


def correction_record(model, embedding=None):
    """The `MLMEmbeddingCorrection` applied to ``model``, or None.

    The record lives in a `TransformerBackbone`'s config (so it survives
    `save` / `load_model` / presets) and, for other models, on the embedding
    layer for the life of the process.
    """
    backbone = _owner_backbone(model)
    if backbone is not None and backbone.mlm_embedding_correction:
        return MLMEmbeddingCorrection.from_config(backbone.mlm_embedding_correction)
    layer = find_token_embedding(model, embedding)
    record = getattr(layer, "mlm_embedding_correction", None)
    return MLMEmbeddingCorrection.from_config(record) if record else None


def _store_record(model, layer, record):
    config = None if record is None else record.to_config()
    backbone = _owner_backbone(model)
    if backbone is not None:
        backbone.mlm_embedding_correction = config
    layer.mlm_embedding_correction = config


def correct_mlm_embeddings(
    model,
    mask_token_id,
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    unselectable_token_ids=None,
    tied_output="keep",
    embedding=None,
):
    """Replaces token embeddings by their expected MLM input, in place.

    ``E_i <- (1 - r) E_i + r (p_m E[MASK] + p_k E_i + p_r mean E)`` for every
    row pretraining could select; other rows keep their values.

    Args:
        model: a `TransformerBackbone` or a task on one, a keras-hub backbone
            or task, or any Keras model with a token `Embedding`.
        mask_token_id: int. The [MASK] id (103 in BERT's English and Chinese
            vocabularies).
        mask_rate: float ``r`` in [0, 1], the selection rate (0.15).
        mask_token_rate: float ``p_m``, share of selected tokens -> [MASK].
        random_token_rate: float ``p_r``, share -> a uniform random token.
            ``p_m + p_r <= 1``; the rest (``p_k``) keeps the token.
        unselectable_token_ids: ids the pretraining masker never selected
            (keras-hub: the tokenizer's special tokens). None corrects every
            row, exactly as the blog's snippet.
        tied_output: what a tied MLM head (output projection = this
            embedding) predicts with afterwards. ``"keep"`` (default): the
            original rows, so MLM logits are unchanged (keras-masking's
            `MaskedLMHead` compensates exactly; a keras-hub head cannot, and
            raises). ``"correct"``: the corrected rows, as an in-place edit of
            a tied matrix gives.
        embedding: optional layer or layer name, when the model has several
            embeddings (see `find_token_embedding`).

    Returns:
        The `MLMEmbeddingCorrection` record, or None if the model was already
        corrected (a second call changes nothing).

    Raises:
        ValueError: bad rates or ids, no unique embedding, or a keras-hub tied
            head with ``tied_output="keep"``. The model is left untouched.

    Example:
    ```python
    keras_masking.correct_mlm_embeddings(backbone, mask_token_id=103)
    ```
    """
    if tied_output not in TIED_OUTPUT_CHOICES:
        raise ValueError(
            f"`tied_output` must be one of {TIED_OUTPUT_CHOICES}. Received: {tied_output!r}"
        )
    layer = find_token_embedding(model, embedding)
    if correction_record(model, layer) is not None:
        logger.info("%s is already MLM-corrected; nothing changed.", layer.name)
        return None
    table = keras.ops.convert_to_numpy(layer.embeddings)
    scale, shift = correction_coefficients(
        table, mask_token_id, mask_rate, mask_token_rate, random_token_rate
    )
    rows = selectable_rows(table.shape[0], unselectable_token_ids)
    heads = find_tied_heads(model, layer) if tied_output == "keep" else []
    for head in heads:
        if not hasattr(head, "keep_original_output_rows"):
            raise ValueError(
                f"{head.name!r} predicts with the token embedding itself (tied) and "
                "cannot keep the original rows; pass tied_output='correct' to correct "
                "both, or convert the model with keras_masking.models.from_keras_hub."
            )
    layer.embeddings.assign(apply_correction(table, scale, shift, rows))
    for head in heads:
        head.keep_original_output_rows(
            np.where(rows, 1.0 / scale, 1.0).astype("float32"),
            np.where(rows, 1.0 / scale, 0.0).astype("float32"),
            shift.astype("float32"),
        )
    _ORIGINAL_TABLES[layer] = table
    record = MLMEmbeddingCorrection(
        mask_token_id=int(mask_token_id),
        mask_rate=float(mask_rate),
        mask_token_rate=float(mask_token_rate),
        random_token_rate=float(random_token_rate),
        unselectable_token_ids=None
        if unselectable_token_ids is None
        else sorted(int(i) for i in unselectable_token_ids),
        tied_output=tied_output,
        vocabulary_size=int(table.shape[0]),
        corrected_rows=int(rows.sum()),
        scale=float(scale),
        shift=shift.tolist(),
        embedding=layer.name,
    )
    _store_record(model, layer, record)
    return record


def masking_configuration(mask_generator):
    """Reads a keras-hub masker's configuration as keyword arguments.

    Args:
        mask_generator: a `keras_hub.layers.MaskedLMMaskGenerator`, or a
            keras-hub masked-LM preprocessor (its ``masker``).

    Returns:
        A dict with ``mask_token_id``, ``mask_rate``, ``mask_token_rate``,
        ``random_token_rate`` and ``unselectable_token_ids``.
    """
    if hasattr(mask_generator, "masker"):
        if mask_generator.masker is None:
            mask_generator.build(None)
        mask_generator = mask_generator.masker
    required = ("mask_selection_rate", "mask_token_id", "mask_token_rate", "random_token_rate")
    missing = [name for name in required if not hasattr(mask_generator, name)]
    if missing:
        raise TypeError(
            "Expected a keras_hub MaskedLMMaskGenerator or masked-LM preprocessor; "
            f"{type(mask_generator).__name__} has no {missing}."
        )
    unselectable = mask_generator.unselectable_token_ids
    return {
        "mask_token_id": int(mask_generator.mask_token_id),
        "mask_rate": float(mask_generator.mask_selection_rate),
        "mask_token_rate": float(mask_generator.mask_token_rate),
        "random_token_rate": float(mask_generator.random_token_rate),
        "unselectable_token_ids": None if unselectable is None else list(unselectable),
    }


def _correct_from_mask_generator(model, mask_generator, **kwargs):
    """`correct_mlm_embeddings` with the masker's own configuration.

    Args:
        model: as in `correct_mlm_embeddings`.
        mask_generator: a keras-hub `MaskedLMMaskGenerator` or masked-LM
            preprocessor, the one pretraining ran with.
        **kwargs: ``tied_output``, ``embedding``.
    """
    return correct_mlm_embeddings(model, **masking_configuration(mask_generator), **kwargs)


correct_mlm_embeddings.from_mask_generator = _correct_from_mask_generator


def undo_mlm_embedding_correction(model, embedding=None):
    """Restores the token embedding from before `correct_mlm_embeddings`.

    Exact (bit for bit) in the process that corrected; after a reload, the
    record's coefficients invert the correction to within float32 rounding.
    Tied-head compensation is reset.

    Args:
        model: the corrected model.
        embedding: optional layer or name (see `find_token_embedding`).

    Returns:
        The record that was undone, or None if the model was not corrected.
    """
    layer = find_token_embedding(model, embedding)
    record = correction_record(model, layer)
    if record is None:
        return None
    original = _ORIGINAL_TABLES.pop(layer, None)
    if original is None:
        rows = selectable_rows(record.vocabulary_size, record.unselectable_token_ids)
        current = keras.ops.convert_to_numpy(layer.embeddings)
        original = invert_expected_input_embeddings(current, record.scale, record.shift, rows)
    layer.embeddings.assign(original)
    for head in find_tied_heads(model, layer):
        if hasattr(head, "reset_output_rows"):
            head.reset_output_rows()
    _store_record(model, layer, None)
    return record
