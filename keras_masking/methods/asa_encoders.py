"""Which encoders ASA can attack, and their adversarial pass."""

import keras
import keras_hub

from keras_masking.layers.attention_adversary import AttentionAdversary
from keras_masking.methods.drop_token import DropTokenEncoder
from keras_masking.methods.drop_token import drop_token_stages
from keras_masking.methods.encoder_stages import encoder_stages
from keras_masking.models.exlm_encoder import ExLMEncoder
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.utils.layer_walk import walk_layers

_KERAS_HUB_ADVICE = (
    "keras-hub's TransformerEncoder merges integer masks only, so the adversary's -10000 "
    "replacing mask cannot reach its attention. Convert the backbone with "
    "keras_masking.models.TransformerBackbone.from_keras_hub(backbone) (same outputs), "
    "build the task model on it, and convert back after training with to_keras_hub()."
)


def _is_functional(model):
    return any(cls.__name__ == "Functional" for cls in type(model).__mro__)


def _refusal(layer):
    """Why ASA cannot attack ``layer``, or None if it can."""
    if isinstance(layer, ExLMEncoder):
        return (
            "ASA cannot attack an ExLMEncoder: it expands [CLS]/[SEP] into k states inside its "
            "own graph, so the sequence the adversary would mask is not the one the task "
            "model was given, and the official ASA defines no adversary over expanded states."
        )
    if isinstance(layer, DropTokenEncoder) and layer.mode == "gather":
        return (
            "ASA cannot attack a DropToken encoder in gather mode: it removes tokens before the "
            "layers, so the clean and adversarial passes would run on different sequences and "
            "the divergence would measure the dropping, not the attention attack. Use "
            "with_drop_token(..., mode='attention'), where every pass keeps the full length."
        )
    if isinstance(layer, DropTokenEncoder) and not isinstance(layer.backbone, TransformerBackbone):
        return "ASA with DropToken needs a TransformerBackbone inside it. " + _KERAS_HUB_ADVICE
    if isinstance(layer, keras_hub.models.Backbone) and not isinstance(layer, TransformerBackbone):
        return f"ASA cannot attack a keras-hub {type(layer).__name__} directly. " + (
            _KERAS_HUB_ADVICE
        )
    return None


def _is_encoder(layer):
    return isinstance(
        layer, (TransformerBackbone, DropTokenEncoder, ExLMEncoder, keras_hub.models.Backbone)
    )


def find_asa_encoder(task_model):
    """The encoder layer the task model calls, and its `TransformerBackbone`.

    Args:
        task_model: a functional Keras model.

    Returns:
        ``(encoder, backbone)``: the layer whose call ASA replaces (a
        `TransformerBackbone` or a `DropTokenEncoder` in attention mode) and
        the backbone holding the transformer layers.

    Raises:
        ValueError: with the reason, for a model that is not functional, has
            no encoder, nests it, or has one ASA cannot attack.
    """
    if not isinstance(task_model, keras.Model) or not _is_functional(task_model):
        raise ValueError(
            "ASA needs a functional task model (keras.Model(inputs, outputs), or a keras-hub "
            f"task): its adversarial pass reruns the model's graph. Received: "
            f"{type(task_model).__name__}."
        )
    encoders = [layer for layer in task_model.layers if _is_encoder(layer)]
    if not encoders:
        nested = [layer for layer in walk_layers(task_model) if _is_encoder(layer)]
        if nested:
            raise ValueError(
                f"The encoder {nested[0].name!r} is nested inside another layer of the task "
                "model. ASA replaces the encoder's call in the task model's own graph: call the "
                "backbone directly in the task model."
            )
        raise ValueError(
            "The task model calls no TransformerBackbone (or DropToken encoder), so ASA has no "
            "attention to attack."
        )
    if len(encoders) > 1:
        names = [layer.name for layer in encoders]
        raise ValueError(f"ASA attacks one encoder; this task model has {len(names)}: {names}.")
    encoder = encoders[0]
    reason = _refusal(encoder)
    if reason:
        raise ValueError(reason)
    backbone = encoder if isinstance(encoder, TransformerBackbone) else encoder.backbone
    return encoder, backbone


def adversarial_encoder_call(encoder, inputs, adversaries, mask_semantics):
    """The encoder's graph with each attacked layer's mask from its adversary.

    Args:
        encoder: a layer `find_asa_encoder` returned.
        inputs: the encoder's input dict (symbolic tensors).
        adversaries: dict ``{layer_index: AttentionAdversary}``.
        mask_semantics: see `keras_masking.ops.apply_replacing_mask`.

    Returns:
        ``(outputs, masks, padding_mask)``: the encoder's output dict, the
        adversaries' binary masks in layer order, and the padding mask.
    """
    padding_mask = inputs["padding_mask"]
    masks = []

    def attention_mask_fn(index, hidden):
        adversary = adversaries.get(index)
        if adversary is None:
            return None
        mask = adversary(hidden, padding_mask)
        masks.append(mask)
        return AttentionAdversary.mask_bias(mask)

    hooks = {"attention_mask_fn": attention_mask_fn, "mask_semantics": mask_semantics}
    if isinstance(encoder, DropTokenEncoder):
        outputs = drop_token_stages(
            encoder_stages(encoder.backbone), encoder.drop_token, inputs, **hooks
        )
    else:
        outputs = encoder.forward_stages(inputs, **hooks)
    return outputs, masks, padding_mask
