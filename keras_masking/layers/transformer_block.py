"""One post-LayerNorm transformer encoder layer, split into two stages."""

import keras

from keras_masking.distribution.dropout import ReplicaDropout
from keras_masking.layers.feed_forward import FeedForward
from keras_masking.layers.self_attention import SelfAttention
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

# The attached layers, in the order the block tracks (and saves) them.
BLOCK_ATTACHMENTS = ("feed_forward_branch", "key_value_prefix", "attention_units")


def _training(training):
    """``training=`` for a sublayer call, left out when None so that it inherits the outer flag."""
    return {} if training is None else {"training": training}


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerBlock(keras.layers.Layer):
    """A BERT-family encoder layer with public stages and hooks.

    ``h = LN(x + Dropout(Attention(x)))`` then
    ``y = LN(h + Dropout(FFN(h) + extra))``.

    The two halves are public (`attention_sublayer`, with the hooks of
    `SelfAttention`, and `feed_forward_sublayer`) so that methods compose
    them in new graphs that reuse this layer's weights. Parameter-efficient
    methods attach trainable parts to a built block in place, so every graph
    that calls it uses them: `attach_feed_forward_branch` (FL-tuning's
    `AddFFN`), `attach_key_value_prefix` (P-tuning v2's `KeyValuePrefix`) and
    `attach_attention_units` (MA-tuning's `AttentionUnits`).

    Args:
        num_heads: int. Number of attention heads.
        intermediate_dim: int. FFN hidden units.
        head_dim: int or None. Per-head size; ``hidden_dim // num_heads`` when
            None.
        activation: FFN activation (see `FeedForward`).
        position: position scheme inside attention (see `SelfAttention`).
        max_relative_position: int. NEZHA's clipping distance.
        dropout: float. Dropout on the attention and FFN outputs.
        attention_dropout: float or None. Dropout on attention probabilities;
            ``dropout`` when None.
        layer_norm_epsilon: float. LayerNorm epsilon (1e-12 in BERT).
        kernel_initializer: initializer of every kernel.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float tensor ``(batch, sequence, hidden)``.
        padding_mask, mask_semantics: see `SelfAttention`.
        training: bool, whether dropout is active.
        **hooks: `SelfAttention`'s tensor hooks (``position_ids``,
            ``attention_bias``, ``kv_prefix``, ``attention_mask_bias``).

    Example:
    >>> block = TransformerBlock(num_heads=4, intermediate_dim=64)
    >>> tuple(block(keras.ops.ones((2, 5, 32))).shape)
    (2, 5, 32)
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        head_dim=None,
        activation="gelu",
        position="absolute",
        max_relative_position=64,
        dropout=0.0,
        attention_dropout=None,
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.intermediate_dim = check_int("intermediate_dim", intermediate_dim, minimum=1)
        self.head_dim = head_dim
        self.activation = activation
        self.position = position
        self.max_relative_position = check_int(
            "max_relative_position", max_relative_position, minimum=1
        )
        self.dropout = check_float("dropout", dropout, 0.0, 1.0, open_maximum=True)
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = check_float(
            "layer_norm_epsilon", layer_norm_epsilon, 0.0, open_minimum=True
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        def dropout_layer(name):
            return ReplicaDropout(self.dropout, dtype=self.dtype_policy, name=name)

        def layer_norm(name):
            return keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
            )

        self.self_attention = None
        self.attention_output_dropout = dropout_layer("attention_dropout")
        self.attention_layer_norm = layer_norm("attention_layer_norm")
        self.feed_forward = FeedForward(
            self.intermediate_dim,
            activation=activation,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward_dropout = dropout_layer("feed_forward_dropout")
        self.feed_forward_layer_norm = layer_norm("feed_forward_layer_norm")
        self.feed_forward_branch = None
        self.key_value_prefix = None
        self.attention_units = None

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        head_dim = self.head_dim or hidden_dim // self.num_heads
        if self.head_dim is None and hidden_dim % self.num_heads:
            raise ValueError(
                "Expected hidden_dim divisible by num_heads. "
                f"Received: hidden_dim={hidden_dim}, num_heads={self.num_heads}."
            )
        self.self_attention = SelfAttention(
            num_heads=self.num_heads,
            head_dim=head_dim,
            position=self.position,
            max_relative_position=self.max_relative_position,
            dropout=self.dropout if self.attention_dropout is None else self.attention_dropout,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.self_attention.build(input_shape)
        self.attention_layer_norm.build(input_shape)
        self.feed_forward.build(input_shape)
        self.feed_forward_layer_norm.build(input_shape)
        self.built = True

    def attach_feed_forward_branch(self, layer):
        """Adds ``layer(h)`` to this block's FFN output from now on.

        Args:
            layer: a layer mapping ``(batch, sequence, hidden)`` to the same
                shape, e.g. `AddFFN`. It is built here.
        """
        self._attach("feed_forward_branch", layer, build=True)

    def attach_key_value_prefix(self, layer):
        """Uses ``layer(batch_size=..., training=...)`` as the default ``kv_prefix``.

        Args:
            layer: a layer returning a ``(keys, values)`` pair of shape
                ``(1 or batch_size, prefix, heads, head_dim)``, e.g.
                `KeyValuePrefix`. It is built here.
        """
        self._attach("key_value_prefix", layer, build=True)

    def attach_attention_units(self, layer):
        """Adds MA-tuning's extra attention units (an `AttentionUnits`)."""
        self._attach("attention_units", layer, build=True)

    def detach_attention_units(self):
        """Removes and returns the attached attention units (or None)."""
        return self._attach("attention_units", None)

    def detach_feed_forward_branch(self):
        """Removes and returns the attached FFN branch (or None)."""
        return self._attach("feed_forward_branch", None)

    def detach_key_value_prefix(self):
        """Removes and returns the attached key/value prefix (or None)."""
        return self._attach("key_value_prefix", None)

    def _attach(self, attribute, layer, build=False):
        if not self.built:
            raise ValueError("Build the block (call it once) before attaching layers to it.")
        if build and not layer.built:
            width = self.self_attention.num_heads * self.self_attention.head_dim
            # Under this block's name, as its own sublayers: every variable's
            # path is unique in the model (the optimizer's slots, LoRA's
            # merge and the adapter files find variables by path).
            with keras.name_scope(self.path):
                layer.build((None, None, width))
        previous = getattr(self, attribute)
        # Keras locks a built layer's state; attaching is this class's own,
        # deliberate state change (the same pattern as Keras' enable_lora).
        self._tracker.unlock()
        try:
            if previous is not None:
                self._tracker.untrack(previous)
            setattr(self, attribute, layer)
            for name in BLOCK_ATTACHMENTS:
                if getattr(self, name) is not None:
                    self._tracker.untrack(getattr(self, name))
            # Tracked again in one order, whatever the order of attaching:
            # the order of the trainable variables, by which Keras saves and
            # restores an optimizer's state, is then the order a loaded model has.
            for name in BLOCK_ATTACHMENTS:
                setattr(self, name, getattr(self, name))
        finally:
            self._tracker.lock()
        return previous

    def attention_sublayer(self, hidden, padding_mask=None, training=None, **hooks):
        """``LN(x + Dropout(Attention(x)))``, the first half of the layer.

        ``hooks`` are `SelfAttention`'s other call arguments; an attached
        key/value prefix is the default ``kv_prefix``.
        """
        if hooks.get("kv_prefix") is None and self.key_value_prefix is not None:
            hooks["kv_prefix"] = self.key_value_prefix(
                batch_size=keras.ops.shape(hidden)[0], **_training(training)
            )
        attended = self.self_attention(
            hidden, padding_mask, extra_units=self.attention_units, **hooks, **_training(training)
        )
        attended = self.attention_output_dropout(attended, **_training(training))
        return self.attention_layer_norm(hidden + attended)

    def feed_forward_sublayer(self, hidden, extra_output=None, training=None):
        """``LN(h + Dropout(FFN(h) + extra_output))``, the second half.

        An attached FFN branch adds its output to ``extra_output``.
        """
        transformed = self.feed_forward(hidden)
        if self.feed_forward_branch is not None:
            transformed = transformed + self.feed_forward_branch(hidden)
        if extra_output is not None:
            transformed = transformed + extra_output
        transformed = self.feed_forward_dropout(transformed, **_training(training))
        return self.feed_forward_layer_norm(hidden + transformed)

    def call(self, hidden, padding_mask=None, mask_semantics="replace", training=None, **hooks):
        # `mask_semantics` (a string) stays apart: Keras refuses a call
        # argument that mixes tensors and other values.
        hidden = self.attention_sublayer(
            hidden, padding_mask, mask_semantics=mask_semantics, training=training, **hooks
        )
        return self.feed_forward_sublayer(hidden, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in _CONFIG_NAMES})
        config["kernel_initializer"] = keras.initializers.serialize(self.kernel_initializer)
        return config


_CONFIG_NAMES = (
    "num_heads",
    "intermediate_dim",
    "head_dim",
    "activation",
    "position",
    "max_relative_position",
    "dropout",
    "attention_dropout",
    "layer_norm_epsilon",
)
