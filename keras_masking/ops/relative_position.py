"""NEZHA's functional relative position encoding as plain functions.

NEZHA (Wei et al. 2019) adds a fixed sinusoidal embedding of the clipped
relative distance ``j - i`` to the attention logits and to the values
(Shaw et al. 2018 style). One table, shared by every head and layer, not
trained: ``T[p, 2k] = sin(p w_k)``, ``T[p, 2k + 1] = cos(p w_k)``,
``w_k = 10000**(-2k / depth)`` for ``k < depth // 2`` (an odd depth's last
column is 0) and rows ``p = 0 .. 2m`` (the row index itself, as the released
code does), and ``R[i, j] = T[clip(j - i, -m, m) + m]``.
"""

import numpy as np
from keras import ops

from keras_masking.utils.arguments import check_int


def relative_position_table(max_relative_position, depth):
    """Builds NEZHA's ``(2m + 1, depth)`` sinusoidal table in numpy.

    Args:
        max_relative_position: int ``m``; distances are clipped to ``[-m, m]``.
        depth: int. The per-head size.

    Returns:
        A float32 numpy array of shape ``(2 * m + 1, depth)``.

    Example:
    >>> relative_position_table(64, 64).shape
    (129, 64)
    """
    check_int("max_relative_position", max_relative_position, minimum=1)
    rows = np.arange(2 * max_relative_position + 1, dtype=np.float64)[:, None]
    # Pairs k = 0 .. depth // 2 - 1: an odd depth's last column stays 0, as
    # the released code's loop leaves it.
    k = np.arange(0, 2 * (depth // 2), 2, dtype=np.float64)
    angles = rows * np.power(10000.0, -k / depth)[None, :]
    table = np.zeros((rows.shape[0], depth), dtype=np.float64)
    table[:, 0 : 2 * (depth // 2) : 2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table.astype("float32")


def relative_position_buckets(position_ids, max_relative_position):
    """Row indices ``clip(p_j - p_i, -m, m) + m`` into the table.

    Args:
        position_ids: int tensor ``(batch or 1, sequence)``.
        max_relative_position: int ``m``.

    Returns:
        An int32 tensor ``(batch or 1, sequence, sequence)`` indexed
        ``[b, query, key]``.
    """
    positions = ops.cast(position_ids, "int32")
    distance = positions[:, None, :] - positions[:, :, None]
    m = max_relative_position
    return ops.clip(distance, -m, m) + m


def relative_position_embeddings(position_ids, table, max_relative_position):
    """Gathers ``R[b, i, j] = T[clip(p_j - p_i, -m, m) + m]``.

    Args:
        position_ids: int tensor ``(batch or 1, sequence)``.
        table: float tensor ``(2m + 1, depth)`` from
            `relative_position_table`.
        max_relative_position: int ``m``.

    Returns:
        A tensor ``(batch or 1, sequence, sequence, depth)``.
    """
    buckets = relative_position_buckets(position_ids, max_relative_position)
    return ops.take(table, buckets, axis=0)
