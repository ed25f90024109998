"""DropToken: drop random tokens in training, keeping the others' positions."""

import random

import keras
import numpy as np
from keras import ops

from keras_masking.distribution.random import batch_uniform
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.ops.token_dropping import check_drop_rate
from keras_masking.ops.token_dropping import check_gather_slots
from keras_masking.ops.token_dropping import kept_indices
from keras_masking.ops.token_dropping import restore_full_length
from keras_masking.ops.token_dropping import sample_keep_mask
from keras_masking.ops.token_dropping import static_keep_length
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.eager_checks import check_zero_one
from keras_masking.utils.eager_checks import concrete_value
from keras_masking.utils.eager_checks import dims_match
from keras_masking.utils.eager_checks import dtype_name
from keras_masking.utils.eager_checks import static_shape

MODES = ("gather", "attention")
_OUTPUTS = ("hidden", "padding_mask", "position_ids", "keep_mask", "kept_indices")


@keras.saving.register_keras_serializable(package="keras_masking")
class DropToken(keras.layers.Layer):
    """Drops a random share of tokens during training; identity at inference.

    The MAE view of masking: dropping tokens is dropout that also shortens
    the sequence, and it needs no correction at inference. The kept tokens
    keep their original positions (absolute embeddings were added before
    dropping; rotary and relative schemes read the returned position ids).

    Per example, real tokens are dropped at ``rate`` (stochastic rounding,
    by `keras_masking.ops.select_tokens`; one is kept when the slots have
    room for it); padding goes first; ``unselectable_token_ids`` and
    ``protected_positions`` are never dropped. The random scores are float32
    under every dtype policy, so mixed precision keeps the same tokens.

    * ``mode="gather"`` (fast): returns the kept tokens in their original
      order in ``keep_length`` static slots (`keep_length`; spare slots are
      masked), with their padding mask, position ids, original indices and
      the full-length keep mask (to restore outputs). A row whose protected
      tokens alone outnumber the slots cannot be gathered: an eager call
      raises a ValueError; a compiled step returns NaN hidden states for
      that row so that the loss shows it.
    * ``mode="attention"`` (full length, for token-level tasks): returns the
      sequence unchanged and a ``padding_mask`` that also hides the dropped
      tokens' keys from every query (the tokens gather mode drops).

    Both modes return the same entries, so the layer sits in a functional
    graph whatever its settings (a backbone keeps one from the start, the
    identity until `reconfigure` turns it on).

    Args:
        rate: float in [0, 1), the share of droppable tokens to drop (numpy
            scalars accepted).
        unselectable_token_ids: list or tuple of ids never dropped (e.g.
            ``(101, 102)``).
        protected_positions: list or tuple of positions never dropped (e.g.
            ``(0,)``).
        mode: ``"gather"`` or ``"attention"``.
        seed: int >= 0 or None.
        slot_multiple: int >= 1. Gather mode rounds the kept slots up to a
            multiple of it (8: on CPU, 464 slots run about 8% faster than
            461 under XLA). 1 keeps exactly ``L - floor(rate L)``.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float ``(batch, sequence, dim)``, embeddings after positions.
        padding_mask: 0/1 or bool ``(batch, sequence)``.
        token_ids: int ``(batch, sequence)``; needed for
            ``unselectable_token_ids``.
        position_ids: int ``(batch or 1, sequence)`` (or ``(batch or 1,
            sequence, 2)`` for 2D rotary positions), or None (``0..L-1``).
        training: bool. Identity when False.

    Returns:
        A dict with ``hidden``, ``padding_mask`` (the keys attention may
        read), ``position_ids`` (as given, or ``0..L-1``, at inference),
        ``keep_mask`` (full length: False where a token was dropped; all
        True at inference, padding included) and ``kept_indices`` (each
        slot's original index; ``0..L-1`` at full length).

    Example:

    >>> drop = DropToken(0.5, protected_positions=(0,))
    >>> out = drop(keras.ops.ones((2, 32, 4)), keras.ops.ones((2, 32)), training=True)
    >>> tuple(out["hidden"].shape)
    (2, 16, 4)
    """

    def __init__(
        self,
        rate,
        unselectable_token_ids=(),
        protected_positions=(),
        mode="gather",
        seed=None,
        slot_multiple=8,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._configure(
            rate, unselectable_token_ids, protected_positions, mode, seed, slot_multiple
        )
        self.seed_generator = keras.random.SeedGenerator(self.seed)

    def reconfigure(
        self,
        rate,
        unselectable_token_ids=(),
        protected_positions=(),
        mode="gather",
        seed=None,
        slot_multiple=8,
    ):
        """Sets every setting at once, as the constructor does (next trace of a step).

        A backbone keeps one `DropToken` in its graph from the start (the
        identity until ``enable_drop_token`` configures it), so turning
        token dropping on changes this layer's settings, not the graph.
        Everything is checked before anything changes; an int ``seed``
        restarts the draws from it.

        Args:
            rate, unselectable_token_ids, protected_positions, mode, seed,
            slot_multiple: see the class.

        Example:

        >>> drop = DropToken(0.0)
        >>> drop.reconfigure(0.2, unselectable_token_ids=(101, 102), mode="attention", seed=3)
        >>> drop.mode, drop.rate
        ('attention', 0.2)
        """
        self._configure(
            rate, unselectable_token_ids, protected_positions, mode, seed, slot_multiple
        )
        # The draws restart as a new layer's would: from ``seed``, or from a
        # fresh random seed (Keras' default, from Python's random state).
        start = self.seed if self.seed is not None else random.randint(1, 10**9)
        state = self.seed_generator.state
        state.assign(ops.cast(ops.convert_to_tensor([start, 0]), state.dtype))

    def _configure(
        self, rate, unselectable_token_ids, protected_positions, mode, seed, slot_multiple
    ):
        """Sets every setting, all checked before any is set."""
        checked = dict(
            rate=check_drop_rate(rate),
            unselectable_token_ids=check_int_list(
                "unselectable_token_ids", unselectable_token_ids, minimum=0
            ),
            protected_positions=check_int_list(
                "protected_positions", protected_positions, minimum=0
            ),
            mode=check_choice("mode", mode, MODES),
            seed=check_seed("seed", seed),
            slot_multiple=check_int("slot_multiple", slot_multiple, minimum=1),
        )
        for name, value in checked.items():
            setattr(self, name, value)

    def set_rate(self, rate):
        """Changes the drop rate (takes effect at the next trace of a step).

        Args:
            rate: float in [0, 1) (numpy scalars accepted).

        Example:

        >>> drop = DropToken(0.5)
        >>> drop.set_rate(0.25)
        >>> drop.rate
        0.25
        """
        self.rate = check_drop_rate(rate)

    def keep_length(self, sequence_length):
        """Static number of slots kept in gather mode.

        Args:
            sequence_length: int >= 0, the static sequence length.

        Returns:
            A Python int, see `static_keep_length`; at least the number of
            protected positions inside the sequence.

        Example:

        >>> DropToken(0.5, slot_multiple=1).keep_length(9)
        5
        """
        length = check_int("sequence_length", sequence_length, minimum=0)
        positions = sum(1 for position in set(self.protected_positions) if position < length)
        return static_keep_length(length, self.rate, self.slot_multiple, minimum=positions)

    def _check_inputs(self, hidden, padding_mask, token_ids, position_ids, training):
        if len(hidden.shape) != 3:
            raise ValueError(
                "Expected hidden of shape (batch, sequence, dim). "
                f"Received: hidden with shape {tuple(hidden.shape)}."
            )
        batch, length = static_shape(hidden)[:2]  # None when symbolic (export)
        for name, value, expected in (
            ("padding_mask", padding_mask, "(batch, sequence)"),
            ("token_ids", token_ids, "(batch, sequence)"),
            ("position_ids", position_ids, "(batch or 1, sequence) or (batch or 1, sequence, 2)"),
        ):
            if value is None:
                if name == "token_ids" and self.unselectable_token_ids and training and self.rate:
                    raise ValueError(
                        "DropToken needs token_ids to protect unselectable_token_ids="
                        f"{self.unselectable_token_ids}. Received: token_ids=None."
                    )
                continue
            shape = static_shape(value)
            ranks = (2, 3) if name == "position_ids" else (2,)
            batch_one = name == "position_ids"
            if len(shape) not in ranks or not dims_match(shape, (batch, length), batch_one):
                raise ValueError(
                    f"Expected {name} of shape {expected} with (batch, sequence) = "
                    f"{(batch, length)}, as hidden. Received: {name} with shape {shape}."
                )
            if name != "padding_mask" and "int" not in dtype_name(value):
                raise ValueError(
                    f"Expected integer {name}. Received: {name} of dtype {dtype_name(value)}."
                )
        check_zero_one("padding_mask", padding_mask)
        if training and self.rate and length is None:
            raise ValueError(
                "DropToken needs a static sequence length in training. Received: hidden with "
                f"shape {tuple(hidden.shape)}."
            )

    def call(self, hidden, padding_mask, token_ids=None, position_ids=None, training=None):
        self._check_inputs(hidden, padding_mask, token_ids, position_ids, training)
        length = hidden.shape[1]
        batch = ops.shape(hidden)[0]
        full_positions = ops.arange(ops.shape(hidden)[1], dtype="int32")[None, :]
        real = ops.cast(padding_mask, "bool")
        all_indices = ops.broadcast_to(full_positions, ops.shape(real))
        if not (bool(training) and self.rate > 0.0):
            # The identity: position ids as given (or 0..L-1, unbroadcast, so
            # relative positions cost no more than without this layer).
            positions = full_positions if position_ids is None else ops.cast(position_ids, "int32")
            outputs = (hidden, padding_mask, positions, ops.ones_like(real), all_indices)
            return dict(zip(_OUTPUTS, outputs))
        position_ids = ops.cast(full_positions if position_ids is None else position_ids, "int32")
        position_ids = ops.broadcast_to(
            position_ids, (batch, ops.shape(hidden)[1]) + tuple(position_ids.shape[2:])
        )
        protected = ops.zeros_like(real)
        for position in self.protected_positions:
            protected = protected | (full_positions == position)
        for token in self.unselectable_token_ids:
            protected = protected | (token_ids == token)
        protected = protected & real
        keep_length = self.keep_length(length)
        if self.mode == "gather":
            self._check_protected_fit(protected, length, keep_length)
        # Per-example draws: replicas of a data-parallel step draw their own
        # rows of the global batch's draws (see `batch_uniform`).
        noise = batch_uniform((batch, length), self.seed_generator)
        rounding = batch_uniform((batch,), self.seed_generator)
        keep = sample_keep_mask(real, real & ~protected, self.rate, keep_length, noise, rounding)
        if self.mode == "attention":
            # Full length; the dropped tokens' keys are hidden as padding is.
            hidden_keys = ops.cast(real, "int32") * ops.cast(keep, "int32")
            hidden_keys = ops.cast(hidden_keys, padding_mask.dtype)
            return dict(zip(_OUTPUTS, (hidden, hidden_keys, position_ids, keep, all_indices)))
        indices = kept_indices(keep, keep_length)
        # A row whose protected tokens outnumber the slots (only possible in a
        # compiled call: eager calls refused it above) keeps its first
        # keep_length tokens, and its hidden states are NaN so the loss shows it.
        gathered = ops.cumsum(ops.cast(keep, "int32"), axis=1) <= keep_length
        overflow = ops.any(keep & ~gathered, axis=1)
        keep = keep & gathered
        kept = batched_gather(hidden, indices)
        kept = ops.where(overflow[:, None, None], ops.cast(float("nan"), kept.dtype), kept)
        kept_mask = ops.cast(batched_gather(keep, indices), padding_mask.dtype)
        kept_positions = batched_gather(position_ids, indices)
        return dict(zip(_OUTPUTS, (kept, kept_mask, kept_positions, keep, indices)))

    def _check_protected_fit(self, protected, length, keep_length):
        values = concrete_value(protected)
        if values is None or not values.size:
            return
        counts = values.sum(axis=1)
        if counts.max() > keep_length:
            row = int(np.argmax(counts))
            raise ValueError(
                f"Row {row} has {int(counts[row])} protected tokens but gather mode keeps only "
                f"{keep_length} of its {length} tokens at rate={self.rate} (unselectable_token_ids"
                f"={self.unselectable_token_ids}, protected_positions={self.protected_positions}). "
                "Expected at most as many protected tokens as kept slots: lower the rate, raise "
                "slot_multiple, protect fewer ids, or use mode='attention'."
            )

    def compute_output_spec(
        self, hidden, padding_mask, token_ids=None, position_ids=None, training=None
    ):
        self._check_inputs(hidden, padding_mask, token_ids, position_ids, training)
        batch, length = hidden.shape[0], hidden.shape[1]
        kept = length
        if training and self.mode == "gather" and self.rate and length is not None:
            kept = self.keep_length(length)
        position_tail = () if position_ids is None else tuple(position_ids.shape[2:])
        return {
            "hidden": keras.KerasTensor((batch, kept) + tuple(hidden.shape[2:]), hidden.dtype),
            "padding_mask": keras.KerasTensor((batch, kept), padding_mask.dtype),
            "position_ids": keras.KerasTensor((None, kept) + position_tail, "int32"),
            "keep_mask": keras.KerasTensor((batch, length), "bool"),
            "kept_indices": keras.KerasTensor((batch, kept), "int32"),
        }

    def get_config(self):
        return {
            **super().get_config(),
            "rate": self.rate,
            "unselectable_token_ids": list(self.unselectable_token_ids),
            "protected_positions": list(self.protected_positions),
            "mode": self.mode,
            "seed": self.seed,
            "slot_multiple": self.slot_multiple,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "protected_token_ids" in config:  # saved before the rename
            config["unselectable_token_ids"] = config.pop("protected_token_ids")
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_masking")
class RestoreDroppedTokens(keras.layers.Layer):
    """Puts gather-mode outputs back at their original positions.

    Args:
        gathering: bool. False makes the layer the identity (a backbone's
            graph holds one from the start; ``enable_drop_token`` in gather
            mode turns it on).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        kept_values: ``(batch, keep_length, ...)`` outputs of the kept tokens.
        keep_mask: bool ``(batch, sequence)`` from `DropToken`.
        training: bool or None. ``training=False`` is the identity (nothing
            was dropped); None restores, as True does.

    Returns:
        ``(batch, sequence, ...)`` with zeros where tokens were dropped (the
        identity at inference, where ``keep_mask`` is all True).

    Example:

    >>> import numpy as np
    >>> restore = RestoreDroppedTokens()
    >>> out = restore(np.array([[[1.0], [2.0]]]), np.array([[True, False, True]]))
    >>> np.asarray(out)[0, :, 0].tolist()
    [1.0, 0.0, 2.0]
    """

    def __init__(self, gathering=True, **kwargs):
        super().__init__(**kwargs)
        self.gathering = check_bool("gathering", gathering)

    def _check_inputs(self, kept_values, keep_mask):
        values_shape, mask_shape = tuple(kept_values.shape), tuple(keep_mask.shape)
        batches = {values_shape[0] if values_shape else None, *mask_shape[:1]} - {None}
        if len(values_shape) < 2 or len(mask_shape) != 2 or len(batches) > 1:
            raise ValueError(
                "Expected kept_values (batch, keep_length, ...) and keep_mask (batch, sequence). "
                f"Received: kept_values with shape {values_shape}, keep_mask with "
                f"shape {mask_shape}."
            )
        check_gather_slots(keep_mask, values_shape[1], "keep_mask", "keep_mask")

    def call(self, kept_values, keep_mask, training=None):
        self._check_inputs(kept_values, keep_mask)
        if not self.gathering or training is False:
            return kept_values
        return restore_full_length(kept_values, keep_mask)

    def compute_output_spec(self, kept_values, keep_mask, training=None):
        self._check_inputs(kept_values, keep_mask)
        shape = (kept_values.shape[0], keep_mask.shape[1]) + tuple(kept_values.shape[2:])
        return keras.KerasTensor(shape, kept_values.dtype)

    def get_config(self):
        return {**super().get_config(), "gathering": self.gathering}
