"""Gradient reversal and the straight-through binary step, as plain functions."""

from keras import ops


def reverse_gradient(x, alpha=1.0):
    """Identity in the forward pass, gradient times ``-alpha`` in the backward.

    Written with `stop_gradient` only, so it runs on every backend and under
    XLA: ``y = sg(x) + alpha * (sg(x) - x)``. The forward value is exactly
    ``x`` for any ``alpha`` (``sg(x) - x`` is exactly zero); the gradient of
    ``y`` with respect to ``x`` is exactly ``-alpha``. (The shorter
    ``sg(x) * (1 + alpha) - alpha * x`` is exact only for ``alpha = 1``.)

    Ganin & Lempitsky (2015), "Unsupervised Domain Adaptation by
    Backpropagation"; ASA (Wu et al., 2023) reverses its adversaries' gradient
    this way.

    Args:
        x: a float tensor.
        alpha: float, the strength of the reversal (0 blocks the gradient).

    Returns:
        A tensor equal to ``x``.

    Example:
    >>> keras.ops.convert_to_numpy(reverse_gradient(keras.ops.ones((2,)), alpha=0.5))
    array([1., 1.], dtype=float32)
    """
    frozen = ops.stop_gradient(x)
    return frozen + ops.cast(alpha, x.dtype) * (frozen - x)


def straight_through_step(scores, threshold_noise=None):
    """``1[scores > 0]`` forward, the gradient of ``sigmoid(scores)`` backward.

    ``hard + (soft - sg(soft))`` with ``soft = sigmoid(scores)``: the forward
    value is exactly 0 or 1 (``soft - sg(soft)`` is exactly zero, whatever
    ``soft`` is), and the gradient is ``sigmoid'(scores)``. This is the
    official ASA code's Gumbel-sigmoid at temperature 1e-12 with its noise
    cancelled (``x + g - g``); a score of exactly 0 gives 0 here where the
    official code gives 0.5.

    Args:
        scores: a float tensor of logits.
        threshold_noise: optional tensor added to ``scores`` before the
            step only (a Gumbel-sigmoid with real noise); the gradient stays
            that of ``sigmoid(scores)``.

    Returns:
        A tensor of the same shape and dtype holding 0.0 and 1.0.

    Example:
    >>> keras.ops.convert_to_numpy(straight_through_step(np.array([-1.0, 2.0], "float32")))
    array([0., 1.], dtype=float32)
    """
    soft = ops.sigmoid(scores)
    thresholded = scores if threshold_noise is None else scores + threshold_noise
    hard = ops.cast(thresholded > 0, scores.dtype)
    return hard + (soft - ops.stop_gradient(soft))
