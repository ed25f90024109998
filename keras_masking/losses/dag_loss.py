"""The DAG alignment log-likelihood of ExLM (DA-Transformer's dynamic programme).

Targets ``y_0 .. y_{T-1}`` are emitted along a path of DAG vertices
``0 = a_0 < a_1 < ... < a_{T-1} = N - 1``, one target per vertex:

    log P(Y) = logsumexp over paths of  sum_i match[i, a_i] + sum_i log E[a_{i-1}, a_i]

The fast pass works in probability space, so that it runs on the matrix
units: one batched ``(1 x N) @ (N x N)`` product per target step forward, and
one backward. The transition matrix's column maxima move into the emissions,
each step's emissions are divided by their largest value, and the values are
renormalised at every step. The forward pass adds back a bound of whatever
float32 flushes to zero (a weak edge, an emission far below the step's best,
a tiny forward value), so its ``log P(Y)`` is an upper bound; the backward
pass only loses such terms, so its ``log P(Y)`` is a lower bound. When the
two agree, the value and the posteriors are exact to float32 precision. When
they do not, paths that matter were lost to underflow (scores that differ by
more than about 80 nats between the vertices of one step, or between the
edges into one vertex, can do that), and the batch is recomputed by the exact
log-space recursion: one ``logsumexp`` over ``(B, N, N)`` per step, several
times slower. Either way the result is the sum over all paths.

The gradient is a custom forward-backward: besides the inputs and the
``(B, N, N)`` transition gradient, it keeps ``O(B x T x N)``. Vertex ``u`` can
only emit target ``i`` inside the band ``i <= u <= N - T + i`` (it must be
reachable from vertex 0 and reach the last vertex).
"""

import keras
import numpy as np
from keras import ops

from keras_masking.utils.eager_checks import concrete_value

# The smallest normal float32: a product or an exponential below it may be
# flushed to zero.
_TINY = 1.1754944e-38
# The fast pass serves a batch when, for every example, its upper bound of
# log P(Y) (forward) and its lower bound (backward) agree to this many nats:
# float32 rounding, which grows with the number of targets.
_GAP_TOLERANCE = 1e-5
_GAP_PER_STEP = 1e-6
# Largest exponent of a per-step factor in the transition gradient.
_MAX_EXPONENT = 80.0


def dag_alignment_feasible(output_length, target_length):
    """Whether a path of the graph can carry the targets, from the lengths alone.

    A path starts at vertex 0, ends at vertex ``output_length - 1`` and visits
    one vertex per target, so it exists when ``2 <= target_length <=
    output_length``, or when both are 1. The weights play no part: an
    alignment whose paths all have zero probability is feasible (its
    log-likelihood is ``-inf``).

    Args:
        output_length: int ``(batch,)`` graph sizes.
        target_length: int ``(batch,)`` target counts.

    Returns:
        bool ``(batch,)``.

    Example:
    >>> feasible = dag_alignment_feasible(np.array([5, 3, 1, 4]), np.array([3, 4, 1, 1]))
    >>> keras.ops.convert_to_numpy(feasible).tolist()
    [True, False, True, False]
    """
    output_length, target_length, lengths_ok = _lengths(output_length, target_length)
    return _feasible(output_length, target_length) & lengths_ok


def dag_loss(match, log_transitions, output_length, target_length):
    """Each example's DAG alignment log-likelihood, summed over all paths.

    Computed in float32 whatever the inputs' dtype, and exact to float32
    precision for scores of any size (see the module notes).

    Args:
        match: float ``(B, T, N)``, ``match[b, i, u] = log P_u(y_i)``; ``-inf``
            is a zero probability.
        log_transitions: float ``(B, N, N)``, log edge weights ``u -> v``;
            ``-inf`` marks an absent edge (only forward edges ``u < v`` are
            read).
        output_length: int ``(B,)``, the graph size ``N_b <= N`` (vertices
            ``0 .. N_b - 1``; the path ends at ``N_b - 1``).
        target_length: int ``(B,)``, the number of targets ``T_b <= T``.
            Float tensors holding whole numbers are accepted.

    Returns:
        float32 ``(B,)``: ``log P(Y_b)``.

        * An impossible alignment (`dag_alignment_feasible` is False: fewer
          vertices than targets, or one target and more than one vertex)
          gives 0 with a zero gradient, as the official code zeroes such
          losses.
        * A feasible alignment whose paths all have zero probability gives
          ``-inf``, with a zero gradient.
        * NaN or ``+inf`` in the example's part of ``match`` (targets
          ``< T_b``, vertices ``< N_b``) or of ``log_transitions`` (forward
          edges between vertices ``< N_b``) gives NaN, and a NaN gradient.
        * In eager calls, lengths that are not whole numbers in ``[0, N]`` /
          ``[0, T]`` raise a ValueError; inside a compiled function (where
          they cannot be read) they give NaN.

    Example:
    >>> match = np.log(np.full((1, 2, 3), 0.5, "float32"))
    >>> edges = np.where(np.triu(np.ones((1, 3, 3)), 1) > 0, np.log(0.5), -np.inf)
    >>> float(dag_loss(match, edges, np.array([3]), np.array([2]))[0])  # one path: 0 -> 2
    -2.0794...
    """
    return _log_likelihood(*_prepare(match, log_transitions, output_length, target_length))


def dag_alignment_posterior(match, log_transitions, output_length, target_length):
    """``P(vertex u emits target i | Y)`` under the DAG, by forward-backward.

    The same pass as `dag_loss`'s gradient (``d log P(Y) / d match``), without
    a gradient of its own: the alignment's marginals, for metrics such as the
    entropy of the states that actually emit the targets.

    Args:
        match, log_transitions, output_length, target_length: as `dag_loss`.

    Returns:
        float32 ``(B, T, N)``. Each valid target's row sums to 1; padded
        targets, impossible alignments and alignments of zero probability
        are all zeros; NaN inputs or invalid lengths (as in `dag_loss`) give
        NaN.

    Example:
    >>> match = np.zeros((1, 2, 3), "float32")
    >>> edges = np.where(np.triu(np.ones((1, 3, 3)), 1) > 0, np.log(0.5), -np.inf)
    >>> posterior = dag_alignment_posterior(match, edges, np.array([3]), np.array([2]))
    >>> keras.ops.convert_to_numpy(posterior)[0, 1].tolist()  # the last target: last vertex
    [0.0, 0.0, 1.0]
    """
    inputs = _with_flags(*_prepare(match, log_transitions, output_length, target_length))
    match = ops.stop_gradient(inputs["match"])
    log_transitions = ops.stop_gradient(inputs["log_transitions"])
    graph = _graph(match, log_transitions, inputs)
    _, occupancy, _, exact = _fast_pass(graph)
    occupancy = _choose(exact, lambda: occupancy, lambda: _log_space(graph, True)[1])
    return _finish_gradient(occupancy, inputs, upstream=None)


# === Checks and preparation ===
_LENGTH_DTYPE = "an integer tensor (or floats holding whole numbers)"


def _number_tensor(name, value, expected):
    """``value`` as a tensor of a numeric (not bool) dtype, else a ValueError."""
    value = ops.convert_to_tensor(value)
    dtype = keras.backend.standardize_dtype(value.dtype)
    if dtype == "bool" or not ("int" in dtype or "float" in dtype):
        raise ValueError(f"Expected {expected} for {name}. Received: {name} of dtype {dtype}.")
    return value


def _check_same_batch(*named):
    sizes = {name: tensor.shape[0] for name, tensor in named if tensor.shape[0] is not None}
    if len(set(sizes.values())) > 1:
        received = ", ".join(f"{name}.shape[0]={size}" for name, size in sizes.items())
        raise ValueError(f"Expected the same batch size in every argument. Received: {received}.")


def _check_length_values(name, value, upper):
    values = concrete_value(value)
    if values is None or values.size == 0:
        return
    values = np.asarray(values, "float64")
    whole = np.isfinite(values) & (values == np.floor(values))
    if not whole.all():
        raise ValueError(
            f"Expected whole numbers for {name}. Received: {name}={values.tolist()} "
            f"(not whole: {values[~whole].tolist()[:10]})."
        )
    bad = (values < 0) | (values > (np.inf if upper is None else upper))
    if bad.any():
        bound = "0 or more" if upper is None else f"between 0 and {upper}"
        raise ValueError(
            f"Expected {name} {bound}. Received: {name}={values.astype('int64').tolist()}."
        )


def _lengths(output_length, target_length, vertices=None, steps=None):
    """The lengths, checked, as int32 in range, and a flag of the valid ones."""
    named = (("output_length", output_length, vertices), ("target_length", target_length, steps))
    named = [
        (name, _number_tensor(name, value, _LENGTH_DTYPE), upper) for name, value, upper in named
    ]
    for name, value, _ in named:
        if len(value.shape) != 1:
            raise ValueError(
                f"Expected {name} of shape (batch,). Received: {name}.shape={tuple(value.shape)}."
            )
    _check_same_batch(*[(name, value) for name, value, _ in named])
    lengths_ok = ops.ones_like(ops.cast(named[0][1], "bool"))
    clipped = []
    for name, value, upper in named:
        _check_length_values(name, value, upper)
        value = ops.cast(value, "float32")
        lengths_ok &= ops.isfinite(value) & (value == ops.floor(value)) & (value >= 0)
        value = ops.maximum(ops.where(ops.isfinite(value), value, 0.0), 0.0)
        if upper is not None:
            lengths_ok &= value <= upper
            value = ops.minimum(value, upper)
        clipped.append(ops.cast(value, "int32"))
    return clipped[0], clipped[1], lengths_ok


def _prepare(match, log_transitions, output_length, target_length):
    """Checks the arguments; returns the float32 inputs, the int32 lengths and
    whether each example's lengths were valid."""
    match = ops.cast(_number_tensor("match", match, "a float tensor"), "float32")
    log_transitions = _number_tensor("log_transitions", log_transitions, "a float tensor")
    log_transitions = ops.cast(log_transitions, "float32")
    if len(match.shape) != 3:
        raise ValueError(
            "Expected match of shape (batch, targets, vertices). "
            f"Received: match.shape={tuple(match.shape)}."
        )
    steps, vertices = match.shape[1], match.shape[2]
    if steps is None or vertices is None:
        raise ValueError(
            "Expected match with static target and vertex dimensions (the recursion is "
            f"unrolled over targets). Received: match.shape={tuple(match.shape)}."
        )
    if steps < 1 or vertices < 1:
        raise ValueError(
            "Expected match with at least one target and one vertex. "
            f"Received: match.shape={tuple(match.shape)}."
        )
    if len(log_transitions.shape) != 3 or tuple(log_transitions.shape[1:]) != (vertices, vertices):
        raise ValueError(
            f"Expected log_transitions of shape (batch, {vertices}, {vertices}) (match has "
            f"{vertices} vertices). Received: log_transitions.shape={tuple(log_transitions.shape)}."
        )
    _check_same_batch(("match", match), ("log_transitions", log_transitions))
    output_length, target_length, lengths_ok = _lengths(
        output_length, target_length, vertices, steps
    )
    _check_same_batch(("match", match), ("output_length", output_length))
    if match.shape[0] == 0:
        # TensorFlow's reductions fail on an empty batch and JAX returns an
        # empty loss whose mean is NaN: neither says what happened.
        raise ValueError(
            f"Expected a batch of at least one example. Received: match.shape={tuple(match.shape)}."
        )
    return match, log_transitions, output_length, target_length, lengths_ok


def _with_flags(match, log_transitions, output_length, target_length, lengths_ok):
    """The prepared arguments with the examples' flags: the edges each reads,
    whether its alignment is feasible, and whether its inputs are bad (NaN or
    +inf where it reads them, or invalid lengths: NaN out, and computed on
    sanitised values so it cannot spread)."""
    steps, vertices = match.shape[1], match.shape[2]
    u = ops.arange(vertices, dtype="int32")
    vertex_ok = u[None, :] < output_length[:, None]
    target_ok = ops.arange(steps, dtype="int32")[None, :] < target_length[:, None]
    edge_used = (u[:, None] < u[None, :])[None] & vertex_ok[:, :, None] & vertex_ok[:, None, :]
    match_bad = ops.isnan(match) | (match == float("inf"))
    edges_bad = ops.isnan(log_transitions) | (log_transitions == float("inf"))
    bad = ~lengths_ok
    bad |= ops.any(match_bad & target_ok[:, :, None] & vertex_ok[:, None, :], axis=(1, 2))
    bad |= ops.any(edges_bad & edge_used, axis=(1, 2))
    return {
        "match": match,
        "log_transitions": log_transitions,
        "output_length": output_length,
        "target_length": target_length,
        "edge_used": edge_used,
        "feasible": _feasible(output_length, target_length),
        "bad": bad,
    }


def _feasible(output_length, target_length):
    return (
        (target_length >= 1)
        & (target_length <= output_length)
        & ((target_length >= 2) | (output_length == 1))
    )


# === The loss and its gradient ===
@ops.custom_gradient
def _log_likelihood(match, log_transitions, output_length, target_length, lengths_ok):
    # Every tensor the gradient reads is made here from the arguments: a
    # custom gradient closing over tensors of an enclosing trace failed under
    # `jax.grad(jax.jit(f))`.
    inputs = _with_flags(match, log_transitions, output_length, target_length, lengths_ok)
    graph = _graph(match, log_transitions, inputs)
    log_z, d_match, d_transitions, exact = _fast_pass(graph)
    # The gradients are computed here too, so that an eager call picks the
    # fast or the exact pass by its values; a compiled call that needs no
    # gradient drops them.
    log_z = _choose(exact, lambda: log_z, lambda: _log_space(graph, False)[0])
    d_match, d_transitions = _choose(
        exact, lambda: (d_match, d_transitions), lambda: _log_space(graph, True)[1:]
    )
    value = ops.where(inputs["feasible"], log_z, 0.0)
    value = ops.where(inputs["bad"], float("nan"), value)

    def grad(*args, upstream=None):
        if upstream is None:
            (upstream,) = args
        return (
            _finish_gradient(d_match, inputs, upstream),
            _finish_gradient(d_transitions, inputs, upstream),
            None,
            None,
            None,
        )

    return value, grad


def _choose(exact, fast_result, exact_result):
    """``fast_result()`` when ``exact`` holds, else ``exact_result()`` (one branch runs)."""
    value = concrete_value(exact)
    if value is not None:
        return fast_result() if bool(value) else exact_result()
    return ops.cond(exact, fast_result, exact_result)


def _finish_gradient(gradient, inputs, upstream):
    """Zero for impossible alignments, NaN for bad inputs, times ``upstream``."""
    if upstream is not None:
        gradient = gradient * ops.cast(upstream, "float32")[:, None, None]
    gradient = ops.where(inputs["feasible"][:, None, None], gradient, 0.0)
    return ops.where(inputs["bad"][:, None, None], float("nan"), gradient)


def _graph(match, log_transitions, inputs):
    """The band, the scaled transition matrix and the emission scores."""
    steps, vertices = match.shape[1], match.shape[2]
    output_length, target_length = inputs["output_length"], inputs["target_length"]
    # NaN or +inf (examples flagged bad, NaN out) must not spread to others.
    match = ops.where(ops.isnan(match) | (match == float("inf")), 0.0, match)
    usable = inputs["edge_used"] & ~ops.isnan(log_transitions) & (log_transitions < float("inf"))
    log_transitions = ops.where(usable, log_transitions, -float("inf"))
    i = ops.arange(steps, dtype="int32")[None, :, None]
    u = ops.arange(vertices, dtype="int32")[None, None, :]
    n = output_length[:, None, None]
    t = target_length[:, None, None]
    band = (u >= i) & (u <= n - t + i) & (u < n) & (i < t)
    # The first target sits on vertex 0, the last on the last vertex.
    band &= (i > 0) | (u == 0)
    band &= (i != t - 1) | (u == n - 1)
    # Bad examples (NaN out) are left out: an empty band, zero probability.
    considered = inputs["feasible"] & ~inputs["bad"]
    band &= considered[:, None, None]
    finite = log_transitions > -float("inf")  # forward edges of valid vertices only
    # Column scales: log E[u, v] = log P[u, v] + c_v with max_u P[u, v] = 1.
    # c_v moves into the emission of v at every step after the first.
    column_max = _safe_max(log_transitions, axis=1)  # -inf off the finite edges
    scaled = ops.where(finite, log_transitions - column_max[:, None, :], 0.0)
    transitions = ops.where(finite, ops.exp(scaled), 0.0)
    first_step = i == 0
    emission = match + ops.where(first_step, 0.0, column_max[:, None, :])
    return {
        **inputs,
        "steps": steps,
        "vertices": vertices,
        "considered": considered,
        "match": ops.where(band, match, -float("inf")),
        "log_transitions": log_transitions,
        "transitions": transitions,
        "emission": ops.where(band, emission, -float("inf")),
    }


def _safe_max(x, axis):
    top = ops.max(x, axis=axis)
    return ops.where(ops.isfinite(top), top, 0.0)


def _fast_pass(graph):
    """``log Z``, its gradients, and whether every example's result is exact."""
    fast = _fast_forward(graph)
    occupancy, d_transitions, exact = _fast_backward(graph, fast)
    exact = ops.all(exact | fast["zero"] | ~graph["considered"])
    keep = ~fast["zero"][:, None, None]  # no gradient through a zero probability
    occupancy = ops.where(keep, occupancy, 0.0)
    d_transitions = ops.where(keep, d_transitions, 0.0)
    return fast["log_z"], occupancy, d_transitions, exact


def _fast_forward(graph):
    """Upper bounds of the forward values, in probability space.

    Per step, ``alpha @ P`` times the step's emission factors
    ``E_i = exp(e_i - max e_i)``, divided by its largest value ``M_i``:
    ``A_i <= exp(S_i) alpha_i`` with ``S_i = sum_{j <= i} (max e_j + log M_j)``.
    Whatever float32 flushes to zero (a scaled value, a weak edge, an
    emission factor or a product) is bounded and added back, so ``alpha``
    bounds the forward values from above, and ``log Z <= S_{T-1}``.
    """
    steps, vertices = graph["steps"], graph["vertices"]
    transitions, emission = graph["transitions"], graph["emission"]
    row_max = _safe_max(emission, axis=2)  # (B, T)
    factors = ops.exp(emission - row_max[:, :, None])  # 0 outside the band
    # A factor flushed to zero was below _TINY (one of -inf is exactly zero).
    upper_factors = ops.where(emission > -float("inf"), ops.maximum(factors, _TINY), 0.0)
    alpha = factors[:, 0, :]  # one-hot at vertex 0
    # Bound of the terms flushed to zero in the next product, per example.
    slack = ops.full_like(row_max[:, 0], 4.0 * vertices * _TINY)
    alphas, log_norms = [alpha], [ops.zeros_like(row_max[:, 0])]
    for i in range(1, steps):
        product = ops.squeeze(ops.matmul(alpha[:, None, :], transitions), 1)
        alpha = (product + slack[:, None]) * upper_factors[:, i, :]
        norm = ops.max(alpha, axis=1)
        norm = ops.where(norm > 0, norm, 1.0)
        inverse = 1.0 / norm
        alpha = alpha * inverse[:, None]
        # Entries flushed before the division were below _TINY, so below
        # _TINY * inverse after it.
        slack = vertices * _TINY * (3.0 + ops.maximum(inverse, 1.0))
        alphas.append(alpha)
        log_norms.append(ops.log(norm))
    log_norms = ops.stack(log_norms, axis=1)  # (B, T), 0 after the last target
    # The last step's band is the last vertex alone, where alpha is 1.
    last_step = ops.one_hot(graph["target_length"] - 1, steps, dtype="float32")
    last = ops.one_hot(graph["output_length"] - 1, vertices, dtype="float32")
    picked = last_step[:, :, None] * last[:, None, :] > 0
    last_emission = ops.sum(ops.where(picked, emission, 0.0), axis=(1, 2))
    zero = graph["considered"] & (last_emission == -float("inf"))  # every path has weight 0
    log_z = ops.sum(row_max + log_norms, axis=1)
    return {
        "factors": factors,
        "alphas": ops.stack(alphas, axis=1),  # (B, T, N)
        "log_norms": log_norms,
        "zero": zero,
        "log_z": ops.where(zero, -float("inf"), log_z),  # an upper bound
    }


def _fast_backward(graph, fast):
    """The beta pass on the forward's scales; posteriors of vertices and edges.

    With the backward values ``B_{T-1} = onehot(N - 1)``, ``B_i = exp(r_i)
    beta_i``, ``max beta_i = 1``, and ``k_i = S_i + r_i - log Z`` (built from
    per-step logs, so that no large number is ever subtracted):
    ``dlogZ/dmatch[i, v] = alpha_i(v) beta_i(v) exp(k_i)`` and
    ``dlogZ/dlogE[u, v] = P[u, v] sum_i alpha_{i-1}(u) E_i(v) beta_i(v) exp(k_i - log M_i)``.

    The backward values only lose what float32 flushes to zero, so the
    backward pass's ``log Z`` (``k_0`` plus the log of ``beta_0(0)``, on the
    forward's scale) is a lower bound. When it meets the forward pass's upper
    bound, the value is exact, and so are the posteriors, to the same
    tolerance (their error, summed over vertices, is at most the gap).
    """
    steps, vertices = graph["steps"], graph["vertices"]
    transitions, target_length = graph["transitions"], graph["target_length"]
    factors, alphas, log_norms = fast["factors"], fast["alphas"], fast["log_norms"]
    last_vertex = ops.one_hot(graph["output_length"] - 1, vertices, dtype="float32")
    beta = ops.zeros_like(last_vertex)
    k = ops.zeros_like(log_norms[:, 0])
    too_large = k > 0
    occupancy = [None] * steps
    weights = [None] * steps
    for i in range(steps - 1, -1, -1):
        inside = i < target_length - 1
        if i < steps - 1:
            recurse = ops.squeeze(
                ops.matmul(transitions, (factors[:, i + 1, :] * beta)[:, :, None]), 2
            )
            top = ops.max(recurse, axis=1)
            safe_top = ops.where(top > 0, top, 1.0)
            beta = ops.where(inside[:, None], recurse / safe_top[:, None], 0.0)
            k = ops.where(inside, k + ops.log(safe_top) - log_norms[:, i + 1], 0.0)
        is_last = ops.equal(target_length - 1, i)
        beta = ops.where(is_last[:, None], last_vertex, beta)
        k = ops.where(is_last, 0.0, k)
        too_large |= k > _MAX_EXPONENT
        occupancy[i] = alphas[:, i, :] * beta * ops.exp(ops.minimum(k, _MAX_EXPONENT))[:, None]
        if i > 0:
            exponent = k - log_norms[:, i]
            too_large |= exponent > _MAX_EXPONENT
            scale = ops.exp(ops.minimum(exponent, _MAX_EXPONENT))
            weights[i] = factors[:, i, :] * beta * scale[:, None]
    d_match = ops.stack(occupancy, axis=1)
    # log(upper bound / lower bound) of Z: minus the log of the first target's occupancy.
    gap = -ops.log(d_match[:, 0, 0])
    tolerance = _GAP_TOLERANCE + _GAP_PER_STEP * ops.cast(target_length, "float32")
    exact = (gap <= tolerance) & ~too_large
    if steps > 1:
        previous = alphas[:, :-1, :]  # alpha_0 .. alpha_{T-2}
        following = ops.stack(weights[1:], axis=1)  # W_1 .. W_{T-1}
        d_transitions = transitions * ops.matmul(ops.transpose(previous, (0, 2, 1)), following)
    else:
        d_transitions = ops.zeros_like(transitions)
    return d_match, d_transitions, exact


def _logsumexp(x, axis):
    top = _safe_max(x, axis)
    return top + ops.log(ops.sum(ops.exp(x - ops.expand_dims(top, axis)), axis=axis))


def _log_space(graph, with_gradients):
    """The exact recursion in log space: ``log Z`` (and its gradients)."""
    # In loops, not unrolled, so that it adds little to the compiled program.
    steps, vertices = graph["steps"], graph["vertices"]
    match, log_transitions = graph["match"], graph["log_transitions"]
    target_length = graph["target_length"]
    u = ops.arange(vertices, dtype="int32")
    last = u[None, :] == graph["output_length"][:, None] - 1
    by_step = ops.transpose(match, (1, 0, 2))  # (T, B, N)

    def forward_step(alpha, emission):
        alpha = emission + _logsumexp(alpha[:, :, None] + log_transitions, axis=1)
        return alpha, alpha

    first = by_step[0]  # -inf except vertex 0
    if steps > 1:
        _, rest = ops.scan(forward_step, first, by_step[1:])
        forward = ops.concatenate([first[None], rest], axis=0)
    else:
        forward = first[None]
    end = ops.arange(steps, dtype="int32")[:, None, None] == target_length[None, :, None] - 1
    picked = end & last[None]
    log_z = ops.sum(ops.where(picked, forward, 0.0), axis=(0, 2))
    log_z = ops.where(ops.any(picked, axis=(0, 2)), log_z, -float("inf"))
    if not with_gradients:
        return log_z, None, None
    finite = ops.isfinite(log_z)
    safe_log_z = ops.where(finite, log_z, 0.0)
    end_value = ops.where(last, 0.0, -float("inf"))

    def backward_step(beta, inputs):
        emission, i = inputs  # emission of target i + 1; beta of target i + 1
        beta = _logsumexp(log_transitions + (emission + beta)[:, None, :], axis=2)
        beta = ops.where((i < target_length - 1)[:, None], beta, -float("inf"))
        beta = ops.where((i == target_length - 1)[:, None], end_value, beta)
        return beta, beta

    final = ops.where((target_length == steps)[:, None], end_value, -float("inf"))
    if steps > 1:
        indices = ops.arange(steps - 1, dtype="int32")
        _, rest = ops.scan(backward_step, final, (by_step[1:], indices), reverse=True)
        backward = ops.concatenate([rest, final[None]], axis=0)
    else:
        backward = final[None]
    occupancy = ops.exp(forward + backward - safe_log_z[None, :, None])

    def edge_step(i, total):
        # Edges into target i: exp(f_{i-1}(u) + log E[u, v] + match_i(v) + b_i(v) - log Z).
        source = ops.take(forward, i - 1, axis=0)
        target = ops.take(by_step, i, axis=0) + ops.take(backward, i, axis=0)
        return total + ops.exp(
            source[:, :, None] + log_transitions + (target - safe_log_z[:, None])[:, None, :]
        )

    d_transitions = ops.fori_loop(1, steps, edge_step, ops.zeros_like(log_transitions))
    keep = finite[:, None, None]  # no gradient through a zero probability
    occupancy = ops.transpose(occupancy, (1, 0, 2))
    return log_z, ops.where(keep, occupancy, 0.0), ops.where(keep, d_transitions, 0.0)


@keras.saving.register_keras_serializable(package="keras_masking")
class DAGLoss(keras.losses.Loss):
    """ExLM's loss: ``-log P(Y) / |Y|`` per example, from `dag_loss`.

    Impossible alignments contribute 0 (as the official code); see `dag_loss`
    for zero-probability alignments and NaN inputs.

    Args:
        **kwargs: `keras.losses.Loss` arguments (``reduction``, ``name``).

    Example:
    >>> match = np.log(np.full((1, 2, 3), 0.5, "float32"))
    >>> edges = np.where(np.triu(np.ones((1, 3, 3)), 1) > 0, np.log(0.5), -np.inf)
    >>> y_true = {"output_length": np.array([3]), "target_length": np.array([2])}
    >>> y_pred = {"match": match, "log_transitions": edges}
    >>> round(float(DAGLoss()(y_true, y_pred)), 4)  # 2.0794 nats over 2 targets
    1.0397

    ``y_true`` is a dict with ``output_length`` and ``target_length``;
    ``y_pred`` a dict with ``match`` ``(B, T, N)`` and ``log_transitions``
    ``(B, N, N)``.
    """

    def __init__(self, name="dag_loss", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        for argument, value, keys in (
            ("y_true", y_true, ("output_length", "target_length")),
            ("y_pred", y_pred, ("match", "log_transitions")),
        ):
            if not isinstance(value, dict) or any(key not in value for key in keys):
                received = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise ValueError(
                    f"Expected {argument} to be a dict with keys {list(keys)}. "
                    f"Received: {argument} with {received}."
                )
        target_length = y_true["target_length"]
        log_likelihood = dag_loss(
            y_pred["match"], y_pred["log_transitions"], y_true["output_length"], target_length
        )
        target_length = ops.cast(ops.convert_to_tensor(target_length), "float32")
        return -log_likelihood / ops.maximum(target_length, 1.0)
