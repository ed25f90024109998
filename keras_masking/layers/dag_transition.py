"""ExLM's transition head: a log transition matrix over the expanded states."""

import math

import keras
from keras import ops

from keras_masking.layers.initializers import bert_initializer
from keras_masking.utils.eager_checks import check_ids_in_range

_NEGATIVE = -1e9


@keras.saving.register_keras_serializable(package="keras_masking")
class DAGTransition(keras.layers.Layer):
    """``log E`` over DAG vertices: multi-head scores mixed by a gate.

    With ``f_i = concat(h_i, slot_embedding(s_i))``, ``q = W_q f``,
    ``k = W_k f`` split into ``H`` heads and ``log g = log_softmax(W_g f)``
    over heads:

        log E_ij = logsumexp_c(log g_ic + log_softmax_j(q^c_i . k^c_j / sqrt(d/H)))

    with edges only forward (``j > i``) and only between valid vertices; every
    other entry is ``-inf``. Computed in float32 whatever the dtype policy.
    ``s_i`` is vertex ``i``'s slot: its position in the expanded sequence
    when ``slot_index`` is given (the official code embeds that position),
    else the vertex index ``i``.

    Args:
        num_heads: int, transition heads ``H``.
        max_vertices: int, the slot embedding's size: the largest vertex
            count, or the largest expanded length when ``slot_index`` holds
            expanded positions.
        slot_dim: int, width of the slot embedding; the hidden width when
            None.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float ``(batch, N, d)``, the vertices' final hidden states.
        vertex_mask: 0/1 ``(batch, N)``, valid vertices (a prefix).
        slot_index: optional int ``(batch, N)`` in ``[0, max_vertices)``,
            each vertex's slot.

    Returns:
        float32 ``(batch, N, N)`` log transition matrix.

    Example:
    >>> head = DAGTransition(num_heads=2, max_vertices=8)
    >>> head(keras.ops.ones((1, 8, 16)), keras.ops.ones((1, 8))).shape
    (1, 8, 8)
    """

    def __init__(self, num_heads, max_vertices, slot_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.max_vertices = int(max_vertices)
        self.slot_dim = slot_dim

    def build(self, hidden_shape, vertex_mask_shape=None):
        width = hidden_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"hidden width {width} is not divisible by num_heads={self.num_heads}")
        slot_dim = self.slot_dim or width
        self.slot_embedding = keras.layers.Embedding(
            self.max_vertices, slot_dim, embeddings_initializer=bert_initializer(), name="slot"
        )
        self.slot_embedding.build((None, None))
        feature_shape = (None, None, width + slot_dim)
        self.query = keras.layers.Dense(width, kernel_initializer=bert_initializer(), name="query")
        self.key = keras.layers.Dense(width, kernel_initializer=bert_initializer(), name="key")
        self.gate = keras.layers.Dense(
            self.num_heads, kernel_initializer=bert_initializer(), name="gate"
        )
        for layer in (self.query, self.key, self.gate):
            layer.build(feature_shape)
        self.built = True

    def call(self, hidden, vertex_mask=None, slot_index=None):
        hidden = ops.cast(hidden, "float32")
        batch, vertices, width = ops.shape(hidden)[0], hidden.shape[1], hidden.shape[2]
        if slot_index is None:
            slot_index = ops.arange(vertices, dtype="int32")[None]
        check_ids_in_range(slot_index, self.max_vertices, "slot_index", "max_vertices")
        slots = ops.cast(self.slot_embedding(ops.cast(slot_index, "int32")), "float32")
        slots = ops.broadcast_to(slots, (batch, vertices, slots.shape[-1]))
        features = ops.concatenate([hidden, slots], axis=-1)
        head_dim = width // self.num_heads
        shape = (batch, vertices, self.num_heads, head_dim)
        query = ops.cast(ops.reshape(self.query(features), shape), "float32")
        key = ops.cast(ops.reshape(self.key(features), shape), "float32")
        scores = ops.einsum("bihd,bjhd->bhij", query, key) / math.sqrt(head_dim)
        index = ops.arange(vertices, dtype="int32")
        allowed = (index[:, None] < index[None, :])[None, None]
        if vertex_mask is not None:
            valid = ops.cast(vertex_mask, "bool")
            allowed = allowed & valid[:, None, :, None] & valid[:, None, None, :]
        scores = ops.where(allowed, scores, _NEGATIVE)
        per_head = scores - ops.logsumexp(scores, axis=-1, keepdims=True)
        log_gate = ops.log_softmax(ops.cast(self.gate(features), "float32"), axis=-1)
        mixed = ops.logsumexp(per_head + ops.transpose(log_gate, (0, 2, 1))[..., None], axis=1)
        return ops.where(ops.any(allowed, axis=1), mixed, -float("inf"))

    def compute_output_spec(self, hidden, vertex_mask=None, slot_index=None):
        return keras.KerasTensor((hidden.shape[0], hidden.shape[1], hidden.shape[1]), "float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "max_vertices": self.max_vertices,
                "slot_dim": self.slot_dim,
            }
        )
        return config
