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

from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list


def validate_masking_rates(mask_rate, mask_token_rate, random_token_rate):
    """Checks that three rates describe a valid BERT-style masker.

    Args:
        mask_rate: float ``r`` in [0, 1].
        mask_token_rate: float ``p_m`` in [0, 1].
        random_token_rate: float ``p_r`` in [0, 1], with ``p_m + p_r <= 1``.

    Returns:
        The three rates as Python floats.

    Example:
    >>> validate_masking_rates(0.15, 0.8, 0.1)
    (0.15, 0.8, 0.1)
    """
    mask_rate = check_float("mask_rate", mask_rate, 0.0, 1.0)
    mask_token_rate = check_float("mask_token_rate", mask_token_rate, 0.0, 1.0)
    random_token_rate = check_float("random_token_rate", random_token_rate, 0.0, 1.0)
    if mask_token_rate + random_token_rate > 1 + 1e-12:
        raise ValueError(
            "Expected mask_token_rate + random_token_rate <= 1 (the rest keeps the token). "
            f"Received: mask_token_rate={mask_token_rate}, random_token_rate={random_token_rate}."
        )
    return mask_rate, mask_token_rate, random_token_rate


def check_token_id(name, value, vocabulary_size=None):
    """A token id as a Python int (numpy integers accepted; bool, float refused).

    Args:
        name: the argument's name, for the message.
        value: the value received.
        vocabulary_size: optional int; the id must then be below it.

    Example:
    >>> check_token_id("mask_token_id", np.int64(103), vocabulary_size=21128)
    103
    """
    value = check_int(name, value, minimum=0)
    if vocabulary_size is not None and value >= vocabulary_size:
        raise ValueError(
            f"Expected {name} in [0, {vocabulary_size}) (an id of the vocabulary). "
            f"Received: {name}={value}."
        )
    return value


def check_token_ids(name, values, vocabulary_size=None):
    """A sorted list of distinct token ids, or None (numpy arrays accepted).

    Args:
        name: the argument's name, for the message.
        values: None or an iterable of integers.
        vocabulary_size: optional int; every id must then be below it.

    Example:
    >>> check_token_ids("unselectable_token_ids", np.array([102, 0, 101]), 21128)
    [0, 101, 102]
    """
    if values is None:
        return None
    values = np.ravel(values) if isinstance(values, np.ndarray) else values
    maximum = None if vocabulary_size is None else vocabulary_size - 1
    return sorted(set(check_int_list(name, values, minimum=0, maximum=maximum)))


def check_embedding_table(embeddings, name="embeddings"):
    """A finite ``(vocabulary_size, dim)`` float table, as float64.

    One NaN or inf row would spread to every row through the mean of the
    table, so a table with any non-finite value is refused.

    Args:
        embeddings: array-like.
        name: what to call it in messages.

    Returns:
        The table as a float64 numpy array.
    """
    try:
        table = np.asarray(embeddings, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Expected a numeric (vocabulary_size, dim) table for {name}. Received: {error}."
        ) from None
    if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] == 0:
        raise ValueError(
            f"Expected a non-empty (vocabulary_size, dim) table for {name}. "
            f"Received: shape {table.shape}."
        )
    bad_rows = np.flatnonzero(~np.isfinite(table).all(axis=1))
    if bad_rows.size:
        raise ValueError(
            f"{name} has NaN or inf values in {bad_rows.size} of {table.shape[0]} rows "
            f"(first: row {int(bad_rows[0])}); the correction averages every row, so it "
            "would spread to the whole table. Nothing was changed."
        )
    return table


def selectable_rows(vocabulary_size, unselectable_token_ids=None):
    """Boolean ``(vocabulary_size,)``: rows that pretraining could select.

    Args:
        vocabulary_size: int.
        unselectable_token_ids: ids never selected ([PAD], [CLS], [SEP]...),
            or None for "every row" (the blog's snippet).

    Returns:
        A numpy bool array.

    Example:
    >>> selectable_rows(4, [0, 2]).tolist()
    [False, True, False, True]
    """
    vocabulary_size = check_int("vocabulary_size", vocabulary_size, minimum=1)
    selectable = np.ones(vocabulary_size, dtype=bool)
    ids = check_token_ids("unselectable_token_ids", unselectable_token_ids, vocabulary_size)
    if ids:
        selectable[ids] = False
    return selectable


def correction_scale(mask_rate, mask_token_rate, random_token_rate):
    """The scale ``a = 1 - r (p_m + p_r)`` of a valid, invertible correction.

    Args:
        mask_rate, mask_token_rate, random_token_rate: the masker's rates.

    Returns:
        ``a`` as a float in (0, 1].

    Raises:
        ValueError: bad rates, or a masker that replaces every token
            (``a = 0``: the correction could not be undone).

    Example:
    >>> round(correction_scale(0.15, 0.8, 0.1), 6)
    0.865
    """
    mask_rate, mask_token_rate, random_token_rate = validate_masking_rates(
        mask_rate, mask_token_rate, random_token_rate
    )
    scale = 1.0 - mask_rate * (mask_token_rate + random_token_rate)
    if scale <= 1e-12:
        raise ValueError(
            "Expected mask_rate * (mask_token_rate + random_token_rate) < 1: a masker that "
            "replaces every token leaves nothing of the original embedding. Received: "
            f"mask_rate={mask_rate}, mask_token_rate={mask_token_rate}, "
            f"random_token_rate={random_token_rate}."
        )
    return scale


def correction_coefficients(
    embeddings,
    mask_token_id,
    mask_rate=0.15,
    mask_token_rate=0.8,
    random_token_rate=0.1,
    random_token_mean=None,
):
    """The affine map ``E_i -> a E_i + c`` of selectable rows.

    Args:
        embeddings: ``(vocabulary_size, dim)`` array (the original table).
        mask_token_id: int. Row of [MASK].
        mask_rate, mask_token_rate, random_token_rate: the masker's rates.
        random_token_mean: None (the mean of ``embeddings``' rows) or the
            ``(dim,)`` mean of the rows random tokens were drawn from (those
            of a pruned table's full vocabulary).

    Returns:
        ``(a, c)``: a float and a float64 ``(dim,)`` vector.

    Raises:
        ValueError: bad rates (see `correction_scale`), a [MASK] id outside
            the table, or a table with NaN or inf.

    Example:
    >>> scale, shift = correction_coefficients(np.eye(3), mask_token_id=2)
    >>> round(scale, 3), shift.round(3).tolist()
    (0.865, [0.005, 0.005, 0.125])
    """
    scale = correction_scale(mask_rate, mask_token_rate, random_token_rate)
    table = check_embedding_table(embeddings)
    mask_token_id = check_token_id("mask_token_id", mask_token_id, table.shape[0])
    mean = table.mean(axis=0) if random_token_mean is None else np.asarray(random_token_mean)
    if mean.shape != table.shape[1:]:
        raise ValueError(
            f"Expected random_token_mean of shape {table.shape[1:]}. Received: {mean.shape}."
        )
    shift = mask_rate * (mask_token_rate * table[mask_token_id] + random_token_rate * mean)
    return scale, shift


def _check_affine(table, scale, shift, selectable, table_name):
    """The arguments of `apply_correction` / its inverse, checked; the table as a float64 copy."""
    array = np.asarray(table)
    dtype = array.dtype if np.issubdtype(array.dtype, np.floating) else np.dtype("float64")
    values = check_embedding_table(array, table_name)
    scale = check_float("scale", scale, minimum=0.0, open_minimum=True)
    shift = np.asarray(shift, dtype=np.float64)
    if shift.shape != (values.shape[1],) or not np.isfinite(shift).all():
        raise ValueError(
            f"Expected a finite ({values.shape[1]},) vector (the table's width) for shift. "
            f"Received: shape {shift.shape}."
        )
    selectable = np.asarray(selectable)
    if selectable.dtype != bool or selectable.shape != (values.shape[0],):
        raise ValueError(
            f"Expected a bool ({values.shape[0]},) array (one per row, see `selectable_rows`) "
            f"for selectable. Received: dtype {selectable.dtype}, shape {selectable.shape}."
        )
    return values.copy(), scale, shift, selectable, dtype


def apply_correction(table, scale, shift, selectable):
    """``a E_i + c`` on the selectable rows (float64 maths), dtype kept.

    Args:
        table: ``(vocabulary_size, dim)`` array.
        scale, shift: ``(a, c)`` from `correction_coefficients`.
        selectable: bool rows to correct.

    Returns:
        A new array with the dtype of ``table`` (float64 for a non-float
        input).

    Example:
    >>> apply_correction(np.ones((2, 1)), 0.5, [1.0], np.array([True, False])).tolist()
    [[1.5], [1.0]]
    """
    corrected, scale, shift, selectable, dtype = _check_affine(
        table, scale, shift, selectable, "table"
    )
    corrected[selectable] = scale * corrected[selectable] + shift
    return corrected.astype(dtype)


def invert_expected_input_embeddings(corrected, scale, shift, selectable):
    """Undoes the correction algebraically (to float rounding).

    Args:
        corrected: the corrected table.
        scale, shift: the ``(a, c)`` that produced it.
        selectable: bool rows that were corrected.

    Returns:
        The reconstructed original table (dtype of ``corrected``).

    Example:
    >>> table = np.eye(3)
    >>> scale, shift = correction_coefficients(table, mask_token_id=2)
    >>> corrected = apply_correction(table, scale, shift, np.ones(3, bool))
    >>> invert_expected_input_embeddings(corrected, scale, shift, np.ones(3, bool)).round(6)
    array([[1., 0., 0.],
           [0., 1., 0.],
           [0., 0., 1.]])
    """
    restored, scale, shift, selectable, dtype = _check_affine(
        corrected, scale, shift, selectable, "corrected"
    )
    restored[selectable] = (restored[selectable] - shift) / scale
    return restored.astype(dtype)
