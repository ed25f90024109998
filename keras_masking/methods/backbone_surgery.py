"""Finding the backbones inside a model and swapping them for new ones.

Parameter-efficient tuning attaches to, merges and splits the
`TransformerBackbone` inside whatever the user trains: the backbone itself, a
keras-hub task built on it, or a functional model that calls it. These
helpers keep that plumbing in one place.
"""

import keras
import keras_hub
import numpy as np

from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.utils.layer_walk import walk_layers

KERAS_HUB_BACKBONES = (keras_hub.models.BertBackbone, keras_hub.models.RobertaBackbone)


def as_transformer_backbone(model):
    """``model`` itself, or a keras-hub BERT/RoBERTa backbone converted.

    Tuning methods attach layers inside each transformer block, which
    keras-hub's blocks offer no hook for; the converted `TransformerBackbone`
    computes the same function (`TransformerBackbone.from_keras_hub`) and,
    after `keras_masking.merge_fl`, converts back with ``to_keras_hub()``.
    """
    if isinstance(model, KERAS_HUB_BACKBONES):
        return TransformerBackbone.from_keras_hub(model)
    return model


def transformer_backbones(model):
    """Every `TransformerBackbone` in ``model`` (``model`` first if it is one).

    Raises:
        TypeError: when there is none; a keras-hub backbone inside a task gets
            a hint to build the task on a converted backbone.
    """
    found = [model] if isinstance(model, TransformerBackbone) else []
    hub = []
    for layer in walk_layers(model):
        if isinstance(layer, TransformerBackbone) and all(layer is not b for b in found):
            found.append(layer)
        elif isinstance(layer, KERAS_HUB_BACKBONES):
            hub.append(layer)
    if found:
        return found
    if hub:
        raise TypeError(
            f"This model is built on a keras-hub {type(hub[0]).__name__}, whose transformer "
            "layers have no hook for tuning branches. Pass the keras-hub backbone itself (it is "
            "converted), or build the task on "
            "keras_masking.models.TransformerBackbone.from_keras_hub(backbone) "
            "(the same function, with hooks)."
        )
    raise TypeError(
        "Expected a keras_masking TransformerBackbone, a keras-hub BertBackbone / "
        f"RobertaBackbone, or a model containing one. Received: {type(model).__name__}"
    )


def replace_backbones(model, replacements):
    """A copy of ``model`` with backbones swapped, other weights copied.

    Args:
        model: a `TransformerBackbone`, a keras-hub `Task` on one, or a
            functional `keras.Model` calling one directly.
        replacements: dict ``id(old_backbone) -> new_backbone``.

    Returns:
        The new model. Layers outside the backbones get fresh copies with the
        same weights.
    """
    if id(model) in replacements:
        return replacements[id(model)]
    if isinstance(model, keras_hub.models.Task):
        config = model.get_config()
        config["backbone"] = replacements[id(model.backbone)]
        # The preprocessor as it is: its config alone holds no vocabulary.
        config["preprocessor"] = model.preprocessor
        new_model = type(model).from_config(config)
    elif isinstance(model, keras.Model) and hasattr(model, "inputs") and model.inputs:

        def clone(layer):
            if id(layer) in replacements:
                return replacements[id(layer)]
            return layer.__class__.from_config(layer.get_config())

        new_model = keras.models.clone_model(model, clone_function=clone)
    else:
        raise TypeError(
            "Expected a TransformerBackbone, a keras-hub task, or a functional keras.Model "
            f"that calls the backbone. Received: {type(model).__name__}"
        )
    new_ids = {id(b) for b in replacements.values()}
    if not any(id(layer) in new_ids for layer in walk_layers(new_model)):
        raise TypeError(
            "The backbone is nested inside another layer of this model, out of reach of the "
            "copy; apply the method to a model that calls the backbone directly."
        )
    _copy_weights_outside_backbones(model, new_model, replacements)
    return new_model


def _copy_weights_outside_backbones(source, target, replacements):
    old_backbone_ids = set()
    for layer in walk_layers(source):
        if id(layer) in replacements:
            old_backbone_ids |= {id(v) for v in layer.weights}
    new_backbone_ids = set()
    for backbone in replacements.values():
        new_backbone_ids |= {id(v) for v in backbone.weights}
    old = [v for v in source.weights if id(v) not in old_backbone_ids]
    new = [v for v in target.weights if id(v) not in new_backbone_ids]
    shapes_old = [tuple(v.shape) for v in old]
    shapes_new = [tuple(v.shape) for v in new]
    if shapes_old != shapes_new:
        raise ValueError(
            "The rebuilt model's weights outside the backbone do not line up with the "
            f"original's ({len(old)} vs {len(new)} variables)."
        )
    for source_variable, target_variable in zip(old, new):
        # A copy: on JAX, assigning the variable would share its buffer, which
        # a compiled step of either model may then donate and delete.
        target_variable.assign(np.array(source_variable.numpy()))
