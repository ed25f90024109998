"""The DAG alignment log-likelihood of ExLM (DA-Transformer's dynamic programme).

Targets ``y_0 .. y_{T-1}`` are emitted along a path of DAG vertices
``0 = a_0 < a_1 < ... < a_{T-1} = N - 1``, one target per vertex:

    log P(Y) = logsumexp over paths of  sum_i match[i, a_i] + sum_i log E[a_{i-1}, a_i]

Computed in probability space, one batched ``(1 x N) @ (N x N)`` product per
target step with per-step renormalisation (so it runs on the matrix units),
and differentiated by a custom forward-backward pass: besides the inputs and
the ``(B, N, N)`` transition gradient, the backward keeps ``O(B x T x N)``.
Vertex ``u`` can only emit target ``i`` inside the band
``i <= u <= N - T + i`` (it must be reachable from vertex 0 and reach the
last vertex), which also keeps the renormalised mass on live paths.
"""

import keras
from keras import ops

_MAX_EXPONENT = 80.0


def dag_alignment_feasible(output_length, target_length):
    """Whether a path can carry the targets: ``target_length <= output_length``.

    Args:
        output_length: int ``(batch,)`` graph sizes.
        target_length: int ``(batch,)`` target counts (>= 1).

    Returns:
        bool ``(batch,)``.
    """
    output_length = ops.convert_to_tensor(output_length, "int32")
    target_length = ops.convert_to_tensor(target_length, "int32")
    return (target_length >= 1) & (target_length <= output_length)


def dag_loss(match, log_transitions, output_length, target_length):
    """Each example's DAG alignment log-likelihood, summed over all paths.

    Args:
        match: float ``(B, T, N)``, ``match[b, i, u] = log P_u(y_i)``.
        log_transitions: float ``(B, N, N)``, log edge weights ``u -> v``;
            ``-inf`` marks an absent edge (only forward edges are used).
        output_length: int ``(B,)``, the graph size ``N_b`` (vertices
            ``0 .. N_b - 1``; the path ends at ``N_b - 1``).
        target_length: int ``(B,)``, the number of targets ``T_b``.

    Returns:
        float32 ``(B,)``: ``log P(Y_b)``. An impossible alignment (fewer
        vertices than targets, or no path with finite weight) gives 0 with a
        zero gradient, as the official code zeroes such losses; count them
        with `dag_alignment_feasible`.

    Example:
    >>> import numpy as np
    >>> match = np.log(np.full((1, 2, 3), 0.5, "float32"))
    >>> edges = np.log(np.triu(np.full((3, 3), 0.5, "float32"), 1))
    >>> float(dag_loss(match, edges, np.array([3]), np.array([2]))[0])  # one path 0 -> 2
    -2.0794...
    """
    match = ops.cast(ops.convert_to_tensor(match), "float32")
    log_transitions = ops.cast(ops.convert_to_tensor(log_transitions), "float32")
    output_length = ops.cast(ops.convert_to_tensor(output_length), "int32")
    target_length = ops.cast(ops.convert_to_tensor(target_length), "int32")
    return _dag_log_likelihood(output_length, target_length)(match, log_transitions)


def dag_alignment_posterior(match, log_transitions, output_length, target_length):
    """``P(vertex u emits target i | Y)`` under the DAG, by forward-backward.

    The same pass as `dag_loss`'s gradient (``d log P(Y) / d match``), without
    a gradient of its own: the alignment's marginals, for metrics such as the
    entropy of the states that actually emit the targets.

    Args:
        match, log_transitions, output_length, target_length: as `dag_loss`.

    Returns:
        float32 ``(B, T, N)``. Each valid target's row sums to 1; padded
        targets and impossible alignments are all zeros.

    Example:
    >>> import numpy as np
    >>> match = np.zeros((1, 2, 3), "float32")
    >>> edges = np.log(np.triu(np.full((3, 3), 0.5, "float32"), 1))
    >>> posterior = dag_alignment_posterior(match, edges, np.array([3]), np.array([2]))
    >>> keras.ops.convert_to_numpy(posterior)[0, 1].tolist()  # the last target: last vertex
    [0.0, 0.0, 1.0]
    """
    match = ops.stop_gradient(ops.cast(ops.convert_to_tensor(match), "float32"))
    log_transitions = ops.stop_gradient(ops.cast(ops.convert_to_tensor(log_transitions), "float32"))
    output_length = ops.cast(ops.convert_to_tensor(output_length), "int32")
    target_length = ops.cast(ops.convert_to_tensor(target_length), "int32")
    steps, emissions, transitions, forward = _forward(
        match, log_transitions, output_length, target_length
    )
    alphas, log_sums, _, feasible = forward
    occupancy, _ = _backward(
        steps,
        emissions,
        transitions,
        alphas,
        log_sums,
        output_length,
        target_length,
        with_transitions=False,
    )
    return ops.where(feasible[:, None, None], occupancy, 0.0)


def _dag_log_likelihood(output_length, target_length):
    @ops.custom_gradient
    def log_likelihood(match, log_transitions):
        steps, emissions, transitions, forward = _forward(
            match, log_transitions, output_length, target_length
        )
        alphas, log_sums, log_z, feasible = forward

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            upstream = ops.where(feasible, ops.cast(upstream, "float32"), 0.0)
            d_match, d_transitions = _backward(
                steps, emissions, transitions, alphas, log_sums, output_length, target_length
            )
            return (
                d_match * upstream[:, None, None],
                d_transitions * upstream[:, None, None],
            )

        return ops.where(feasible, log_z, 0.0), grad

    return log_likelihood


def _emission_band(steps, vertices, output_length, target_length):
    """bool ``(B, T, N)``: vertex u may emit target i (in the band, valid)."""
    i = ops.arange(steps, dtype="int32")[None, :, None]
    u = ops.arange(vertices, dtype="int32")[None, None, :]
    n = output_length[:, None, None]
    t = target_length[:, None, None]
    last = i == t - 1
    band = (u >= i) & (u <= n - t + i) & (u < n) & (i < t)
    # The final target is emitted by the final vertex only.
    return band & (~last | (u == n - 1))


def _forward(match, log_transitions, output_length, target_length):
    steps, vertices = match.shape[1], match.shape[2]
    band = _emission_band(steps, vertices, output_length, target_length)
    u = ops.arange(vertices, dtype="int32")
    forward_edge = u[:, None] < u[None, :]
    finite = ops.isfinite(log_transitions) & forward_edge[None]
    # Column scales: log E[u, v] = log P[u, v] + c_v with max_u P[u, v] = 1.
    # c_v moves into the emission of v at every step after the first, so
    # weak edges into a vertex never underflow against strong edges elsewhere.
    column_max = ops.max(ops.where(finite, log_transitions, -float("inf")), axis=1)
    column_max = ops.where(ops.isfinite(column_max), column_max, 0.0)
    transitions = ops.where(finite, ops.exp(log_transitions - column_max[:, None, :]), 0.0)
    first_step = ops.arange(steps, dtype="int32")[None, :, None] == 0
    match = match + ops.where(first_step, 0.0, column_max[:, None, :])
    match = ops.where(band, match, -float("inf"))
    # Per-step emission scales: E_i = exp(match_i - m_i), m_i the row max.
    row_max = ops.max(match, axis=2, keepdims=True)
    row_max = ops.where(ops.isfinite(row_max), row_max, 0.0)
    emissions = ops.exp(match - row_max)

    active_steps = ops.arange(steps, dtype="int32")[None, :] < target_length[:, None]
    alpha = ops.cast(ops.equal(u, 0), "float32")[None, :] * emissions[:, 0, :]
    total = ops.sum(alpha, axis=1)
    alpha = alpha / ops.where(total > 0, total, 1.0)[:, None]
    log_z = ops.log(total) + row_max[:, 0, 0]
    alphas, log_sums = [alpha], [ops.log(total)]
    for i in range(1, steps):
        moved = ops.squeeze(ops.matmul(alpha[:, None, :], transitions), 1) * emissions[:, i, :]
        total = ops.sum(moved, axis=1)
        active = active_steps[:, i]
        alpha = ops.where(active[:, None], moved / ops.where(total > 0, total, 1.0)[:, None], alpha)
        step_log = ops.where(active, ops.log(total) + row_max[:, i, 0], 0.0)
        log_z = log_z + step_log
        alphas.append(alpha)
        log_sums.append(ops.where(active, ops.log(total), 0.0))
    alphas = ops.stack(alphas, axis=1)  # (B, T, N), each active row sums to 1
    log_sums = ops.stack(log_sums, axis=1)  # (B, T)
    feasible = dag_alignment_feasible(output_length, target_length) & ops.isfinite(log_z)
    return steps, emissions, transitions, (alphas, log_sums, log_z, feasible)


def _backward(
    steps,
    emissions,
    transitions,
    alphas,
    log_sums,
    output_length,
    target_length,
    with_transitions=True,
):
    """Posteriors of (target, vertex) pairs and of edges, by the beta pass.

    With ``A_i`` the renormalised forward rows and ``s_i`` their sums,
    ``B_{i-1} = P (E_i * B_i) / s_i`` from ``B_{T-1} = onehot(N - 1)``; the
    rescaled ``B~_i = B_i / r_i`` keeps fp32 in range. Then
    ``dlogZ/dmatch[i, u] = A_i(u) B_i(u)`` and
    ``dlogZ/dlogE[u, v] = P[u, v] sum_i A_{i-1}(u) E_i(v) B_i(v) / s_i``.
    """
    vertices = emissions.shape[2]
    last_vertex = ops.one_hot(output_length - 1, vertices, dtype="float32")
    beta = ops.zeros_like(last_vertex)
    log_r = ops.zeros_like(log_sums[:, 0])
    occupancy = [None] * steps
    weights = [None] * steps
    for i in range(steps - 1, -1, -1):
        is_last = ops.equal(target_length - 1, i)
        if i < steps - 1:
            recurse = ops.squeeze(
                ops.matmul(transitions, (emissions[:, i + 1, :] * beta)[:, :, None]), 2
            )
            top = ops.max(recurse, axis=1)
            safe_top = ops.where(top > 0, top, 1.0)
            next_beta = recurse / safe_top[:, None]
            next_log_r = log_r + ops.log(safe_top) - log_sums[:, i + 1]
            inside = i < target_length - 1
            beta = ops.where(inside[:, None], next_beta, ops.zeros_like(beta))
            log_r = ops.where(inside, next_log_r, 0.0)
        beta = ops.where(is_last[:, None], last_vertex, beta)
        log_r = ops.where(is_last, 0.0, log_r)
        scale = ops.exp(ops.minimum(log_r, _MAX_EXPONENT))[:, None]
        occupancy[i] = alphas[:, i, :] * beta * scale
        if i > 0:
            step_scale = ops.exp(ops.minimum(log_r - log_sums[:, i], _MAX_EXPONENT))[:, None]
            used = (i < target_length)[:, None]
            weights[i] = ops.where(used, emissions[:, i, :] * beta * step_scale, 0.0)
    d_match = ops.stack(occupancy, axis=1)
    if not with_transitions:
        return d_match, None
    if steps > 1:
        previous = alphas[:, :-1, :]  # A_0 .. A_{T-2}
        following = ops.stack(weights[1:], axis=1)  # W_1 .. W_{T-1}
        d_transitions = transitions * ops.matmul(ops.transpose(previous, (0, 2, 1)), following)
    else:
        d_transitions = ops.zeros_like(transitions)
    return d_match, d_transitions


@keras.saving.register_keras_serializable(package="keras_masking")
class DAGLoss(keras.losses.Loss):
    """ExLM's loss: ``-log P(Y) / |Y|`` per example, from `dag_loss`.

    ``y_true`` is a dict with ``output_length`` and ``target_length``;
    ``y_pred`` a dict with ``match`` ``(B, T, N)`` and ``log_transitions``
    ``(B, N, N)``. Impossible alignments contribute 0 (as the official code).

    Args:
        **kwargs: `keras.losses.Loss` arguments (``reduction``, ``name``).
    """

    def __init__(self, name="dag_loss", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        target_length = ops.cast(y_true["target_length"], "int32")
        log_likelihood = dag_loss(
            y_pred["match"], y_pred["log_transitions"], y_true["output_length"], target_length
        )
        return -log_likelihood / ops.cast(ops.maximum(target_length, 1), "float32")
