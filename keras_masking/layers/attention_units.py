"""MA-tuning: extra trainable units in every attention head's projections."""

import keras
from keras import ops

from keras_masking.layers.initializers import bert_initializer
from keras_masking.utils.arguments import check_int

_PROJECTIONS = ("query", "key", "value")


@keras.saving.register_keras_serializable(package="keras_masking")
class AttentionUnits(keras.layers.Layer):
    """``u`` extra query/key/value units per head, and their output rows.

    FL-tuning's attention variant (MA-tuning): the logits gain
    ``(x W_q')(x W_k')^T`` (with the base head's ``1/sqrt(head_dim)`` scale)
    and the output the extra values mapped back by ``W_o'``, when this layer
    is `SelfAttention`'s ``extra_units``. No rotary or relative position.

    Args:
        units_per_head: int, the ``u`` extra units per head.
        num_heads: int, heads of the attention it extends.
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> units = AttentionUnits(units_per_head=2, num_heads=4)
    >>> units.build((None, None, 32))
    >>> query, key, value = units.projections(keras.ops.ones((1, 5, 32)))
    >>> tuple(query.shape)
    (1, 5, 4, 2)
    """

    def __init__(self, units_per_head, num_heads, **kwargs):
        units_per_head = check_int("units_per_head", units_per_head, minimum=1)
        super().__init__(**kwargs)
        self.units_per_head = units_per_head
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        width = self.units_per_head * self.num_heads
        self.query, self.key, self.value = (self._dense(width, name) for name in _PROJECTIONS)
        self.attention_output = None

    def _dense(self, units, name):
        return keras.layers.Dense(
            units, kernel_initializer=bert_initializer(), dtype=self.dtype_policy, name=name
        )

    def build(self, input_shape):
        for projection in (self.query, self.key, self.value):
            projection.build(input_shape)
        self.attention_output = self._dense(input_shape[-1], "attention_output")
        self.attention_output.build((None, None, self.units_per_head * self.num_heads))
        self.built = True

    def projections(self, hidden):
        """Extra queries, keys and values, each ``(batch, sequence, heads, u)``."""
        batch, length = ops.shape(hidden)[0], ops.shape(hidden)[1]
        shape = (batch, length, self.num_heads, self.units_per_head)
        return tuple(
            ops.reshape(projection(hidden), shape)
            for projection in (self.query, self.key, self.value)
        )

    def project_output(self, context):
        """Maps extra context ``(batch, sequence, heads, u)`` to the hidden size."""
        batch, length = ops.shape(context)[0], ops.shape(context)[1]
        flat = ops.reshape(context, (batch, length, self.num_heads * self.units_per_head))
        return self.attention_output(flat)

    def call(self, hidden):
        query, key, value = self.projections(hidden)
        return self.project_output(value)

    def get_config(self):
        config = {"units_per_head": self.units_per_head, "num_heads": self.num_heads}
        return {**super().get_config(), **config}
