"""Start/end logits of span extraction, restricted to the context."""

import keras
from keras import ops

from keras_masking.layers.multiple_choice import MASKED_LOGIT
from keras_masking.utils.arguments import check_int


@keras.saving.register_keras_serializable(package="keras_masking")
class MaskedSpanLogits(keras.layers.Layer):
    """Masks start/end logits outside the context (the second segment).

    Valid positions are the real tokens of segment ``context_segment`` (the
    context window of ``[CLS] question [SEP] context [SEP]``) and position 0
    ([CLS], the target of a window without the answer); every other
    position gets `MASKED_LOGIT` (``-1e9``), so the softmax over positions
    gives it probability 0. Float32 output under every dtype policy (float32
    logits are not cast to the policy's compute dtype first).

    Args:
        context_segment: int, the segment id of the context (1).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        logits: float tensor ``(batch, length, 2)``.
        segment_ids: int tensor ``(batch, length)``.
        padding_mask: 0/1 tensor ``(batch, length)``.

    Example:
    >>> logits = np.ones((1, 4, 2), "float32")
    >>> masked = MaskedSpanLogits()(logits, np.array([[0, 0, 1, 1]]), np.array([[1, 1, 1, 0]]))
    >>> keras.ops.convert_to_numpy(masked)[0, :, 0].tolist()
    [1.0, -1000000000.0, 1.0, -1000000000.0]
    """

    def __init__(self, context_segment=1, **kwargs):
        kwargs.setdefault("autocast", False)  # float32 logits stay float32
        super().__init__(**kwargs)
        self.context_segment = check_int("context_segment", context_segment)
        self.built = True

    def call(self, logits, segment_ids, padding_mask):
        real = ops.cast(padding_mask, "bool")
        context = real & ops.equal(ops.cast(segment_ids, "int32"), self.context_segment)
        first = ops.arange(ops.shape(segment_ids)[1]) == 0
        valid = ops.logical_or(context, first[None, :])
        logits = ops.cast(logits, "float32")
        return ops.where(valid[..., None], logits, ops.cast(MASKED_LOGIT, "float32"))

    def compute_output_shape(self, logits_shape, segment_ids_shape, padding_mask_shape):
        return tuple(logits_shape)

    def compute_output_spec(self, logits, segment_ids, padding_mask):
        return keras.KerasTensor(tuple(logits.shape), "float32")

    def get_config(self):
        return {**super().get_config(), "context_segment": self.context_segment}
