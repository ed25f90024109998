"""Position-encoding maths against independent formulas and keras-hub."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_masking.ops import apply_interleaved_rotary
from keras_masking.ops import apply_split_rotary
from keras_masking.ops import padding_mask_to_bias
from keras_masking.ops import relative_position_buckets
from keras_masking.ops import relative_position_embeddings
from keras_masking.ops import relative_position_table
from keras_masking.ops import rotary_inverse_frequencies


def test_interleaved_rotary_rotates_each_pair():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3, 8)).astype("float32")
    positions = np.array([[0, 1, 2, 3, 4], [7, 3, 9, 0, 2]], "int32")
    actual = np.asarray(apply_interleaved_rotary(x, positions))
    expected = np.empty_like(x)
    for b in range(2):
        for s in range(5):
            for i in range(4):
                angle = positions[b, s] * 10000.0 ** (-2 * i / 8)
                c, n = np.cos(angle), np.sin(angle)
                even, odd = x[b, s, :, 2 * i], x[b, s, :, 2 * i + 1]
                expected[b, s, :, 2 * i] = even * c - odd * n
                expected[b, s, :, 2 * i + 1] = odd * c + even * n
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_split_rotary_matches_keras_hub_rotary_embedding():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, 3, 8)).astype("float32")
    reference = keras_hub.layers.RotaryEmbedding(max_wavelength=10000)(x)
    ours = apply_split_rotary(x, np.arange(6)[None])
    np.testing.assert_allclose(ours, reference, atol=1e-5)


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


def test_padding_mask_to_bias():
    bias = np.asarray(padding_mask_to_bias(np.array([[1, 1, 0]])))
    assert bias.shape == (1, 1, 1, 3)
    np.testing.assert_array_equal(bias[0, 0, 0], [0.0, 0.0, -1e9])
    half = padding_mask_to_bias(np.array([[1, 0]]), "float16")
    assert keras.ops.convert_to_numpy(half)[0, 0, 0, 1] == np.float16(-3e4)


def test_relative_position_buckets_clip_each_distance():
    positions = np.array([[0, 1, 2, 9], [5, 5, 0, 3]], "int32")
    buckets = np.asarray(relative_position_buckets(positions, 3))
    expected = np.clip(positions[:, None, :] - positions[:, :, None], -3, 3) + 3
    np.testing.assert_array_equal(buckets, expected)
    assert buckets[0, 0, 3] == 6 and buckets[0, 3, 0] == 0 and buckets[1, 0, 1] == 3


def test_rotary_inverse_frequencies_and_odd_depth():
    np.testing.assert_allclose(
        np.asarray(rotary_inverse_frequencies(6, base=100.0)),
        [1.0, 100.0 ** (-2 / 6), 100.0 ** (-4 / 6)],
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="even depth"):
        rotary_inverse_frequencies(5)


def test_rotary_keeps_the_input_dtype_with_float32_angles():
    """A bfloat16 input is rotated by float32 angles: at position 1000 the
    angle in bfloat16 would be off by whole radians."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 2, 1, 8)).astype("float32")
    positions = np.array([[1000, 1001]], "int32")
    expected = np.asarray(apply_interleaved_rotary(x, positions))
    half = apply_interleaved_rotary(keras.ops.cast(x, "bfloat16"), positions)
    assert keras.backend.standardize_dtype(half.dtype) == "bfloat16"
    actual = keras.ops.convert_to_numpy(keras.ops.cast(half, "float32"))
    np.testing.assert_allclose(actual, expected, atol=0.03)
