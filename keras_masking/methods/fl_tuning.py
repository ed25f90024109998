"""FL-tuning: addFFN branches on a frozen backbone, and their exact merge.

``FFN_FL(x) = f(x W1 + b1) W2 + b2 + f(x W1' + b1') W2' + b2'``. Hidden units
are exchangeable, so the sum is one FFN with ``m + k`` units:
``W1 <- [W1 W1']``, ``b1 <- [b1 b1']``, ``W2 <- [W2; W2']``, ``b2 <- b2 + b2'``,
wherever the new units are placed (prefix, infix or suffix).
"""

import numpy as np

from keras_masking.layers.feed_forward import FeedForward
from keras_masking.methods.backbone_surgery import as_transformer_backbone
from keras_masking.methods.backbone_surgery import replace_backbones
from keras_masking.methods.backbone_surgery import transformer_backbones
from keras_masking.methods.parameter_report import parameter_report
from keras_masking.models.transformer_backbone import TransformerBackbone


def fl_tune(model, units=160, layers=None, attention_units=0, verbose=True):
    """Adds FL-tuning's `AddFFN` to every (or the chosen) FFN and freezes the rest.

    Embeddings, attention, the original FFNs and all LayerNorms are frozen;
    layers outside the backbone (the task head) keep their trainable flags.
    Compile the model after calling this.

    Args:
        model: a `TransformerBackbone` (any family), a keras-hub `BertBackbone`
            / `RobertaBackbone` (converted to an equivalent
            `TransformerBackbone`, which is returned), or a model built on a
            `TransformerBackbone` (a keras-hub task, a functional classifier).
        units: int, added hidden units per FFN (160 in the paper); 0 with
            ``attention_units`` for MA-tuning alone.
        layers: list of layer indices, or None for every layer.
        attention_units: int, MA-tuning: extra query/key/value units per
            attention head (`AttentionUnits`); 0 (default) for none. These
            units do not merge (`merge_fl` refuses them).
        verbose: bool, print the trainable count and ratio.

    Returns:
        The tuned model: ``model`` itself, changed in place, or the converted
        backbone for a keras-hub backbone.

    Example:
    ```python
    classifier = keras_masking.fl_tune(classifier, units=160)
    # trainable parameters: 2,960,256 + head of ... (2.9%)
    classifier.compile(optimizer=keras.optimizers.Adam(5e-5), loss=...)
    ```
    """
    if not units and not attention_units:
        raise ValueError("`units` must be a positive integer (or give `attention_units`).")
    model = as_transformer_backbone(model)
    for backbone in transformer_backbones(model):
        if backbone.add_ffn is not None or backbone.add_attention_units is not None:
            raise ValueError(
                f"This backbone already has addFFN branches or attention units "
                f"({backbone.add_ffn or backbone.add_attention_units}). Merge them "
                "(keras_masking.merge_fl) or detach them (backbone.detach_attachments()) first."
            )
        if units:
            backbone.attach_add_ffn(units, layers)
        if attention_units:
            backbone.attach_attention_units(attention_units, layers)
        backbone.freeze_base()
    if verbose:
        print(
            f"FL-tuning: {units} units per FFN, {attention_units} attention units per head; "
            f"{parameter_report(model)}"
        )
    return model


def add_ffn_parameter_count(hidden_dim, units, num_layers):
    """Parameters FL-tuning adds: ``layers * (2 d k + k + d)``.

    >>> add_ffn_parameter_count(768, 160, 12)
    2960256
    """
    return num_layers * (2 * hidden_dim * units + units + hidden_dim)


def merge_fl(model, placement="suffix"):
    """A plain model whose FFNs carry the addFFN units: same function, no branch.

    Each tuned FFN becomes one FFN with ``m + k`` hidden units. Layers that
    were not tuned get ``k`` zero units (exactly no change), so every layer
    keeps one ``intermediate_dim`` and the result converts to keras-hub
    (``backbone.to_keras_hub()``). The merged backbone is trainable again and
    records what was merged (``merged_add_ffn``) for `unmerge_fl`.

    Args:
        model: an FL-tuned backbone, or a model built on one.
        placement: ``"suffix"`` (after the original units), ``"prefix"``, or an
            int index for an infix. All give the same function.

    Returns:
        A new model; layers outside the backbone are copies with the same
        weights.
    """
    replacements = {}
    for backbone in transformer_backbones(model):
        if backbone.add_attention_units is not None:
            raise ValueError(
                "MA-tuning's attention units do not merge into a plain attention layer (the "
                "extra dimensions keep the base head's scale); keep them attached."
            )
        if backbone.add_ffn is None:
            continue
        replacements[id(backbone)] = _merged_backbone(backbone, placement)
    if not replacements:
        raise ValueError("No addFFN branches to merge: call keras_masking.fl_tune first.")
    return replace_backbones(model, replacements)


def unmerge_fl(model, units=None, placement=None, layers=None):
    """Splits merged FFNs back into the base FFN and a trainable `AddFFN`.

    Args:
        model: a backbone merged by `merge_fl` (its record gives the defaults),
            or any model built on a `TransformerBackbone` whose FFNs hold
            ``units`` extra units.
        units: int; default from the merge record.
        placement: where the units sit (see `merge_fl`); default from the
            record, else ``"suffix"``.
        layers: the tuned layers; default from the record, else all.

    Returns:
        A new FL-tuned model (base frozen, branches trainable).
    """
    replacements = {}
    for backbone in transformer_backbones(model):
        record = dict(backbone.merged_add_ffn or {})
        record_units = units if units is not None else record.get("units")
        if record_units is None:
            raise ValueError(
                "This backbone has no merge record; pass `units` (and `placement`, `layers`)."
            )
        replacements[id(backbone)] = _unmerged_backbone(
            backbone,
            int(record_units),
            placement if placement is not None else record.get("placement", "suffix"),
            layers if layers is not None else record.get("layers"),
        )
    return replace_backbones(model, replacements)


def _insert_index(placement, base_units):
    if placement == "suffix":
        return base_units
    if placement == "prefix":
        return 0
    if isinstance(placement, (int, np.integer)) and 0 <= placement <= base_units:
        return int(placement)
    raise ValueError(
        f"`placement` must be 'prefix', 'suffix' or an int in [0, {base_units}]. "
        f"Received: {placement!r}"
    )


def _config_without_attachments(backbone):
    config = backbone.get_config()
    config.update(add_ffn=None, frozen_base=False)
    return config


def _copy_shared_weights(source, target):
    """Copies every weight except the FFNs' and the addFFN branches'."""
    for old, new in zip(source.base_layers(), target.base_layers()):
        if not isinstance(old, FeedForward):
            new.set_weights(old.get_weights())
    for old_block, new_block in zip(source.transformer_layers, target.transformer_layers):
        if old_block.key_value_prefix is not None:
            new_block.key_value_prefix.set_weights(old_block.key_value_prefix.get_weights())


def _merged_backbone(backbone, placement):
    units = backbone.add_ffn["units"]
    tuned = backbone.add_ffn["layers"]
    base_units = backbone.intermediate_dim
    at = _insert_index(placement, base_units)
    config = _config_without_attachments(backbone)
    config.update(
        intermediate_dim=base_units + units,
        merged_add_ffn={
            "units": units,
            "layers": tuned,
            "placement": placement,
            "base_intermediate_dim": base_units,
        },
    )
    merged = TransformerBackbone.from_config(config)
    _copy_shared_weights(backbone, merged)
    for index, (old, new) in enumerate(zip(backbone.transformer_layers, merged.transformer_layers)):
        w1, b1, w2, b2 = old.feed_forward.get_weights()
        if index in tuned:
            a1, c1, a2, c2 = old.feed_forward_branch.get_weights()
        else:
            hidden = w1.shape[0]
            a1, c1 = np.zeros((hidden, units), w1.dtype), np.zeros((units,), b1.dtype)
            a2, c2 = np.zeros((units, hidden), w2.dtype), np.zeros_like(b2)
        new.feed_forward.set_weights(
            [
                np.concatenate([w1[:, :at], a1, w1[:, at:]], axis=1),
                np.concatenate([b1[:at], c1, b1[at:]]),
                np.concatenate([w2[:at], a2, w2[at:]], axis=0),
                b2 + c2,
            ]
        )
    return merged


def _unmerged_backbone(backbone, units, placement, layers):
    total = backbone.intermediate_dim
    base_units = total - units
    if base_units < 1:
        raise ValueError(f"Cannot take {units} units out of FFNs with {total} hidden units.")
    at = _insert_index(placement, base_units)
    config = _config_without_attachments(backbone)
    config.update(intermediate_dim=base_units, merged_add_ffn=None)
    split = TransformerBackbone.from_config(config)
    split.attach_add_ffn(units, layers)
    _copy_shared_weights(backbone, split)
    tuned = split.add_ffn["layers"]
    added = slice(at, at + units)
    for index, (old, new) in enumerate(zip(backbone.transformer_layers, split.transformer_layers)):
        w1, b1, w2, b2 = old.feed_forward.get_weights()
        keep = np.r_[0:at, at + units : total]
        new.feed_forward.set_weights([w1[:, keep], b1[keep], w2[keep], b2])
        if index in tuned:
            # The branch's output bias b2' is not recoverable from b2 + b2':
            # it starts at zero and the base bias keeps the sum.
            new.feed_forward_branch.set_weights(
                [w1[:, added], b1[added], w2[added], np.zeros_like(b2)]
            )
        elif np.any(w2[added]) or np.any(w1[:, added]):
            raise ValueError(
                f"Layer {index} is not listed as tuned but its units {at}..{at + units} are "
                "not zero; pass the `layers` that were tuned."
            )
    split.freeze_base()
    return split
