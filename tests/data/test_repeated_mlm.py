"""Repeated MLM: ExLM's analysis tool (repeat every token k times, then mask)."""

import numpy as np
import pytest

from keras_masking.data import repeated_mlm
from tests.models.exlm_testing import CLS
from tests.models.exlm_testing import IDS
from tests.models.exlm_testing import MASK
from tests.models.exlm_testing import ONES
from tests.models.exlm_testing import SEP


def test_repeated_mlm_ratios():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (200, 40)).astype("int32")
    ids[:, 0], ids[:, -1] = CLS, SEP
    batch = repeated_mlm(
        ids,
        np.ones_like(ids),
        k=3,
        mask_rate=0.4,
        mask_token_id=MASK,
        unselectable_token_ids=(CLS, SEP),
        seed=1,
    )
    assert batch.token_ids.shape == (200, 120)
    assert abs(batch.unreal_token_ratio - 0.4) < 0.01
    assert abs(batch.corrupted_semantics_ratio - 0.4**3) < 0.01
    assert (batch.token_ids[:, :3] == CLS).all()  # specials repeated, never masked
    restored = np.where(batch.labels >= 0, batch.labels, batch.token_ids)
    np.testing.assert_array_equal(restored, np.repeat(ids, 3, axis=1))
    with pytest.raises(ValueError, match="mask_rate"):
        repeated_mlm(ids, np.ones_like(ids), 2, 1.5, MASK)


def test_numpy_numbers_are_accepted_where_python_numbers_are():
    batch = repeated_mlm(IDS, ONES, np.int64(2), np.float32(0.5), np.int64(MASK), seed=0)
    assert batch.token_ids.shape == (1, 8)


BAD_ARGUMENTS = [
    (lambda: repeated_mlm(IDS, ONES, 2.5, 0.5, MASK), r"integer for k\. Received: k=2\.5"),
    (lambda: repeated_mlm(IDS, ONES, 0, 0.5, MASK), r"k\. Received: k=0"),
    (lambda: repeated_mlm(IDS, ONES, 2, 1.5, MASK), r"mask_rate in \(0\.0, 1\.0\)"),
    (lambda: repeated_mlm(IDS, ONES, 2, "0.5", MASK), r"number for mask_rate"),
    (lambda: repeated_mlm(IDS, ONES, 2, 0.5, -1), r">= 0 for mask_token_id"),
    (
        lambda: repeated_mlm(IDS, ONES, 2, 0.5, MASK, 5),
        r"list of integers for unselectable_token_ids",
    ),
    (lambda: repeated_mlm(IDS * 1.5, ONES, 2, 0.5, MASK), r"Expected integer token_ids"),
    (lambda: repeated_mlm(IDS[0], ONES[0], 2, 0.5, MASK), r"shape \(batch, sequence\)"),
    (lambda: repeated_mlm(IDS, ONES[:, :3], 2, 0.5, MASK), r"padding_mask of the same shape"),
    (lambda: repeated_mlm(IDS, ONES * 2, 2, 0.5, MASK), r"padding_mask of 0s and 1s"),
    (lambda: repeated_mlm(IDS, ONES, 2, 0.5, MASK, seed=0.5), r"integer for seed"),
    (
        lambda: repeated_mlm(IDS.astype("int8"), ONES, 2, 0.5, 200),
        r"mask_token_id that token_ids' dtype holds.*mask_token_id=200.*int8 \(at most 127\)",
    ),
]


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int16", "int32", "int64"])
def test_labels_are_signed_whatever_the_ids_dtype(dtype):
    """uint16 ids (a common storage type) gave labels of 65535, not -1, where
    nothing was masked: a loss ignoring -1 trained on every position."""
    expected = repeated_mlm(IDS.astype("int64"), ONES, 2, 0.5, MASK, seed=0)
    batch = repeated_mlm(IDS.astype(dtype), ONES, 2, 0.5, MASK, seed=0)
    assert batch.labels.dtype.kind == "i" and batch.labels.dtype.itemsize >= 4
    np.testing.assert_array_equal(batch.labels, expected.labels)
    assert (batch.labels == -1).any() and (batch.labels >= 0).any()
    assert batch.token_ids.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(batch.token_ids, expected.token_ids)


@pytest.mark.parametrize("make, match", BAD_ARGUMENTS)
def test_bad_arguments_are_refused_with_a_clear_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()
