"""Model averaging over MLM maskings: the optimum the dropout view points to."""

import keras
import numpy as np

from keras_masking.methods.token_embedding_lookup import find_token_embedding
from keras_masking.ops.embedding_correction import selectable_rows
from keras_masking.ops.embedding_correction import validate_masking_rates


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

    Each selectable, non-padding token is selected with ``mask_rate``; a
    selected token becomes ``mask_token_id`` with ``mask_token_rate``, a
    uniform random id in ``[0, vocabulary_size)`` with ``random_token_rate``,
    and stays itself otherwise.

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
    """
    validate_masking_rates(mask_rate, mask_token_rate, random_token_rate)
    token_ids = np.asarray(token_ids)
    rng = np.random.default_rng(seed)
    shape = (samples,) + token_ids.shape
    selectable = selectable_rows(vocabulary_size, unselectable_token_ids)[token_ids]
    if padding_mask is not None:
        selectable &= np.asarray(padding_mask).astype(bool)
    selected = (rng.random(shape) < mask_rate) & selectable[None]
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
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    unselectable_token_ids=None,
    from_logits=False,
    seed=None,
    batch_size=None,
):
    """Predictions averaged over ``samples`` random MLM maskings of the inputs.

    The alternative to `correct_mlm_embeddings` that the dropout view calls
    optimal: rather than feeding the expected embedding, average the model's
    predictions over maskings drawn from the pretraining distribution. The
    ``samples x batch`` masked copies go through the model in one batched
    ``predict`` call, not a loop of predicts.

    Args:
        model: a Keras model taking a dict with ``token_ids`` (and usually
            ``padding_mask``, ``segment_ids``).
        inputs: that dict of arrays.
        mask_token_id: int. The [MASK] id.
        samples: int ``K`` >= 1.
        mask_rate, mask_token_rate, random_token_rate,
        unselectable_token_ids: the pretraining masker's configuration.
        from_logits: bool. Apply a softmax over the last axis before
            averaging (average probabilities, not logits).
        seed: int or None, for reproducible maskings.
        batch_size: predict batch size (default: all ``K x batch`` rows).

    Returns:
        The averaged outputs, with the structure of the model's outputs.

    Example:
    ```python
    probabilities = keras_masking.mlm_model_average(
        classifier, features, mask_token_id=103, samples=16)
    ```
    """
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"`samples` must be a positive integer. Received: samples={samples!r}")
    if "token_ids" not in inputs:
        raise ValueError(f"`inputs` must hold 'token_ids'. Received keys {sorted(inputs)}.")
    vocabulary_size = find_token_embedding(model).input_dim
    if not 0 <= mask_token_id < vocabulary_size:
        raise ValueError(
            f"mask_token_id must lie in [0, {vocabulary_size}). Received: {mask_token_id}"
        )
    token_ids = np.asarray(inputs["token_ids"])
    batch = token_ids.shape[0]
    masked = sample_mlm_maskings(
        token_ids,
        samples,
        mask_token_id,
        vocabulary_size,
        mask_rate,
        mask_token_rate,
        random_token_rate,
        unselectable_token_ids,
        inputs.get("padding_mask"),
        seed,
    )
    tiled = {
        key: np.concatenate([np.asarray(value)] * samples, axis=0) for key, value in inputs.items()
    }
    tiled["token_ids"] = masked.reshape((samples * batch,) + token_ids.shape[1:])
    outputs = model.predict(tiled, batch_size=batch_size or samples * batch, verbose=0)

    def average(values):
        values = np.asarray(values)
        if from_logits:
            values = keras.ops.convert_to_numpy(keras.ops.softmax(values, axis=-1))
        return values.reshape((samples, batch) + values.shape[1:]).mean(axis=0)

    return keras.tree.map_structure(average, outputs)
