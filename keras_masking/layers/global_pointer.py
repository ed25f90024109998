"""GlobalPointer: a score for every (start, end) token pair, per entity type."""

import math

import keras
from keras import ops

from keras_masking.ops.rotary import apply_interleaved_rotary
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_int

#: The score of a pair that cannot be an entity (end before start, padding).
MASKED_SCORE = -1e12


@keras.saving.register_keras_serializable(package="keras_masking")
class GlobalPointer(keras.layers.Layer):
    """Span scores for named entities, one head per entity type (Su, 2021).

    Each token's hidden state is projected to a query ``q_t`` and a key
    ``k_t`` of ``head_size`` features per type ``t``; both are rotated by
    their token's position with interleaved RoPE (`apply_interleaved_rotary`,
    bert4keras' layout) so the score sees the relative distance; the score
    of the span from token ``i`` to token ``j`` (inclusive) is

        ``s[t, i, j] = q_t(i) . k_t(j) / sqrt(head_size)``.

    Pairs with ``j < i`` and pairs touching padding get `MASKED_SCORE`. A
    span is predicted when its score is > 0; train with
    `keras_masking.losses.MultilabelCategoricalCrossentropy`. The scores are
    float32 under every dtype policy (only the projection runs in the
    compute dtype), so the mask value and the loss keep their precision.

    Args:
        num_types: int >= 1, the number of entity types (heads).
        head_size: even int, the query/key size per type (64 in bert4keras).
        use_rotary: bool. Rotate queries and keys by position (RoPE).
        kernel_initializer: initializer of the projection kernel.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        sequence: float tensor ``(batch, length, hidden)``.
        padding_mask: optional 0/1 tensor ``(batch, length)``.

    Returns:
        float32 scores ``(batch, num_types, length, length)``.

    Example:
    >>> layer = GlobalPointer(num_types=2, head_size=4)
    >>> scores = layer(np.ones((1, 3, 8), "float32"), np.array([[1, 1, 0]]))
    >>> tuple(scores.shape), keras.backend.standardize_dtype(scores.dtype)
    ((1, 2, 3, 3), 'float32')
    >>> float(scores[0, 0, 1, 0]) == float(scores[0, 0, 0, 2]) == float(np.float32(MASKED_SCORE))
    True
    """

    def __init__(
        self,
        num_types,
        head_size=64,
        use_rotary=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_types = check_int("num_types", num_types, minimum=1)
        self.head_size = check_int("head_size", head_size, minimum=1)
        if head_size % 2:
            raise ValueError(
                f"Expected an even head_size (RoPE rotates feature pairs). "
                f"Received: head_size={head_size}."
            )
        self.use_rotary = check_bool("use_rotary", use_rotary)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.projection = None

    def build(self, sequence_shape, padding_mask_shape=None):
        self.projection = keras.layers.Dense(
            self.num_types * self.head_size * 2,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="projection",
        )
        self.projection.build(sequence_shape)
        self.built = True

    def call(self, sequence, padding_mask=None):
        projected = ops.cast(self.projection(sequence), "float32")
        length = ops.shape(sequence)[1]  # the input's: see SelfAttention._split_heads
        # Per type, the first head_size features are the query, the rest the key.
        projected = ops.reshape(projected, (-1, length, self.num_types, 2 * self.head_size))
        queries = projected[..., : self.head_size]
        keys = projected[..., self.head_size :]
        if self.use_rotary:
            positions = ops.arange(length, dtype="int32")[None]
            queries = apply_interleaved_rotary(queries, positions)
            keys = apply_interleaved_rotary(keys, positions)
        scores = ops.einsum("bitd,bjtd->btij", queries, keys) / math.sqrt(self.head_size)
        index = ops.arange(length, dtype="int32")
        valid = (index[None, :] >= index[:, None])[None, None]  # j >= i
        if padding_mask is not None:
            real = ops.cast(padding_mask, "bool")
            valid = valid & real[:, None, :, None] & real[:, None, None, :]
        return ops.where(valid, scores, ops.cast(MASKED_SCORE, "float32"))

    def compute_output_shape(self, sequence_shape, padding_mask_shape=None):
        batch, length = sequence_shape[0], sequence_shape[1]
        return (batch, self.num_types, length, length)

    def compute_output_spec(self, sequence, padding_mask=None):
        return keras.KerasTensor(self.compute_output_shape(sequence.shape), "float32")

    def get_config(self):
        return {
            **super().get_config(),
            "num_types": self.num_types,
            "head_size": self.head_size,
            "use_rotary": self.use_rotary,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
