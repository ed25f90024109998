"""ExLM's analysis tool: Repeated MLM (repeat every token k times, then mask)."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RepeatedMLMBatch:
    """A Repeated-MLM batch and the two ratios it produced.

    Attributes:
        token_ids: int ``(batch, k * L)`` repeated and masked ids.
        padding_mask: int ``(batch, k * L)``.
        labels: int ``(batch, k * L)``, the original id where masked, -1 else.
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
    token_ids, padding_mask, k, mask_rate, mask_token_id, special_token_ids=(), seed=None
):
    """Repeats every token ``k`` times, then masks each copy at ``mask_rate``.

    Repetition keeps the share of unreal [MASK] tokens at ``p`` while the
    share of tokens whose meaning is lost (every copy masked) falls to
    ``p^k``: the paper's way to tell the two effects apart. Special tokens
    are repeated but never masked.

    Args:
        token_ids: int array ``(batch, L)``.
        padding_mask: 0/1 array ``(batch, L)``.
        k: int >= 1, copies per token.
        mask_rate: float in (0, 1), the per-copy masking probability ``p``.
        mask_token_id: int.
        special_token_ids: ids never masked.
        seed: int or None.

    Returns:
        A `RepeatedMLMBatch`.

    Example:
    >>> batch = repeated_mlm(np.array([[101, 5, 6, 102]]), np.ones((1, 4)), 2, 0.5, 103,
    ...                      special_token_ids=(101, 102), seed=0)
    >>> batch.token_ids.shape
    (1, 8)
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"`k` must be a positive integer. Received: k={k!r}")
    if not 0 < mask_rate < 1:
        raise ValueError(f"`mask_rate` must be in (0, 1). Received: {mask_rate}")
    token_ids = np.asarray(token_ids)
    padding_mask = np.asarray(padding_mask).astype(bool)
    if token_ids.shape != padding_mask.shape:
        raise ValueError(
            f"token_ids {token_ids.shape} and padding_mask {padding_mask.shape} differ in shape."
        )
    rng = np.random.default_rng(seed)
    repeated = np.repeat(token_ids, k, axis=1)
    real = np.repeat(padding_mask, k, axis=1)
    maskable = real & ~np.isin(repeated, special_token_ids)
    masked = maskable & (rng.random(repeated.shape) < mask_rate)
    ids = np.where(masked, mask_token_id, repeated)
    labels = np.where(masked, repeated, -1)
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
