"""Which tokens a method masks or drops: per row, the k lowest random scores.

One rule serves every method that chooses tokens at random (DropToken, the
ExLM pretrainer, the streaming MLM pipeline, MLM model averaging): round the
count, keep the lowest random ranks.
"""

from keras import ops as keras_ops


def select_tokens(
    selectable, rate, noise, rounding=None, min_count=0, max_count=None, backend_ops=None
):
    """bool ``(batch, sequence)``: per row, the ``k`` selectable tokens of lowest ``noise``.

    With ``n`` selectable tokens in a row, ``k = floor(rate * n + rounding)``
    when ``rounding`` is given (stochastic rounding: the expected count is
    exactly ``rate * n``), else ``round(rate * n)`` (half to even, BERT's
    count). Then ``k = min(k, max_count)`` and ``k = max(k, min(min_count,
    n))``: the lower bound wins. Unselectable tokens and padding (False in
    ``selectable``) are never chosen; equal scores go to the earlier token.
    Every shape is static, so a compiled step compiles once. The counts are
    computed in float32 whatever the inputs' dtypes.

    Args:
        selectable: bool ``(batch, sequence)``, the tokens that may be chosen
            (real and not unselectable).
        rate: float, the share of the selectable tokens chosen.
        noise: float ``(batch, sequence)``, the random scores (uniform in
            ``[0, 1)``).
        rounding: float ``(batch,)`` uniform in ``[0, 1)``, or None for
            round-half-to-even.
        min_count: int or float ``(batch,)``, the fewest tokens chosen
            (capped at ``n``).
        max_count: int, float ``(batch,)`` or None, the most tokens chosen.
        backend_ops: the operations to compute with: ``keras.ops`` (None), or
            a namespace with the same ``cast``, ``sum``, ``floor``,
            ``round``, ``minimum``, ``maximum``, ``where`` and ``argsort``
            (a `tf.data` pipeline passes TensorFlow's under any backend).

    Returns:
        A bool tensor ``(batch, sequence)``.

    Example:

    >>> import numpy as np
    >>> selectable = np.array([[False, True, True, True, True, False]])
    >>> noise = np.array([[0.0, 0.7, 0.2, 0.9, 0.1, 0.0]], "float32")
    >>> np.asarray(select_tokens(selectable, 0.5, noise)).tolist()
    [[False, False, True, False, True, False]]
    """
    ops = backend_ops or keras_ops
    selectable = ops.cast(selectable, "bool")
    count = ops.sum(ops.cast(selectable, "float32"), axis=1)
    if rounding is None:
        chosen = ops.round(rate * count)
    else:
        chosen = ops.floor(rate * count + ops.cast(rounding, "float32"))
    if max_count is not None:
        chosen = ops.minimum(chosen, ops.cast(max_count, "float32"))
    chosen = ops.maximum(chosen, ops.minimum(ops.cast(min_count, "float32"), count))
    score = ops.where(selectable, ops.cast(noise, "float32"), 2.0)
    rank = ops.argsort(ops.argsort(score, axis=1), axis=1)
    return selectable & (ops.cast(rank, "float32") < chosen[:, None])
