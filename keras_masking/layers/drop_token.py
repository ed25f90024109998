"""DropToken: drop random tokens in training, keeping the others' positions."""

import keras
from keras import ops

from keras_masking.ops.attention_masks import large_negative
from keras_masking.ops.token_dropping import batched_gather
from keras_masking.ops.token_dropping import kept_indices
from keras_masking.ops.token_dropping import restore_full_length
from keras_masking.ops.token_dropping import sample_keep_mask
from keras_masking.ops.token_dropping import static_keep_length
from keras_masking.utils.eager_checks import concrete_value

MODES = ("gather", "attention")


@keras.saving.register_keras_serializable(package="keras_masking")
class DropToken(keras.layers.Layer):
    """Drops a random share of tokens during training; identity at inference.

    The MAE view of masking: dropping tokens is dropout that also shortens
    the sequence, and it needs no correction at inference. The kept tokens
    keep their original positions (absolute embeddings were added before
    dropping; rotary and relative schemes read the returned position ids).

    Per example, real unprotected tokens are dropped at ``rate`` (stochastic
    rounding, at least one kept); padding is dropped before real tokens;
    protected tokens ([CLS], [SEP], or positions you name) are never dropped.

    * ``mode="gather"`` (fast): returns the kept tokens in their original
      order, in ``keep_length = L - floor(rate * L)`` slots rounded up to a
      multiple of ``slot_multiple`` (static, so a step compiles once; spare
      slots are masked), with their padding mask, original position ids, their
      original indices and the full-length keep mask (to restore outputs).
    * ``mode="attention"`` (full length, for token-level tasks): returns the
      sequence unchanged and an additive ``attention_bias`` ``(batch, 1, 1,
      sequence)`` that hides the dropped tokens' keys from every query, the
      same set in every layer.

    Args:
        rate: float in [0, 1), the share of droppable tokens to drop.
        protected_token_ids: ids never dropped (e.g. ``(101, 102)``).
        protected_positions: positions never dropped (e.g. ``(0,)``).
        mode: ``"gather"`` or ``"attention"``.
        seed: int or None.
        slot_multiple: int >= 1. Gather mode rounds the kept slots up to a
            multiple of it (8 by default: on CPU, 464 slots run about 8%
            faster than 461 under XLA). 1 keeps exactly ``L - floor(rate L)``.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        hidden: float ``(batch, sequence, dim)``, embeddings after positions.
        padding_mask: 0/1 ``(batch, sequence)``.
        token_ids: int ``(batch, sequence)``; needed for
            ``protected_token_ids``.
        position_ids: int ``(batch or 1, sequence)`` or None (``0..L-1``).
        training: bool. Identity when False.

    Returns:
        A dict with ``hidden``, ``padding_mask``, ``position_ids``,
        ``keep_mask`` (full length: False where a token was dropped; all
        True at inference, padding included), and ``kept_indices`` (gather
        mode) or ``attention_bias`` (attention mode).

    Example:
    >>> drop = DropToken(0.5, protected_positions=(0,))
    >>> out = drop(keras.ops.ones((2, 32, 4)), keras.ops.ones((2, 32)), training=True)
    >>> out["hidden"].shape
    (2, 16, 4)
    """

    def __init__(
        self,
        rate,
        protected_token_ids=(),
        protected_positions=(),
        mode="gather",
        seed=None,
        slot_multiple=8,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.set_rate(rate)
        if (
            isinstance(slot_multiple, bool)
            or not isinstance(slot_multiple, int)
            or slot_multiple < 1
        ):
            raise ValueError(
                f"`slot_multiple` must be a positive integer. Received: {slot_multiple!r}"
            )
        self.slot_multiple = slot_multiple
        if mode not in MODES:
            raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")
        self.protected_token_ids = tuple(int(i) for i in protected_token_ids)
        self.protected_positions = tuple(int(i) for i in protected_positions)
        self.mode = mode
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def set_rate(self, rate):
        """Changes the drop rate (takes effect at the next trace of a step).

        Args:
            rate: float in [0, 1).
        """
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f"`rate` must be a float in [0, 1). Received: rate={rate!r}")
        self.rate = float(rate)

    def keep_length(self, sequence_length):
        """Static number of slots kept in gather mode."""
        return static_keep_length(sequence_length, self.rate, self.slot_multiple)

    def _protected(self, token_ids, real):
        length = ops.shape(real)[1]
        protected = ops.zeros_like(real)
        if self.protected_positions:
            positions = ops.arange(length, dtype="int32")[None, :]
            for position in self.protected_positions:
                protected = protected | (positions == position)
        if self.protected_token_ids:
            if token_ids is None:
                raise ValueError("DropToken needs `token_ids` to protect protected_token_ids.")
            for token in self.protected_token_ids:
                protected = protected | (token_ids == token)
        return protected & real

    def call(self, hidden, padding_mask, token_ids=None, position_ids=None, training=None):
        length = hidden.shape[1]
        if padding_mask.shape[:2] != hidden.shape[:2] and None not in padding_mask.shape[:2]:
            raise ValueError(
                f"padding_mask shape {tuple(padding_mask.shape)} does not match hidden "
                f"{tuple(hidden.shape)} on (batch, sequence)."
            )
        batch = ops.shape(hidden)[0]
        if position_ids is None:
            position_ids = ops.arange(length, dtype="int32")[None, :]
        position_ids = ops.broadcast_to(ops.cast(position_ids, "int32"), (batch, length))
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
                    ops.arange(length, dtype="int32")[None, :], (batch, length)
                )
            else:
                outputs["attention_bias"] = ops.zeros((batch, 1, 1, length), hidden.dtype)
            return outputs
        if length is None:
            raise ValueError("DropToken needs a static sequence length in training.")
        protected = self._protected(token_ids, real)
        self._check_protected_fit(protected, length)
        noise = keras.random.uniform((batch, length), seed=self.seed_generator)
        rounding = keras.random.uniform((batch,), seed=self.seed_generator)
        keep_length = self.keep_length(length)
        keep = sample_keep_mask(real, real & ~protected, self.rate, keep_length, noise, rounding)
        if self.mode == "attention":
            bias = (1.0 - ops.cast(keep, hidden.dtype)) * large_negative(hidden.dtype)
            return {
                "hidden": hidden,
                "padding_mask": padding_mask,
                "position_ids": position_ids,
                "keep_mask": keep,
                "attention_bias": bias[:, None, None, :],
            }
        indices = kept_indices(keep, keep_length)
        kept_mask = batched_gather(keep, indices)
        return {
            "hidden": batched_gather(hidden, indices),
            "padding_mask": ops.cast(kept_mask, padding_mask.dtype),
            "position_ids": batched_gather(position_ids, indices),
            "keep_mask": keep,
            "kept_indices": indices,
        }

    def _check_protected_fit(self, protected, length):
        values = concrete_value(protected)
        if values is None:
            return
        most = int(values.sum(axis=1).max()) if values.size else 0
        if self.mode == "gather" and most > self.keep_length(length):
            raise ValueError(
                f"An example has {most} protected tokens but only "
                f"{self.keep_length(length)} of {length} slots are kept at rate={self.rate}."
            )

    def compute_output_spec(
        self, hidden, padding_mask, token_ids=None, position_ids=None, training=None
    ):
        batch, length = hidden.shape[0], hidden.shape[1]
        kept = length
        if training and self.mode == "gather" and self.rate and length is not None:
            kept = self.keep_length(length)
        spec = {
            "hidden": keras.KerasTensor((batch, kept) + tuple(hidden.shape[2:]), hidden.dtype),
            "padding_mask": keras.KerasTensor((batch, kept), padding_mask.dtype),
            "position_ids": keras.KerasTensor((batch, kept), "int32"),
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
                "protected_token_ids": list(self.protected_token_ids),
                "protected_positions": list(self.protected_positions),
                "mode": self.mode,
                "seed": self.seed,
                "slot_multiple": self.slot_multiple,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_masking")
class RestoreDroppedTokens(keras.layers.Layer):
    """Puts gather-mode outputs back at their original positions.

    Call arguments:
        kept_values: ``(batch, keep_length, dim)`` outputs of the kept tokens.
        keep_mask: bool ``(batch, sequence)`` from `DropToken`.

    Returns:
        ``(batch, sequence, dim)`` with zeros where tokens were dropped (the
        identity at inference, where ``keep_mask`` is all True).
    """

    def call(self, kept_values, keep_mask):
        return restore_full_length(kept_values, keep_mask)

    def compute_output_spec(self, kept_values, keep_mask):
        shape = (kept_values.shape[0], keep_mask.shape[1]) + tuple(kept_values.shape[2:])
        return keras.KerasTensor(shape, kept_values.dtype)
