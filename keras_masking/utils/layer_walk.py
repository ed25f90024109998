"""Walking every layer of a model, nested models and composite layers included."""

import keras


def walk_layers(model):
    """Every layer reachable from ``model``, breadth first, each once.

    Follows ``.layers`` (functional and sequential models) and every layer an
    attribute holds, directly or in a list, tuple or dict: a composite layer's
    sublayers, whatever their names (a backbone kept as ``self.encoder``, a
    head inside a layer of your own).

    Args:
        model: a Keras model or layer (not yielded itself).

    Yields:
        `keras.layers.Layer` instances.

    Example:
    ```python
    names = [layer.name for layer in walk_layers(classifier)]
    assert "token_embedding" in names  # inside the classifier's backbone
    ```
    """
    seen = {id(model)}
    queue = _children(model)
    while queue:
        layer = queue.pop(0)
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        yield layer
        queue.extend(_children(layer))


def _children(layer):
    """The layers ``layer`` holds: its ``.layers`` and its attributes' layers."""
    children = list(getattr(layer, "layers", []))
    for value in vars(layer).values():
        values = value.values() if isinstance(value, dict) else value
        if isinstance(value, keras.layers.Layer):
            children.append(value)
        elif isinstance(value, (list, tuple, dict)):
            children.extend(item for item in values if isinstance(item, keras.layers.Layer))
    return children
