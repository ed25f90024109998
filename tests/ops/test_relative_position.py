"""Relative position tables and buckets against independent formulas."""

import numpy as np

from keras_masking.ops import relative_position_buckets
from keras_masking.ops import relative_position_embeddings
from keras_masking.ops import relative_position_table


def test_relative_table_and_clipping():
    table = relative_position_table(3, 6)
    assert table.shape == (7, 6)
    for p in range(7):
        for k in range(3):
            w = 10000.0 ** (-2 * k / 6)
            assert np.isclose(table[p, 2 * k], np.sin(p * w), atol=1e-6)
            assert np.isclose(table[p, 2 * k + 1], np.cos(p * w), atol=1e-6)
    positions = np.array([[0, 1, 2, 9]], "int32")
    relative = np.asarray(relative_position_embeddings(positions, table, 3))
    assert relative.shape == (1, 4, 4, 6)
    np.testing.assert_allclose(relative[0, 0, 3], table[6])  # 9 - 0 clipped to +3
    np.testing.assert_allclose(relative[0, 3, 0], table[0])  # 0 - 9 clipped to -3
    np.testing.assert_allclose(relative[0, 1, 2], table[4])  # +1
    np.testing.assert_allclose(relative[0, 2, 2], table[3])  # 0


def test_an_odd_head_size_leaves_the_last_column_zero_as_the_released_code():
    """NEZHA's loop fills pairs ``i < depth // 2``: head size 9's ninth column
    stays 0 (it held sin(p w_4), 1.5e-3 on a tiny model's outputs)."""
    table = relative_position_table(3, 9)
    expected = np.zeros((7, 9))
    for p in range(7):
        for i in range(9 // 2):  # the released code's loop
            w = 10000.0 ** (-2 * i / 9)
            expected[p, 2 * i], expected[p, 2 * i + 1] = np.sin(p * w), np.cos(p * w)
    np.testing.assert_allclose(table, expected, atol=1e-6)
    assert not table[:, 8].any()


def test_relative_position_buckets_clip_each_distance():
    positions = np.array([[0, 1, 2, 9], [5, 5, 0, 3]], "int32")
    buckets = np.asarray(relative_position_buckets(positions, 3))
    expected = np.clip(positions[:, None, :] - positions[:, :, None], -3, 3) + 3
    np.testing.assert_array_equal(buckets, expected)
    assert buckets[0, 0, 3] == 6 and buckets[0, 3, 0] == 0 and buckets[1, 0, 1] == 3
