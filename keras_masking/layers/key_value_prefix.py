"""P-tuning v2's trainable per-layer key/value prefixes, and its shared prefix MLP."""

import contextlib

import keras
from keras import ops

from keras_masking.distribution.dropout import ReplicaDropout
from keras_masking.layers.initializers import bert_initializer
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int


@keras.saving.register_keras_serializable(package="keras_masking")
class PrefixEncoder(keras.layers.Layer):
    """P-tuning v2's prefix MLP: one network gives every layer's keys and values.

    ``Embedding(length, d) -> Dense(hidden_units) -> tanh ->
    Dense(num_layers * 2 * d)``, as P-tuning v2's ``PrefixEncoder`` with
    ``prefix_projection=True``: columns ``[2 l d, (2 l + 1) d)`` are layer
    ``l``'s keys, the next ``d`` its values. The layers' `KeyValuePrefix`
    share one encoder and each reads its own columns.

    Args:
        length: int >= 0, the prefix length ``P``.
        hidden_dim: int >= 1, ``d`` = heads * head_dim of the attention.
        num_layers: int >= 1, the number of layers it gives prefixes to.
        hidden_units: int >= 1, the MLP's hidden width (512 in P-tuning v2).
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> encoder = PrefixEncoder(length=4, hidden_dim=16, num_layers=3, hidden_units=8)
    >>> tuple(encoder().shape)
    (4, 96)
    >>> tuple(encoder(layer_index=1).shape)
    (4, 32)
    """

    def __init__(self, length, hidden_dim, num_layers, hidden_units=512, **kwargs):
        length = check_int("length", length, minimum=0)
        hidden_dim = check_int("hidden_dim", hidden_dim, minimum=1)
        num_layers = check_int("num_layers", num_layers, minimum=1)
        hidden_units = check_int("hidden_units", hidden_units, minimum=1)
        super().__init__(**kwargs)
        self.length = length
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.hidden_units = hidden_units
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        d, h, width = self.hidden_dim, self.hidden_units, self.num_layers * 2 * self.hidden_dim
        for name, shape in (
            ("embeddings", (self.length, d)),
            ("hidden_kernel", (d, h)),
            ("hidden_bias", (h,)),
            ("output_kernel", (h, width)),
            ("output_bias", (width,)),
        ):
            initializer = "zeros" if name.endswith("_bias") else bert_initializer()
            setattr(self, name, self.add_weight(name=name, shape=shape, initializer=initializer))
        self.built = True

    def call(self, layer_index=None):
        """All layers' keys and values ``(length, num_layers * 2 * d)``, or
        one layer's ``(length, 2 * d)`` when ``layer_index`` is given."""
        hidden = ops.tanh(ops.matmul(self.embeddings, self.hidden_kernel) + self.hidden_bias)
        if layer_index is None:
            return ops.matmul(hidden, self.output_kernel) + self.output_bias
        columns = slice(2 * self.hidden_dim * layer_index, 2 * self.hidden_dim * (layer_index + 1))
        return ops.matmul(hidden, self.output_kernel[:, columns]) + self.output_bias[columns]

    def get_config(self):
        names = ("length", "hidden_dim", "num_layers", "hidden_units")
        return {**super().get_config(), **{name: getattr(self, name) for name in names}}


@keras.saving.register_keras_serializable(package="keras_masking")
class KeyValuePrefix(keras.layers.Layer):
    """``length`` trainable keys and values that every query may attend to.

    The pair it returns is `SelfAttention`'s ``kv_prefix``: keys and values of
    shape ``(1, length, heads, head_dim)``, with no position and no mask; in
    training with dropout, called with ``batch_size``, ``(batch_size, ...)``
    with a dropout mask per example, as P-tuning v2's code draws them.
    With ``reparameterize=True`` they come from P-tuning v2's MLP
    (`PrefixEncoder`), shared by all layers as ``key_value_prefixes`` builds
    them (without an ``encoder`` the layer makes its own).

    Args:
        length: int >= 0, the prefix length ``P`` (160 in the FL-tuning paper's
            comparison). 0 gives no prefix.
        num_heads: int >= 1, attention heads of the layer it attaches to.
        head_dim: int >= 1, per-head size.
        dropout: float in [0, 1), dropout on the prefixes.
        reparameterize: bool, use the MLP reparameterisation.
        hidden_units: int >= 1, the MLP's hidden width (512 in P-tuning v2).
        encoder: a shared `PrefixEncoder` (``reparameterize=True`` only), or
            None.
        layer_index: int, which of the encoder's layers this prefix reads.
        **kwargs: base `keras.layers.Layer` arguments.

    Example:
    >>> prefix = KeyValuePrefix(length=4, num_heads=2, head_dim=8)
    >>> keys, values = prefix()
    >>> tuple(keys.shape)
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
        encoder=None,
        layer_index=0,
        **kwargs,
    ):
        length = check_int("length", length, minimum=0)
        num_heads = check_int("num_heads", num_heads, minimum=1)
        head_dim = check_int("head_dim", head_dim, minimum=1)
        dropout = check_float("dropout", dropout, 0.0, 1.0, open_maximum=True)
        reparameterize = check_bool("reparameterize", reparameterize)
        hidden_units = check_int("hidden_units", hidden_units, minimum=1)
        if isinstance(encoder, dict):
            encoder = keras.saving.deserialize_keras_object(encoder)
        width = num_heads * head_dim
        if encoder is not None:
            if not reparameterize:
                raise ValueError(
                    "An `encoder` is only used with reparameterize=True. "
                    f"Received: reparameterize={reparameterize}."
                )
            if not isinstance(encoder, PrefixEncoder):
                raise ValueError(
                    f"Expected a PrefixEncoder for encoder. Received: encoder={encoder!r}."
                )
            fits = (encoder.length, encoder.hidden_dim, encoder.hidden_units)
            if fits != (length, width, hidden_units):
                raise ValueError(
                    "The encoder does not fit this prefix: expected (length, heads * head_dim, "
                    f"hidden_units) = {(length, width, hidden_units)}. Received: {fits}."
                )
            layer_index = check_int(
                "layer_index", layer_index, minimum=0, maximum=encoder.num_layers - 1
            )
        else:
            layer_index = check_int("layer_index", layer_index, minimum=0, maximum=0)
        super().__init__(**kwargs)
        self.length = length
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.reparameterize = reparameterize
        self.hidden_units = hidden_units
        self.layer_index = layer_index
        self.prefix_dropout = ReplicaDropout(self.dropout, dtype=self.dtype_policy)
        if self.reparameterize and encoder is None:
            encoder = PrefixEncoder(
                length, width, 1, hidden_units, dtype=self.dtype_policy, name="prefix_encoder"
            )
        self.encoder = encoder
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        if not self.reparameterize:
            shape = (self.length, self.num_heads, self.head_dim)
            for name in ("keys", "values"):
                table = self.add_weight(name=name, shape=shape, initializer=bert_initializer())
                setattr(self, name, table)
        self.built = True

    def call(self, batch_size=None, training=None):
        shape = (1, self.length, self.num_heads, self.head_dim)
        if self.reparameterize:
            pair = ops.split(self.encoder(layer_index=self.layer_index), 2, axis=-1)
        else:
            pair = (self.keys, self.values)
        pair = [ops.reshape(x, shape) for x in pair]
        if training and self.dropout > 0 and batch_size is not None:
            # P-tuning v2 expands the prefixes over the batch, then drops: one
            # dropout mask per example (not one shared by the whole batch).
            pair = [ops.broadcast_to(x, (batch_size, *shape[1:])) for x in pair]
        return tuple(self.prefix_dropout(x, training=training) for x in pair)

    def get_config(self):
        names = ("length", "num_heads", "head_dim", "dropout", "reparameterize", "hidden_units")
        config = {**super().get_config(), **{name: getattr(self, name) for name in names}}
        config["encoder"] = keras.saving.serialize_keras_object(self.encoder)
        config["layer_index"] = self.layer_index
        return config


def key_value_prefixes(
    length,
    num_layers,
    num_heads,
    head_dim,
    dropout=0.1,
    reparameterize=False,
    hidden_units=512,
    dtype=None,
    name_scopes=None,
):
    """One `KeyValuePrefix` per tuned layer, as P-tuning v2 builds them.

    Free tables are separate per layer; reparameterised prefixes share one
    `PrefixEncoder`.

    Args:
        length, num_heads, head_dim, dropout, reparameterize, hidden_units:
            see `KeyValuePrefix`.
        num_layers: int >= 1, how many layers get a prefix.
        dtype: dtype or `keras.DTypePolicy` of the layers.
        name_scopes: None, or one name per prefix (the paths of the layers
            they go to): each prefix is made under its own, so that its
            variables' paths (``transformer_layer_3/key_value_prefix/keys``)
            differ from the other prefixes'.

    Returns:
        A list of ``num_layers`` `KeyValuePrefix` layers, in layer order.

    Example:
    >>> prefixes = key_value_prefixes(4, num_layers=2, num_heads=2, head_dim=8,
    ...                               reparameterize=True, hidden_units=16)
    >>> prefixes[0].encoder is prefixes[1].encoder
    True
    """
    # The layers check the other arguments.
    num_layers = check_int("num_layers", num_layers, minimum=1)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    head_dim = check_int("head_dim", head_dim, minimum=1)
    reparameterize = check_bool("reparameterize", reparameterize)
    encoder = None
    if reparameterize:
        encoder = PrefixEncoder(
            length,
            num_heads * head_dim,
            num_layers,
            hidden_units,
            dtype=dtype,
            name="prefix_encoder",
        )
    if name_scopes is None:
        name_scopes = [None] * num_layers
    elif len(name_scopes) != num_layers:
        raise ValueError(
            f"Expected one name scope per prefix ({num_layers}). Received: "
            f"name_scopes={name_scopes!r}."
        )
    prefixes = []
    for index, scope in enumerate(name_scopes):
        with keras.name_scope(scope) if scope else contextlib.nullcontext():
            prefix = KeyValuePrefix(
                length,
                num_heads=num_heads,
                head_dim=head_dim,
                dropout=dropout,
                reparameterize=reparameterize,
                hidden_units=hidden_units,
                encoder=encoder,
                layer_index=index if reparameterize else 0,
                dtype=dtype,
                name="key_value_prefix",
            )
        prefixes.append(prefix)
    return prefixes
