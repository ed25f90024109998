"""The call-context reading behind the backbone's caller record."""

import keras
import numpy as np

import keras_masking
from tests.testing import random_features
from tests.testing import tiny_backbone_kwargs


def test_a_backbone_predict_leaves_no_training_flag_for_later_calls():
    # JAX runs `call` through `stateless_call` with no call context open; the
    # backbone's caller record once opened one there and never closed it, so
    # after any later `fit` every eager call in the process ran dropout.
    backbone = keras_masking.models.TransformerBackbone(**tiny_backbone_kwargs())
    backbone.predict(random_features(), verbose=0)
    assert keras_masking.utils.outermost_caller() is None
    assert list(backbone.callers) == [backbone]
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dropout(0.5)(keras.layers.Dense(2)(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 2)), verbose=0)
    ones = keras.ops.ones((3, 8))
    dropped = keras.layers.Dropout(0.5, seed=1)(ones)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dropped), np.ones((3, 8)))
