"""Numeric argument checks: numpy numbers accepted, bools and truncation refused."""

import numpy as np
import pytest

from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list


@pytest.mark.parametrize("value", [3, np.int32(3), np.int64(3)])
def test_integers_of_any_kind_are_accepted(value):
    assert check_int("k", value, minimum=1) == 3
    assert type(check_int("k", value)) is int


@pytest.mark.parametrize(
    "value, message",
    [
        (2.5, r"Expected an integer for k. Received: k=2.5"),
        (3.0, r"Expected an integer for k. Received: k=3.0"),
        (np.float32(2.0), r"Expected an integer for k"),
        (True, r"Expected an integer for k. Received: k=True"),
        ("3", r"Expected an integer for k. Received: k='3'"),
        (None, r"Expected an integer for k. Received: k=None"),
        (0, r"Expected an integer >= 1 for k. Received: k=0"),
        (9, r"Expected an integer <= 8 for k. Received: k=9"),
    ],
)
def test_integers_refused_with_the_name_and_the_value(value, message):
    with pytest.raises(ValueError, match=message):
        check_int("k", value, minimum=1, maximum=8)


@pytest.mark.parametrize("value", [0.25, np.float32(0.25), np.float64(0.25)])
def test_floats_of_any_kind_are_accepted(value):
    assert check_float("rate", value, 0.0, 1.0) == 0.25
    assert check_float("rate", 0, 0.0, 1.0) == 0.0


@pytest.mark.parametrize(
    "value, kwargs, message",
    [
        (1.5, {}, r"Expected rate in \[0.0, 1.0\)\. Received: rate=1.5"),
        (1.0, {}, r"Expected rate in \[0.0, 1.0\)\. Received: rate=1.0"),
        (-0.1, {}, r"Expected rate in \[0.0, 1.0\)"),
        (0.0, {"open_minimum": True}, r"Expected rate in \(0.0, 1.0\)"),
        (float("nan"), {}, r"Expected a number for rate"),
        (False, {}, r"Expected a number for rate. Received: rate=False"),
        ("0.1", {}, r"Expected a number for rate. Received: rate='0.1'"),
        (None, {}, r"Expected a number for rate"),
    ],
)
def test_floats_refused_with_the_interval(value, kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_float("rate", value, 0.0, 1.0, open_maximum=True, **kwargs)


def test_unbounded_sides_read_as_infinities():
    # inf is refused unless allowed: the interval is open there ("(0.0, inf]" read as if it passed).
    with pytest.raises(ValueError, match=r"Expected tau in \[0.0, inf\)"):
        check_float("tau", -1, minimum=0.0)
    with pytest.raises(ValueError, match=r"Expected tau in \(0.0, inf\]"):
        check_float("tau", 0, minimum=0.0, open_minimum=True, allow_infinite=True)
    with pytest.raises(ValueError, match=r"every entry of ids in \[0, inf\)"):
        check_int_list("ids", [1, -1], minimum=0)
    assert check_float("tau", 1e9, minimum=0.0) == 1e9


@pytest.mark.parametrize("value", [float("inf"), -float("inf"), np.float32(np.inf)])
def test_infinities_are_refused_unless_allowed(value):
    with pytest.raises(ValueError, match=r"Expected a finite number for tau\. Received: tau=-?inf"):
        check_float("tau", value, minimum=-float("inf"))
    assert check_float("tau", value, allow_infinite=True) == float(value)


def test_paths_are_str_or_path_like_and_nothing_else():
    import pathlib

    from keras_masking.utils.arguments import check_path

    assert check_path("folder", pathlib.Path("a") / "b") == str(pathlib.Path("a") / "b")
    assert check_path("folder", "a") == "a"
    for value in (None, 3, True, b"a", ["a"]):
        with pytest.raises(TypeError, match=r"Expected a path \(str or os.PathLike\) for folder"):
            check_path("folder", value)
