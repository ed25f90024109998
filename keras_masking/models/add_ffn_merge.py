"""FL-tuning's merge: addFFN branches folded into plain FFNs of a new backbone, and back."""

import numpy as np

from keras_masking.layers.add_ffn import insert_index
from keras_masking.layers.add_ffn import merge_feed_forward_weights
from keras_masking.layers.add_ffn import split_feed_forward_weights
from keras_masking.layers.feed_forward import FeedForward
from keras_masking.utils.arguments import check_int


def merge_add_ffn(backbone, placement="suffix"):
    """`TransformerBackbone.merge_fl`: each tuned FFN and its `AddFFN` as one wider FFN.

    The hidden units are concatenated (`merge_feed_forward_weights`);
    untuned layers get zero units, so every layer has the same width.

    Args:
        backbone: an FL-tuned `TransformerBackbone` (not changed).
        placement: as `TransformerBackbone.merge_fl` takes it.

    Example:
    ```python
    backbone.enable_fl_tuning(units=8)
    merged = keras_masking.models.add_ffn_merge.merge_add_ffn(backbone)  # backbone.merge_fl()
    ```
    """
    if backbone.add_attention_units is not None:
        raise ValueError(
            "MA-tuning's attention units do not merge into a plain attention layer (the "
            "extra dimensions keep the base head's scale); keep them attached."
        )
    if backbone.add_ffn is None:
        raise ValueError("No addFFN branches to merge: call enable_fl_tuning() first.")
    _refuse_feed_forward_lora(backbone, "merge_fl")
    units, tuned = backbone.add_ffn["units"], list(backbone.add_ffn["layers"])
    at = insert_index(placement, backbone.intermediate_dim)
    record = {
        "units": units,
        "layers": tuned,
        "placement": placement if isinstance(placement, str) else int(placement),
        "base_intermediate_dim": backbone.intermediate_dim,
    }
    merged = copy_backbone(
        backbone, intermediate_dim=backbone.intermediate_dim + units, merged_add_ffn=record
    )
    for index, (old, new) in enumerate(zip(backbone.transformer_layers, merged.transformer_layers)):
        base = old.feed_forward.get_weights()
        if index in tuned:
            branch = old.feed_forward_branch.get_weights()
        else:
            branch = [np.zeros((base[0].shape[0], units), base[0].dtype), np.zeros(units)]
            branch += [np.zeros((units, base[0].shape[0]), base[2].dtype), 0 * base[3]]
        new.feed_forward.set_weights(merge_feed_forward_weights(base, branch, at))
    return merged


def unmerge_add_ffn(backbone, units=None, placement=None, layers=None):
    """`TransformerBackbone.unmerge_fl`: merged FFNs split again into base FFN and `AddFFN`.

    Args:
        backbone: a merged `TransformerBackbone` (not changed).
        units, placement, layers: as `TransformerBackbone.unmerge_fl` takes them.

    Example:
    ```python
    backbone.enable_fl_tuning(units=8)
    tuned_again = keras_masking.models.add_ffn_merge.unmerge_add_ffn(backbone.merge_fl())
    ```
    """
    if backbone.add_ffn is not None or backbone.add_attention_units is not None:
        raise ValueError(
            "This backbone has addFFN branches or attention units attached; unmerge_fl "
            "splits a merged backbone. Merge it first (backbone.merge_fl())."
        )
    _refuse_feed_forward_lora(backbone, "unmerge_fl")
    record = dict(backbone.merged_add_ffn or {})
    units = record.get("units") if units is None else check_int("units", units, minimum=1)
    if units is None:
        raise ValueError(
            "This backbone has no merge record; pass `units` (and `placement`, `layers`)."
        )
    total = backbone.intermediate_dim
    if units >= total:
        raise ValueError(
            f"Expected units < {total} for units (the FFNs have {total} hidden units, and "
            f"at least one must stay in the base FFN). Received: units={units}."
        )
    placement = placement if placement is not None else record.get("placement", "suffix")
    at = insert_index(placement, total - units)
    layers = backbone.layer_indices(layers if layers is not None else record.get("layers"))
    split = copy_backbone(backbone, intermediate_dim=total - units, merged_add_ffn=None)
    split.attach_add_ffn(units, layers)
    for index, (old, new) in enumerate(zip(backbone.transformer_layers, split.transformer_layers)):
        base, branch = split_feed_forward_weights(old.feed_forward.get_weights(), units, at)
        new.feed_forward.set_weights(base)
        if index in layers:
            new.feed_forward_branch.set_weights(branch)
        elif np.any(branch[0]) or np.any(branch[2]):
            raise ValueError(
                f"Layer {index} is not listed as tuned but its units {at}..{at + units} are "
                "not zero; pass the `layers` that were tuned."
            )
    split.freeze_base()
    return split


def _refuse_feed_forward_lora(backbone, what):
    """LoRA kernels of an FFN's layers have the FFN's width: they do not carry over."""
    adapted = [layer.path for layer in backbone.lora_layers() if "/feed_forward/" in layer.path]
    if adapted:
        raise ValueError(
            f"{what} changes the FFNs' width, and LoRA adapts their layers ({adapted[0]}...): "
            f"merge LoRA first (backbone.merge_lora().{what}())."
        )


def copy_backbone(backbone, **changes):
    """A new backbone of ``backbone``'s config with ``changes``, without addFFN.

    Every weight but the FFNs' is copied (the embeddings, attention,
    LayerNorms, pooler, prefixes and adversaries).

    Args:
        backbone: a `TransformerBackbone`.
        **changes: config entries to change (``intermediate_dim``...).

    Example:
    ```python
    wider = keras_masking.models.add_ffn_merge.copy_backbone(backbone, intermediate_dim=200)
    ```
    """
    config = backbone.get_config()
    config.update(add_ffn=None, frozen_base=False, **changes)
    target = type(backbone).from_config(config)
    pairs = list(zip(backbone.base_layers(), target.base_layers()))
    for old, new in zip(backbone.transformer_layers, target.transformer_layers):
        pairs.append((old.key_value_prefix, new.key_value_prefix))
    pairs += list(zip(backbone.attention_adversaries or [], target.attention_adversaries or []))
    for old, new in pairs:
        if old is not None and not isinstance(old, FeedForward):
            new.set_weights(old.get_weights())
    return target
