"""Model averaging over MLM maskings: the optimum the dropout view points to."""

import keras
import numpy as np

from keras_masking.methods.token_embedding_lookup import find_token_embedding
from keras_masking.ops.embedding_correction import check_token_id
from keras_masking.ops.embedding_correction import selectable_rows
from keras_masking.ops.embedding_correction import validate_masking_rates
from keras_masking.ops.token_selection import select_tokens
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.eager_checks import check_ids_in_range
from keras_masking.utils.eager_checks import check_integer_ids
from keras_masking.utils.eager_checks import check_zero_one


def _check_token_array(token_ids, vocabulary_size):
    """``token_ids`` as a non-empty 2-D numpy array of ids in range."""
    array = np.asarray(token_ids)
    if array.ndim != 2 or not array.size:
        raise ValueError(
            "Expected token_ids of shape (batch, sequence), not empty. "
            f"Received: token_ids.shape={array.shape}."
        )
    check_integer_ids("token_ids", array)
    check_ids_in_range(array, vocabulary_size, "token_ids", "vocabulary_size")
    return array


_SPECIAL_ID_NAMES = ("cls_token_id", "sep_token_id", "pad_token_id", "mask_token_id")


def _special_token_ids(model, tokenizer):
    """The special ids of ``tokenizer``, or of the model's preprocessor's tokenizer."""
    source = "tokenizer"
    if tokenizer is None:
        preprocessor = getattr(model, "preprocessor", None)
        tokenizer = getattr(preprocessor, "tokenizer", None)
        source = "the model's preprocessor.tokenizer"
        if tokenizer is None:
            raise ValueError(
                "Expected unselectable_token_ids (the ids BERT-style pretraining never masks: "
                "[CLS], [SEP], [PAD], [MASK]), a tokenizer, or a model with a preprocessor "
                "whose tokenizer knows them; pass unselectable_token_ids=() to make every "
                f"token selectable. Received: unselectable_token_ids=None, tokenizer=None and "
                f"a model {model.name!r} without a preprocessor tokenizer."
            )
    ids = getattr(tokenizer, "special_token_ids", None)
    if ids is None:
        ids = [getattr(tokenizer, name, None) for name in _SPECIAL_ID_NAMES]
        ids = [value for value in ids if value is not None]
    if not ids:
        raise ValueError(
            "Expected a tokenizer with special_token_ids (or cls_token_id, sep_token_id, "
            f"pad_token_id, mask_token_id). Received: {source}={tokenizer!r:.80}."
        )
    return sorted({int(value) for value in ids})


def sample_mlm_maskings(
    token_ids,
    samples,
    mask_token_id,
    vocabulary_size,
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    unselectable_token_ids=None,
    padding_mask=None,
    seed=None,
):
    """Draws ``samples`` maskings of every sequence, BERT style, at once.

    In each row, ``floor(mask_rate * n + u)`` of its ``n`` selectable,
    non-padding tokens are selected (`keras_masking.ops.select_tokens`,
    ``u`` uniform in [0, 1)), so each with probability ``mask_rate``; a
    selected token becomes ``mask_token_id`` with ``mask_token_rate``, a
    uniform random id with ``random_token_rate``, and stays itself otherwise.

    Args:
        token_ids: int array ``(batch, sequence)``.
        samples: int ``K``.
        mask_token_id, vocabulary_size: ints.
        mask_rate, mask_token_rate, random_token_rate: the masker's rates.
        unselectable_token_ids: ids never selected, or None.
        padding_mask: optional 0/1 ``(batch, sequence)``; padding is never
            selected.
        seed: int or None.

    Returns:
        An int32 array ``(samples, batch, sequence)``.

    Raises:
        ValueError: bad rates, sizes or ids (named, with what was received).

    Example:
    ```python
    masked = sample_mlm_maskings(
        features["token_ids"], 8, mask_token_id=103, vocabulary_size=21128, seed=0)
    masked.shape  # (8, batch, sequence)
    ```
    """
    mask_rate, mask_token_rate, random_token_rate = validate_masking_rates(
        mask_rate, mask_token_rate, random_token_rate
    )
    samples = check_int("samples", samples, minimum=1)
    vocabulary_size = check_int("vocabulary_size", vocabulary_size, minimum=1)
    mask_token_id = check_token_id("mask_token_id", mask_token_id, vocabulary_size)
    token_ids = _check_token_array(token_ids, vocabulary_size)
    selectable = selectable_rows(vocabulary_size, unselectable_token_ids)[token_ids]
    if padding_mask is not None:
        padding_mask = np.asarray(padding_mask)
        if padding_mask.shape != token_ids.shape:
            raise ValueError(
                f"Expected padding_mask of the shape of token_ids {token_ids.shape}. "
                f"Received: padding_mask.shape={padding_mask.shape}."
            )
        check_zero_one("padding_mask", padding_mask)
        selectable &= padding_mask.astype(bool)
    rng = np.random.default_rng(check_seed("seed", seed))
    shape = (samples,) + token_ids.shape
    rows_shape = (samples * token_ids.shape[0], token_ids.shape[1])
    selected = select_tokens(
        np.broadcast_to(selectable, shape).reshape(rows_shape),
        mask_rate,
        rng.random(rows_shape, dtype=np.float32),
        rounding=rng.random(rows_shape[:1], dtype=np.float32),
    )
    selected = keras.ops.convert_to_numpy(selected).reshape(shape)
    choice = rng.random(shape)
    to_mask = selected & (choice < mask_token_rate)
    to_random = (
        selected & (choice >= mask_token_rate) & (choice < mask_token_rate + random_token_rate)
    )
    masked = np.broadcast_to(token_ids, shape).copy()
    masked[to_mask] = mask_token_id
    masked[to_random] = rng.integers(0, vocabulary_size, size=int(to_random.sum()))
    return masked.astype("int32")


def mlm_model_average(
    model,
    inputs,
    mask_token_id,
    samples=8,
    *,
    unselectable_token_ids=None,
    tokenizer=None,
    from_logits=False,
    seed=None,
    batch_size=None,
    **masking,
):
    """Predictions averaged over ``samples`` random MLM maskings of the inputs.

    The alternative to `correct_mlm_embeddings` that the dropout view calls
    optimal: average the model's predictions over maskings drawn from the
    pretraining distribution (`sample_mlm_maskings`), in one batched
    ``predict`` call. A model with a preprocessor (a keras-hub task) is fed
    the token features as they are (its preprocessor is not run). On a
    pruned backbone (`prune_token_embeddings`) the random tokens come from
    the rows it kept, where pretraining drew them from the whole vocabulary.

    Args:
        model: a Keras model taking a dict with ``token_ids`` (and usually
            ``padding_mask``, ``segment_ids``), with or without a
            preprocessor.
        inputs: that dict of arrays (token features, not strings).
        mask_token_id: int. The [MASK] id.
        samples: int ``K`` >= 1.
        unselectable_token_ids: ids never masked. None (the default): the
            ``special_token_ids`` of ``tokenizer``, or of the model's
            preprocessor's tokenizer, as BERT's pretraining never masks
            [CLS], [SEP], [PAD], [MASK]; a model with no tokenizer then
            raises a ValueError. ``()`` makes every non-padding token
            selectable.
        tokenizer: optional keras-hub tokenizer whose ``special_token_ids``
            (or ``cls_token_id``, ``sep_token_id``, ``pad_token_id``,
            ``mask_token_id``) give the default ``unselectable_token_ids``.
        from_logits: bool. Apply a softmax over the last axis before
            averaging (average probabilities, not logits).
        seed: int or None, for reproducible maskings.
        batch_size: predict batch size (default: all ``K x batch`` rows).
        **masking: the pretraining masker's ``mask_rate`` (0.15),
            ``mask_token_rate`` (0.8) and ``random_token_rate`` (0.1), as in
            `sample_mlm_maskings`.

    Returns:
        The averaged outputs, with the structure of the model's outputs.

    Raises:
        ValueError: bad settings, ids or inputs (named, with what was
            received); nothing is predicted.

    Example:
    ```python
    # A plain functional model: name the ids pretraining never masked
    # (Chinese BERT: [PAD] 0, [CLS] 101, [SEP] 102, [MASK] 103).
    probabilities = keras_masking.mlm_model_average(
        model, features, mask_token_id=103, samples=16, from_logits=True,
        unselectable_token_ids=[0, 101, 102, 103])
    # A keras-hub task with a preprocessor (a TransformerTextClassifier)
    # needs no ids: its tokenizer's special tokens are never masked.
    # probabilities = keras_masking.mlm_model_average(
    #     classifier, classifier.preprocessor(["今天天气很好"]), mask_token_id=103)
    ```
    """
    samples = check_int("samples", samples, minimum=1)
    if batch_size is not None:
        batch_size = check_int("batch_size", batch_size, minimum=1)
    from_logits = check_bool("from_logits", from_logits)
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"Expected a Keras model for model. Received: model of type {type(model).__name__}."
        )
    if not isinstance(inputs, dict) or "token_ids" not in inputs:
        received = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
        raise ValueError(
            f"Expected a dict of inputs holding 'token_ids' for inputs. Received: {received}."
        )
    vocabulary_size = find_token_embedding(model).input_dim
    check_token_id("mask_token_id", mask_token_id, vocabulary_size)
    token_ids = _check_token_array(inputs["token_ids"], vocabulary_size)
    batch = token_ids.shape[0]
    wrong = {
        key: np.shape(value)
        for key, value in inputs.items()
        if np.ndim(value) < 1 or np.shape(value)[0] != batch
    }
    if wrong:
        raise ValueError(
            f"Expected every input with the batch size of token_ids ({batch}). "
            f"Received: the shapes {wrong}."
        )
    if unselectable_token_ids is None:
        unselectable_token_ids = _special_token_ids(model, tokenizer)
    elif tokenizer is not None:
        _special_token_ids(model, tokenizer)  # still checked
    masked = sample_mlm_maskings(
        token_ids,
        samples,
        mask_token_id,
        vocabulary_size,
        unselectable_token_ids=unselectable_token_ids,
        padding_mask=inputs.get("padding_mask"),
        seed=seed,
        **masking,
    )
    tiled = {
        key: np.concatenate([np.asarray(value)] * samples, axis=0) for key, value in inputs.items()
    }
    tiled["token_ids"] = masked.reshape((samples * batch,) + token_ids.shape[1:])
    # A keras-hub task's `predict` runs its preprocessor (which takes strings)
    # on the inputs; these are token features already: predict as a plain
    # Keras model does.
    predict = model.predict
    if getattr(model, "preprocessor", None) is not None:
        predict = keras.Model.predict.__get__(model)
    outputs = predict(tiled, batch_size=batch_size or samples * batch, verbose=0)

    def average(values):
        values = np.asarray(values)
        if keras.backend.standardize_dtype(values.dtype) in ("bfloat16", "float16"):
            values = values.astype("float32")  # a 16-bit head: average in float32
        if from_logits:
            values = keras.ops.convert_to_numpy(keras.ops.softmax(values, axis=-1))
        return values.reshape((samples, batch) + values.shape[1:]).mean(axis=0)

    return keras.tree.map_structure(average, outputs)
