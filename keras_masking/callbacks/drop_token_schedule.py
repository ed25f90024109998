"""A drop-rate schedule for DropToken layers (random-LTD's kept-length ramp)."""

import keras

from keras_masking.layers.drop_token import DropToken
from keras_masking.utils.layer_walk import walk_layers


class DropTokenRateSchedule(keras.callbacks.Callback):
    """Changes the rate of every `DropToken` in the model during `fit`.

    The rate goes linearly from ``initial_rate`` to ``final_rate`` over
    ``ramp_steps`` training steps, then stays. DeepSpeed's random-LTD grows
    the kept length during training (``initial_rate=0.5, final_rate=0``); a
    warm-up of dropping is ``initial_rate=0, final_rate=0.15``. A constant
    schedule is ``initial_rate == final_rate``.

    Gather mode has a static kept length per rate, so each new rate traces
    and compiles the training step once: the ramp is quantised to ``levels``
    evenly spaced rates (``levels`` compilations in all).

    Args:
        final_rate: float in [0, 1).
        ramp_steps: int >= 1, steps from the initial to the final rate.
        initial_rate: float in [0, 1).
        levels: int >= 2, number of distinct rates used on the ramp.

    Attributes:
        history: list of ``(step, rate)`` at each change.

    Example:
    ```python
    model.fit(data, callbacks=[keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=10_000)])
    ```
    """

    def __init__(self, final_rate, ramp_steps, initial_rate=0.0, levels=4):
        super().__init__()
        for name, rate in (("final_rate", final_rate), ("initial_rate", initial_rate)):
            if not 0 <= rate < 1:
                raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={rate}")
        if int(ramp_steps) < 1 or int(levels) < 2:
            raise ValueError(
                f"Need ramp_steps >= 1 and levels >= 2. Received: {ramp_steps}, {levels}"
            )
        self.final_rate = float(final_rate)
        self.initial_rate = float(initial_rate)
        self.ramp_steps = int(ramp_steps)
        self.levels = int(levels)
        self.step = 0
        self.history = []

    def rate_at(self, step):
        """The quantised rate at a training step."""
        progress = min(step / self.ramp_steps, 1.0)
        level = round(progress * (self.levels - 1)) / (self.levels - 1)
        return self.initial_rate + (self.final_rate - self.initial_rate) * level

    def _apply(self):
        rate = self.rate_at(self.step)
        layers = [layer for layer in walk_layers(self.model) if isinstance(layer, DropToken)]
        if not layers:
            raise ValueError("DropTokenRateSchedule found no DropToken layer in the model.")
        if all(layer.rate == rate for layer in layers) and self.history:
            return
        for layer in layers:
            layer.set_rate(rate)
        self.model.make_train_function(force=True)
        self.history.append((self.step, rate))

    def on_train_begin(self, logs=None):
        self._apply()

    def on_train_batch_begin(self, batch, logs=None):
        self._apply()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
