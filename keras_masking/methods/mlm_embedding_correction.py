"""MLM embedding correction: feed each token its expected input embedding.

After MLM pretraining, fine-tuning sees no [MASK] and no random tokens: the
dropout that masking was is turned off, and the consistent input is the
expectation of what pretraining fed (see `keras_masking.ops.embedding_correction`
for the formula). For BERT's defaults, every selectable row becomes
``0.85 E + 0.15 (0.8 E[MASK] + 0.1 E + 0.1 mean E)``.

The method has one gesture per place it is used: `correct_mlm_embeddings` on a
model in memory, the `keras_masking.callbacks.MLMEmbeddingCorrection` callback
inside `fit`, and `correct_checkpoint_embeddings` / `correct_preset_embeddings`
on files. Each leaves an `MLMEmbeddingCorrectionRecord` that the models keep.
"""

import hashlib
import logging
import weakref

import keras
import numpy as np

from keras_masking.methods.token_embedding_lookup import find_tied_heads
from keras_masking.methods.token_embedding_lookup import find_token_embedding
from keras_masking.models.mlm_embedding_correction_record import MLMEmbeddingCorrectionRecord
from keras_masking.ops.embedding_correction import apply_correction
from keras_masking.ops.embedding_correction import check_embedding_table
from keras_masking.ops.embedding_correction import check_token_id
from keras_masking.ops.embedding_correction import check_token_ids
from keras_masking.ops.embedding_correction import correction_coefficients
from keras_masking.ops.embedding_correction import correction_scale
from keras_masking.ops.embedding_correction import invert_expected_input_embeddings
from keras_masking.ops.embedding_correction import selectable_rows
from keras_masking.ops.embedding_correction import validate_masking_rates
from keras_masking.utils.arguments import check_choice

logger = logging.getLogger("keras_masking")
TIED_OUTPUT_CHOICES = ("keep", "correct")
# The settings of a correction besides ``mask_token_id``, with BERT's defaults.
DEFAULT_SETTINGS = {"mask_rate": 0.15, "mask_token_rate": 0.8, "random_token_rate": 0.1}
DEFAULT_SETTINGS.update(unselectable_token_ids=None, tied_output="keep")
# The exact original table of each correction made in this process, with a
# digest of the table it became: `undo` uses it while the table is unchanged.
_ORIGINAL_TABLES = weakref.WeakKeyDictionary()


def _digest(layer):
    return hashlib.blake2b(keras.ops.convert_to_numpy(layer.embeddings).tobytes()).digest()


def correction_record(model, embedding=None):
    """The `MLMEmbeddingCorrectionRecord` applied to ``model``, or None.

    The record is kept on the token embedding layer, which the correction
    changes (whichever model it went through); a `TransformerBackbone`'s
    config carries it too (so it survives saving, presets and corrected
    checkpoints).

    Args:
        model: a Keras model or layer (see `correct_mlm_embeddings`).
        embedding: optional layer or layer name (see `find_token_embedding`).

    Returns:
        An `MLMEmbeddingCorrectionRecord`, or None.

    Example:
    ```python
    if keras_masking.methods.correction_record(backbone) is None:
        keras_masking.correct_mlm_embeddings(backbone, mask_token_id=103)
    ```
    """
    layer = find_token_embedding(model, embedding)
    record = getattr(layer, "mlm_embedding_correction", None)
    return MLMEmbeddingCorrectionRecord.from_config(record) if record else None


def _store_record(layer, record):
    layer.mlm_embedding_correction = None if record is None else record.to_config()


def check_correction_settings(mask_token_id, vocabulary_size=None, **settings):
    """Validates a masking configuration; returns it with plain Python values.

    Args:
        mask_token_id: see `correct_mlm_embeddings`.
        vocabulary_size: optional int; ids must then lie below it.
        **settings: some of the other arguments of `correct_mlm_embeddings`
            (the keys of `DEFAULT_SETTINGS`); the others take BERT's defaults.

    Returns:
        A dict with ``mask_token_id`` and every key of `DEFAULT_SETTINGS`.

    Raises:
        ValueError: a bad value.
        TypeError: an unknown setting.

    Example:
    ```python
    check_correction_settings(103, unselectable_token_ids=[0, 101, 102, 103])
    ```
    """
    unknown = sorted(set(settings) - set(DEFAULT_SETTINGS))
    if unknown:
        raise TypeError(
            f"Unknown masking settings {unknown}; expected some of {list(DEFAULT_SETTINGS)}."
        )
    settings = {**DEFAULT_SETTINGS, **settings}
    rates = validate_masking_rates(*[settings[name] for name in list(DEFAULT_SETTINGS)[:3]])
    correction_scale(*rates)
    ids = settings["unselectable_token_ids"]
    return {
        "mask_token_id": check_token_id("mask_token_id", mask_token_id, vocabulary_size),
        **dict(zip(DEFAULT_SETTINGS, rates)),
        "unselectable_token_ids": check_token_ids("unselectable_token_ids", ids, vocabulary_size),
        "tied_output": check_choice("tied_output", settings["tied_output"], TIED_OUTPUT_CHOICES),
    }


def correct_embedding_table(
    table, embedding="embeddings", mask_token_id=None, random_token_mean=None, **settings
):
    """The corrected copy of a bare ``(vocabulary_size, dim)`` table, and its record.

    The one computation behind the correction of models and of files.

    Args:
        table: the token embedding table (numpy).
        embedding: the table's name, for the record and the messages.
        mask_token_id, **settings: see `check_correction_settings`.
        random_token_mean: see `correction_coefficients` (a pruned table's).

    Returns:
        ``(corrected, record)``: a new table with the dtype of ``table`` and
        an `MLMEmbeddingCorrectionRecord`.

    Example:
    ```python
    corrected, record = correct_embedding_table(np.eye(4), mask_token_id=3)
    record.scale  # 0.865
    ```
    """
    settings = check_correction_settings(mask_token_id, len(table), **settings)
    rates = [settings[name] for name in ("mask_rate", "mask_token_rate", "random_token_rate")]
    checked = check_embedding_table(table, embedding)
    scale, shift = correction_coefficients(
        checked, settings["mask_token_id"], *rates, random_token_mean=random_token_mean
    )
    rows = selectable_rows(len(table), settings["unselectable_token_ids"])
    record = MLMEmbeddingCorrectionRecord(
        **settings,
        vocabulary_size=len(table),
        corrected_rows=int(rows.sum()),
        scale=float(scale),
        shift=shift.tolist(),
        embedding=embedding,
    )
    return apply_correction(table, scale, shift, rows), record


def _plan_correction(model, embedding, mask_token_id, **settings):
    """``(layer, corrected table, record, tied heads)``, or the layer and Nones when
    already corrected: every check of `correct_mlm_embeddings`, changing nothing."""
    layer = find_token_embedding(model, embedding)
    check_correction_settings(mask_token_id, layer.input_dim, **settings)
    if correction_record(model, layer) is not None:
        return layer, None, None, None
    table = keras.ops.convert_to_numpy(layer.embeddings)
    # A pruned table's random tokens were drawn from the vocabulary it was cut from.
    mean = (getattr(layer, "pruned_from", None) or {}).get("token_embedding_mean")
    corrected, record = correct_embedding_table(table, layer.name, mask_token_id, mean, **settings)
    heads = find_tied_heads(model, layer) if record.tied_output == "keep" else []
    for head in heads:
        if not hasattr(head, "keep_original_output_rows"):
            raise ValueError(
                f"{head.name!r} predicts with the token embedding itself (tied) and "
                "cannot keep the original rows; pass tied_output='correct' to correct "
                "both, or convert the model with keras_masking.models.from_keras_hub."
            )
    return layer, corrected, record, heads


def stale_average_steps(model):
    """The steps the moving averages of ``model``'s optimizer have taken, else 0.

    An optimizer with ``use_ema=True`` that has stepped holds averages of the
    weights, and Keras writes them into the weights at the end of each `fit`:
    a correction made in between is then mostly undone (all but ``1 -
    ema_momentum ** steps`` of it after ``steps`` more steps).

    Args:
        model: a Keras model (compiled or not) or layer.

    Returns:
        int >= 0.

    Example:

    >>> stale_average_steps(keras.Sequential())
    0
    """
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # under loss scaling
    if not getattr(optimizer, "use_ema", False) or not getattr(optimizer, "built", False):
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def check_mlm_correction(model, mask_token_id, *, embedding=None, **settings):
    """Runs every check of `correct_mlm_embeddings` without changing anything.

    For a long run whose end applies the correction.

    Args:
        model, mask_token_id, embedding: see `correct_mlm_embeddings`.
        **settings: the other arguments of `correct_mlm_embeddings`.

    Returns:
        True if `correct_mlm_embeddings` would correct the model, False if it
        is already corrected.

    Example:
    ```python
    check_mlm_correction(classifier, mask_token_id=103)
    ```
    """
    return _plan_correction(model, embedding, mask_token_id, **settings)[1] is not None


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
            `MaskedLMHead` compensates exactly, wherever it is: in ``model``
            or in another model on the same table; a keras-hub head in
            ``model`` cannot, and raises; a projection your own graph makes
            with the table, ``ReversibleEmbedding(..., reverse=True)``, is not
            found, and predicts with the corrected rows). ``"correct"``: the
            corrected rows, as an in-place edit of a tied matrix gives.
        embedding: optional layer or layer name, when the model has several
            embeddings (see `find_token_embedding`).

    Returns:
        The `MLMEmbeddingCorrectionRecord`, or None if the model was already
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
    settings = {name: value for name, value in locals().items() if name in DEFAULT_SETTINGS}
    layer, corrected, record, heads = _plan_correction(model, embedding, mask_token_id, **settings)
    if record is None:
        logger.info("%s is already MLM-corrected; nothing changed.", layer.name)
        return None
    steps = stale_average_steps(model)
    if steps:
        logger.warning(
            "%s's optimizer keeps moving averages of the weights (use_ema) from %d steps "
            "before this correction: a further fit with it ends by writing them back, undoing "
            "most of it. Compile with a fresh optimizer before fitting again.",
            model.name,
            steps,
        )
    unbuilt = [head.name for head in heads if not head.built]
    if unbuilt:  # checked before the table changes: a head keeps its rows in its weights
        raise ValueError(
            f"The MLM head(s) {unbuilt} on {layer.name!r} are not built yet, so they cannot "
            "keep their output rows. Call the model once on a batch (or fit it) before "
            "correcting its embeddings."
        )
    original = keras.ops.convert_to_numpy(layer.embeddings)
    layer.embeddings.assign(corrected)
    rows = selectable_rows(record.vocabulary_size, record.unselectable_token_ids)
    inverse = np.where(rows, 1.0 / record.scale, 1.0).astype("float32")
    for head in heads:
        head.keep_original_output_rows(
            inverse,
            np.where(rows, inverse, 0.0).astype("float32"),
            np.asarray(record.shift, "float32"),
        )
    _ORIGINAL_TABLES[layer] = (original, _digest(layer))
    _store_record(layer, record)
    return record


def masking_configuration(mask_generator):
    """Reads a keras-hub masker's configuration as keyword arguments.

    These are the masker's settings, not the share it picked: keras-hub picks
    each token with ``mask_selection_rate``, then keeps at most
    ``mask_selection_length`` per row. Where that cap binds (at ``0.15 *
    sequence_length`` it cut a fifth of the demo's rows, which then had 14.0%
    picked), pass the share your masker picked as ``mask_rate`` instead.

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
    mask_generator = _masker(mask_generator)
    required = ("mask_selection_rate", "mask_token_id", "mask_token_rate", "random_token_rate")
    missing = [name for name in required if not hasattr(mask_generator, name)]
    if missing:
        raise TypeError(
            "Expected a keras_hub MaskedLMMaskGenerator or masked-LM preprocessor for "
            f"mask_generator. Received: mask_generator of type "
            f"{type(mask_generator).__name__}, which has no {missing}."
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
    """`correct_mlm_embeddings` with the configuration of the masker pretraining ran with.

    Args:
        model: as in `correct_mlm_embeddings`.
        mask_generator: see `masking_configuration`.
        **kwargs: ``tied_output``, ``embedding``.

    Raises:
        ValueError: also when the masker drew its random tokens from another
            number of ids than the embedding has rows (``mean E`` would be
            the mean over the wrong rows).

    Example:
    ```python
    keras_masking.correct_mlm_embeddings.from_mask_generator(backbone, preprocessor)
    ```
    """
    settings = masking_configuration(mask_generator)
    check_random_token_range(model, masker_vocabulary_size(mask_generator), kwargs.get("embedding"))
    return correct_mlm_embeddings(model, **settings, **kwargs)


def masker_vocabulary_size(mask_generator):
    """The number of ids a keras-hub masker draws its random tokens from, or None.

    Args:
        mask_generator: see `masking_configuration`.

    Example:
    ```python
    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=21128, mask_selection_rate=0.15, mask_token_id=103)
    assert masker_vocabulary_size(masker) == 21128
    ```
    """
    size = getattr(_masker(mask_generator), "vocabulary_size", None)
    return None if size is None else int(size)


def _masker(mask_generator):
    """The masker layer of a keras-hub masked-LM preprocessor, or the argument."""
    if hasattr(mask_generator, "masker"):
        if mask_generator.masker is None:
            mask_generator.build(None)
        return mask_generator.masker
    return mask_generator


def check_random_token_range(model, drawn, embedding=None):
    """Raises unless random tokens were drawn from exactly the embedding's rows.

    ``mean E`` is the mean over the table's rows (a pruned table's: over the
    table it was cut from, `prune_token_embeddings`): it is the mean of the
    random-replacement distribution only when the masker drew from
    ``[0, rows)``.

    Args:
        model: as in `correct_mlm_embeddings`.
        drawn: int, the number of ids the masker drew from, or None (unknown:
            nothing is checked).
        embedding: see `correct_mlm_embeddings`.

    Raises:
        ValueError: ``drawn`` is not the embedding's number of rows.

    Example:
    ```python
    check_random_token_range(backbone, backbone.vocabulary_size)
    ```
    """
    layer = find_token_embedding(model, embedding)
    rows = (getattr(layer, "pruned_from", None) or {}).get("vocabulary_size", layer.input_dim)
    if drawn is not None and drawn != rows:
        raise ValueError(
            f"The masker drew random tokens from {drawn} ids, and {layer.name!r} has "
            f"{rows} rows: the correction's mean E, over the table's rows, would not "
            "be the mean of the tokens pretraining drew. Correct a table with the masker's "
            "vocabulary size (a masker over the same ids as the table)."
        )


correct_mlm_embeddings.from_mask_generator = _correct_from_mask_generator


def undo_mlm_embedding_correction(model, embedding=None):
    """Restores the token embedding from before `correct_mlm_embeddings`.

    Exact (bit for bit) in the process that corrected, while the table is
    unchanged; otherwise to within float32 rounding. Tied-head compensation
    is reset.

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
    original, digest = _ORIGINAL_TABLES.pop(layer, (None, None))
    if original is None or digest != _digest(layer):
        rows = selectable_rows(record.vocabulary_size, record.unselectable_token_ids)
        current = keras.ops.convert_to_numpy(layer.embeddings)
        original = invert_expected_input_embeddings(current, record.scale, record.shift, rows)
    layer.embeddings.assign(original)
    for head in find_tied_heads(model, layer):
        if hasattr(head, "reset_output_rows"):
            head.reset_output_rows()
    _store_record(layer, None)
    return record
