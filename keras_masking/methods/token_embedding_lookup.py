"""Finding a model's token embedding and the MLM heads tied to it."""

import keras

from keras_masking.utils.layer_walk import walk_layers


def _describe(layer):
    return f"{layer.name!r} ({layer.input_dim} x {layer.output_dim})"


def find_token_embedding(model, embedding=None, vocabulary_size=None):
    """The token embedding layer of a model.

    Looks, in order, at: an explicit ``embedding`` (a layer or a layer name);
    the ``token_embedding`` of the model or of its ``backbone``
    (`TransformerBackbone`, keras-hub backbones and tasks); the only
    `keras.layers.Embedding` in the model whose row count is
    ``vocabulary_size`` (or the only one at all).

    Args:
        model: a Keras model or layer.
        embedding: optional layer or layer name.
        vocabulary_size: optional int to choose among several embeddings.

    Returns:
        A `keras.layers.Embedding` (keras' `ReversibleEmbedding` included).

    Raises:
        ValueError: when none or several candidates fit; the message names
            the candidates.
    """
    candidates = [
        layer for layer in walk_layers(model) if isinstance(layer, keras.layers.Embedding)
    ]
    if isinstance(model, keras.layers.Embedding):
        return model
    if isinstance(embedding, keras.layers.Embedding):
        return embedding
    if isinstance(embedding, str):
        named = [layer for layer in candidates if layer.name == embedding]
        if len(named) != 1:
            raise ValueError(
                f"Found {len(named)} embedding layers named {embedding!r}. "
                f"Embedding layers in this model: {[_describe(c) for c in candidates]}"
            )
        return named[0]
    if embedding is not None:
        raise TypeError(f"`embedding` must be a layer, a name or None. Received: {embedding!r}")
    for owner in (model, getattr(model, "backbone", None)):
        layer = getattr(owner, "token_embedding", None) if owner is not None else None
        if isinstance(layer, keras.layers.Embedding):
            return layer
    if vocabulary_size is not None:
        candidates = [c for c in candidates if c.input_dim == vocabulary_size]
    if len(candidates) == 1:
        return candidates[0]
    what = "none" if not candidates else [_describe(c) for c in candidates]
    raise ValueError(
        "Could not tell which layer is the token embedding: "
        f"candidates {what}. Pass `embedding=` (a layer or its name)"
        + ("" if vocabulary_size else " or `vocabulary_size=`")
        + "."
    )


def find_tied_heads(model, token_embedding):
    """MLM heads in ``model`` whose output projection is ``token_embedding``.

    Returns:
        A list of keras-masking and keras-hub ``MaskedLMHead`` layers built on
        that embedding.
    """
    import keras_hub

    from keras_masking.layers.masked_lm_head import MaskedLMHead

    head_types = (MaskedLMHead, keras_hub.layers.MaskedLMHead)
    return [
        layer
        for layer in walk_layers(model)
        if isinstance(layer, head_types)
        and getattr(layer, "token_embedding", None) is token_embedding
    ]
