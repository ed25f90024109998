"""The dropout view of MLM masking: expected input embeddings.

BERT's pretraining selects each selectable token with rate ``r``; a selected
token becomes [MASK] with ``p_m``, stays itself with ``p_k = 1 - p_m - p_r``
and becomes a uniformly random vocabulary token with ``p_r``. Read as dropout
on the input embedding, turning that dropout off for fine-tuning means
feeding each token its expected input embedding:

    E_i <- (1 - r) E_i + r (p_m E_[MASK] + p_k E_i + p_r mean(E))
         = a E_i + c,   a = 1 - r (p_m + p_r),   c = r (p_m E_[MASK] + p_r mean(E))

``mean(E)`` is over the whole vocabulary (the random replacement is uniform
over ``[0, vocabulary_size)`` in BERT and keras-hub). Rows of tokens that
pretraining never selects keep their values. Reference: Su Jianlin, "MLM
embedding correction from the dropout view" (kexue.fm, 2022).
"""

import numpy as np


def validate_masking_rates(mask_rate, mask_token_rate, random_token_rate):
    """Raises ValueError unless the three rates describe a valid masker."""
    for name, value in (
        ("mask_rate", mask_rate),
        ("mask_token_rate", mask_token_rate),
        ("random_token_rate", random_token_rate),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"`{name}` must be a number in [0, 1]. Received: {name}={value!r}")
    if mask_token_rate + random_token_rate > 1 + 1e-12:
        raise ValueError(
            "mask_token_rate + random_token_rate must not exceed 1 (the rest "
            "keeps the token). Received: "
            f"mask_token_rate={mask_token_rate}, random_token_rate={random_token_rate}"
        )


def selectable_rows(vocabulary_size, unselectable_token_ids=None):
    """Boolean ``(vocabulary_size,)``: rows that pretraining could select.

    Args:
        vocabulary_size: int.
        unselectable_token_ids: ids never selected ([PAD], [CLS], [SEP]...),
            or None for "every row" (the blog's snippet).

    Returns:
        A numpy bool array.
    """
    selectable = np.ones(vocabulary_size, dtype=bool)
    if unselectable_token_ids is None:
        return selectable
    ids = np.asarray(list(unselectable_token_ids), dtype=np.int64)
    bad = ids[(ids < 0) | (ids >= vocabulary_size)]
    if bad.size:
        raise ValueError(
            f"unselectable_token_ids must lie in [0, {vocabulary_size}). "
            f"Received out-of-range ids {sorted(set(bad.tolist()))}."
        )
    selectable[ids] = False
    return selectable


def correction_coefficients(
    embeddings, mask_token_id, mask_rate=0.15, mask_token_rate=0.8, random_token_rate=0.1
):
    """The affine map ``E_i -> a E_i + c`` of selectable rows.

    Args:
        embeddings: ``(vocabulary_size, dim)`` array (the original table).
        mask_token_id: int. Row of [MASK].
        mask_rate, mask_token_rate, random_token_rate: the masker's rates.

    Returns:
        ``(a, c)``: a float and a float64 ``(dim,)`` vector.
    """
    validate_masking_rates(mask_rate, mask_token_rate, random_token_rate)
    table = np.asarray(embeddings, dtype=np.float64)
    if table.ndim != 2:
        raise ValueError(f"Expected a (vocabulary, dim) table. Received shape {table.shape}.")
    if not 0 <= int(mask_token_id) < table.shape[0]:
        raise ValueError(
            f"mask_token_id must lie in [0, {table.shape[0]}) (the vocabulary). "
            f"Received: mask_token_id={mask_token_id}"
        )
    scale = 1.0 - mask_rate * (mask_token_rate + random_token_rate)
    shift = mask_rate * (
        mask_token_rate * table[int(mask_token_id)] + random_token_rate * table.mean(axis=0)
    )
    return scale, shift


def apply_correction(table, scale, shift, selectable):
    """``a E_i + c`` on the selectable rows (float64 maths), dtype kept.

    Args:
        table: ``(vocabulary_size, dim)`` array.
        scale, shift: ``(a, c)`` from `correction_coefficients`.
        selectable: bool rows to correct.

    Returns:
        A new array with the dtype of ``table``.
    """
    table = np.asarray(table)
    corrected = table.astype(np.float64)
    corrected[selectable] = scale * corrected[selectable] + np.asarray(shift)
    return corrected.astype(table.dtype)


def expected_input_embeddings(
    embeddings,
    mask_token_id,
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    unselectable_token_ids=None,
):
    """Corrected embedding table: each row's expected MLM input embedding.

    Args:
        embeddings: ``(vocabulary_size, dim)`` array.
        mask_token_id: int. Row of [MASK].
        mask_rate: float ``r``, the selection rate (0.15 in BERT).
        mask_token_rate: float ``p_m`` (0.8).
        random_token_rate: float ``p_r`` (0.1).
        unselectable_token_ids: ids pretraining never selects (their rows are
            kept), or None to correct every row.

    Returns:
        A new array with the dtype of ``embeddings``.

    Example:
    >>> table = np.eye(3)
    >>> expected_input_embeddings(table, mask_token_id=2)[0].round(4)
    array([0.87 , 0.005, 0.125])
    """
    table = np.asarray(embeddings)
    scale, shift = correction_coefficients(
        table, mask_token_id, mask_rate, mask_token_rate, random_token_rate
    )
    rows = selectable_rows(table.shape[0], unselectable_token_ids)
    return apply_correction(table, scale, shift, rows)


def invert_expected_input_embeddings(corrected, scale, shift, selectable):
    """Undoes the correction algebraically (to float rounding).

    Args:
        corrected: the corrected table.
        scale, shift: the ``(a, c)`` that produced it.
        selectable: bool rows that were corrected.

    Returns:
        The reconstructed original table (dtype of ``corrected``).
    """
    table = np.asarray(corrected)
    restored = table.astype(np.float64)
    restored[selectable] = (restored[selectable] - np.asarray(shift)) / scale
    return restored.astype(table.dtype)
