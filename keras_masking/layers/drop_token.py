"""DropToken: drop random tokens in training, keeping the others' positions."""

import keras
import numpy as np
from keras import ops

from keras_masking.distribution.random import batch_uniform
from keras_masking.ops.attention_masks import large_negative
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.ops.token_dropping import check_drop_rate
from keras_masking.ops.token_dropping import kept_indices
from keras_masking.ops.token_dropping import restore_full_length
from keras_masking.ops.token_dropping import sample_keep_mask
from keras_masking.ops.token_dropping import static_keep_length
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.arguments import check_seed
from keras_masking.utils.arguments import pop_renamed_argument
from keras_masking.utils.eager_checks import concrete_value

MODES = ("gather", "attention")


def _dtype_kind(tensor):
    return keras.backend.standardize_dtype(tensor.dtype)


@keras.saving.register_keras_serializable(package="keras_masking")
class DropToken(keras.layers.Layer):
    """Drops a random share of tokens during training; identity at inference.

    The MAE view of masking: dropping tokens is dropout that also shortens
    the sequence, and it needs no correction at inference. The kept tokens
    keep their original positions (absolute embeddings were added before
    dropping; rotary and relative schemes read the returned position ids).

    Per example, real unprotected tokens are dropped at ``rate`` (stochastic
    rounding, by `keras_masking.ops.select_tokens`; one is kept when the
    slots have room for it); padding is dropped before real tokens;
    unselectable tokens ([CLS], [SEP]) and protected positions are never
    dropped. The random scores that choose the tokens are
    float32 under every dtype policy, so mixed precision keeps the same
    tokens as float32.

    * ``mode="gather"`` (fast): returns the kept tokens in their original
      order, in ``keep_length = L - floor(rate * L)`` slots rounded up to a
      multiple of ``slot_multiple`` and to at least the number of
      ``protected_positions`` (static, so a step compiles once; spare slots
      are masked), with their padding mask, original position ids, their
      original indices and the full-length keep mask (to restore outputs).
      When the protected tokens fill the slots, the row keeps just them.
      A row whose protected tokens alone outnumber the slots (more than a
      share ``1 - rate`` of the sequence, counting ``unselectable_token_ids``)
      cannot be gathered: an eager call raises a ValueError; a compiled step,
      which cannot raise, returns NaN hidden states for that row so that the
      loss shows it (its ``keep_mask`` then marks only the tokens gathered).
    * ``mode="attention"`` (full length, for token-level tasks): returns the
      sequence unchanged and an additive ``attention_bias`` ``(batch, 1, 1,
      sequence)`` that hides the dropped tokens' keys from every query, the
      same set in every layer (the same tokens as gather mode drops).

    Args:
        rate: float in [0, 1), the share of droppable tokens to drop (numpy
            scalars accepted).
        unselectable_token_ids: list or tuple of ids never dropped (e.g.
            ``(101, 102)``; formerly ``protected_token_ids``).
        protected_positions: list or tuple of positions never dropped (e.g.
            ``(0,)``).
        mode: ``"gather"`` or ``"attention"``.
        seed: int >= 0 or None.
        slot_multiple: int >= 1. Gather mode rounds the kept slots up to a
            multiple of it (8 by default: on CPU, 464 slots run about 8%
            faster than 461 under XLA). 1 keeps exactly ``L - floor(rate L)``.
        **kwargs: base `keras.layers.Layer` arguments (``name``, ``dtype``,
            ``trainable``).

    Call arguments:
        hidden: float ``(batch, sequence, dim)``, embeddings after positions.
        padding_mask: 0/1 or bool ``(batch, sequence)``.
        token_ids: int ``(batch, sequence)``; needed for
            ``unselectable_token_ids``.
        position_ids: int ``(batch or 1, sequence)`` (or ``(batch or 1,
            sequence, 2)`` for 2D rotary positions), or None (``0..L-1``).
        training: bool. Identity when False.

    Returns:
        A dict with ``hidden``, ``padding_mask``, ``position_ids``,
        ``keep_mask`` (full length: False where a token was dropped; all
        True at inference, padding included), and ``kept_indices`` (gather
        mode) or ``attention_bias`` (attention mode).

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
        unselectable_token_ids = pop_renamed_argument(
            kwargs, "protected_token_ids", "unselectable_token_ids", unselectable_token_ids
        )
        rate = check_drop_rate(rate)
        unselectable_token_ids = check_int_list(
            "unselectable_token_ids", unselectable_token_ids, minimum=0
        )
        protected_positions = check_int_list("protected_positions", protected_positions, minimum=0)
        mode = check_choice("mode", mode, MODES)
        seed = check_seed("seed", seed)
        slot_multiple = check_int("slot_multiple", slot_multiple, minimum=1)
        super().__init__(**kwargs)
        self.rate = rate
        self.slot_multiple = slot_multiple
        self.unselectable_token_ids = unselectable_token_ids
        self.protected_positions = protected_positions
        self.mode = mode
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    @property
    def protected_token_ids(self):
        """Deprecated name of ``unselectable_token_ids``."""
        return self.unselectable_token_ids

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

    def _protected(self, token_ids, real):
        length = ops.shape(real)[1]
        protected = ops.zeros_like(real)
        if self.protected_positions:
            positions = ops.arange(length, dtype="int32")[None, :]
            for position in self.protected_positions:
                protected = protected | (positions == position)
        if self.unselectable_token_ids:
            for token in self.unselectable_token_ids:
                protected = protected | (token_ids == token)
        return protected & real

    def _check_inputs(self, hidden, padding_mask, token_ids, position_ids, training):
        if len(hidden.shape) != 3:
            raise ValueError(
                "Expected hidden of shape (batch, sequence, dim). "
                f"Received: hidden with shape {tuple(hidden.shape)}."
            )
        batch_length = tuple(hidden.shape[:2])

        def matches(shape, allow_one=False):
            pairs = zip(shape, batch_length)
            return all(
                a is None or b is None or a == b or (allow_one and axis == 0 and a == 1)
                for axis, (a, b) in enumerate(pairs)
            )

        shape = tuple(padding_mask.shape)
        if len(shape) != 2 or not matches(shape):
            raise ValueError(
                f"Expected padding_mask of shape (batch, sequence) = {batch_length}, as hidden. "
                f"Received: padding_mask with shape {shape}."
            )
        if token_ids is not None:
            shape = tuple(token_ids.shape)
            if len(shape) != 2 or not matches(shape):
                raise ValueError(
                    f"Expected token_ids of shape (batch, sequence) = {batch_length}, as hidden. "
                    f"Received: token_ids with shape {shape}."
                )
            if "int" not in _dtype_kind(token_ids):
                raise ValueError(
                    f"Expected integer token_ids. Received: token_ids of dtype "
                    f"{_dtype_kind(token_ids)}."
                )
        elif self.unselectable_token_ids and training and self.rate:
            raise ValueError(
                "DropToken needs token_ids to protect unselectable_token_ids="
                f"{self.unselectable_token_ids}. Received: token_ids=None."
            )
        if position_ids is not None:
            shape = tuple(position_ids.shape)
            if len(shape) not in (2, 3) or not matches(shape[:2], allow_one=True):
                raise ValueError(
                    "Expected position_ids of shape (batch or 1, sequence) or (batch or 1, "
                    f"sequence, 2) with sequence = {batch_length[1]}. Received: position_ids "
                    f"with shape {shape}."
                )
            if "int" not in _dtype_kind(position_ids):
                raise ValueError(
                    "Expected integer position_ids. Received: position_ids of dtype "
                    f"{_dtype_kind(position_ids)}."
                )
        values = concrete_value(padding_mask)
        if values is not None and values.size and not np.isin(values, (0, 1)).all():
            bad = sorted(set(np.unique(values[~np.isin(values, (0, 1))]).tolist()))[:5]
            raise ValueError(
                f"Expected a padding_mask of 0s and 1s. Received: padding_mask with values {bad}."
            )

    def call(self, hidden, padding_mask, token_ids=None, position_ids=None, training=None):
        self._check_inputs(hidden, padding_mask, token_ids, position_ids, training)
        length = hidden.shape[1]
        batch = ops.shape(hidden)[0]
        if position_ids is None:
            position_ids = ops.arange(ops.shape(hidden)[1], dtype="int32")[None, :]
        position_ids = ops.cast(position_ids, "int32")
        position_ids = ops.broadcast_to(
            position_ids, (batch, ops.shape(hidden)[1]) + tuple(position_ids.shape[2:])
        )
        real = ops.cast(padding_mask, "bool")
        if not training or self.rate == 0.0:
            outputs = {
                "hidden": hidden,
                "padding_mask": padding_mask,
                "position_ids": position_ids,
                "keep_mask": ops.ones_like(real),
            }
            if self.mode == "gather":
                outputs["kept_indices"] = ops.broadcast_to(
                    ops.arange(ops.shape(hidden)[1], dtype="int32")[None, :],
                    ops.shape(real),
                )
            else:
                outputs["attention_bias"] = ops.zeros_like(
                    ops.cast(real, hidden.dtype)[:, None, None, :]
                )
            return outputs
        if length is None:
            raise ValueError(
                "DropToken needs a static sequence length in training. Received: hidden with "
                f"shape {tuple(hidden.shape)}."
            )
        protected = self._protected(token_ids, real)
        keep_length = self.keep_length(length)
        if self.mode == "gather":
            self._check_protected_fit(protected, length, keep_length)
        # Per-example draws: replicas of a data-parallel step draw their own
        # rows of the global batch's draws (see `batch_uniform`).
        noise = batch_uniform((batch, length), self.seed_generator)
        rounding = batch_uniform((batch,), self.seed_generator)
        keep = sample_keep_mask(real, real & ~protected, self.rate, keep_length, noise, rounding)
        if self.mode == "attention":
            dtype = keras.backend.standardize_dtype(hidden.dtype)
            bias = (1.0 - ops.cast(keep, dtype)) * large_negative(dtype)
            return {
                "hidden": hidden,
                "padding_mask": padding_mask,
                "position_ids": position_ids,
                "keep_mask": keep,
                "attention_bias": bias[:, None, None, :],
            }
        indices = kept_indices(keep, keep_length)
        # A row whose protected tokens outnumber the slots (only possible in a
        # compiled call: eager calls refused it above) keeps its first
        # keep_length tokens, and its hidden states are NaN so the loss shows it.
        gathered = ops.cumsum(ops.cast(keep, "int32"), axis=1) <= keep_length
        overflow = ops.any(keep & ~gathered, axis=1)
        keep = keep & gathered
        kept = batched_gather(hidden, indices)
        kept = ops.where(overflow[:, None, None], ops.cast(float("nan"), kept.dtype), kept)
        return {
            "hidden": kept,
            "padding_mask": ops.cast(batched_gather(keep, indices), padding_mask.dtype),
            "position_ids": batched_gather(position_ids, indices),
            "keep_mask": keep,
            "kept_indices": indices,
        }

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
        if training and self.rate and length is None:
            raise ValueError(
                "DropToken needs a static sequence length in training. Received: hidden with "
                f"shape {tuple(hidden.shape)}."
            )
        kept = length
        if training and self.mode == "gather" and self.rate and length is not None:
            kept = self.keep_length(length)
        position_tail = () if position_ids is None else tuple(position_ids.shape[2:])
        spec = {
            "hidden": keras.KerasTensor((batch, kept) + tuple(hidden.shape[2:]), hidden.dtype),
            "padding_mask": keras.KerasTensor((batch, kept), padding_mask.dtype),
            "position_ids": keras.KerasTensor((batch, kept) + position_tail, "int32"),
            "keep_mask": keras.KerasTensor((batch, length), "bool"),
        }
        if self.mode == "gather":
            spec["kept_indices"] = keras.KerasTensor((batch, kept), "int32")
        else:
            spec["attention_bias"] = keras.KerasTensor((batch, 1, 1, length), hidden.dtype)
        return spec

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "rate": self.rate,
                "unselectable_token_ids": list(self.unselectable_token_ids),
                "protected_positions": list(self.protected_positions),
                "mode": self.mode,
                "seed": self.seed,
                "slot_multiple": self.slot_multiple,
            }
        )
        return config

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
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        kept_values: ``(batch, keep_length, ...)`` outputs of the kept tokens.
        keep_mask: bool ``(batch, sequence)`` from `DropToken`.

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

    def _check_inputs(self, kept_values, keep_mask):
        values_shape, mask_shape = tuple(kept_values.shape), tuple(keep_mask.shape)
        batches = {values_shape[0] if values_shape else None, *mask_shape[:1]} - {None}
        if len(values_shape) < 2 or len(mask_shape) != 2 or len(batches) > 1:
            raise ValueError(
                "Expected kept_values (batch, keep_length, ...) and keep_mask (batch, sequence). "
                f"Received: kept_values with shape {values_shape}, keep_mask with "
                f"shape {mask_shape}."
            )
        values = concrete_value(keep_mask)
        if values is not None and values.size and values_shape[1] is not None:
            most = int(values.astype(bool).sum(axis=1).max())
            if most > values_shape[1]:
                raise ValueError(
                    f"Expected the keep_mask of the gather that produced kept_values. Received: "
                    f"a keep_mask row that keeps {most} tokens, kept_values with "
                    f"{values_shape[1]} slots."
                )

    def call(self, kept_values, keep_mask):
        self._check_inputs(kept_values, keep_mask)
        return restore_full_length(kept_values, keep_mask)

    def compute_output_spec(self, kept_values, keep_mask):
        self._check_inputs(kept_values, keep_mask)
        shape = (kept_values.shape[0], keep_mask.shape[1]) + tuple(kept_values.shape[2:])
        return keras.KerasTensor(shape, kept_values.dtype)
