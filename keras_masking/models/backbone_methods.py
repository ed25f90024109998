"""TransformerBackbone's one-call methods: DropToken, ASA, FL-tuning, P-tuning v2, LoRA."""

import logging

from keras_masking.layers.attention_adversary import AttentionAdversary
from keras_masking.layers.attention_adversary import attention_adversaries
from keras_masking.models.add_ffn_merge import merge_add_ffn
from keras_masking.models.add_ffn_merge import unmerge_add_ffn
from keras_masking.models.backbone_attachments import refreshes_callers
from keras_masking.models.backbone_config import ASA_WITH_GATHER
from keras_masking.models.serving_copy import copy_with_lora_merged
from keras_masking.models.serving_copy import serving_backbone
from keras_masking.ops.attention_masks import validate_mask_semantics
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.arguments import check_str_list
from keras_masking.utils.xla_cpu import warn_if_slow_token_dropping_under_xla

logger = logging.getLogger("keras_masking")


class BackboneMethods:
    """`TransformerBackbone`'s ``enable_*`` calls, one per method, and ASA's pass.

    Each call checks its arguments, changes the backbone's layers, records
    the setting in the config, and refreshes every model that already
    compiled or fitted the backbone (`keras_masking.utils.refresh_training`),
    so the next ``fit`` trains with the method whenever it is called.

    Example:
    ```python
    backbone.enable_drop_token(0.15, unselectable_token_ids=(101, 102))
    ```
    """

    @refreshes_callers
    def enable_drop_token(
        self, rate, unselectable_token_ids=(), mode="gather", seed=None, slot_multiple=8
    ):
        """Drops tokens after the embedding stage in training (DropToken).

        The backbone's graph is ``embed -> DropToken -> encode ->
        RestoreDroppedTokens -> pool`` from the start, for training and
        inference alike; this call configures its `DropToken` (the identity
        until then), so the graph does not change. In training, [CLS] is
        always kept and ``sequence_output`` comes back at full length
        (``token_mask`` marks the tokens the encoder read); inference drops
        nothing. The layer is ``backbone.drop_token``;
        `keras_masking.callbacks.DropTokenRateSchedule` changes its rate.

        Args:
            rate: float in [0, 1); 0.10-0.15 did best on CLUE.
            unselectable_token_ids: ids never dropped, e.g. ``(101, 102)``.
            mode: ``"gather"`` (shorter sequence, faster) or ``"attention"``
                (full length, dropped keys hidden; the mode ASA can attack).
            seed: int >= 0 or None.
            slot_multiple: int >= 1, see `DropToken`.

        Example:
        ```python
        backbone.enable_drop_token(0.15, unselectable_token_ids=(101, 102))
        ```
        """
        if self.drop_token is not None:
            raise ValueError(
                "DropToken is already enabled; change its rate with "
                "backbone.drop_token.set_rate(rate)."
            )
        ids = check_int_list(
            "unselectable_token_ids",
            unselectable_token_ids,
            minimum=0,
            maximum=self.vocabulary_size - 1,
        )
        if mode == "gather" and (self.asa is not None or self.attacking_trainers()):
            raise ValueError(ASA_WITH_GATHER)
        # The graph's layers are configured, not added: the graph is the same.
        self.token_dropping.reconfigure(
            rate, ids, (0,), mode=mode, seed=seed, slot_multiple=slot_multiple
        )
        self.restore_dropped_tokens.gathering = self.token_dropping.mode == "gather"
        self.drop_token_enabled = True
        if self.restore_dropped_tokens.gathering and self.token_dropping.rate:
            warn_if_slow_token_dropping_under_xla()

    def attacking_trainers(self):
        """The `ASATrainer`s built on a model that calls this backbone (alive ones).

        Example:
        ```python
        assert backbone.attacking_trainers() == []
        ```
        """
        callers = self.callers
        return [model for model in callers if getattr(model, "attacked_backbone", None) is self]

    @refreshes_callers
    def enable_asa(
        self, tau=0.5, layers=None, alpha=1.0, mask_semantics="replace", noise=False, seed=None
    ):
        """Attaches ASA's adversaries (adversarial self-attention fine-tuning).

        The backbone holds the setting and one `AttentionAdversary` per
        attacked layer; its own outputs stay the clean pass. The objective
        needs the head, so it lives in the model that has one:
        `TransformerTextClassifier` trains with ASA as soon as its backbone
        has it; a user's own head trains with
        ``keras_masking.methods.ASATrainer(task_model)`` (a training call of
        the backbone outside those two raises: it would train without the
        adversaries).

        Args:
            tau: float >= 0, the mask penalty's temperature (0.5).
            layers: layer indices to attack, or None for every layer.
            alpha: float >= 0, the gradient reversal's strength (1).
            mask_semantics: ``"replace"`` (official), ``"additive"`` or
                ``"guarded"`` (see `keras_masking.ops.apply_replacing_mask`).
            noise: bool, logistic noise before each adversary's step (a
                deviation).
            seed: int >= 0 or None, for ``noise``.

        Example:
        ```python
        backbone.enable_asa(tau=0.5)
        ```
        """
        if self.asa is not None:
            raise ValueError(f"ASA is already enabled ({self.asa}).")
        if self.attacking_trainers():
            raise ValueError(
                "An ASATrainer already attacks this backbone with its own adversaries and "
                "settings, which it keeps: enable_asa here would not be trained. Build the "
                "ASATrainer after enable_asa (it then reads the backbone's setting), or give the "
                "ASATrainer the settings you want."
            )
        if self.drop_token is not None and self.drop_token.mode == "gather":
            raise ValueError(ASA_WITH_GATHER)
        tau = check_float("tau", tau, minimum=0.0)
        alpha = check_float("alpha", alpha, minimum=0.0)
        validate_mask_semantics(mask_semantics)
        noise = check_bool("noise", noise)
        seed = check_seed("seed", seed)
        layers = self.layer_indices(layers)
        adversaries = attention_adversaries(layers, self.hidden_dim, alpha, noise, seed)
        self._track("attention_adversaries", list(adversaries.values()))
        self.asa = {
            "tau": tau,
            "layers": layers,
            "alpha": alpha,
            "mask_semantics": mask_semantics,
            "noise": noise,
            "seed": seed,
        }

    @refreshes_callers
    def enable_fl_tuning(self, units=160, layers=None, attention_units=0):
        """FL-tuning: `AddFFN` branches on the chosen FFNs, every base weight frozen.

        ``FFN(x) + f(x W1' + b1') W2' + b2'`` with ``units`` new hidden units
        per FFN; only the branches (and a task's head) train.
        ``attention_units`` adds MA-tuning's units per head (they do not
        merge). `merge_fl` folds the branches into plain FFNs afterwards.

        Args:
            units: int >= 0, hidden units added per FFN (160 in the paper);
                0 with ``attention_units`` for MA-tuning alone.
            layers: layer indices, or None for every layer.
            attention_units: int >= 0, MA-tuning units per head (0: none).

        Example:
        ```python
        backbone.enable_fl_tuning(units=160)
        ```
        """
        units = check_int("units", units, minimum=0)
        attention_units = check_int("attention_units", attention_units, minimum=0)
        if not units and not attention_units:
            raise ValueError(
                "Expected units >= 1 (or attention_units >= 1 for MA-tuning alone). "
                f"Received: units={units}, attention_units={attention_units}."
            )
        layers = self.layer_indices(layers)
        if self.add_ffn is not None or self.add_attention_units is not None:
            raise ValueError(
                f"This backbone already has addFFN branches or attention units "
                f"({self.add_ffn or self.add_attention_units}). Merge them "
                "(backbone.merge_fl()) or detach them (backbone.detach_attachments()) first."
            )
        with self.restore_on_error():
            if units:
                self.attach_add_ffn(units, layers)
            if attention_units:
                self.attach_attention_units(attention_units, layers)
            self.freeze_base()
        self._log_trainable(
            f"FL-tuning: {units} units per FFN, {attention_units} attention units per head"
        )

    @refreshes_callers
    def enable_prefix_tuning(
        self, length=160, layers=None, dropout=0.1, reparameterize=False, hidden_units=512
    ):
        """P-tuning v2: trainable key/value prefixes in every chosen layer, base frozen.

        Each layer gets ``length`` trainable keys and values per head
        (`KeyValuePrefix`). ``reparameterize=True`` is P-tuning v2's
        ``prefix_projection``: one MLP shared by all tuned layers.

        Args:
            length: int >= 0, prefix length (0 leaves the function unchanged).
            layers: layer indices, or None for every layer.
            dropout: float in [0, 1), dropout on the prefixes.
            reparameterize: bool, the shared MLP reparameterisation.
            hidden_units: int >= 1, width of that MLP.

        Example:
        ```python
        backbone.enable_prefix_tuning(length=160)
        ```
        """
        if self.key_value_prefix is not None:
            raise ValueError(
                f"This backbone already has key/value prefixes ({self.key_value_prefix}); "
                "detach them first (backbone.detach_attachments())."
            )
        with self.restore_on_error():
            self.attach_key_value_prefixes(length, layers, dropout, reparameterize, hidden_units)
            self.freeze_base()
        self._log_trainable(f"P-tuning v2: prefix length {self.key_value_prefix['length']}")

    @refreshes_callers
    def enable_lora(self, rank, target_layer_names=None):
        """LoRA on the attention projections (keras-hub's `Backbone.enable_lora`), base frozen.

        Every base weight is frozen but the named layers' biases, and the
        named layers get rank-``rank`` LoRA kernels (Keras'
        ``Dense.enable_lora``, which leaves a layer's bias training, as in
        keras-hub; adapter files hold those biases); attachments of other
        methods (FL-tuning's units, P-tuning v2's prefixes, ASA's
        adversaries) keep training, so the methods compose. The config
        records the call: a saved model loads with LoRA on (Keras saves each
        LoRA layer's kernel merged and loads its LoRA kernels as zeros; the
        next ``fit`` gives ``A`` fresh values, `restart_loaded_lora`). Only
        the pretrained layers are adapted, not the methods' own layers of
        the same names (addFFN, attention units, adversaries).

        Args:
            rank: int >= 1, the rank of the LoRA factorisation.
            target_layer_names: names of the layers to adapt, each the name of
                at least one layer here that supports LoRA; None for the query
                and value projections (``"query"``, ``"value"``).

        Example:
        ```python
        backbone.enable_lora(4)
        ```
        """
        rank = check_int("rank", rank, minimum=1)
        if self.lora is not None:
            raise ValueError(f"LoRA is already enabled ({self.lora}).")
        adaptable = sorted({layer.name for layer in self._lora_capable()})
        if target_layer_names is None:
            names = [name for name in self.default_lora_layer_names() if name in adaptable]
        else:
            names = list(dict.fromkeys(check_str_list("target_layer_names", target_layer_names)))
            unknown = [name for name in names if name not in adaptable]
            if unknown or not names:
                raise ValueError(
                    f"Expected target_layer_names among this backbone's layers that take LoRA "
                    f"{adaptable}. Received: target_layer_names={target_layer_names!r} "
                    f"({unknown or 'empty'} match no such layer)."
                )
        attached = [(v, v.trainable) for layer in self._attachments() for v in layer.weights]
        # keras-hub's `Backbone.enable_lora` on the pretrained layers only: its
        # name match would also adapt the methods' own layers of those names.
        targets = self.lora_targets(names)
        self.trainable = True
        for layer in self._flatten_layers(include_self=False):
            layer.trainable = False
        for layer in targets:
            layer.trainable = True
            layer.enable_lora(rank)
        self._lora_rank = rank
        for variable, trainable in attached:
            variable.trainable = trainable
        self.lora = {"rank": rank, "target_layer_names": names}
        self._index_lora_layers()
        self._log_trainable(f"LoRA: rank {rank} on {names}")

    def _index_lora_layers(self):
        """Where keras-hub's `.lora.h5` functions find the adapted layers: their
        positions among the layers with weights, as the model stands now (a
        method enabled after LoRA adds layers before them)."""
        targets = self.lora_targets(self.lora["target_layer_names"]) if self.lora else []
        chosen = {id(layer) for layer in targets}
        with_weights = [lyr for lyr in self._flatten_layers(include_self=False) if lyr.weights]
        self._lora_enabled_layers = [i for i, lyr in enumerate(with_weights) if id(lyr) in chosen]

    def save_lora_weights(self, filepath):
        """keras-hub's ``.lora.h5`` file: each adapted layer's ``A`` and ``B``.

        The file holds no biases, and `enable_lora` trains the adapted
        layers' biases (as keras-hub's does): loaded onto a fresh base, it
        predicts otherwise than the model that wrote it, so a warning says
        so. `keras_masking.methods.save_adapter` writes every weight the
        methods train. The file finds layers by position: load it into a
        backbone with the same methods enabled.

        Args:
            filepath: a path ending in ``.lora.h5``.

        Example:
        ```python
        backbone.save_lora_weights("task.lora.h5")  # A and B only
        keras_masking.methods.save_adapter(backbone, "task")  # biases and methods too
        ```
        """
        self._index_lora_layers()
        super().save_lora_weights(filepath)
        logger.warning(
            "%s holds LoRA's A and B only, not the biases LoRA trained: loaded onto a fresh "
            "base it predicts otherwise. keras_masking.methods.save_adapter keeps them.",
            filepath,
        )

    def load_lora_weights(self, filepath):
        """keras-hub's `load_lora_weights` (see `save_lora_weights`), on the
        adapted layers as the model stands now."""
        self._index_lora_layers()
        super().load_lora_weights(filepath)

    def adversarial_forward(self, inputs, training=None, adversaries=None, mask_semantics=None):
        """ASA's adversarial pass: each attacked layer's mask from its adversary.

        The same layers as the backbone's graph (its `DropToken` included,
        which ASA allows in attention mode only), with each attacked layer's
        padding mask replaced by its adversary's mask.

        Args:
            inputs: the backbone's input dict.
            training: bool, whether dropout (and token dropping) is active.
            adversaries: ``{layer_index: AttentionAdversary}``; None for the
                ones `enable_asa` attached.
            mask_semantics: see `encode`; None for `enable_asa`'s.

        Returns:
            ``(outputs, masks)``: the output dict and the adversaries' binary
            masks ``(batch, query, key)`` in layer order.

        Example:
        ```python
        backbone.enable_asa(tau=0.5)
        outputs, masks = backbone.adversarial_forward(features, training=True)
        ```
        """
        if adversaries is None:
            if self.asa is None:
                raise ValueError("Call enable_asa() before adversarial_forward().")
            adversaries = dict(zip(self.asa["layers"], self.attention_adversaries))
        semantics = mask_semantics or (self.asa or {}).get("mask_semantics", "replace")
        masks = []

        def attention_mask_fn(index, hidden):
            if index not in adversaries:
                return None
            masks.append(adversaries[index](hidden, inputs["padding_mask"], training=training))
            return AttentionAdversary.mask_bias(masks[-1])

        outputs = self.forward_stages(inputs, attention_mask_fn, semantics, training=training)
        return outputs, masks

    def serving_copy(self):
        """The plain inference backbone: training-only methods off, FL-tuning and LoRA merged.

        See `keras_masking.models.serving_backbone`; ``export`` serves it.

        Example:
        ```python
        plain = backbone.serving_copy()
        ```
        """
        return serving_backbone(self)

    def merge_lora(self):
        """A new backbone with LoRA merged into the kernels it adapts: same function, no LoRA.

        The other methods stay as they are; nothing is frozen in the copy.

        Example:
        ```python
        backbone.enable_lora(2)
        merged = backbone.merge_lora()  # a backbone without LoRA kernels
        ```
        """
        if self.lora is None:
            raise ValueError("No LoRA to merge: call enable_lora() first.")
        return copy_with_lora_merged(self, frozen_base=False)

    def merge_fl(self, placement="suffix"):
        """A new backbone whose FFNs carry the addFFN units: same function, no branch.

        Each tuned FFN becomes one FFN with ``m + k`` hidden units; untuned
        layers get ``k`` zero units, so the result converts to keras-hub. The
        merged backbone is trainable and records the merge for `unmerge_fl`;
        this one is not changed (`keras_masking.models.add_ffn_merge`).

        Args:
            placement: ``"suffix"``, ``"prefix"`` or an int in ``[0, m]``.

        Example:
        ```python
        backbone.enable_fl_tuning(units=8)
        merged = backbone.merge_fl()
        ```
        """
        return merge_add_ffn(self, placement)

    def unmerge_fl(self, units=None, placement=None, layers=None):
        """A new FL-tuned backbone: merged FFNs split into base FFN and `AddFFN`.

        The converse of `merge_fl` (its record gives the defaults); this
        backbone is not changed.

        Args:
            units: int >= 1, fewer than the FFNs' hidden units.
            placement: where the units sit (see `merge_fl`); else ``"suffix"``.
            layers: the tuned layers; else every layer.

        Example:
        ```python
        backbone.enable_fl_tuning(units=8)
        tuned_again = backbone.merge_fl().unmerge_fl()
        ```
        """
        return unmerge_add_ffn(self, units, placement, layers)
