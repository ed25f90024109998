"""Walking every layer of a model, nested models and composite layers included."""

import keras

# keras-masking and keras-hub layers keep some sublayers as plain attributes.
_SUBLAYER_ATTRIBUTES = ("token_embedding", "embeddings", "backbone", "masked_lm_head", "mlm_head")


def walk_layers(model):
    """Every layer reachable from ``model``, breadth first, each once.

    Follows ``.layers`` (functional and sequential models) and the sublayer
    attributes that BERT-family backbones and tasks use.

    Args:
        model: a Keras model or layer (not yielded itself).

    Yields:
        `keras.layers.Layer` instances.
    """
    seen = set()
    queue = list(getattr(model, "layers", []))
    while queue:
        layer = queue.pop(0)
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        queue.extend(getattr(layer, "layers", []))
        for name in _SUBLAYER_ATTRIBUTES:
            child = getattr(layer, name, None)
            if isinstance(child, keras.layers.Layer):
                queue.append(child)
