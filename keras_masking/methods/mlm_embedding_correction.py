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
from keras_masking.ops.embedding_correction import check_embedding_table
from keras_masking.ops.embedding_correction import check_token_id
from keras_masking.ops.embedding_correction import check_token_ids
from keras_masking.ops.embedding_correction import correction_coefficients
from keras_masking.ops.embedding_correction import correction_scale
from keras_masking.ops.embedding_correction import invert_expected_input_embeddings
from keras_masking.ops.embedding_correction import selectable_rows
from keras_masking.ops.embedding_correction import validate_masking_rates
from keras_masking.utils.layer_walk import walk_layers

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
        """Inverse of `to_config`.

        Args:
            config: a dict as `to_config` returns.

        Returns:
            An `MLMEmbeddingCorrection`.

        Raises:
            ValueError: not a dict, or missing or unknown keys (named).

        Example:
        ```python
        record = keras_masking.correct_mlm_embeddings(backbone, mask_token_id=103)
        assert MLMEmbeddingCorrection.from_config(record.to_config()) == record
        ```
        """
        if not isinstance(config, dict):
            raise ValueError(
                "An MLM embedding correction record must be a dict. "
                f"Received: config of type {type(config).__name__}"
            )
        fields = [field.name for field in dataclasses.fields(cls)]
        missing = [name for name in fields if name not in config]
        unknown = sorted(set(config) - set(fields))
        if missing or unknown:
            raise ValueError(
                "Not an MLM embedding correction record: "
                + (f"missing {missing}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"unknown keys {unknown}" if unknown else "")
                + "."
            )
        return cls(**config)


def _owner_backbone(model, layer=None):
    """The TransformerBackbone whose config records corrections, if any.

    The model itself, its ``backbone``, or a `TransformerBackbone` nested
    anywhere in it whose token embedding is ``layer``.
    """
    from keras_masking.models.transformer_backbone import TransformerBackbone

    for candidate in (model, getattr(model, "backbone", None)):
        if isinstance(candidate, TransformerBackbone) and (
            layer is None or candidate.token_embedding is layer
        ):
            return candidate
    if layer is None or not isinstance(model, keras.layers.Layer):
        return None
    for candidate in walk_layers(model):
        if isinstance(candidate, TransformerBackbone) and candidate.token_embedding is layer:
            return candidate
    return None


def correction_record(model, embedding=None):
    """The `MLMEmbeddingCorrection` applied to ``model``, or None.

    The record lives in a `TransformerBackbone`'s config (so it survives
    `save` / `load_model` / presets, and `from_tf_checkpoint` reads it back
    from a corrected checkpoint's folder) and, for other models, on the
    embedding layer for the life of the process.

    Args:
        model: a Keras model or layer (see `correct_mlm_embeddings`).
        embedding: optional layer or layer name (see `find_token_embedding`).

    Returns:
        An `MLMEmbeddingCorrection`, or None.

    Example:
    ```python
    if keras_masking.methods.correction_record(backbone) is None:
        keras_masking.correct_mlm_embeddings(backbone, mask_token_id=103)
    ```
    """
    layer = find_token_embedding(model, embedding)
    backbone = _owner_backbone(model, layer)
    if backbone is not None and backbone.mlm_embedding_correction:
        return MLMEmbeddingCorrection.from_config(backbone.mlm_embedding_correction)
    record = getattr(layer, "mlm_embedding_correction", None)
    return MLMEmbeddingCorrection.from_config(record) if record else None


def _store_record(model, layer, record):
    config = None if record is None else record.to_config()
    backbone = _owner_backbone(model, layer)
    if backbone is not None:
        backbone.mlm_embedding_correction = config
    layer.mlm_embedding_correction = config


def check_tied_output(tied_output):
    """Raises ValueError unless ``tied_output`` is ``"keep"`` or ``"correct"``."""
    if not isinstance(tied_output, str) or tied_output not in TIED_OUTPUT_CHOICES:
        raise ValueError(
            f"`tied_output` must be one of {TIED_OUTPUT_CHOICES}. "
            f"Received: tied_output={tied_output!r}"
        )
    return tied_output


def check_correction_settings(
    mask_token_id,
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    unselectable_token_ids=None,
    tied_output="keep",
    vocabulary_size=None,
):
    """Validates a masking configuration; returns it with plain Python values.

    Args:
        mask_token_id, mask_rate, mask_token_rate, random_token_rate,
        unselectable_token_ids, tied_output: see `correct_mlm_embeddings`.
        vocabulary_size: optional int; ids must then lie below it.

    Returns:
        A dict with those keys (ids as ints, rates as floats).

    Raises:
        ValueError: naming the argument, what was expected and what was
            received.

    Example:
    ```python
    check_correction_settings(103, unselectable_token_ids=[0, 101, 102, 103])
    ```
    """
    rates = validate_masking_rates(mask_rate, mask_token_rate, random_token_rate)
    correction_scale(*rates)
    return {
        "mask_token_id": check_token_id("mask_token_id", mask_token_id, vocabulary_size),
        "mask_rate": rates[0],
        "mask_token_rate": rates[1],
        "random_token_rate": rates[2],
        "unselectable_token_ids": check_token_ids(
            "unselectable_token_ids", unselectable_token_ids, vocabulary_size
        ),
        "tied_output": check_tied_output(tied_output),
    }


def _plan_correction(model, settings, embedding):
    """Every check of `correct_mlm_embeddings`; changes nothing.

    Returns:
        ``(layer, table, scale, shift, rows, heads, settings)``, or
        ``(layer, None, ...)`` when the model is already corrected.
    """
    check_tied_output(settings["tied_output"])
    layer = find_token_embedding(model, embedding)
    settings = check_correction_settings(**settings, vocabulary_size=layer.input_dim)
    if correction_record(model, layer) is not None:
        return layer, None, None, None, None, None, settings
    table = keras.ops.convert_to_numpy(layer.embeddings)
    scale, shift = correction_coefficients(
        check_embedding_table(table, f"{layer.name} (the token embedding)"),
        settings["mask_token_id"],
        settings["mask_rate"],
        settings["mask_token_rate"],
        settings["random_token_rate"],
    )
    rows = selectable_rows(table.shape[0], settings["unselectable_token_ids"])
    heads = find_tied_heads(model, layer) if settings["tied_output"] == "keep" else []
    for head in heads:
        if not hasattr(head, "keep_original_output_rows"):
            raise ValueError(
                f"{head.name!r} predicts with the token embedding itself (tied) and "
                "cannot keep the original rows; pass tied_output='correct' to correct "
                "both, or convert the model with keras_masking.models.from_keras_hub."
            )
    return layer, table, scale, shift, rows, heads, settings


def check_mlm_correction(
    model,
    mask_token_id,
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    unselectable_token_ids=None,
    tied_output="keep",
    embedding=None,
):
    """Runs every check of `correct_mlm_embeddings` without changing anything.

    Use it before a long run whose end applies the correction (the
    `MLMEmbeddingCorrection` callback does, at the start of `fit`).

    Args:
        model, mask_token_id, mask_rate, mask_token_rate, random_token_rate,
        unselectable_token_ids, tied_output, embedding: see
            `correct_mlm_embeddings`.

    Returns:
        True if `correct_mlm_embeddings` would correct the model, False if it
        is already corrected.

    Raises:
        ValueError, TypeError: what `correct_mlm_embeddings` would raise.

    Example:
    ```python
    check_mlm_correction(classifier, mask_token_id=103)
    ```
    """
    settings = dict(
        mask_token_id=mask_token_id,
        mask_rate=mask_rate,
        mask_token_rate=mask_token_rate,
        random_token_rate=random_token_rate,
        unselectable_token_ids=unselectable_token_ids,
        tied_output=tied_output,
    )
    return _plan_correction(model, settings, embedding)[1] is not None


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
            or task, any Keras model holding one of those (nested, or inlined
            through ``backbone.output``), or any Keras model with a token
            `Embedding`.
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
        corrected (a second call changes nothing). A model loaded with
        `from_tf_checkpoint` from a corrected checkpoint counts as corrected.

    Raises:
        ValueError: bad rates or ids, no unique embedding, a table with NaN
            or inf, or a keras-hub tied head with ``tied_output="keep"``. The
            model is left untouched.

    Example:
    ```python
    keras_masking.correct_mlm_embeddings(backbone, mask_token_id=103)
    ```
    """
    settings = dict(
        mask_token_id=mask_token_id,
        mask_rate=mask_rate,
        mask_token_rate=mask_token_rate,
        random_token_rate=random_token_rate,
        unselectable_token_ids=unselectable_token_ids,
        tied_output=tied_output,
    )
    layer, table, scale, shift, rows, heads, settings = _plan_correction(model, settings, embedding)
    if table is None:
        logger.info("%s is already MLM-corrected; nothing changed.", layer.name)
        return None
    layer.embeddings.assign(apply_correction(table, scale, shift, rows))
    for head in heads:
        head.keep_original_output_rows(
            np.where(rows, 1.0 / scale, 1.0).astype("float32"),
            np.where(rows, 1.0 / scale, 0.0).astype("float32"),
            shift.astype("float32"),
        )
    _ORIGINAL_TABLES[layer] = table
    record = MLMEmbeddingCorrection(
        **settings,
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

    Example:
    ```python
    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=21128, mask_selection_rate=0.15, mask_token_id=103,
        unselectable_token_ids=[0, 101, 102, 103])
    settings = masking_configuration(masker)  # or a keras-hub masked-LM preprocessor
    keras_masking.correct_mlm_embeddings(backbone, **settings)
    ```
    """
    if hasattr(mask_generator, "masker"):
        if mask_generator.masker is None:
            mask_generator.build(None)
        mask_generator = mask_generator.masker
    required = ("mask_selection_rate", "mask_token_id", "mask_token_rate", "random_token_rate")
    missing = [name for name in required if not hasattr(mask_generator, name)]
    if missing:
        raise TypeError(
            "`mask_generator` must be a keras_hub MaskedLMMaskGenerator or masked-LM "
            f"preprocessor. Received: mask_generator of type {type(mask_generator).__name__}, "
            f"which has no {missing}."
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

    Returns:
        As `correct_mlm_embeddings`.

    Example:
    ```python
    keras_masking.correct_mlm_embeddings.from_mask_generator(backbone, preprocessor)
    ```
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

    Raises:
        ValueError: the record does not fit the embedding (another
            vocabulary size or width); nothing is changed.

    Example:
    ```python
    keras_masking.undo_mlm_embedding_correction(backbone)
    ```
    """
    layer = find_token_embedding(model, embedding)
    record = correction_record(model, layer)
    if record is None:
        return None
    if record.vocabulary_size != layer.input_dim or len(record.shift) != layer.output_dim:
        raise ValueError(
            f"The correction record of {layer.name!r} is for a {record.vocabulary_size} x "
            f"{len(record.shift)} table, but the layer is {layer.input_dim} x "
            f"{layer.output_dim}; nothing was changed."
        )
    original = _ORIGINAL_TABLES.get(layer)
    if original is None:
        rows = selectable_rows(record.vocabulary_size, record.unselectable_token_ids)
        current = keras.ops.convert_to_numpy(layer.embeddings)
        original = invert_expected_input_embeddings(current, record.scale, record.shift, rows)
    layer.embeddings.assign(original)
    _ORIGINAL_TABLES.pop(layer, None)
    for head in find_tied_heads(model, layer):
        if hasattr(head, "reset_output_rows"):
            head.reset_output_rows()
    _store_record(model, layer, None)
    return record


def mark_loaded_weights(model, record=None):
    """Sets the correction record of a model whose token embedding was loaded.

    After loading a table from files (`load_tf_checkpoint_weights`), the
    model is corrected exactly when the files were: the record is set (or
    cleared), a previous in-process original is forgotten, and tied-head
    compensation is reset.

    Args:
        model: a `TransformerBackbone` or `TransformerMaskedLM`.
        record: the files' record config (see `MLMEmbeddingCorrection`), or
            None for uncorrected files.

    Example:
    ```python
    mark_loaded_weights(backbone, None)
    ```
    """
    layer = find_token_embedding(model)
    record = None if record is None else MLMEmbeddingCorrection.from_config(record)
    _ORIGINAL_TABLES.pop(layer, None)
    for head in find_tied_heads(model, layer):
        if hasattr(head, "reset_output_rows"):
            head.reset_output_rows()
    _store_record(model, layer, record)
