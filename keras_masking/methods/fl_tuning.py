"""FL-tuning: addFFN branches on a frozen backbone, and their exact merge.

``FFN_FL(x) = f(x W1 + b1) W2 + b2 + f(x W1' + b1') W2' + b2'``. Hidden units
are exchangeable, so the sum is one FFN with ``m + k`` units:
``W1 <- [W1 W1']``, ``b1 <- [b1 b1']``, ``W2 <- [W2; W2']``, ``b2 <- b2 + b2'``,
wherever the new units are placed (prefix, infix or suffix).
"""

import contextlib
import logging
import sys

import keras
import numpy as np

from keras_masking.layers.feed_forward import FeedForward
from keras_masking.methods.backbone_surgery import KERAS_HUB_BACKBONES
from keras_masking.methods.backbone_surgery import as_transformer_backbone
from keras_masking.methods.backbone_surgery import replace_backbones
from keras_masking.methods.backbone_surgery import transformer_backbones
from keras_masking.methods.parameter_report import parameter_report
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.utils.arguments import check_int

logger = logging.getLogger(__name__)


def fl_tune(model, units=160, layers=None, attention_units=0, verbose=False):
    """Adds FL-tuning's `AddFFN` to every (or the chosen) FFN and freezes the rest.

    Embeddings, attention, the original FFNs and all LayerNorms are frozen;
    layers outside the backbone (the task head) keep their trainable flags.
    Compile the model after calling this.

    Every argument is checked before the model is touched: a refused call
    leaves the model as it was, and a corrected call then works.

    The trainable count and ratio are logged at INFO level (logger
    ``keras_masking.methods.fl_tuning``); ``verbose=True`` also prints them.

    Args:
        model: a `TransformerBackbone` (any family), a keras-hub `BertBackbone`
            / `RobertaBackbone` (converted to an equivalent
            `TransformerBackbone`, which is returned), or a model built on a
            `TransformerBackbone` (a keras-hub task, a functional classifier).
        units: int >= 0, added hidden units per FFN (160 in the paper); 0 with
            ``attention_units`` for MA-tuning alone.
        layers: list of distinct layer indices in ``[0, num_layers)``, or
            None for every layer.
        attention_units: int >= 0, MA-tuning: extra query/key/value units per
            attention head (`AttentionUnits`); 0 (default) for none. These
            units do not merge (`merge_fl` refuses them).
        verbose: bool, also print the trainable count and ratio.

    Returns:
        The tuned model: ``model`` itself, changed in place, or the converted
        backbone for a keras-hub backbone.

    Example:
    ```python
    classifier = keras_masking.fl_tune(classifier, units=160, verbose=True)
    # FL-tuning: 160 units per FFN, 0 attention units per head; trainable parameters: ...
    classifier.compile(
        optimizer=keras.optimizers.Adam(5e-5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    ```
    """
    units = check_int("units", units, minimum=0)
    attention_units = check_int("attention_units", attention_units, minimum=0)
    if not units and not attention_units:
        raise ValueError(
            "Expected units >= 1 (or attention_units >= 1 for MA-tuning alone). "
            f"Received: units={units}, attention_units={attention_units}."
        )
    verbose = _check_verbose(verbose)
    layers = _check_layer_list(layers)
    backbones = _backbones_to_tune(model)
    for backbone in backbones:
        if backbone.add_ffn is not None or backbone.add_attention_units is not None:
            raise ValueError(
                f"This backbone already has addFFN branches or attention units "
                f"({backbone.add_ffn or backbone.add_attention_units}). Merge them "
                "(keras_masking.merge_fl) or detach them (backbone.detach_attachments()) first."
            )
        _check_layer_range(layers, backbone.num_layers_built)
    model = as_transformer_backbone(model)
    backbones = transformer_backbones(model)
    with _unchanged_on_error(backbones):
        for backbone in backbones:
            if units:
                backbone.attach_add_ffn(units, layers)
            if attention_units:
                backbone.attach_attention_units(attention_units, layers)
            backbone.freeze_base()
    _report(
        f"FL-tuning: {units} units per FFN, {attention_units} attention units per head; "
        f"{parameter_report(model)}",
        verbose,
    )
    return model


def _backbones_to_tune(model):
    """The backbones a tuning call will change (a keras-hub one as it is)."""
    if isinstance(model, KERAS_HUB_BACKBONES):
        return [_HubBackboneView(model)]
    return transformer_backbones(model)


class _HubBackboneView:
    """What the checks need of a keras-hub backbone before it is converted."""

    def __init__(self, backbone):
        self.num_layers_built = int(backbone.num_layers)
        self.add_ffn = self.add_attention_units = self.key_value_prefix = None


def _check_verbose(verbose):
    """``verbose`` as a bool: True, False, or the ints 0 / 1 as Keras takes them."""
    if isinstance(verbose, (bool, np.bool_)):
        return bool(verbose)
    if isinstance(verbose, (int, np.integer)) and int(verbose) in (0, 1):
        return bool(verbose)
    raise ValueError(f"Expected True, False, 0 or 1 for verbose. Received: verbose={verbose!r}.")


def _check_layer_list(layers, name="layers"):
    """Checks a layer selection's form: None, or distinct integers (numpy ones too).

    Returns:
        None, or the sorted list of Python ints.
    """
    if layers is None:
        return None
    expected = f"Expected None or a non-empty list of distinct integer layer indices for {name}."
    if (
        isinstance(layers, (str, bytes, dict))
        or not hasattr(layers, "__iter__")
        or (isinstance(layers, np.ndarray) and layers.ndim != 1)
    ):
        raise ValueError(f"{expected} Received: {name}={layers!r}.")
    values = list(layers)
    if not values or any(
        isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in values
    ):
        raise ValueError(f"{expected} Received: {name}={layers!r}.")
    indices = [int(v) for v in values]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{expected} Received duplicates: {name}={indices}.")
    return sorted(indices)


def _check_layer_range(layers, num_layers, name="layers"):
    """Raises a ValueError when a checked selection names a layer the backbone lacks."""
    if layers is not None and (layers[0] < 0 or layers[-1] >= num_layers):
        raise ValueError(
            f"Expected layer indices in [0, {num_layers}) for {name} (the backbone has "
            f"{num_layers} layers). Received: {name}={layers}."
        )


def _report(message, verbose):
    """Logs ``message`` at INFO level; with ``verbose`` also writes it to stdout,
    as Keras writes its progress (to the log when interactive logging is off)."""
    logger.info(message)
    if verbose and keras.config.is_interactive_logging_enabled():
        sys.stdout.write(message + "\n")
        sys.stdout.flush()


_ATTACHMENT_ATTRIBUTES = (
    ("feed_forward_branch", "attach_feed_forward_branch", "detach_feed_forward_branch"),
    ("key_value_prefix", "attach_key_value_prefix", "detach_key_value_prefix"),
    ("attention_units", "attach_attention_units", "detach_attention_units"),
)
_RECORDS = ("add_ffn", "key_value_prefix", "add_attention_units", "frozen_base")


@contextlib.contextmanager
def _unchanged_on_error(backbones, variables=()):
    """Puts ``backbones`` back as they were when the block raises.

    Restores each backbone's attachment records and frozen flag, each block's
    attached layers, every layer's and variable's ``trainable`` flag, and the
    values of ``variables``.
    """
    saved = []
    for backbone in backbones:
        records = {key: _plain_copy(getattr(backbone, key)) for key in _RECORDS}
        blocks = [
            {attribute: getattr(block, attribute) for attribute, _, _ in _ATTACHMENT_ATTRIBUTES}
            for block in backbone.transformer_layers
        ]
        flags = [(layer, layer.trainable) for layer in backbone._flatten_layers(include_self=True)]
        variable_flags = [(v, v.trainable) for v in backbone.weights]
        saved.append((backbone, records, blocks, flags, variable_flags))
    values = [(v, keras.ops.convert_to_numpy(v)) for v in variables]
    try:
        yield
    except BaseException:
        for backbone, records, blocks, flags, variable_flags in saved:
            for block, attached in zip(backbone.transformer_layers, blocks):
                for attribute, attach, detach in _ATTACHMENT_ATTRIBUTES:
                    if getattr(block, attribute) is attached[attribute]:
                        continue
                    if attached[attribute] is None:
                        getattr(block, detach)()
                    else:
                        getattr(block, attach)(attached[attribute])
            for key, value in records.items():
                setattr(backbone, key, value)
            for layer, trainable in flags:  # parents first: children override
                layer.trainable = trainable
            for variable, trainable in variable_flags:
                variable.trainable = trainable
        for variable, value in values:
            variable.assign(value)
        raise


def _plain_copy(value):
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in value.items()}
    return value


def add_ffn_parameter_count(hidden_dim, units, num_layers):
    """Parameters FL-tuning adds: ``layers * (2 d k + k + d)``.

    Args:
        hidden_dim: int >= 1, the hidden size ``d``.
        units: int >= 0, added units per FFN ``k``.
        num_layers: int >= 0, tuned layers.

    Returns:
        The parameter count, an int.

    Example:
    >>> add_ffn_parameter_count(768, 160, 12)
    2960256
    """
    hidden_dim = check_int("hidden_dim", hidden_dim, minimum=1)
    units = check_int("units", units, minimum=0)
    num_layers = check_int("num_layers", num_layers, minimum=0)
    if not units:
        return 0
    return num_layers * (2 * hidden_dim * units + units + hidden_dim)


def merge_fl(model, placement="suffix"):
    """A plain model whose FFNs carry the addFFN units: same function, no branch.

    Each tuned FFN becomes one FFN with ``m + k`` hidden units. Layers that
    were not tuned get ``k`` zero units (exactly no change), so every layer
    keeps one ``intermediate_dim`` and the result converts to keras-hub
    (``backbone.to_keras_hub()``). The merged backbone is trainable again and
    records what was merged (``merged_add_ffn``) for `unmerge_fl`. ``model``
    itself is not changed.

    Args:
        model: an FL-tuned backbone, or a model built on one.
        placement: ``"suffix"`` (after the original units), ``"prefix"``, or an
            int index in ``[0, m]`` for an infix. All give the same function.

    Returns:
        A new model; layers outside the backbone are copies with the same
        weights.

    Example:
    ```python
    classifier = keras_masking.fl_tune(classifier, units=160)
    # ... compile and fit ...
    deployable = keras_masking.merge_fl(classifier)  # FFNs of m + 160 units, same outputs
    deployable(features)
    ```
    """
    backbones = transformer_backbones(model)
    tuned = []
    for backbone in backbones:
        if backbone.add_attention_units is not None:
            raise ValueError(
                "MA-tuning's attention units do not merge into a plain attention layer (the "
                "extra dimensions keep the base head's scale); keep them attached."
            )
        if backbone.add_ffn is not None:
            tuned.append((backbone, _insert_index(placement, backbone.intermediate_dim)))
    if not tuned:
        raise ValueError("No addFFN branches to merge: call keras_masking.fl_tune first.")
    replacements = {
        id(backbone): _merged_backbone(backbone, placement, at) for backbone, at in tuned
    }
    return replace_backbones(model, replacements)


def unmerge_fl(model, units=None, placement=None, layers=None):
    """Splits merged FFNs back into the base FFN and a trainable `AddFFN`.

    ``model`` itself is not changed.

    Args:
        model: a backbone merged by `merge_fl` (its record gives the defaults),
            or any model built on a `TransformerBackbone` whose FFNs hold
            ``units`` extra units.
        units: int >= 1, fewer than the FFNs' hidden units; default from the
            merge record.
        placement: where the units sit (see `merge_fl`); default from the
            record, else ``"suffix"``.
        layers: the tuned layers (distinct indices in ``[0, num_layers)``);
            default from the record, else all.

    Returns:
        A new FL-tuned model (base frozen, branches trainable).

    Example:
    ```python
    merged = keras_masking.merge_fl(keras_masking.fl_tune(classifier, units=8))
    tuned_again = keras_masking.unmerge_fl(merged)  # same outputs, AddFFN branches back
    ```
    """
    if units is not None:
        units = check_int("units", units, minimum=1)
    layers = _check_layer_list(layers)
    plans = []
    for backbone in transformer_backbones(model):
        if any(getattr(backbone, key) is not None for key in ("add_ffn", "add_attention_units")):
            raise ValueError(
                "This backbone has addFFN branches or attention units attached; unmerge_fl "
                "splits a merged backbone. Merge it first (keras_masking.merge_fl)."
            )
        record = dict(backbone.merged_add_ffn or {})
        backbone_units = units if units is not None else record.get("units")
        if backbone_units is None:
            raise ValueError(
                "This backbone has no merge record; pass `units` (and `placement`, `layers`)."
            )
        total = backbone.intermediate_dim
        if backbone_units >= total:
            raise ValueError(
                f"Expected units < {total} for units (the FFNs have {total} hidden units, and "
                f"at least one must stay in the base FFN). Received: units={backbone_units}."
            )
        backbone_placement = placement if placement is not None else record.get("placement")
        backbone_placement = "suffix" if backbone_placement is None else backbone_placement
        at = _insert_index(backbone_placement, total - backbone_units)
        backbone_layers = layers if layers is not None else record.get("layers")
        _check_layer_range(backbone_layers, backbone.num_layers_built)
        plans.append((backbone, int(backbone_units), at, backbone_layers))
    replacements = {
        id(backbone): _unmerged_backbone(backbone, units_, at, layers_)
        for backbone, units_, at, layers_ in plans
    }
    return replace_backbones(model, replacements)


def _insert_index(placement, base_units):
    if isinstance(placement, str) and placement in ("suffix", "prefix"):
        return base_units if placement == "suffix" else 0
    if (
        isinstance(placement, (int, np.integer))
        and not isinstance(placement, (bool, np.bool_))
        and 0 <= placement <= base_units
    ):
        return int(placement)
    raise ValueError(
        f"Expected 'prefix', 'suffix' or an integer in [0, {base_units}] for placement. "
        f"Received: placement={placement!r}."
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


def _merged_backbone(backbone, placement, at):
    units = backbone.add_ffn["units"]
    tuned = list(backbone.add_ffn["layers"])
    base_units = backbone.intermediate_dim
    placement = placement if isinstance(placement, str) else int(placement)
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


def _unmerged_backbone(backbone, units, at, layers):
    total = backbone.intermediate_dim
    base_units = total - units
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
