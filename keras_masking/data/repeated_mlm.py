"""ExLM's analysis tool: Repeated MLM (repeat every token k times, then mask)."""

import dataclasses

import numpy as np

from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.eager_checks import check_integer_ids
from keras_masking.utils.eager_checks import check_zero_one


@dataclasses.dataclass(frozen=True)
class RepeatedMLMBatch:
    """A Repeated-MLM batch and the two ratios it produced.

    Attributes:
        token_ids: int ``(batch, k * L)`` repeated and masked ids.
        padding_mask: int ``(batch, k * L)``.
        labels: signed int ``(batch, k * L)`` (int32, or int64 for wider ids),
            the original id where masked, -1 else.
        unreal_token_ratio: share of real repeated tokens replaced by [MASK]
            (expected ``p``).
        corrupted_semantics_ratio: share of original tokens all of whose ``k``
            copies are masked (expected ``p ** k``).
    """

    token_ids: np.ndarray
    padding_mask: np.ndarray
    labels: np.ndarray
    unreal_token_ratio: float
    corrupted_semantics_ratio: float


def repeated_mlm(
    token_ids,
    padding_mask,
    k,
    mask_rate,
    mask_token_id,
    unselectable_token_ids=(),
    seed=None,
):
    """Repeats every token ``k`` times, then masks each copy at ``mask_rate``.

    Repetition keeps the share of unreal [MASK] tokens at ``p`` while the
    share of tokens whose meaning is lost (every copy masked) falls to
    ``p^k``: the paper's way to tell the two effects apart. Each copy is
    masked independently (so that the share is ``p^k``, not a count per
    row). Unselectable tokens ([CLS], [SEP]) are repeated but never masked.

    Args:
        token_ids: int array ``(batch, L)``.
        padding_mask: 0/1 array ``(batch, L)``.
        k: int >= 1, copies per token.
        mask_rate: float in (0, 1), the per-copy masking probability ``p``.
        mask_token_id: int >= 0.
        unselectable_token_ids: ids never masked.
        seed: int or None.

    Raises:
        ValueError: for an argument of the wrong type or range, naming it.

    Returns:
        A `RepeatedMLMBatch`.

    Example:
    >>> batch = repeated_mlm(np.array([[101, 5, 6, 102]]), np.ones((1, 4)), 2, 0.5, 103,
    ...                      unselectable_token_ids=(101, 102), seed=0)
    >>> batch.token_ids.shape
    (1, 8)
    """
    k = check_int("k", k, minimum=1)
    mask_rate = check_float("mask_rate", mask_rate, 0.0, 1.0, open_minimum=True, open_maximum=True)
    mask_token_id = check_int("mask_token_id", mask_token_id, minimum=0)
    unselectable_token_ids = check_int_list(
        "unselectable_token_ids", unselectable_token_ids, minimum=0
    )
    seed = check_seed("seed", seed)
    token_ids = np.asarray(token_ids)
    padding_mask = np.asarray(padding_mask)
    check_integer_ids("token_ids", token_ids)
    if token_ids.ndim != 2 or token_ids.shape != padding_mask.shape:
        raise ValueError(
            "Expected token_ids of shape (batch, sequence) and a padding_mask of the same "
            f"shape. Received: token_ids.shape={token_ids.shape}, "
            f"padding_mask.shape={padding_mask.shape}."
        )
    check_zero_one("padding_mask", padding_mask)
    if mask_token_id > np.iinfo(token_ids.dtype).max:
        raise ValueError(
            f"Expected a mask_token_id that token_ids' dtype holds. Received: mask_token_id="
            f"{mask_token_id} with token_ids of dtype {token_ids.dtype} (at most "
            f"{np.iinfo(token_ids.dtype).max})."
        )
    padding_mask = padding_mask.astype(bool)
    rng = np.random.default_rng(seed)
    repeated = np.repeat(token_ids, k, axis=1)
    real = np.repeat(padding_mask, k, axis=1)
    maskable = real & ~np.isin(repeated, unselectable_token_ids)
    masked = maskable & (rng.random(repeated.shape) < mask_rate)
    ids = np.where(masked, mask_token_id, repeated)
    # Signed, whatever the ids' dtype (-1 in uint16 labels read as id 65535).
    labels = np.where(masked, repeated.astype("int64"), -1).astype(_signed(token_ids.dtype))
    per_token = masked.reshape(token_ids.shape[0], token_ids.shape[1], k)
    maskable_tokens = maskable.reshape(per_token.shape)[..., 0]
    corrupted = per_token.all(axis=-1) & maskable_tokens
    return RepeatedMLMBatch(
        token_ids=ids.astype(token_ids.dtype),
        padding_mask=real.astype("int32"),
        labels=labels,
        unreal_token_ratio=float(masked.sum() / max(maskable.sum(), 1)),
        corrupted_semantics_ratio=float(corrupted.sum() / max(maskable_tokens.sum(), 1)),
    )


def _signed(dtype):
    """The smallest signed integer dtype of at least 32 bits that holds ``dtype``'s ids and -1."""
    promoted = np.promote_types(dtype, np.int32)
    return promoted if promoted.kind == "i" else np.dtype("int64")
