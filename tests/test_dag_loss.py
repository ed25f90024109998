"""ExLM's DAG loss against brute-force path enumeration and a naive loop's autodiff."""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

from keras_masking.losses import DAGLoss
from keras_masking.losses import dag_alignment_feasible
from keras_masking.losses import dag_alignment_posterior
from keras_masking.losses import dag_loss


def _random_graph(batch, steps, vertices, seed, scale=2.0):
    rng = np.random.default_rng(seed)
    match = (rng.normal(size=(batch, steps, vertices)) * scale).astype("float32")
    edges = rng.normal(size=(batch, vertices, vertices)).astype("float32")
    upper = np.triu(np.ones((vertices, vertices)), 1) > 0
    edges = np.where(upper, edges, -np.inf).astype("float32")
    return match, edges


def _brute_force(match, edges, output_length, target_length):
    result = []
    for b, (n, t) in enumerate(zip(output_length, target_length)):
        scores = []
        if t == 1:
            if n == 1:
                scores.append(match[b, 0, 0])
        else:
            for middle in itertools.combinations(range(1, n - 1), t - 2):
                path = (0, *middle, n - 1)
                score = sum(match[b, i, a] for i, a in enumerate(path))
                score += sum(edges[b, path[i - 1], path[i]] for i in range(1, t))
                scores.append(score)
        result.append(np.logaddexp.reduce(np.array(scores, "float64")) if scores else 0.0)
    return np.array(result)


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
    for b, (n, t) in enumerate(zip(RAGGED["output_length"], RAGGED["target_length"])):
        expected = np.zeros((4, 7))
        if t >= 2:
            paths = [(0, *m, n - 1) for m in itertools.combinations(range(1, n - 1), t - 2)]
            scores = np.array(
                [
                    sum(match[b, i, a] for i, a in enumerate(p))
                    + sum(edges[b, p[i - 1], p[i]] for i in range(1, t))
                    for p in paths
                ],
                "float64",
            )
            weights = np.exp(scores - np.logaddexp.reduce(scores))
            for path, weight in zip(paths, weights):
                for i, a in enumerate(path):
                    expected[i, a] += weight
        np.testing.assert_allclose(got[b], expected, atol=1e-5)
        # Impossible (row 2: one target, seven vertices) is all zeros; valid rows sum to 1.
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


def test_large_negative_logits_stay_finite_and_exact():
    match, edges = _random_graph(2, 6, 9, seed=2, scale=1.0)
    match = match - 500.0  # log-probs of a confident model on the wrong tokens
    # Sharp transitions: a log-softmax over each vertex's forward edges.
    logits = np.where(np.isfinite(edges), edges * 20.0, -np.inf)
    with np.errstate(invalid="ignore"):  # the last row has no edge at all
        edges = (logits - np.logaddexp.reduce(logits, axis=2, keepdims=True)).astype("float32")
    edges[:, -1] = -np.inf
    lengths = dict(output_length=np.array([9, 7]), target_length=np.array([6, 4]))
    got = np.asarray(dag_loss(match, edges, **lengths))
    expected = _brute_force(match, edges, lengths["output_length"], lengths["target_length"])
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    grads = _gradients(lambda m, e: dag_loss(m, e, **lengths), match, edges)
    assert all(np.isfinite(g).all() for g in grads)
    # Each target is emitted by exactly one vertex: occupancies sum to 1 per step.
    np.testing.assert_allclose(grads[0][0, :6].sum(-1), 1.0, atol=1e-4)


def test_impossible_alignments_are_zero_and_counted():
    match, edges = _random_graph(2, 5, 5, seed=3)
    lengths = dict(output_length=np.array([3, 5]), target_length=np.array([5, 5]))
    got = np.asarray(dag_loss(match, edges, **lengths))
    assert got[0] == 0.0 and np.isfinite(got[1]) and got[1] != 0.0
    assert np.asarray(dag_alignment_feasible(**lengths)).tolist() == [False, True]
    grads = _gradients(lambda m, e: dag_loss(m, e, **lengths), match, edges)
    assert np.all(grads[0][0] == 0) and np.all(grads[1][0] == 0)


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
    if keras.config.backend() == "jax":
        import jax

        compiled = jax.jit(lambda t, p: loss(t, p))
    else:
        import tensorflow as tf

        compiled = tf.function(lambda t, p: loss(t, p), jit_compile=True)
    np.testing.assert_allclose(np.asarray(compiled(y_true, y_pred)), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("steps, vertices", [(1, 3), (3, 3)])
def test_edge_sizes(steps, vertices):
    match, edges = _random_graph(1, steps, vertices, seed=5)
    lengths = dict(output_length=np.array([vertices]), target_length=np.array([steps]))
    got = np.asarray(dag_loss(match, edges, **lengths))
    expected = _brute_force(match, edges, lengths["output_length"], lengths["target_length"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
