"""ExLM's DAG loss against brute-force path enumeration and a naive loop's autodiff.

Bad-input cases tried here, per entry point (`test_bad_input_*`): dag_loss 18,
dag_alignment_posterior 4, DAGLoss 5, dag_alignment_feasible 5. Lengths that a
compiled call cannot check give NaN (`test_invalid_lengths_in_a_compiled_call_give_nan`).
"""

import itertools
import sys

import keras
import numpy as np
import pytest
from keras import ops

from keras_masking.losses import DAGLoss
from keras_masking.losses import dag_alignment_feasible
from keras_masking.losses import dag_alignment_posterior
from keras_masking.losses import dag_loss
from tests.testing import value_and_gradients

dag_module = sys.modules["keras_masking.losses.dag_loss"]


def _random_graph(batch, steps, vertices, seed, scale=2.0):
    rng = np.random.default_rng(seed)
    match = (rng.normal(size=(batch, steps, vertices)) * scale).astype("float32")
    edges = rng.normal(size=(batch, vertices, vertices)).astype("float32")
    upper = np.triu(np.ones((vertices, vertices)), 1) > 0
    edges = np.where(upper, edges, -np.inf).astype("float32")
    return match, edges


def _paths(n, t):
    if t == 1:
        return [(0,)] if n == 1 else []
    return [(0, *middle, n - 1) for middle in itertools.combinations(range(1, n - 1), t - 2)]


def _path_scores(match, edges, b, paths):
    return np.array(
        [
            sum(np.float64(match[b, i, a]) for i, a in enumerate(p))
            + sum(np.float64(edges[b, p[i - 1], p[i]]) for i in range(1, len(p)))
            for p in paths
        ],
        "float64",
    )


def _brute_force(match, edges, output_length, target_length):
    result = []
    for b, (n, t) in enumerate(zip(output_length, target_length)):
        paths = _paths(n, t)
        scores = _path_scores(match, edges, b, paths)
        result.append(np.logaddexp.reduce(scores) if paths else 0.0)
    return np.array(result)


def _brute_force_gradients(match, edges, output_length, target_length, weights):
    """d/d(match, edges) of sum_b weights[b] log P(Y_b): path posteriors per cell and edge."""
    d_match = np.zeros(match.shape)
    d_edges = np.zeros(edges.shape)
    for b, (n, t) in enumerate(zip(output_length, target_length)):
        paths = _paths(n, t)
        if not paths:
            continue
        scores = _path_scores(match, edges, b, paths)
        posterior = np.exp(scores - np.logaddexp.reduce(scores))
        for path, p in zip(paths, posterior):
            for i, a in enumerate(path):
                d_match[b, i, a] += weights[b] * p
                if i:
                    d_edges[b, path[i - 1], a] += weights[b] * p
    return d_match, d_edges


def _naive_log_space(match, edges, output_length, target_length):
    """The textbook recursion in log space, one logsumexp per step."""
    steps, vertices = match.shape[1], match.shape[2]
    u = ops.arange(vertices)
    alpha = ops.where(u[None] == 0, match[:, 0, :], -1e30)
    finals = []
    for i in range(steps):
        if i:
            alpha = ops.logsumexp(alpha[:, :, None] + edges, axis=1) + match[:, i, :]
        finals.append(ops.sum(ops.where(u[None] == output_length[:, None] - 1, alpha, 0.0), 1))
    finals = ops.stack(finals, axis=1)
    pick = ops.one_hot(target_length - 1, steps)
    return ops.sum(finals * pick, axis=1)


def _gradients(function, match, edges):
    match, edges = ops.convert_to_tensor(match), ops.convert_to_tensor(edges)
    if keras.config.backend() == "jax":
        import jax

        def total(m, e):
            return ops.sum(function(m, e) * ops.arange(1, m.shape[0] + 1, dtype="float32"))

        return [np.asarray(g) for g in jax.grad(total, argnums=(0, 1))(match, edges)]
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch([match, edges])
        value = function(match, edges)
        total = tf.reduce_sum(value * tf.range(1, match.shape[0] + 1, dtype=tf.float32))
    return [np.asarray(g) for g in tape.gradient(total, [match, edges])]


def _compile(function):
    if keras.config.backend() == "jax":
        import jax

        return jax.jit(function)
    import tensorflow as tf

    return tf.function(function, jit_compile=True)


def _compiled_value_and_gradients(fn):
    """A compiled (XLA) ``(match, edges, *rest) -> (fn(...), d/dmatch, d/dedges)``."""
    if keras.config.backend() == "jax":
        import jax

        step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))

        def run(*args):
            value, grads = step(*args)
            return float(value), *(np.asarray(g) for g in grads)

        return run
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def step(match, edges, *rest):
        with tf.GradientTape() as tape:
            tape.watch([match, edges])
            value = fn(match, edges, *rest)
        return value, tape.gradient(value, [match, edges])

    def run(*args):
        value, grads = step(*(tf.convert_to_tensor(a) for a in args))
        return float(value), *(np.asarray(g) for g in grads)

    return run


RAGGED = dict(
    output_length=np.array([7, 5, 6, 4], "int32"), target_length=np.array([4, 3, 1, 4], "int32")
)


def test_equals_brute_force_enumeration_on_ragged_graphs():
    match, edges = _random_graph(4, 4, 7, seed=0)
    match[2, 0, 0] = 0.3  # target_length 1 needs output_length 1: impossible here -> 0
    got = np.asarray(dag_loss(match, edges, **RAGGED))
    expected = _brute_force(match, edges, RAGGED["output_length"], RAGGED["target_length"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert got[2] == 0.0
    one = dag_loss(match[:, :1, :1], edges[:, :1, :1], np.ones(4, "int32"), np.ones(4, "int32"))
    np.testing.assert_allclose(np.asarray(one), match[:, 0, 0], rtol=1e-6)


def test_alignment_posterior_equals_brute_force_marginals():
    match, edges = _random_graph(4, 4, 7, seed=3)
    got = np.asarray(keras.ops.convert_to_numpy(dag_alignment_posterior(match, edges, **RAGGED)))
    expected, _ = _brute_force_gradients(
        match, edges, RAGGED["output_length"], RAGGED["target_length"], np.ones(4)
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # Impossible (row 2: one target, six vertices) is all zeros; valid rows sum to 1.
    for b, t in enumerate(RAGGED["target_length"]):
        np.testing.assert_allclose(
            got[b].sum(axis=1), [1.0 if t >= 2 and i < t else 0.0 for i in range(4)], atol=1e-5
        )


def test_gradient_equals_autodiff_of_the_naive_loop():
    match, edges = _random_graph(3, 5, 8, seed=1)
    lengths = dict(
        output_length=np.array([8, 6, 5], "int32"), target_length=np.array([5, 4, 5], "int32")
    )
    naive_edges = np.where(np.isfinite(edges), edges, -1e30).astype("float32")
    expected_value = _brute_force(match, edges, lengths["output_length"], lengths["target_length"])
    naive_value = np.asarray(
        _naive_log_space(
            ops.convert_to_tensor(match),
            ops.convert_to_tensor(naive_edges),
            ops.convert_to_tensor(lengths["output_length"]),
            ops.convert_to_tensor(lengths["target_length"]),
        )
    )
    np.testing.assert_allclose(naive_value, expected_value, rtol=1e-5)

    got = _gradients(lambda m, e: dag_loss(m, e, **lengths), match, edges)
    want = _gradients(
        lambda m, e: _naive_log_space(
            m,
            e,
            ops.convert_to_tensor(lengths["output_length"]),
            ops.convert_to_tensor(lengths["target_length"]),
        ),
        match,
        naive_edges,
    )
    np.testing.assert_allclose(got[0], want[0], atol=2e-5)
    finite = np.isfinite(edges)
    np.testing.assert_allclose(got[1][finite], want[1][finite], atol=2e-5)
    assert np.all(got[1][~finite] == 0)


# === Scores thousands of nats apart ===
DEFICIT_LENGTHS = dict(
    output_length=np.array([8, 7, 8], "int32"), target_length=np.array([5, 4, 5], "int32")
)


def _deficit_graph(seed, kind):
    """Log-probs with deficits of 1,000-4,000 nats, different at every step and vertex.

    Two random paths (and the paths that mix their cells) carry no deficit,
    so several paths share the top and the logsumexp is more than a max; a
    decoy cell at step 2 scores +2,000 (the step's strongest score, 2,000
    nats above the best live path) but is only reachable through a cell
    20,000 nats down. ``kind``:

    * ``"emission"``: the free cells score a few nats;
    * ``"large_total"``: the two paths also carry deficits of thousands
      (whole numbers, a total tie), so log P(Y) is about -8,000;
    * ``"edges"``: the edges off the two paths are 1,000-4,000 nats down too.
    """
    rng = np.random.default_rng(seed)
    batch, steps, vertices = 3, 5, 8
    match = np.round(rng.normal(size=(batch, steps, vertices)) * 0.5 * 256) / 256
    edges = np.round(rng.normal(size=(batch, vertices, vertices)) * 256) / 256
    deficit = np.round(rng.uniform(1000, 4000, size=(batch, steps, vertices)))
    edge_deficit = np.round(rng.uniform(1000, 4000, size=(batch, vertices, vertices)))
    for b, (n, t) in enumerate(
        zip(DEFICIT_LENGTHS["output_length"], DEFICIT_LENGTHS["target_length"])
    ):
        paths = [p for p in _paths(n, t) if p[1] >= 2]  # off the decoy's only way in
        chosen = [paths[k] for k in rng.choice(len(paths), size=2, replace=False)]
        for path in chosen:
            for i, a in enumerate(path):
                deficit[b, i, a] = 0.0
                if i:
                    edge_deficit[b, path[i - 1], a] = 0.0
        if kind == "large_total":  # both paths lose the same total, differently per step
            for path in chosen:
                for i, a in enumerate(path):
                    deficit[b, i, a] = np.round(rng.uniform(1000, 3000))
            totals = [sum(deficit[b, i, a] for i, a in enumerate(p)) for p in chosen]
            low = int(np.argmin(totals))
            other = set(enumerate(chosen[1 - low]))
            cell = next(c for c in enumerate(chosen[low]) if c not in other)
            deficit[(b, *cell)] += abs(totals[0] - totals[1])
        deficit[b, 1, 1] = 20_000.0
        match[b, 2, 2] = 2000.0 + deficit[b, 2, 2]  # the decoy
    match = match - deficit
    if kind == "edges":
        edges = edges - edge_deficit
    upper = np.triu(np.ones((vertices, vertices)), 1) > 0
    edges = np.where(upper[None], edges, -np.inf)
    return match.astype("float32"), edges.astype("float32")


@pytest.mark.parametrize("kind", ["emission", "large_total", "edges"])
@pytest.mark.parametrize("seed", [0, 1])
def test_deficits_that_differ_per_step_and_vertex_equal_brute_force(kind, seed):
    match, edges = _deficit_graph(seed, kind)
    n, t = DEFICIT_LENGTHS["output_length"], DEFICIT_LENGTHS["target_length"]
    expected = _brute_force(match, edges, n, t)
    # The decoy is its step's strongest score, over 1,000 nats above any other.
    for b in range(3):
        assert match[b, 2, 2] - np.sort(match[b, 2])[-2] > 1000
    weights = np.array([1.0, -2.0, 0.5])
    value, (d_match, d_edges) = value_and_gradients(
        lambda m, e: ops.sum(dag_loss(m, e, n, t) * weights), [match, edges]
    )
    got = np.asarray(dag_loss(match, edges, n, t))
    want_match, want_edges = _brute_force_gradients(match, edges, n, t, weights)
    # float32 resolves a log-likelihood of -8,000 to about 5e-4 nats.
    atol = 2e-3 if kind == "large_total" else 2e-5
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=atol)
    np.testing.assert_allclose(value, float(np.dot(expected, weights)), rtol=1e-6, atol=atol)
    np.testing.assert_allclose(d_match, want_match, atol=atol)
    finite = np.isfinite(edges)
    np.testing.assert_allclose(d_edges[finite], want_edges[finite], atol=atol)
    assert np.all(d_edges[~finite] == 0)
    # Several paths share the top: each target's posterior is split.
    assert np.sum((want_match[0] > 0.01) & (want_match[0] < 0.99)) >= 2
    assert np.asarray(dag_alignment_feasible(n, t)).all()


def test_example_of_the_issue_a_live_path_far_below_the_strongest_score():
    """Step 1's strongest cell (vertex 1) leads into an edge 5,000 nats down;
    the true alignment goes through a cell 2,000 nats below it. (Padded to the
    shapes of the other tests: 5 vertices and 4 targets are used.)"""
    match = np.full((3, 5, 8), -10_000.0, "float32")
    edges = np.where(np.triu(np.ones((8, 8)), 1) > 0, 0.0, -np.inf).astype("float32")
    edges = np.repeat(edges[None], 3, axis=0)
    edges[:, 1, 3] = -np.inf  # from vertex 1, only vertex 2 ...
    edges[:, 2, 4] = -5000.0  # ... and from vertex 2 a weak edge to the end
    match[:, 0, 0] = 0.0
    match[:, 1, 1] = 0.0
    match[:, 2, 2] = 0.0
    match[:, 1, 2] = -2000.0  # the best path: 0 -> 2 -> 3 -> 4
    match[:, 2, 3] = -1.5
    match[:, 3, 4] = -0.25
    lengths = np.array([5, 5, 5]), np.array([4, 4, 4])
    got = np.asarray(dag_loss(match, edges, *lengths))
    np.testing.assert_allclose(got, -2001.75, atol=1e-3)
    np.testing.assert_allclose(got, _brute_force(match, edges, *lengths), atol=1e-3)
    _, (d_match, d_edges) = value_and_gradients(
        lambda m, e: ops.sum(dag_loss(m, e, *lengths)), [match, edges]
    )
    expected = np.zeros((5, 8))
    expected[[0, 1, 2, 3], [0, 2, 3, 4]] = 1.0
    np.testing.assert_allclose(d_match[0], expected, atol=1e-6)
    expected = np.zeros((8, 8))
    expected[[0, 2, 3], [2, 3, 4]] = 1.0
    np.testing.assert_allclose(d_edges[0], expected, atol=1e-6)


def test_the_fast_pass_vouches_for_smooth_inputs_and_defers_on_sharp_ones():
    """The probability-space pass serves benchmark-like inputs (so the speed
    of benchmarks/dag_loss.py holds); the exact log-space pass takes over
    when scores thousands of nats apart leave it unsure."""

    def fast_pass_serves(match, edges, n, t):
        inputs = dag_module._with_flags(*dag_module._prepare(match, edges, n, t))
        graph = dag_module._graph(inputs["match"], inputs["log_transitions"], inputs)
        return bool(dag_module._fast_pass(graph)[3])

    rng = np.random.default_rng(7)
    batch, steps, vertices = 2, 12, 40
    match = rng.normal(size=(batch, steps, vertices))
    match = (match - np.logaddexp.reduce(match, axis=-1, keepdims=True)).astype("float32")
    upper = np.triu(np.ones((vertices, vertices)), 1) > 0
    logits = np.where(upper, rng.normal(size=(batch, vertices, vertices)), -np.inf)
    with np.errstate(invalid="ignore"):
        edges = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    edges = np.where(upper, edges, -np.inf).astype("float32")
    lengths = np.full(batch, vertices, "int32"), np.full(batch, steps, "int32")
    assert fast_pass_serves(match, edges, *lengths)
    np.testing.assert_allclose(
        np.asarray(dag_loss(match, edges, *lengths)),
        np.asarray(
            _naive_log_space(
                *(ops.convert_to_tensor(v) for v in (match, edges, *lengths)),
            )
        ),
        rtol=1e-6,
    )
    match, edges = _deficit_graph(0, "emission")
    assert not fast_pass_serves(match, edges, *DEFICIT_LENGTHS.values())


def test_impossible_alignments_are_zero_and_counted_from_the_lengths_alone():
    match, edges = _random_graph(3, 5, 8, seed=3)
    lengths = dict(output_length=np.array([3, 8, 6]), target_length=np.array([5, 5, 1]))
    got = np.asarray(dag_loss(match, edges, **lengths))
    assert got[0] == 0.0 and got[2] == 0.0 and np.isfinite(got[1]) and got[1] != 0.0
    assert np.asarray(dag_alignment_feasible(**lengths)).tolist() == [False, True, False]
    grads = _gradients(lambda m, e: dag_loss(m, e, **lengths), match, edges)
    for b in (0, 2):
        assert np.all(grads[0][b] == 0) and np.all(grads[1][b] == 0)
    feasible = dag_alignment_feasible(np.array([1, 3, 3, 0, 4, 4]), np.array([1, 1, 0, 0, 4, 2]))
    assert np.asarray(feasible).tolist() == [True, False, False, False, True, True]
    # Every path has probability zero: -inf, still counted feasible, no gradient.
    match[1, 2, :] = -np.inf
    got = np.asarray(dag_loss(match, edges, **lengths))
    assert got[1] == -np.inf and got[0] == 0.0
    grads = _gradients(lambda m, e: dag_loss(m, e, **lengths), match, edges)
    assert np.all(grads[0] == 0) and np.all(grads[1] == 0)


@pytest.mark.parametrize(
    "where",
    ["match_nan", "match_inf", "edge_nan", "edge_inf", "padding_nan"],
)
def test_nan_and_inf_inputs_give_nan_not_an_impossible_alignment(where):
    match, edges = _random_graph(3, 5, 8, seed=11)
    lengths = dict(output_length=np.array([5, 8, 6]), target_length=np.array([3, 5, 4]))
    expected = _brute_force(match, edges, lengths["output_length"], lengths["target_length"])
    if where == "match_nan":
        match[0, 1, 3] = np.nan
    elif where == "match_inf":
        match[0, 2, 4] = np.inf
    elif where == "edge_nan":
        edges[0, 1, 3] = np.nan
    elif where == "edge_inf":
        edges[0, 0, 2] = np.inf
    else:  # beyond example 0's lengths: not read
        match[0, 3:, :] = np.nan
        match[0, :, 5:] = np.nan
        edges[0, :, 5:] = np.nan
        edges[0, 5:, :] = np.nan
    got = np.asarray(dag_loss(match, edges, **lengths))
    grads = _gradients(lambda m, e: dag_loss(m, e, **lengths), match, edges)
    posterior = np.asarray(dag_alignment_posterior(match, edges, **lengths))
    np.testing.assert_allclose(got[1:], expected[1:], rtol=1e-6)
    assert np.isfinite(grads[0][1:]).all() and np.isfinite(posterior[1:]).all()
    assert np.asarray(dag_alignment_feasible(**lengths)).all()
    if where == "padding_nan":
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
        assert np.isfinite(grads[0][0]).all() and np.isfinite(posterior[0]).all()
    else:
        assert np.isnan(got[0])
        assert np.isnan(grads[0][0]).all() and np.isnan(grads[1][0]).all()
        assert np.isnan(posterior[0]).all()


def test_compiles_under_xla_and_the_keras_loss_normalises_by_length():
    match, edges = _random_graph(4, 4, 7, seed=4)
    loss = DAGLoss(reduction=None)
    y_true = {k: ops.convert_to_tensor(v) for k, v in RAGGED.items()}
    y_pred = {
        "match": ops.convert_to_tensor(match),
        "log_transitions": ops.convert_to_tensor(edges),
    }
    expected = -_brute_force(match, edges, RAGGED["output_length"], RAGGED["target_length"])
    expected = expected / RAGGED["target_length"]
    compiled = _compile(lambda t, p: loss(t, p))
    np.testing.assert_allclose(np.asarray(compiled(y_true, y_pred)), expected, rtol=1e-5, atol=1e-6)


_COMPILED = {}


@pytest.mark.parametrize("kind", ["smooth", "emission"])
def test_compiled_value_and_gradient_equal_brute_force_on_both_passes(kind):
    """One compiled program holds both passes; the values pick the pass."""
    if kind == "smooth":
        match, edges = _random_graph(3, 5, 8, seed=6)
    else:
        match, edges = _deficit_graph(2, "emission")
    n, t = DEFICIT_LENGTHS["output_length"], DEFICIT_LENGTHS["target_length"]
    weights = np.array([1.0, -2.0, 0.5], "float32")
    if "step" not in _COMPILED:  # compiled once, for both kinds
        _COMPILED["step"] = _compiled_value_and_gradients(
            lambda m, e, n, t, w: ops.sum(dag_loss(m, e, n, t) * w)
        )
    value, d_match, d_edges = _COMPILED["step"](match, edges, n, t, weights)
    expected = _brute_force(match, edges, n, t)
    want_match, want_edges = _brute_force_gradients(match, edges, n, t, weights)
    np.testing.assert_allclose(value, float(np.dot(expected, weights)), rtol=1e-6)
    np.testing.assert_allclose(d_match, want_match, atol=2e-5)
    finite = np.isfinite(edges)
    np.testing.assert_allclose(d_edges[finite], want_edges[finite], atol=2e-5)


@pytest.mark.skipif(keras.config.backend() != "jax", reason="jax.grad over jax.jit is JAX's")
def test_a_gradient_taken_outside_a_compiled_loss_equals_brute_force():
    """``jax.grad(jax.jit(f))``: the custom gradient closed over tensors of the
    compiled trace, and JAX raised a TypeError."""
    import jax

    match, edges = _random_graph(3, 5, 8, seed=6)
    n, t = DEFICIT_LENGTHS["output_length"], DEFICIT_LENGTHS["target_length"]
    weights = np.array([1.0, -2.0, 0.5], "float32")
    compiled = jax.jit(lambda m: ops.sum(dag_loss(m, edges, n, t) * weights))
    want_match, _ = _brute_force_gradients(match, edges, n, t, weights)
    np.testing.assert_allclose(np.asarray(jax.grad(compiled)(match)), want_match, atol=2e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_scales_equal_brute_force_whichever_pass_serves(seed):
    """Log-probs and edges from a few nats to hundreds of nats apart: each
    batch is served by the fast pass or by the exact one, and both occur."""
    rng = np.random.default_rng(100 + seed)
    served = set()
    for match_scale, edge_scale in itertools.product([1.0, 30.0, 100.0, 300.0], [1.0, 100.0]):
        match = (rng.normal(size=(3, 5, 8)) * match_scale).astype("float32")
        edges = (rng.normal(size=(3, 8, 8)) * edge_scale).astype("float32")
        edges = np.where(np.triu(np.ones((8, 8)), 1) > 0, edges, -np.inf).astype("float32")
        n = rng.integers(5, 9, size=3).astype("int32")
        t = rng.integers(2, 6, size=3).astype("int32")
        inputs = dag_module._with_flags(*dag_module._prepare(match, edges, n, t))
        graph = dag_module._graph(inputs["match"], inputs["log_transitions"], inputs)
        served.add(bool(dag_module._fast_pass(graph)[3]))
        weights = np.array([1.0, 0.5, -1.0])
        value, (d_match, d_edges) = value_and_gradients(
            lambda m, e: ops.sum(dag_loss(m, e, n, t) * weights), [match, edges]
        )
        expected = _brute_force(match, edges, n, t)
        want_match, want_edges = _brute_force_gradients(match, edges, n, t, weights)
        # float32 resolves scores of 1,000 nats to 6e-5 nats.
        atol = max(2e-5, 3e-7 * np.abs(expected).max())
        np.testing.assert_allclose(value, float(np.dot(expected, weights)), rtol=1e-6, atol=atol)
        np.testing.assert_allclose(d_match, want_match, atol=atol)
        finite = np.isfinite(edges)
        np.testing.assert_allclose(d_edges[finite], want_edges[finite], atol=atol)
    assert served == {True, False}


def test_invalid_lengths_in_a_compiled_call_give_nan():
    match, edges = _random_graph(4, 5, 8, seed=8)
    compiled = _compile(lambda m, e, n, t: dag_loss(m, e, n, t))
    n = np.array([8.0, 9.0, 8.0, 4.5], "float32")  # 9 > 8 vertices; 4.5 is not whole
    t = np.array([5.0, 3.0, -1.0, 2.0], "float32")  # -1 is negative
    got = np.asarray(compiled(match, edges, n, t))
    assert np.isfinite(got[0]) and np.isnan(got[1:]).all()
    np.testing.assert_allclose(got[0], _brute_force(match, edges, [8], [5])[0], rtol=1e-6)


@pytest.mark.parametrize("steps, vertices", [(1, 3), (3, 3), (1, 1)])
def test_edge_sizes(steps, vertices):
    match, edges = _random_graph(1, steps, vertices, seed=5)
    lengths = dict(output_length=np.array([vertices]), target_length=np.array([steps]))
    got = np.asarray(dag_loss(match, edges, **lengths))
    expected = _brute_force(match, edges, lengths["output_length"], lengths["target_length"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# === Mixed precision (the `mixed_policy` fixture is conftest's) ===
def test_computes_in_float32_under_mixed_precision(mixed_policy):
    half = "bfloat16" if mixed_policy == "mixed_bfloat16" else "float16"
    match, edges = _random_graph(4, 4, 7, seed=9)
    match_half = ops.cast(match, half)
    edges_half = ops.cast(edges, half)
    value = dag_loss(match_half, edges_half, **RAGGED)
    posterior = dag_alignment_posterior(match_half, edges_half, **RAGGED)
    y_true = dict(RAGGED)
    loss_value = DAGLoss(reduction=None)(
        y_true, {"match": match_half, "log_transitions": edges_half}
    )
    for tensor in (value, posterior, loss_value):
        assert keras.backend.standardize_dtype(tensor.dtype) == "float32"
    # Equal to the float32 computation on the same (rounded) numbers.
    match32 = np.asarray(ops.convert_to_numpy(ops.cast(match_half, "float32")))
    edges32 = np.asarray(ops.convert_to_numpy(ops.cast(edges_half, "float32")))
    expected = _brute_force(match32, edges32, RAGGED["output_length"], RAGGED["target_length"])
    np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(loss_value), -expected / RAGGED["target_length"], rtol=1e-5, atol=1e-5
    )
    _, (d_match, _) = value_and_gradients(
        lambda m, e: ops.sum(dag_loss(m, e, **RAGGED)), [match32, edges32]
    )
    np.testing.assert_allclose(np.asarray(posterior), d_match, atol=1e-6)


# === Bad input ===
M, E = _random_graph(2, 3, 5, seed=10)
N2, T2 = np.array([5, 4]), np.array([3, 2])

DAG_LOSS_BAD = [
    ("match_rank_2", (M[0], E, N2, T2), r"match of shape \(batch, targets, vertices\)"),
    ("match_rank_4", (M[..., None], E, N2, T2), r"match of shape \(batch, targets, vertices\)"),
    ("no_targets", (M[:, :0], E, N2, T2), r"at least one target.*match.shape=\(2, 0, 5\)"),
    ("no_vertices", (M[:, :, :0], E[:, :0, :0], N2, T2), r"at least one target.*\(2, 3, 0\)"),
    ("edges_not_square", (M, E[:, :, :4], N2, T2), r"log_transitions of shape \(batch, 5, 5\)"),
    ("edges_other_size", (M, np.zeros((2, 6, 6)), N2, T2), r"log_transitions.*\(2, 6, 6\)"),
    ("edges_rank_2", (M, E[0], N2, T2), r"log_transitions of shape.*\(5, 5\)"),
    ("edges_batch", (M, E[:1], N2, T2), r"same batch size.*log_transitions.shape\[0\]=1"),
    ("lengths_batch", (M, E, N2, np.array([3, 2, 1])), r"same batch.*target_length.shape\[0\]=3"),
    ("lengths_rank_2", (M, E, N2[:, None], T2), r"output_length of shape \(batch,\)"),
    ("lengths_scalar", (M, E, N2, 3), r"target_length of shape \(batch,\)"),
    ("output_not_whole", (M, E, np.array([5.9, 4.0]), T2), r"whole numbers for output_length.*5.9"),
    ("target_nan", (M, E, N2, np.array([3.0, np.nan])), r"whole numbers for target_length"),
    ("output_negative", (M, E, np.array([5, -1]), T2), r"output_length between 0 and 5.*-1"),
    ("output_too_large", (M, E, np.array([6, 4]), T2), r"output_length between 0 and 5.*6"),
    ("target_too_large", (M, E, N2, np.array([4, 2])), r"target_length between 0 and 3.*4"),
    ("bool_lengths", (M, E, N2 > 0, T2), r"integer tensor.*output_length.*bool"),
    ("bool_match", (M > 0, E, N2, T2), r"float tensor for match.*bool"),
    (
        "empty_batch",
        (M[:0], E[:0], N2[:0], T2[:0]),
        r"Expected a batch of at least one example\. Received: match.shape=\(0, 3, 5\)\.",
    ),
]


@pytest.mark.parametrize(
    "args, message", [c[1:] for c in DAG_LOSS_BAD], ids=[c[0] for c in DAG_LOSS_BAD]
)
def test_bad_input_dag_loss(args, message):
    with pytest.raises(ValueError, match=message):
        dag_loss(*args)


POSTERIOR_BAD = [
    ("edges_other_size", (M, np.zeros((2, 4, 4)), N2, T2), r"log_transitions of shape"),
    ("output_not_whole", (M, E, np.array([5.0, 3.5]), T2), r"whole numbers for output_length"),
    ("target_negative", (M, E, N2, np.array([-2, 2])), r"target_length between 0 and 3"),
    ("no_targets", (M[:, :0], E, N2, T2), r"at least one target"),
    ("empty_batch", (M[:0], E[:0], N2[:0], T2[:0]), r"batch of at least one example"),
]


@pytest.mark.parametrize(
    "args, message", [c[1:] for c in POSTERIOR_BAD], ids=[c[0] for c in POSTERIOR_BAD]
)
def test_bad_input_dag_alignment_posterior(args, message):
    with pytest.raises(ValueError, match=message):
        dag_alignment_posterior(*args)


LOSS_BAD = [
    ("y_true_not_dict", (N2, {"match": M, "log_transitions": E}), r"y_true to be a dict"),
    (
        "y_true_missing_key",
        ({"output_length": N2}, {"match": M, "log_transitions": E}),
        r"y_true to be a dict with keys \['output_length', 'target_length'\].*\['output_length'\]",
    ),
    ("y_pred_missing_key", ({"output_length": N2, "target_length": T2}, {"match": M}), r"y_pred"),
    (
        "target_not_whole",
        (
            {"output_length": N2, "target_length": np.array([2.5, 2.0])},
            {"match": M, "log_transitions": E},
        ),
        r"whole numbers for target_length",
    ),
    (
        "edges_other_size",
        ({"output_length": N2, "target_length": T2}, {"match": M, "log_transitions": E[:, :4, :4]}),
        r"log_transitions of shape",
    ),
]


@pytest.mark.parametrize("args, message", [c[1:] for c in LOSS_BAD], ids=[c[0] for c in LOSS_BAD])
def test_bad_input_dag_loss_class(args, message):
    with pytest.raises(ValueError, match=message):
        DAGLoss()(*args)


FEASIBLE_BAD = [
    ("bool", (N2 > 0, T2), r"integer tensor.*output_length"),
    ("rank_2", (N2[:, None], T2), r"shape \(batch,\)"),
    ("batch", (N2, np.array([1, 2, 3])), r"same batch size"),
    ("not_whole", (N2, np.array([2.5, 1.0])), r"whole numbers for target_length"),
    ("negative", (np.array([-3, 2]), T2), r"output_length 0 or more.*-3"),
]


@pytest.mark.parametrize(
    "args, message", [c[1:] for c in FEASIBLE_BAD], ids=[c[0] for c in FEASIBLE_BAD]
)
def test_bad_input_dag_alignment_feasible(args, message):
    with pytest.raises(ValueError, match=message):
        dag_alignment_feasible(*args)


def test_whole_float_lengths_are_accepted():
    got = dag_loss(M, E, N2.astype("float32"), T2.astype("float64"))
    np.testing.assert_allclose(np.asarray(got), _brute_force(M, E, N2, T2), rtol=1e-6)
