"""The attachments of TransformerBackbone's methods: attach, detach, freeze, restore."""

import contextlib
import functools
import logging
import math

import keras
from keras import ops

from keras_masking.layers.add_ffn import AddFFN
from keras_masking.layers.attention_units import AttentionUnits
from keras_masking.layers.key_value_prefix import key_value_prefixes
from keras_masking.layers.transformer_block import BLOCK_ATTACHMENTS
from keras_masking.models.backbone_config import ATTACHMENT_RECORDS
from keras_masking.models.backbone_config import plain_record
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list

logger = logging.getLogger("keras_masking.models.transformer_backbone")


def refreshes_callers(method):
    """Runs `refresh_training` on the backbone's callers after ``method``.

    A method turned on after a model compiled or fitted the backbone would
    otherwise be ignored by that model's traced steps and optimizer.

    Args:
        method: a backbone method that changes its layers or trainable set.

    Example:
    ```python
    @refreshes_callers
    def enable_something(self): ...
    ```
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        self.callers.refresh()
        return result

    return wrapper


class BackboneAttachments:
    """`TransformerBackbone`'s public hooks for the layers methods attach.

    addFFN branches, MA-tuning's attention units and P-tuning v2's prefixes
    attach to the transformer blocks; `freeze_base` freezes what they leave;
    `restore_on_error` makes a tuning call all or nothing.

    Example:
    ```python
    backbone.attach_add_ffn(8, layers=[0])
    backbone.freeze_base()
    ```
    """

    def _log_trainable(self, message):
        def count(variables):
            return sum(math.prod(v.shape) for v in {id(v): v for v in variables}.values())

        trainable, total = count(self.trainable_weights), count(self.weights)
        logger.info(
            "%s; trainable parameters: %s of %s (%.2f%%)",
            message,
            f"{trainable:,}",
            f"{total:,}",
            100.0 * trainable / max(total, 1),
        )

    def _track(self, name, value):
        """Sets a sublayer attribute after the model is built (an enable_* call)."""
        self._tracker.unlock()
        try:
            setattr(self, name, value)
        finally:
            self._tracker.lock()

    @contextlib.contextmanager
    def restore_on_error(self, variables=()):
        """Puts this backbone back as it was when the block raises.

        Restores the attachments, their records, the ``trainable`` flags and
        the values of ``variables``: a tuning call or an adapter load is all
        or nothing.

        Example:
        ```python
        with backbone.restore_on_error():
            backbone.attach_add_ffn(8)
            backbone.freeze_base()
        ```
        """
        records = {key: plain_record(getattr(self, key)) for key in ATTACHMENT_RECORDS}
        blocks = [
            {attribute: getattr(block, attribute) for attribute in BLOCK_ATTACHMENTS}
            for block in self.transformer_layers
        ]
        flags = [(layer, layer.trainable) for layer in self._flatten_layers(include_self=True)]
        flags += [(v, v.trainable) for v in self.weights]
        values = [(v, ops.convert_to_numpy(v)) for v in variables]
        try:
            yield
        except BaseException:
            for block, attached in zip(self.transformer_layers, blocks):
                for attribute, layer in attached.items():
                    if getattr(block, attribute) is not layer:
                        if layer is None:
                            getattr(block, f"detach_{attribute}")()
                        else:
                            getattr(block, f"attach_{attribute}")(layer)
            for key, value in records.items():
                setattr(self, key, value)
            for item, trainable in flags:  # parents first: children override
                item.trainable = trainable
            for variable, value in values:
                variable.assign(value)
            raise

    @refreshes_callers
    def attach_add_ffn(self, units, layers=None):
        """Attaches an `AddFFN` of ``units`` to the chosen layers' FFNs.

        The branch uses this backbone's FFN activation, so merging is exact.

        Args:
            units: int, hidden units added per FFN.
            layers: list of layer indices, or None for every layer.
        """
        units = check_int("units", units, minimum=1)
        layers = self.layer_indices(layers)
        for index in layers:
            self.transformer_layers[index].attach_feed_forward_branch(
                AddFFN(units, activation=self.activation, dtype=self.dtype_policy, name="add_ffn")
            )
        self.add_ffn = {"units": int(units), "layers": layers}

    @refreshes_callers
    def attach_key_value_prefixes(
        self, length, layers=None, dropout=0.1, reparameterize=False, hidden_units=512
    ):
        """Attaches trainable `KeyValuePrefix` tables to the chosen layers.

        Args:
            length: int >= 0, prefix length.
            layers: list of layer indices, or None for every layer.
            dropout, reparameterize, hidden_units: see `KeyValuePrefix`.
                Reparameterised prefixes share one `PrefixEncoder` across
                the chosen layers, as in P-tuning v2.
        """
        layers = self.layer_indices(layers)
        # The layers check the other arguments before any is attached.
        prefixes = key_value_prefixes(
            length,
            num_layers=len(layers),
            num_heads=self.num_heads,
            head_dim=self.hidden_dim // self.num_heads,
            dropout=dropout,
            reparameterize=reparameterize,
            hidden_units=hidden_units,
            dtype=self.dtype_policy,
            name_scopes=[self.transformer_layers[index].path for index in layers],
        )
        for index, prefix in zip(layers, prefixes):
            self.transformer_layers[index].attach_key_value_prefix(prefix)
        checked = ("length", "dropout", "reparameterize", "hidden_units")
        record = {key: getattr(prefixes[0], key) for key in checked}
        self.key_value_prefix = {**record, "layers": layers}

    @refreshes_callers
    def attach_attention_units(self, units_per_head, layers=None):
        """Attaches MA-tuning's `AttentionUnits` to the chosen layers.

        Args:
            units_per_head: int, extra query/key/value units per head.
            layers: list of layer indices, or None for every layer.
        """
        units_per_head = check_int("units_per_head", units_per_head, minimum=1)
        layers = self.layer_indices(layers)
        for index in layers:
            self.transformer_layers[index].attach_attention_units(
                AttentionUnits(
                    units_per_head,
                    num_heads=self.num_heads,
                    dtype=self.dtype_policy,
                    name="attention_units",
                )
            )
        self.add_attention_units = {"units_per_head": int(units_per_head), "layers": layers}

    @refreshes_callers
    def detach_attachments(self):
        """Removes every attached FFN branch, attention unit and prefix."""
        for block in self.transformer_layers:
            for attribute in BLOCK_ATTACHMENTS:
                getattr(block, f"detach_{attribute}")()
        for name in ATTACHMENT_RECORDS[:-1]:
            setattr(self, name, None)

    def attached_methods(self):
        """The attached tuning weights that only this package's layers hold, by name.

        What a plain format (a Google checkpoint, keras-hub's layers) has no
        place for: FL-tuning's addFFN branches, prefixes, attention units.

        Example:
        ```python
        assert backbone.attached_methods() == []
        ```
        """
        attached = (
            ("FL-tuning's addFFN branches", self.add_ffn),
            ("P-tuning v2's prefixes", self.key_value_prefix),
            ("MA-tuning's attention units", self.add_attention_units),
        )
        return [name for name, setting in attached if setting is not None]

    def base_layers(self):
        """The layers holding the pretrained weights (not the attachments)."""
        layers = [self.embeddings]
        for block in self.transformer_layers:
            layers += [
                block.self_attention,
                block.attention_layer_norm,
                block.feed_forward,
                block.feed_forward_layer_norm,
            ]
        if self.pooled_dense is not None:
            layers.append(self.pooled_dense)
        return layers

    @refreshes_callers
    def freeze_base(self, frozen=True):
        """Freezes (or unfreezes) every pretrained weight, LayerNorms included.

        Attached branches and prefixes keep their own ``trainable`` flag;
        LoRA's layers keep training their LoRA kernels and bias (as
        `enable_lora` leaves them), whichever was called first.

        Args:
            frozen: bool.
        """
        for layer in self.base_layers():
            # Each sublayer explicitly: Keras' setter does not always recurse
            # (on TensorFlow, not into a layer whose flag is already the value).
            for sublayer in layer._flatten_layers(include_self=True):
                sublayer.trainable = not frozen
        for layer in self.lora_layers():
            trained = {id(v) for v in lora_trained_variables(layer)}
            layer.trainable = True
            for variable in layer.weights:
                variable.trainable = id(variable) in trained or not frozen
        self.frozen_base = bool(frozen)

    def layer_indices(self, layers=None):
        """Sorted, checked layer indices: every layer when ``layers`` is None.

        Args:
            layers: distinct ints in ``[0, num_layers)``, or None.
        """
        count = self.num_layers
        if layers is None:
            return list(range(count))
        checked = check_int_list(
            "layers", layers, minimum=0, maximum=count - 1, allow_empty=False, unique=True
        )
        return sorted(checked)

    def _attachments(self):
        """The layers the methods attach (addFFN, attention units, prefixes, adversaries)."""
        layers = [
            getattr(block, attribute)
            for block in self.transformer_layers
            for attribute in BLOCK_ATTACHMENTS
        ]
        return [layer for layer in layers + list(self.attention_adversaries or []) if layer]

    def lora_targets(self, target_layer_names):
        """The layers ``enable_lora(rank, target_layer_names)`` adapts, in order.

        Args:
            target_layer_names: layer names, as `enable_lora` takes them.
        """
        names = set(target_layer_names)
        return [layer for layer in self._lora_capable() if layer.name in names]

    def _lora_capable(self):
        """The pretrained sublayers that take LoRA (Keras' ``Dense`` / ``EinsumDense``).

        Not the embedding tables (Keras' ``Embedding.enable_lora`` factors
        the table, which LoRA's merge, adapters and exports do not hold). Not
        the methods' own layers (addFFN, attention units, ASA's
        adversaries), which train whole: their ``query`` or
        ``intermediate_dense`` share the base layers' names.
        """
        base = {
            id(sublayer)
            for layer in self.base_layers()
            for sublayer in layer._flatten_layers(include_self=True)
        }
        return [
            layer
            for layer in self._flatten_layers(include_self=False)
            if id(layer) in base
            and isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))
            and layer.weights
        ]

    def lora_layers(self):
        """The sublayers with LoRA on (keras ``Dense`` / ``EinsumDense`` after `enable_lora`)."""
        return [
            layer
            for layer in self._flatten_layers(include_self=False)
            if getattr(layer, "lora_enabled", False)
        ]


def lora_trained_variables(layer):
    """What a layer with LoRA on trains: its two LoRA kernels and its bias (as keras-hub).

    Args:
        layer: a Keras ``Dense`` / ``EinsumDense`` after ``enable_lora``.

    Example:
    ```python
    backbone.enable_lora(2)
    variables = lora_trained_variables(backbone.lora_layers()[0])  # A, B, bias
    ```
    """
    bias = getattr(layer, "bias", None)
    return [layer.lora_kernel_a, layer.lora_kernel_b] + ([] if bias is None else [bias])
