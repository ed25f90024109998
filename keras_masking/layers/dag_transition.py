"""ExLM's transition head: a log transition matrix over the expanded states."""

import math

import keras
from keras import ops

from keras_masking.layers.initializers import bert_initializer
from keras_masking.utils.arguments import check_int
from keras_masking.utils.eager_checks import check_ids_in_range
from keras_masking.utils.eager_checks import check_integer_ids
from keras_masking.utils.eager_checks import check_zero_one
from keras_masking.utils.eager_checks import dims_match
from keras_masking.utils.eager_checks import static_shape

_NEGATIVE = -1e9


@keras.saving.register_keras_serializable(package="keras_masking")
class DAGTransition(keras.layers.Layer):
    """``log E`` over DAG vertices: multi-head scores mixed by a gate.

    With ``f_i = concat(h_i, slot_embedding(s_i))``, ``q = W_q f``,
    ``k = W_k f`` split into ``H`` heads and ``log g = log_softmax(W_g f)``
    over heads:

        log E_ij = logsumexp_c(log g_ic + log_softmax_j(q^c_i . k^c_j / sqrt(d/H)))

    with edges only forward (``j > i``) and only between valid vertices; every
    other entry is ``-inf``. ``s_i`` is vertex ``i``'s slot: ``slot_index``
    (the official code embeds the position in the expanded sequence), else
    ``i``. Computed in float32 under every dtype policy (the sublayers have
    a float32 policy), since the log-probabilities feed the DAG loss's
    products over whole paths.

    Args:
        num_heads: int >= 1, transition heads ``H``; must divide the hidden
            width.
        max_vertices: int >= 1, the slot embedding's size: the largest vertex
            count, or the largest expanded length when ``slot_index`` holds
            expanded positions.
        slot_dim: int >= 1, width of the slot embedding; the hidden width
            when None.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float ``(batch, N, d)``, the vertices' final hidden states.
        vertex_mask: 0/1 ``(batch, N)``, valid vertices (a prefix).
        slot_index: optional int ``(batch, N)`` (or ``(1, N)``) in
            ``[0, max_vertices)``, each vertex's slot; checked in eager calls.

    Returns:
        float32 ``(batch, N, N)`` log transition matrix.

    Example:
    >>> head = DAGTransition(num_heads=2, max_vertices=8)
    >>> log_e = head(keras.ops.ones((1, 8, 16)), keras.ops.ones((1, 8)))
    >>> tuple(log_e.shape), keras.backend.standardize_dtype(log_e.dtype)
    ((1, 8, 8), 'float32')
    """

    def __init__(self, num_heads, max_vertices, slot_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.max_vertices = check_int("max_vertices", max_vertices, minimum=1)
        self.slot_dim = None if slot_dim is None else check_int("slot_dim", slot_dim, minimum=1)
        self.width = None

    @property
    def input_dtype(self):
        """float32: inputs are never rounded to a 16-bit compute dtype."""
        return "float32"

    def build(self, hidden_shape, vertex_mask_shape=None, slot_index_shape=None):
        hidden_shape = tuple(hidden_shape)
        width = hidden_shape[-1] if hidden_shape else None
        if len(hidden_shape) != 3 or width is None:
            raise ValueError(
                "Expected hidden of shape (batch, vertices, width) with a known width. "
                f"Received: hidden.shape={hidden_shape}."
            )
        if width % self.num_heads:
            raise ValueError(
                "Expected a hidden width divisible by num_heads. Received: hidden width "
                f"{width}, num_heads={self.num_heads}."
            )
        slot_dim = self.slot_dim or width
        # float32 sublayers: the transition log-probabilities are computed in
        # float32 under any dtype policy.
        self.slot_embedding = keras.layers.Embedding(
            self.max_vertices,
            slot_dim,
            embeddings_initializer=bert_initializer(),
            dtype="float32",
            name="slot",
        )
        self.slot_embedding.build((None, None))
        feature_shape = (None, None, width + slot_dim)
        for name, units in (("query", width), ("key", width), ("gate", self.num_heads)):
            layer = keras.layers.Dense(
                units, kernel_initializer=bert_initializer(), dtype="float32", name=name
            )
            layer.build(feature_shape)
            setattr(self, name, layer)
        self.width = width
        self.built = True

    def _check_inputs(self, hidden, vertex_mask, slot_index):
        shape = tuple(hidden.shape)
        if len(shape) != 3 or shape[1] is None:
            raise ValueError(
                "Expected hidden of shape (batch, vertices, width) with a static vertex "
                f"count. Received: hidden.shape={shape}."
            )
        dtype = keras.backend.standardize_dtype(hidden.dtype)
        if "float" not in dtype:
            raise ValueError(
                f"Expected a float tensor for hidden. Received: hidden of dtype {dtype}."
            )
        if self.width is not None and shape[2] != self.width:
            raise ValueError(
                f"Expected hidden of width {self.width} (the width this layer was built "
                f"for). Received: hidden.shape={shape}."
            )
        for name, value, batch_one in (
            ("vertex_mask", vertex_mask, False),
            ("slot_index", slot_index, True),
        ):
            if value is None:
                continue
            other = static_shape(value)
            if len(other) != 2 or not dims_match(other, shape, broadcast_batch=batch_one):
                raise ValueError(
                    f"Expected {name} of shape ({shape[0]}, {shape[1]}) (hidden has "
                    f"{shape[1]} vertices). Received: {name}.shape={tuple(other)}."
                )
        if slot_index is not None:
            check_integer_ids("slot_index", slot_index)
        if vertex_mask is not None:
            check_zero_one("vertex_mask", vertex_mask)

    def call(self, hidden, vertex_mask=None, slot_index=None):
        self._check_inputs(hidden, vertex_mask, slot_index)
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
        names = ("num_heads", "max_vertices", "slot_dim")
        return {**super().get_config(), **{name: getattr(self, name) for name in names}}
