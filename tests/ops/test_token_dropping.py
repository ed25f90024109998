"""Token-dropping ops: keep lengths, keep masks, gathers and restores."""

import numpy as np
import pytest

from keras_masking.ops.token_dropping import batched_gather
from keras_masking.ops.token_dropping import kept_indices
from keras_masking.ops.token_dropping import restore_full_length
from keras_masking.ops.token_dropping import sample_keep_mask
from keras_masking.ops.token_dropping import static_keep_length
from tests.drop_token_cases import NOISE
from tests.drop_token_cases import REAL
from tests.drop_token_cases import ROUNDING
from tests.drop_token_cases import _numpy
from tests.drop_token_cases import _raises


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((-1, 0.1), r"integer >= 0 for sequence_length\. Received: sequence_length=-1"),
        ((8.5, 0.1), r"Expected an integer for sequence_length\. Received: sequence_length=8\.5"),
        ((True, 0.1), r"Expected an integer for sequence_length\. Received: sequence_length=True"),
        ((8, 1.0), r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.0"),
        ((8, float("nan")), r"Expected a number for rate\. Received: rate=nan"),
        ((8, 0.1, 0), r"integer >= 1 for multiple\. Received: multiple=0"),
        ((8, 0.1, 2.5), r"Expected an integer for multiple\. Received: multiple=2\.5"),
        ((8, 0.1, 1, -1), r"integer >= 0 for minimum\. Received: minimum=-1"),
    ],
)
def test_static_keep_length_bad_input(args, pattern):
    _raises(pattern, static_keep_length, *args)


def test_static_keep_length_values():
    # L - floor(rate L), rounded up to the multiple, at least the minimum, at most L.
    for length, rate, multiple, minimum in [(512, 0.1, 1, 0), (512, 0.1, 8, 0), (12, 0.1, 8, 0)]:
        kept = length - int(np.floor(rate * length))
        expected = min(max(-(-kept // multiple) * multiple, minimum), length)
        assert static_keep_length(length, rate, multiple, minimum) == expected
    assert static_keep_length(10, 0.9, 1, 6) == 6
    assert static_keep_length(10, 0.9, 1, 60) == 10
    assert static_keep_length(0, 0.5) == 0


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((REAL, REAL, 1.0, 2, NOISE, ROUNDING), r"Expected rate in \[0\.0, 1\.0\)"),
        ((REAL, REAL, 0.5, 2.5, NOISE, ROUNDING), r"integer for keep_length\. .*=2\.5"),
        ((REAL, REAL, 0.5, -1, NOISE, ROUNDING), r"integer >= 0 for keep_length\. .*=-1"),
        ((REAL[0], REAL, 0.5, 2, NOISE, ROUNDING), r"Expected real of rank 2\. .*\(4,\)"),
        ((REAL, REAL, 0.5, 2, NOISE[:, :3], ROUNDING), r"Expected matching \(batch, sequence\)"),
        ((REAL, REAL, 0.5, 2, NOISE, ROUNDING[:1]), r"Expected matching \(batch, sequence\)"),
    ],
)
def test_sample_keep_mask_bad_input(args, pattern):
    _raises(pattern, sample_keep_mask, *args)


def test_sample_keep_mask_values():
    """A hand example of the rule, row by row."""
    real = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    protected = np.array([[1, 0, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]], bool)
    noise = np.array([[0.0, 0.5, 0.1, 0.9, 0.3, 0.0]] * 3, "float32")
    rounding = np.array([0.6, 0.0, 0.0], "float32")
    keep = _numpy(sample_keep_mask(real, real & ~protected, 0.5, 4, noise, rounding))
    # Row 0: 4 droppable, floor(2 + 0.6) = 2 dropped, lowest noise first (2, 4).
    # Row 1: 1 droppable, kept (one is kept and the 4 slots have room).
    # Row 2: 4 protected fill the 4 slots: both droppable tokens go.
    np.testing.assert_array_equal(
        keep, [[1, 1, 0, 1, 0, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]]
    )


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((np.ones((2, 4, 1), bool), 2), r"Expected keep of rank 2\. .*\(2, 4, 1\)"),
        ((np.ones((2, 4), bool), 5), r"integer <= 4 for keep_length\. Received: keep_length=5"),
        ((np.ones((2, 4), bool), 2.0), r"Expected an integer for keep_length\. .*=2\.0"),
    ],
)
def test_kept_indices_bad_input(args, pattern):
    _raises(pattern, kept_indices, *args)


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((np.ones((4,)), np.zeros((2, 2), "int32")), r"Expected values of rank >= 2\. .*\(4,\)"),
        ((np.ones((2, 4)), np.zeros((2,), "int32")), r"Expected indices of rank 2\. .*\(2,\)"),
        ((np.ones((2, 4)), np.zeros((3, 2), "int32")), r"Expected matching \(batch, sequence\)"),
        ((np.ones((2, 4)), np.array([[0, 4], [1, 2]], "int32")), r"indices in \[0, 4\) .*\[4\]"),
        ((np.ones((2, 4)), np.zeros((2, 2), "float32")), r"Expected integer indices\. .*float32"),
    ],
)
def test_batched_gather_bad_input(args, pattern):
    _raises(pattern, batched_gather, *args)


@pytest.mark.parametrize(
    "args, pattern",
    [
        ((np.ones((2,)), np.ones((2, 4), bool)), r"Expected kept_values of rank >= 2"),
        ((np.ones((2, 2, 1)), np.ones((4,), bool)), r"Expected keep of rank 2"),
        ((np.ones((2, 2, 1)), np.ones((3, 4), bool)), r"Expected matching \(batch, sequence\)"),
        (
            (np.ones((2, 2, 1)), np.ones((2, 4), bool)),
            r"Received: a keep row that keeps 4 tokens, kept_values with 2 slots",
        ),
    ],
)
def test_restore_full_length_bad_input(args, pattern):
    _raises(pattern, restore_full_length, *args)
