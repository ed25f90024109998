"""The start/end cross-entropy of span extraction (CMRC2018, SQuAD)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_masking")
class SpanCrossentropy(keras.losses.Loss):
    """Mean of the start and end softmax cross-entropies over the positions.

    The scores are ``(batch, length, 2)`` (start logits ``[..., 0]``, end
    logits ``[..., 1]``, as `build_task_model` gives for span tasks) and the
    targets ``(batch, 2)`` token indices (``(0, 0)``, the [CLS] token, for a
    window without the answer). Per example the loss is ``(CE(start) +
    CE(end)) / 2`` with the softmax over the ``length`` positions, as in
    BERT's SQuAD fine-tuning; computed in float32.

    Args:
        name: the loss name.
        reduction: a Keras reduction.
        dtype: must stay float32 or None.

    Example:
    >>> logits = np.zeros((1, 4, 2), "float32")
    >>> round(float(SpanCrossentropy()(np.array([[1, 2]]), logits)), 5)  # log(4)
    1.38629
    """

    def __init__(self, name="span_crossentropy", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        if len(y_pred.shape) != 3 or y_pred.shape[-1] != 2:
            raise ValueError(
                "SpanCrossentropy expects logits (batch, length, 2). "
                f"Received: y_pred of shape {tuple(y_pred.shape)}."
            )
        log_probabilities = ops.log_softmax(y_pred, axis=1)
        positions = ops.cast(ops.reshape(y_true, (-1, 1, 2)), "int32")
        picked = ops.take_along_axis(log_probabilities, positions, axis=1)  # (batch, 1, 2)
        return -ops.mean(picked[:, 0, :], axis=-1)

    def get_config(self):
        return {"name": self.name, "reduction": self.reduction, "dtype": self.dtype}
