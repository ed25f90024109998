"""The embedding-correction formula as plain numpy functions: values and bad input."""

import numpy as np
import pytest

from keras_masking.ops import embedding_correction as ec
from tests.methods.mlm_correction_helpers import numpy_formula

OPS_TABLE = np.random.default_rng(0).normal(size=(6, 3))


OPS_BAD = [
    (lambda: ec.selectable_rows(0), "Expected an integer >= 1 for vocabulary_size"),
    (lambda: ec.selectable_rows(2.5), "Expected an integer for vocabulary_size"),
    (lambda: ec.selectable_rows(True), "Expected an integer for vocabulary_size"),
    (lambda: ec.selectable_rows(6, [6]), r"unselectable_token_ids in \[0, 5\]"),
    (lambda: ec.selectable_rows(6, [1.0]), "Expected a list of integers"),
    (lambda: ec.correction_coefficients(OPS_TABLE[0], 1), r"Received: shape \(3,\)"),
    (lambda: ec.correction_coefficients(np.zeros((0, 3)), 0), r"Received: shape \(0, 3\)"),
    (lambda: ec.correction_coefficients([["a", "b"]], 0), "Expected a numeric"),
    (lambda: ec.correction_coefficients(OPS_TABLE, 6), r"Expected mask_token_id in \[0, 6\)"),
    (lambda: ec.correction_coefficients(OPS_TABLE, 1, mask_rate=-1), "mask_rate"),
    (lambda: ec.correction_coefficients(OPS_TABLE, 1.5), "Expected an integer for mask_token_id"),
    (lambda: ec.selectable_rows(len(OPS_TABLE), unselectable_token_ids=[9]), r"\[9\]"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.0, np.zeros(3), np.ones(6, bool)), "scale"),
    (lambda: ec.apply_correction(OPS_TABLE, np.nan, np.zeros(3), np.ones(6, bool)), "scale"),
    (lambda: ec.apply_correction(OPS_TABLE, True, np.zeros(3), np.ones(6, bool)), "scale"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.9, np.zeros(4), np.ones(6, bool)), r"\(3,\)"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.9, np.zeros(3), np.ones(6)), "bool"),
    (lambda: ec.apply_correction(OPS_TABLE, 0.9, np.zeros(3), np.ones(5, bool)), r"\(6,\)"),
    (lambda: ec.invert_expected_input_embeddings(OPS_TABLE, -1, np.zeros(3), None), "scale"),
    (lambda: ec.validate_masking_rates(0.1, 0.6, 0.6), "random_token_rate <= 1"),
]


@pytest.mark.parametrize("call, message", OPS_BAD)
def test_embedding_correction_ops_bad_input(call, message):
    before = OPS_TABLE.copy()
    with pytest.raises(ValueError, match=message):
        call()
    np.testing.assert_array_equal(OPS_TABLE, before)


def test_embedding_correction_ops_accept_numpy_scalars():
    rates = (np.float32(0.2), np.float16(0.5), np.float32(0.25))
    scale, shift = ec.correction_coefficients(OPS_TABLE, np.int32(1), *rates)
    got = ec.apply_correction(OPS_TABLE, scale, shift, ec.selectable_rows(6, np.array([0])))
    expected = numpy_formula(OPS_TABLE, 1, *map(float, rates), unselectable=[0])
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert got.dtype == np.float64
