"""Attention masks: a padding mask as an additive bias."""

import keras
import numpy as np

from keras_masking.ops import padding_mask_to_bias


def test_padding_mask_to_bias():
    bias = np.asarray(padding_mask_to_bias(np.array([[1, 1, 0]])))
    assert bias.shape == (1, 1, 1, 3)
    np.testing.assert_array_equal(bias[0, 0, 0], [0.0, 0.0, -1e9])
    half = padding_mask_to_bias(np.array([[1, 0]]), "float16")
    assert keras.ops.convert_to_numpy(half)[0, 0, 0, 1] == np.float16(-3e4)
