"""Multilabel categorical cross-entropy (Su, 2020): GlobalPointer's loss."""

import keras
from keras import ops

_EXCLUDED = -1e12


@keras.saving.register_keras_serializable(package="keras_masking")
def multilabel_categorical_crossentropy(y_true, y_pred):
    """``log(1 + sum_neg e^{s}) + log(1 + sum_pos e^{-s})`` over the last axis.

    The softmax cross-entropy generalised to any number of positive classes
    (Su Jianlin, "将'softmax+交叉熵'推广到多标签分类问题", 2020): every
    positive score is pushed above 0 and every negative score below 0, with
    no class-imbalance weighting. Scores are read as float32; entries masked
    with a very negative score (`GlobalPointer`'s ``-1e12``) add nothing.

    Args:
        y_true: 0/1 tensor, the shape of ``y_pred``.
        y_pred: float scores ``(..., classes)``.

    Returns:
        float32 tensor ``(...)``, the loss per row.

    Example:
    >>> y_pred = np.array([[2.0, -1.0, 0.5]], "float32")
    >>> loss = multilabel_categorical_crossentropy(np.array([[1, 0, 0]]), y_pred)
    >>> round(float(loss[0]), 5)  # log(1 + e^-1 + e^0.5) + log(1 + e^-2)
    1.23106
    """
    y_true = ops.cast(y_true, "float32")
    y_pred = ops.cast(y_pred, "float32")
    positive = y_true > 0.5
    excluded = ops.cast(_EXCLUDED, "float32")
    negatives = ops.where(positive, excluded, y_pred)
    positives = ops.where(positive, -y_pred, excluded)
    zeros = ops.zeros_like(y_pred[..., :1])
    negative_loss = ops.logsumexp(ops.concatenate([negatives, zeros], axis=-1), axis=-1)
    positive_loss = ops.logsumexp(ops.concatenate([positives, zeros], axis=-1), axis=-1)
    return negative_loss + positive_loss


def entity_targets(entities, num_types, length):
    """Dense 0/1 span targets ``(batch, num_types, length, length)`` from entity rows.

    Args:
        entities: int tensor ``(batch, max_entities, 3)`` of ``(type, start
            token, end token)`` rows; rows with a negative type are padding.
        num_types: int, the number of entity types.
        length: int (or scalar tensor), the sequence length.

    Returns:
        float32 tensor ``(batch, num_types, length, length)``, 1 at each
        entity's ``[type, start, end]``.

    Example:
    >>> rows = np.array([[[1, 0, 2], [-1, -1, -1]]])
    >>> dense = keras.ops.convert_to_numpy(entity_targets(rows, 2, 3))
    >>> dense.shape, float(dense.sum()), float(dense[0, 1, 0, 2])
    ((1, 2, 3, 3), 1.0, 1.0)
    """
    entities = ops.cast(entities, "int32")
    valid = ops.cast(entities[..., 0] >= 0, "float32")[..., None]
    types = ops.one_hot(ops.maximum(entities[..., 0], 0), num_types, dtype="float32") * valid
    starts = ops.one_hot(ops.maximum(entities[..., 1], 0), length, dtype="float32")
    ends = ops.one_hot(ops.maximum(entities[..., 2], 0), length, dtype="float32")
    return ops.minimum(ops.einsum("bet,bei,bej->btij", types, starts, ends), 1.0)


@keras.saving.register_keras_serializable(package="keras_masking")
class MultilabelCategoricalCrossentropy(keras.losses.Loss):
    """GlobalPointer's loss: multilabel CE per (example, type), over all spans.

    For scores ``(batch, types, length, length)`` each type's ``length x
    length`` span scores are one multilabel row
    (`multilabel_categorical_crossentropy`); an example's loss is the mean
    over its types, so the default ``"sum_over_batch_size"`` reduction gives
    bert4keras' mean over ``batch x types``. The targets may be dense 0/1
    (the scores' shape) or the entity rows `encode_examples` writes,
    ``(batch, max_entities, 3)`` of ``(type, start, end)`` with ``-1``
    padding (made dense by `entity_targets` inside the loss). Computed in
    float32.

    Args:
        name: the loss name.
        reduction: a Keras reduction.
        dtype: must stay float32 or None (the loss is computed in float32).

    Example:
    >>> scores = np.full((1, 2, 3, 3), -5.0, "float32")
    >>> scores[0, 1, 0, 2] = 5.0
    >>> loss = MultilabelCategoricalCrossentropy()
    >>> round(float(loss(np.array([[[1, 0, 2]]]), scores)), 4)  # (0.0588 + 0.0525 + 0.0067) / 2
    0.059
    """

    def __init__(
        self,
        name="multilabel_categorical_crossentropy",
        reduction="sum_over_batch_size",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        if len(y_pred.shape) != 4:
            raise ValueError(
                "MultilabelCategoricalCrossentropy expects scores (batch, types, length, length). "
                f"Received: y_pred of shape {tuple(y_pred.shape)}."
            )
        if len(y_true.shape) == 3:
            y_true = entity_targets(y_true, y_pred.shape[1], ops.shape(y_pred)[2])
        rows = ops.reshape(y_pred, (ops.shape(y_pred)[0], y_pred.shape[1], -1))
        targets = ops.reshape(y_true, ops.shape(rows))
        return ops.mean(multilabel_categorical_crossentropy(targets, rows), axis=-1)

    def get_config(self):
        return {"name": self.name, "reduction": self.reduction, "dtype": self.dtype}
