"""P-tuning v2's trainable per-layer key/value prefixes."""

import keras
from keras import ops

from keras_masking.layers.initializers import bert_initializer


@keras.saving.register_keras_serializable(package="keras_masking")
class KeyValuePrefix(keras.layers.Layer):
    """``length`` trainable keys and values that every query may attend to.

    The pair it returns is `SelfAttention`'s ``kv_prefix``: keys and values of
    shape ``(1, length, heads, head_dim)``, concatenated after the key/value
    projections, with no position and no mask (the padding mask is extended
    with ones). Dropout (0.1 in P-tuning v2) applies to the prefixes in
    training.

    With ``reparameterize=True`` the prefixes come from P-tuning v2's optional
    MLP, ``Embedding(length, d) -> Dense(hidden_units, tanh) -> Dense(2 d)``,
    instead of free tables.

    Args:
        length: int >= 0, the prefix length ``P`` (160 in the FL-tuning paper's
            comparison). 0 gives no prefix.
        num_heads: int, attention heads of the layer it attaches to.
        head_dim: int, per-head size.
        dropout: float in [0, 1), dropout on the prefixes.
        reparameterize: bool, use the MLP reparameterisation.
        hidden_units: int, the MLP's hidden width (512 in P-tuning v2).
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> prefix = KeyValuePrefix(length=4, num_heads=2, head_dim=8)
    >>> keys, values = prefix()
    >>> keys.shape
    (1, 4, 2, 8)
    """

    def __init__(
        self,
        length,
        num_heads,
        head_dim,
        dropout=0.1,
        reparameterize=False,
        hidden_units=512,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ValueError(f"`length` must be an integer >= 0. Received: length={length!r}")
        if not 0 <= dropout < 1:
            raise ValueError(f"`dropout` must be a float in [0, 1). Received: dropout={dropout}")
        self.length = length
        self.num_heads = int(num_heads)
        self.head_dim = int(head_dim)
        self.dropout = float(dropout)
        self.reparameterize = bool(reparameterize)
        self.hidden_units = int(hidden_units)
        self.prefix_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        width = self.num_heads * self.head_dim
        if self.reparameterize:
            self.prefix_embedding = keras.layers.Embedding(
                max(length, 1), width, embeddings_initializer=bert_initializer(), name="embedding"
            )
            self.prefix_hidden = keras.layers.Dense(
                self.hidden_units, activation="tanh", name="hidden_dense"
            )
            self.prefix_output = keras.layers.Dense(2 * width, name="output_dense")
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        width = self.num_heads * self.head_dim
        if self.reparameterize:
            self.prefix_embedding.build((None,))
            self.prefix_hidden.build((None, width))
            self.prefix_output.build((None, self.hidden_units))
        else:
            shape = (self.length, self.num_heads, self.head_dim)
            self.keys = self.add_weight(
                name="keys", shape=shape, initializer=bert_initializer(), dtype=self.variable_dtype
            )
            self.values = self.add_weight(
                name="values",
                shape=shape,
                initializer=bert_initializer(),
                dtype=self.variable_dtype,
            )
        self.built = True

    def call(self, training=None):
        shape = (1, self.length, self.num_heads, self.head_dim)
        if self.reparameterize:
            table = self.prefix_embedding(ops.arange(self.length, dtype="int32"))
            pair = self.prefix_output(self.prefix_hidden(table))
            keys, values = ops.split(pair, 2, axis=-1)
        else:
            keys, values = self.keys, self.values
        keys = self.prefix_dropout(ops.reshape(keys, shape), training=training)
        values = self.prefix_dropout(ops.reshape(values, shape), training=training)
        return keys, values

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "length": self.length,
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "dropout": self.dropout,
                "reparameterize": self.reparameterize,
                "hidden_units": self.hidden_units,
            }
        )
        return config
