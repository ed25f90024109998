"""ASA's divergence between the clean and the adversarial predictions."""

from keras import ops

from keras_masking.utils.arguments import check_choice

#: The task kinds `asa_divergence` knows, with the official normaliser of each.
ASA_TASKS = ("classification", "multiple_choice", "regression", "token_classification")


def symmetric_kl_divergence(clean_logits, adversarial_logits, weights=None):
    """``1/2 [KL(p_adv || p) + KL(p || p_adv)]``, summed and divided by the batch.

    ``p = softmax(clean_logits)`` and ``p_adv = softmax(adversarial_logits)``
    over the last axis. As PyTorch's ``KLDivLoss(reduction="batchmean")``
    that the official ASA code uses: the sum over every axis but the first,
    divided by the first axis' size. For [CLS] classification ``(B, C)`` that
    is the mean over examples; for multiple choice ``(B, choices)`` the same;
    for token classification ``(B, T, C)`` it is the SUM over the ``T``
    positions (padding and special tokens included), divided by ``B``.

    Args:
        clean_logits: float tensor ``(batch, ..., classes)``.
        adversarial_logits: float tensor of the same shape.
        weights: optional tensor ``(batch, ...)`` (the logits' shape without
            the last axis) multiplying each distribution's divergence before
            the sum, e.g. 1 for real tokens only (not the official behaviour).

    Returns:
        A float32 scalar.

    Example:
    >>> clean, adversarial = keras.ops.array([[0.0, 1.0]]), keras.ops.array([[1.0, 0.0]])
    >>> value = symmetric_kl_divergence(clean, adversarial)
    >>> round(float(value), 6)
    0.462117
    """
    clean = ops.log_softmax(ops.cast(clean_logits, "float32"), axis=-1)
    adversarial = ops.log_softmax(ops.cast(adversarial_logits, "float32"), axis=-1)
    # KL(a || b) + KL(b || a) = sum (a - b)(log a - log b).
    per_distribution = 0.5 * ops.sum(
        (ops.exp(clean) - ops.exp(adversarial)) * (clean - adversarial), axis=-1
    )
    if weights is not None:
        per_distribution = per_distribution * ops.cast(weights, "float32")
    batch = ops.cast(ops.shape(clean)[0], "float32")
    return ops.sum(per_distribution) / batch


def batch_softmax_divergence(clean_predictions, adversarial_predictions):
    """The official ASA divergence for regression: softmax over the BATCH.

    With one output per example (``num_labels == 1``, ``(B, 1)``), the
    official ``divergence`` flattens both to ``(B,)`` and applies the
    symmetric KL of `symmetric_kl_divergence` to the softmax over the batch
    axis, divided by ``B``. This is a quirk of that code (the value depends
    on the other examples of the batch); it is reproduced as it is.

    Args:
        clean_predictions: float tensor ``(batch, 1)`` or ``(batch,)``.
        adversarial_predictions: float tensor of the same shape.

    Returns:
        A float32 scalar.

    Example:
    >>> clean, adversarial = keras.ops.array([[0.0], [1.0]]), keras.ops.array([[1.0], [0.0]])
    >>> value = batch_softmax_divergence(clean, adversarial)
    >>> round(float(value), 6)
    0.231059
    """
    clean = ops.reshape(clean_predictions, (1, -1))
    adversarial = ops.reshape(adversarial_predictions, (1, -1))
    batch = ops.cast(ops.shape(clean)[1], "float32")
    return symmetric_kl_divergence(clean, adversarial) / batch


def span_position_divergence(clean_logits, adversarial_logits):
    """ASA's divergence for span extraction: over positions, start and end.

    Span models give start and end logits per position, ``(B, L, 2)``; the
    answer's start and its end are each a distribution over the ``L``
    positions. This is the symmetric KL of `symmetric_kl_divergence` on
    each of the two distributions, summed, divided by ``B``. The official
    ASA code has no span task; this extends its classification divergence to
    the distributions a span head predicts (reading ``(B, L, 2)`` as token
    classification would compare start against end at each position).

    Args:
        clean_logits: float ``(batch, length, 2)``.
        adversarial_logits: float, the same shape.

    Returns:
        A float32 scalar.

    Example:
    >>> clean = np.zeros((1, 3, 2), "float32")
    >>> float(span_position_divergence(clean, clean))
    0.0
    """
    clean = ops.transpose(ops.cast(clean_logits, "float32"), (0, 2, 1))
    adversarial = ops.transpose(ops.cast(adversarial_logits, "float32"), (0, 2, 1))
    return symmetric_kl_divergence(clean, adversarial)


def asa_divergence(clean, adversarial, task="classification", weights=None):
    """The official ASA divergence of a task kind.

    Args:
        clean: the clean pass' logits (or predictions, for regression).
        adversarial: the adversarial pass' logits, same shape.
        task: one of `ASA_TASKS`: ``"classification"`` and
            ``"multiple_choice"`` ``(B, C)``, ``"token_classification"``
            ``(B, T, C)`` (sum over positions / B), ``"regression"``
            ``(B, 1)`` (softmax over the batch, see
            `batch_softmax_divergence`).
        weights: optional per-position weights for token classification
            (see `symmetric_kl_divergence`).

    Returns:
        A float32 scalar.
    """
    if check_choice("task", task, ASA_TASKS) == "regression":
        return batch_softmax_divergence(clean, adversarial)
    return symmetric_kl_divergence(clean, adversarial, weights)
