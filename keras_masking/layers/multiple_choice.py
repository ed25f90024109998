"""Multiple choice on a sequence encoder: choices into the batch axis and back."""

import keras
from keras import ops

#: The logit of a padded choice: its softmax probability is exactly 0 in float32.
MASKED_LOGIT = -1e9


@keras.saving.register_keras_serializable(package="keras_masking")
class FlattenChoices(keras.layers.Layer):
    """Merges the choice axis into the batch axis: ``(B, C, ...) -> (B * C, ...)``.

    So that an encoder of ``(batch, length)`` inputs scores every choice of a
    C3 question (or every candidate of a CHID blank) as one sequence.
    `ChoiceLogits` puts the choices back.

    Args:
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: a tensor ``(batch, choices, ...)`` with static inner sizes.

    Example:
    >>> flat = FlattenChoices()(np.zeros((2, 4, 8), "int32"))
    >>> tuple(flat.shape)
    (8, 8)
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.built = True

    def call(self, inputs):
        inner = tuple(ops.shape(inputs)[2:])
        return ops.reshape(inputs, (-1,) + inner)

    def compute_output_shape(self, input_shape):
        batch, choices = input_shape[0], input_shape[1]
        merged = None if batch is None or choices is None else batch * choices
        return (merged,) + tuple(input_shape[2:])

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), inputs.dtype)


@keras.saving.register_keras_serializable(package="keras_masking")
class ChoiceLogits(keras.layers.Layer):
    """One score per sequence ``(B * C, 1)`` -> choice logits ``(B, C)``, padding masked.

    A padded choice (``choice_mask`` 0) gets `MASKED_LOGIT` (``-1e9``), so
    its softmax probability is exactly 0. The logits are float32 under every
    dtype policy, and so are the scores they keep (not cast to the policy's
    compute dtype first).

    Args:
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        scores: float tensor ``(batch * choices, 1)`` or ``(batch * choices,)``.
        choice_mask: 0/1 tensor ``(batch, choices)``.

    Example:
    >>> logits = ChoiceLogits()(np.array([[1.0], [2.0], [3.0], [4.0]]), np.array([[1, 0], [1, 1]]))
    >>> keras.ops.convert_to_numpy(logits).tolist()
    [[1.0, -1000000000.0], [3.0, 4.0]]
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("autocast", False)  # float32 scores stay float32
        super().__init__(**kwargs)
        self.built = True

    def call(self, scores, choice_mask):
        logits = ops.reshape(ops.cast(scores, "float32"), (-1, ops.shape(choice_mask)[1]))
        valid = ops.cast(choice_mask, "bool")
        return ops.where(valid, logits, ops.cast(MASKED_LOGIT, "float32"))

    def compute_output_shape(self, scores_shape, choice_mask_shape):
        return tuple(choice_mask_shape)

    def compute_output_spec(self, scores, choice_mask):
        return keras.KerasTensor(tuple(choice_mask.shape), "float32")
