"""Finding a model's token embedding and the MLM heads tied to it."""

import keras
import keras_hub

from keras_masking.layers.masked_lm_head import MaskedLMHead
from keras_masking.layers.masked_lm_head import heads_on_embedding
from keras_masking.utils.arguments import check_int
from keras_masking.utils.layer_walk import walk_layers


def _describe(layer):
    return f"{layer.name!r} ({layer.input_dim} x {layer.output_dim})"


def _input(layer):
    """The tensor a layer was first called on in a functional graph, if any
    (for a functional model, the tensors of the graph it was called on in,
    where its own ``input`` gives its own inputs)."""
    try:
        return keras.Operation.input.fget(layer)
    except (AttributeError, ValueError, RuntimeError):
        return None


def _input_name(layer):
    """The name of the tensor a layer was first called on, if it has one."""
    return getattr(_input(layer), "name", None)


def _distinct(layers):
    return list({id(layer): layer for layer in layers}.values())


def _token_embedding_of(owner):
    layer = getattr(owner, "token_embedding", None)
    return layer if isinstance(layer, keras.layers.Embedding) else None


TOKEN_INPUTS = ("token_ids", "input_ids")  # keras-hub's name, Hugging Face's


def _functional(layer):
    """Whether ``layer`` is a functional (or Sequential) model other than a
    backbone: its layers are its graph. A subclassed model's are what it holds."""
    return (
        isinstance(layer, keras.Model)
        and bool(getattr(layer, "inputs", None))
        and not isinstance(layer, keras_hub.models.Backbone)
    )


def _graph_layers(model):
    """The layers of the functional models nested in ``model``'s graph, at any depth."""
    for layer in getattr(model, "layers", []):
        if _functional(layer):
            yield from layer.layers
            yield from _graph_layers(layer)


def _graph_tables(model, nested_only=False):
    """The ``token_embedding`` tables the layers of ``model``'s graph hold
    (with ``nested_only``, only those of the functional models nested in it)."""
    layers = list(_graph_layers(model))
    if not nested_only:
        layers = list(getattr(model, "layers", [])) + layers
    return _distinct(filter(None, map(_token_embedding_of, layers)))


def _takes_token_input(layer):
    """Whether ``layer`` was called on a tensor named as a token-id input, or
    (a functional model) has such an input."""
    tensors = keras.tree.flatten(_input(layer)) + _flat_inputs(layer)
    return any(getattr(tensor, "name", None) in TOKEN_INPUTS for tensor in tensors)


def _flat_inputs(model):
    return keras.tree.flatten(getattr(model, "inputs", None) or [])


# Operations that pass ids on unchanged (a cast, a reshape): an embedding
# behind them looks up the ids themselves. Position ids computed from the
# token ids (a cumsum of the padding mask) go through other operations.
ID_PRESERVING_OPERATIONS = ("Cast", "Reshape", "Squeeze", "ExpandDims", "Identity", "Flatten")


def _embeddings_reading(model, tensors):
    """The embeddings of ``model``'s graph that look up one of ``tensors``
    (their ids) as they are: directly, through operations that pass ids on
    unchanged (`ID_PRESERVING_OPERATIONS`), or inside a functional model of
    one input nested in the graph and called on them. A layer called more
    than once is read at its first call."""
    operations = getattr(model, "operations", None) or getattr(model, "layers", [])
    producers = {}
    for operation in operations:
        try:
            outputs = keras.tree.flatten(operation.output)
        except (AttributeError, ValueError, RuntimeError):
            continue
        producers.update({id(tensor): operation for tensor in outputs})

    def reads(tensor):
        while id(tensor) not in tensors:
            operation = producers.get(id(tensor))
            if type(operation).__name__ not in ID_PRESERVING_OPERATIONS:
                return False
            inputs = keras.tree.flatten(_input(operation))
            if len(inputs) != 1:
                return False
            tensor = inputs[0]
        return True

    found = []
    for layer in getattr(model, "layers", []):
        if isinstance(layer, keras.layers.Embedding) and reads(_input(layer)):
            found.append(layer)
        elif _token_embedding_of(layer) is not None:  # a keras-hub TokenAndPositionEmbedding
            if any(map(reads, keras.tree.flatten(_input(layer)))):
                found.append(_token_embedding_of(layer))
        elif _functional(layer) and len(_flat_inputs(layer)) == 1:
            # (A model of several inputs records the tensors it was called
            # on without the names Keras paired them by.)
            if reads(_input(layer)):
                found += _embeddings_reading(layer, {id(_flat_inputs(layer)[0])})
    return _distinct(found)


def _evidence(model, layers):
    """Token-embedding candidates, from the strongest evidence to the weakest (see
    `find_token_embedding`)."""
    backbones = [layer for layer in layers if isinstance(layer, keras_hub.models.Backbone)]
    embeddings = [layer for layer in layers if isinstance(layer, keras.layers.Embedding)]
    yield "backbone", _distinct(filter(None, map(_token_embedding_of, backbones)))
    inputs = _flat_inputs(model)
    token_inputs = {id(t) for t in inputs if getattr(t, "name", None) in TOKEN_INPUTS}
    # The graph says so, before a `token_embedding` held elsewhere: the one
    # table that looks up the token ids as they are (directly, behind a cast
    # or a reshape, in a functional model of yours); where several do (a
    # per-token bias or type table beside the word table), all are named.
    on_token_ids = [layer for layer in embeddings if _input_name(layer) in TOKEN_INPUTS]
    on_token_ids = _distinct(on_token_ids + _embeddings_reading(model, token_inputs))
    if on_token_ids:
        yield "token_ids", on_token_ids
    graph = list(getattr(model, "layers", []))
    # The `token_embedding` of a layer of the model's own graph (a backbone's
    # embedding layers, inlined), then of a functional model nested in it
    # that takes the token ids.
    yield "token_embedding", _distinct(filter(None, map(_token_embedding_of, graph)))
    on_tokens = [layer for layer in graph if _functional(layer) and _takes_token_input(layer)]
    yield "token_embedding", _distinct([table for sub in on_tokens for table in _graph_tables(sub)])
    nested = _graph_tables(model, nested_only=True)
    held = _distinct(filter(None, map(_token_embedding_of, layers)))
    if not token_inputs and _embeddings_reading(model, {id(tensor) for tensor in inputs}):
        # No input is named as the token ids: an embedding the graph applies
        # to an input is the token embedding only where the model holds no
        # other table (a nested model's, a layer of yours', one of the graph's
        # first called elsewhere: `embeddings` holds them all); else all are named.
        yield "model_input", embeddings
    yield "token_embedding", nested
    yield "token_embedding", held
    yield "embedding", embeddings


def find_token_embedding(model, embedding=None, vocabulary_size=None):
    """The token embedding layer of a model.

    Looks, in order, at: an explicit ``embedding`` (a layer or a layer name);
    the ``token_embedding`` of the model or of its ``backbone``; the
    ``token_embedding`` of a backbone anywhere in the model (a
    `TransformerBackbone` or keras-hub backbone, nested in functional models
    at any depth); the table that looks up the ids of a ``token_ids`` (or
    ``input_ids``) input as they are (directly, behind a cast or a reshape,
    in a keras-hub `TokenAndPositionEmbedding`, or inside a functional model
    of one input), where several do, all named in the error; the
    ``token_embedding`` of a layer of the model's own graph (a backbone
    whose layers were inlined with ``backbone.output``), then of a
    functional model nested in it that takes that input; with no input so
    named, an embedding the graph applies to an input, only where the model
    holds no other table (else all are named in the error); the
    ``token_embedding`` of a nested model, then of any layer; the only
    `keras.layers.Embedding` in the model.
    At each step, ``vocabulary_size`` (when given) narrows the choice.

    Args:
        model: a Keras model or layer.
        embedding: optional layer or layer name.
        vocabulary_size: optional int to choose among several embeddings.

    Returns:
        A `keras.layers.Embedding` (keras' `ReversibleEmbedding` included).

    Raises:
        ValueError: none or several candidates fit (they are named).
        TypeError: ``model`` or ``embedding`` of the wrong type.

    Example:
    ```python
    # A classifier on a backbone's layers (inlined through `backbone.output`).
    logits = keras.layers.Dense(2)(backbone.output["pooled_output"])
    classifier = keras.Model(backbone.input, logits)
    assert find_token_embedding(classifier) is backbone.token_embedding
    ```
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            "Expected a Keras model or layer for model. "
            f"Received: model of type {type(model).__name__}."
        )
    if vocabulary_size is not None:
        vocabulary_size = check_int("vocabulary_size", vocabulary_size, minimum=1)
    if not isinstance(embedding, (str, keras.layers.Embedding, type(None))):
        raise TypeError(
            "Expected a keras.layers.Embedding, a layer name or None for embedding. "
            f"Received: embedding={embedding!r} of type {type(embedding).__name__}."
        )
    if isinstance(model, keras.layers.Embedding):
        return model
    if isinstance(embedding, keras.layers.Embedding):
        return embedding
    layers = list(walk_layers(model))
    candidates = [layer for layer in layers if isinstance(layer, keras.layers.Embedding)]
    if isinstance(embedding, str):
        named = [layer for layer in candidates if layer.name == embedding]
        if len(named) != 1:
            raise ValueError(
                f"Found {len(named)} embedding layers named {embedding!r}. "
                f"Embedding layers in this model: {[_describe(c) for c in candidates]}"
            )
        return named[0]
    for owner in (model, getattr(model, "backbone", None)):
        layer = _token_embedding_of(owner)
        if layer is not None and vocabulary_size in (None, layer.input_dim):
            return layer
    for _, found in _evidence(model, layers):
        if vocabulary_size is not None:
            found = [c for c in found if c.input_dim == vocabulary_size]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            candidates = found
            break
    else:
        candidates = []
    what = "none" if not candidates else [_describe(c) for c in candidates]
    raise ValueError(
        "Could not tell which layer is the token embedding: "
        f"candidates {what}. Pass `embedding=` (a layer or its name)"
        + ("" if vocabulary_size else " or `vocabulary_size=`")
        + "."
    )


def find_tied_heads(model, token_embedding):
    """MLM heads whose output projection is ``token_embedding``.

    The heads in ``model``, and the keras-masking heads built on the same
    layer elsewhere (a `TransformerMaskedLM` on the backbone ``model``
    shares). An embedding with untied output rows
    (``ReversibleEmbedding(tie_weights=False)``) has none.

    Args:
        model: a Keras model or layer.
        token_embedding: the `keras.layers.Embedding` (see
            `find_token_embedding`).

    Returns:
        A list of keras-masking and keras-hub ``MaskedLMHead`` layers built on
        that embedding.

    Example:
    ```python
    masked_lm = keras_masking.models.TransformerMaskedLM(backbone)
    heads = find_tied_heads(masked_lm, find_token_embedding(masked_lm))
    assert heads == [masked_lm.masked_lm_head]
    ```
    """
    if not isinstance(token_embedding, keras.layers.Embedding):
        raise TypeError(
            "Expected a keras.layers.Embedding for token_embedding. "
            f"Received: token_embedding of type {type(token_embedding).__name__}."
        )
    if not getattr(token_embedding, "tie_weights", True):
        return []
    head_types = (MaskedLMHead, keras_hub.layers.MaskedLMHead)
    heads = [
        layer
        for layer in walk_layers(model)
        if isinstance(layer, head_types)
        and getattr(layer, "token_embedding", None) is token_embedding
    ]
    return _distinct(heads + heads_on_embedding(token_embedding))
