"""The embedding stage of a BERT-family encoder."""

import keras
from keras import ops

from keras_masking.distribution.dropout import ReplicaDropout
from keras_masking.layers.initializers import clone_initializer
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.eager_checks import check_ids_in_range
from keras_masking.utils.eager_checks import check_integer_ids
from keras_masking.utils.eager_checks import check_sequence_length
from keras_masking.utils.eager_checks import static_shape


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerEmbedding(keras.layers.Layer):
    """Token + segment (+ absolute position) embeddings, LayerNorm, dropout.

    Absolute position embeddings are looked up by ``position_ids``, so a
    shortened sequence keeps its original positions; rotary and relative
    schemes have none here (``use_position_embedding=False``).

    Args:
        vocabulary_size: int. Rows of the token embedding.
        hidden_dim: int. Embedding width.
        num_segments: int. Rows of the segment embedding.
        max_sequence_length: int. Rows of the position embedding.
        use_position_embedding: bool. Whether to add learned absolute
            position embeddings.
        dropout: float. Dropout after the LayerNorm.
        layer_norm_epsilon: float. LayerNorm epsilon.
        embeddings_initializer: initializer of the three tables.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        token_ids: int tensor ``(batch, sequence)``.
        segment_ids: int tensor ``(batch, sequence)``.
        position_ids: optional int tensor ``(batch or 1, sequence)``;
            ``0 .. sequence - 1`` when None.
        training: bool, whether dropout is active.

    Example:
    >>> embed = TransformerEmbedding(100, 32, max_sequence_length=16)
    >>> ids = keras.ops.ones((2, 5), "int32")
    >>> tuple(embed(ids, keras.ops.zeros((2, 5), "int32")).shape)
    (2, 5, 32)
    """

    def __init__(
        self,
        vocabulary_size,
        hidden_dim,
        num_segments=2,
        max_sequence_length=512,
        use_position_embedding=True,
        dropout=0.0,
        layer_norm_epsilon=1e-12,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = check_int("vocabulary_size", vocabulary_size, minimum=1)
        self.hidden_dim = check_int("hidden_dim", hidden_dim, minimum=1)
        self.num_segments = check_int("num_segments", num_segments, minimum=0)
        self.max_sequence_length = check_int("max_sequence_length", max_sequence_length, minimum=1)
        self.use_position_embedding = check_bool("use_position_embedding", use_position_embedding)
        self.dropout = check_float("dropout", dropout, 0.0, 1.0, open_maximum=True)
        self.layer_norm_epsilon = check_float(
            "layer_norm_epsilon", layer_norm_epsilon, 0.0, open_minimum=True
        )
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

        def table(rows, name, layer_class=keras.layers.Embedding):
            return layer_class(
                rows,
                self.hidden_dim,
                embeddings_initializer=clone_initializer(self.embeddings_initializer),
                dtype=self.dtype_policy,
                name=name,
            )

        self.token_embedding = table(
            self.vocabulary_size, "token_embedding", keras.layers.ReversibleEmbedding
        )
        self.segment_embedding = None
        if self.num_segments > 0:
            self.segment_embedding = table(self.num_segments, "segment_embedding")
        self.position_embedding = None
        if self.use_position_embedding:
            self.position_embedding = table(self.max_sequence_length, "position_embedding")
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm"
        )
        self.embedding_dropout = ReplicaDropout(
            self.dropout, dtype=self.dtype_policy, name="embedding_dropout"
        )

    def build(self, token_ids_shape, segment_ids_shape=None, position_ids_shape=None):
        for table in (self.token_embedding, self.segment_embedding, self.position_embedding):
            if table is not None:
                table.build(token_ids_shape)
        self.layer_norm.build(tuple(token_ids_shape) + (self.hidden_dim,))
        self.built = True

    def call(self, token_ids, segment_ids=None, position_ids=None, training=None):
        if self.position_embedding is not None:  # the length is None when unknown (export)
            check_sequence_length(static_shape(token_ids)[1], self.max_sequence_length)
        check_integer_ids("token_ids", token_ids)
        if segment_ids is None and self.segment_embedding is not None:
            segment_ids = ops.zeros_like(token_ids)
        if position_ids is None and self.position_embedding is not None:
            position_ids = ops.arange(ops.shape(token_ids)[1], dtype="int32")[None, :]
        embedded = valid = None
        for name, ids, table, limit in (
            ("token_ids", token_ids, self.token_embedding, "vocabulary_size"),
            ("segment_ids", segment_ids, self.segment_embedding, "num_segments"),
            ("position_ids", position_ids, self.position_embedding, "max_sequence_length"),
        ):
            if table is None:
                continue
            upper = getattr(self, limit)
            check_ids_in_range(ids, upper, name, limit)
            # Compiled calls cannot raise on values: an out-of-range id makes its
            # embedding NaN (looked up as id 0: a lookup past the table raises on
            # TensorFlow's CPU kernels and clamps under XLA and on JAX).
            in_range = (ids >= 0) & (ids < upper)
            valid = in_range if valid is None else valid & in_range
            rows = table(ops.where(in_range, ids, 0))
            embedded = rows if embedded is None else embedded + rows
        embedded = ops.where(valid[..., None], embedded, float("nan"))
        embedded = self.layer_norm(embedded)
        return self.embedding_dropout(embedded, training=training)

    def compute_output_shape(self, token_ids_shape, *args, **kwargs):
        return tuple(token_ids_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in _CONFIG_NAMES})
        config["embeddings_initializer"] = keras.initializers.serialize(self.embeddings_initializer)
        return config


_CONFIG_NAMES = (
    "vocabulary_size",
    "hidden_dim",
    "num_segments",
    "max_sequence_length",
    "use_position_embedding",
    "dropout",
    "layer_norm_epsilon",
)
