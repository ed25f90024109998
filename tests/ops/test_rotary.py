"""Rotary position encodings (1D split and interleaved, 2D) against formulas and keras-hub."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_masking.ops import apply_interleaved_rotary
from keras_masking.ops import apply_split_rotary
from keras_masking.ops import rotary_inverse_frequencies
from keras_masking.ops.rotary import apply_rotary_2d


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


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
    actual = to_numpy(keras.ops.cast(half, "float32"))
    np.testing.assert_allclose(actual, expected, atol=0.03)


def test_2d_rope_reduces_to_1d_rope_when_the_copy_index_is_zero():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 3, 8)).astype("float32")
    pos1 = rng.integers(0, 50, (2, 6)).astype("int32")
    zero = np.stack([pos1, np.zeros_like(pos1)], -1)
    got = to_numpy(apply_rotary_2d(x, zero))
    want = np.concatenate([to_numpy(apply_split_rotary(x[..., :4], pos1)), x[..., 4:]], -1)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(to_numpy(apply_rotary_2d(x, pos1)), want, atol=1e-6)
    # Relative: q.k depends on position differences only, in both dimensions.
    both = np.stack([pos1, rng.integers(0, 5, (2, 6))], -1).astype("int32")
    shifted = both + np.array([7, 3], "int32")
    q, k = x, rng.normal(size=x.shape).astype("float32")

    def logits(positions):
        return np.einsum(
            "bqhd,bkhd->bhqk",
            to_numpy(apply_rotary_2d(q, positions)),
            to_numpy(apply_rotary_2d(k, positions)),
        )

    np.testing.assert_allclose(logits(both), logits(shifted), atol=1e-4)
    assert np.abs(logits(both) - logits(zero)).max() > 1e-3
