"""`select_tokens` against a brute-force selection, row by row."""

import math

import keras
import numpy as np
import pytest

from keras_masking.ops import select_tokens


def brute_force(selectable, rate, noise, rounding=None, min_count=0, max_count=None):
    """Each row by hand: count, round, bound, then the lowest scores in order."""
    chosen = np.zeros(selectable.shape, bool)
    for row in range(selectable.shape[0]):
        candidates = [j for j in range(selectable.shape[1]) if selectable[row, j]]
        n = len(candidates)
        exact = np.float32(rate) * np.float32(n)
        if rounding is None:
            count = int(np.round(exact))  # half to even
        else:
            count = math.floor(np.float32(exact + np.float32(rounding[row])))
        if max_count is not None:
            count = min(count, int(np.broadcast_to(max_count, selectable.shape[:1])[row]))
        count = max(count, min(int(np.broadcast_to(min_count, selectable.shape[:1])[row]), n))
        # Lowest scores first; equal scores: the earlier token.
        for j in sorted(candidates, key=lambda j: (noise[row, j], j))[: max(count, 0)]:
            chosen[row, j] = True
    return chosen


def _select(*args, **kwargs):
    return keras.ops.convert_to_numpy(select_tokens(*args, **kwargs))


@pytest.mark.parametrize("stochastic", [False, True])
def test_equals_brute_force_on_random_rows(stochastic):
    rng = np.random.default_rng(0)
    for trial in range(40):
        batch, length = 4, int(rng.integers(1, 24))
        real = rng.random((batch, length)) < 0.8
        selectable = real & (rng.random((batch, length)) < 0.8)
        noise = rng.random((batch, length)).astype("float32")
        if trial % 2:
            noise = (np.floor(noise * 4) / 4).astype("float32")  # many equal scores
        rounding = rng.random(batch).astype("float32") if stochastic else None
        rate = float(rng.choice([0.0, 0.1, 0.15, 0.5, 0.9, rng.random()]))
        bounds = dict(min_count=int(rng.integers(0, 3)), max_count=int(rng.integers(1, 9)))
        if trial % 3 == 0:
            bounds = {}
        got = _select(selectable, rate, noise, rounding, **bounds)
        np.testing.assert_array_equal(
            got, brute_force(selectable, rate, noise, rounding, **bounds), err_msg=str(trial)
        )
        assert not (got & ~selectable).any()  # padding and unselectable ids: never


def test_the_count_per_row_follows_the_rounding_rule():
    selectable = np.ones((6, 10), bool)
    selectable[1, 5:] = False  # 5 selectable: 0.5 * 5 = 2.5 rounds to 2 (half to even)
    selectable[2, 7:] = False  # 7: 3.5 rounds to 4
    selectable[3] = False  # none: nothing, whatever min_count
    noise = np.random.default_rng(1).random((6, 10)).astype("float32")
    counts = _select(selectable, 0.5, noise, min_count=1).sum(axis=1)
    assert counts.tolist() == [5, 2, 4, 0, 5, 5]
    assert _select(selectable, 0.5, noise, max_count=3).sum(axis=1).tolist() == [3, 2, 3, 0, 3, 3]
    # Stochastic rounding: floor(rate * n + u).
    rounding = np.array([0.0, 0.49, 0.51, 0.9, 0.99, 0.5], "float32")
    counts = _select(selectable, 0.5, noise, rounding).sum(axis=1)
    assert counts.tolist() == [5, 2, 4, 0, 5, 5]
    # The lower bound wins over the upper one, and counts per row may be tensors.
    both = _select(selectable, 0.1, noise, min_count=np.array([4.0] * 6), max_count=2)
    assert both.sum(axis=1).tolist() == [4, 4, 4, 0, 4, 4]


def test_the_lowest_scores_are_chosen_in_a_compiled_call():
    selectable = np.array([[False, True, True, True, True, False, True, True]])
    noise = np.array([[0.0, 0.7, 0.2, 0.9, 0.1, 0.0, 0.2, 0.8]], "float32")
    if keras.config.backend() == "jax":
        import jax

        compiled = jax.jit(lambda s, n: select_tokens(s, 0.5, n))
    else:
        import tensorflow as tf

        compiled = tf.function(lambda s, n: select_tokens(s, 0.5, n), jit_compile=True)
    got = keras.ops.convert_to_numpy(compiled(selectable, noise))
    # 6 selectable: 3 chosen, the scores 0.1, 0.2 (position 2) and 0.2 (position 6).
    assert got.tolist() == [[False, False, True, False, True, False, True, False]]


def test_tensorflow_operations_give_the_same_selection_under_any_backend():
    import tensorflow as tf

    from keras_masking.data.text_shards import _tensorflow_ops

    rng = np.random.default_rng(2)
    selectable = rng.random((5, 16)) < 0.7
    noise = rng.random((5, 16)).astype("float32")
    expected = _select(selectable, 0.15, noise, min_count=1, max_count=3)
    got = select_tokens(
        tf.constant(selectable),
        0.15,
        tf.constant(noise),
        min_count=1,
        max_count=3,
        backend_ops=_tensorflow_ops(),
    )
    np.testing.assert_array_equal(got.numpy(), expected)
