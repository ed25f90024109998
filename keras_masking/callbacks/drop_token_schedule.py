"""A drop-rate schedule for DropToken layers (random-LTD's kept-length ramp)."""

import keras

from keras_masking.layers.drop_token import DropToken
from keras_masking.ops.token_dropping import check_drop_rate
from keras_masking.utils.arguments import check_int
from keras_masking.utils.layer_walk import walk_layers


class DropTokenRateSchedule(keras.callbacks.Callback):
    """Changes the rate of every `DropToken` in the model during `fit`.

    The rate goes linearly from ``initial_rate`` to ``final_rate`` over
    ``ramp_steps`` optimizer steps, then stays. Steps are the optimizer's
    (``model.optimizer.iterations``), so a model that already trained
    resumes the ramp where it stands; with ``steps_per_execution > 1`` the
    rate changes between executions only, and under
    ``gradient_accumulation_steps=k`` a step is ``k`` batches. DeepSpeed's
    random-LTD is ``initial_rate=0.5, final_rate=0``; a warm-up of dropping
    is ``initial_rate=0, final_rate=0.15``.

    Each new rate compiles the training step once (gather mode has a static
    kept length per rate), so the ramp is quantised to ``levels`` rates.

    Args:
        final_rate: float in [0, 1) (numpy scalars accepted).
        ramp_steps: int >= 1, optimizer steps from the initial to the final
            rate.
        initial_rate: float in [0, 1).
        levels: int >= 2, number of distinct rates used on the ramp.

    Attributes:
        step: optimizer steps done (updated during `fit`).
        history: list of ``(step, rate)`` at each change.

    Example:

    ```python
    model.fit(data, callbacks=[keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=10_000)])
    ```
    """

    def __init__(self, final_rate, ramp_steps, initial_rate=0.0, levels=4):
        final_rate = check_drop_rate(final_rate, "final_rate")
        initial_rate = check_drop_rate(initial_rate, "initial_rate")
        ramp_steps = check_int("ramp_steps", ramp_steps, minimum=1)
        levels = check_int("levels", levels, minimum=2)
        super().__init__()
        self.final_rate = final_rate
        self.initial_rate = initial_rate
        self.ramp_steps = ramp_steps
        self.levels = levels
        self.step = 0
        self.history = []

    def rate_at(self, step):
        """The quantised rate after ``step`` (int >= 0) training steps, a float.

        ``initial + (final - initial) * round(min(step / ramp_steps, 1) *
        (levels - 1)) / (levels - 1)``.

        Example:

        >>> DropTokenRateSchedule(0.0, ramp_steps=4, initial_rate=0.5, levels=3).rate_at(2)
        0.25
        """
        step = check_int("step", step, minimum=0)
        progress = min(step / self.ramp_steps, 1.0)
        level = round(progress * (self.levels - 1)) / (self.levels - 1)
        return self.initial_rate + (self.final_rate - self.initial_rate) * level

    def _apply(self):
        rate = self.rate_at(self.step)
        # A backbone with enable_drop_token holds its layer as ``drop_token``
        # (None while off); a DropToken may also be a model's own layer.
        layers, off = {}, set()
        for layer in (self.model, *walk_layers(self.model)):
            drop = layer if isinstance(layer, DropToken) else getattr(layer, "drop_token", None)
            if isinstance(drop, DropToken):
                layers[id(drop)] = drop
            if getattr(layer, "drop_token", DropToken) is None:  # a backbone's, still off
                off.add(id(getattr(layer, "token_dropping", None)))
        layers = [layer for key, layer in layers.items() if key not in off]
        if not layers:
            raise ValueError(
                "Expected a model with a DropToken layer (backbone.enable_drop_token) for "
                f"DropTokenRateSchedule. Received: a model {self.model.name!r} with none."
            )
        if all(layer.rate == rate for layer in layers) and self.history:
            return
        for layer in layers:
            layer.set_rate(rate)
        self._retrace()
        self.history.append((self.step, rate))

    def _retrace(self):
        """Rebuilds the training step so that its next trace reads the new rate."""
        model = self.model
        if keras.config.backend() != "jax":
            model.make_train_function(force=True)
            return
        # `jax.jit` caches its traces by function, and a bound `train_step` is
        # the same function at every call: the old rate would be reused. A new
        # function object gets a new trace.
        previous = vars(model).get("train_step")
        step = previous or type(model).train_step.__get__(model)
        model.train_step = lambda state, data: step(state, data)
        try:
            model.make_train_function(force=True)
        finally:
            del model.train_step
            if previous is not None:
                model.train_step = previous

    def _read_optimizer_steps(self):
        """Sets ``step`` from the optimizer's iteration count, when there is one.

        Called where the variables hold the training state (JAX syncs them
        at each epoch's end): exact, with no per-step synchronisation. Under
        ``gradient_accumulation_steps=k`` an optimizer step takes ``k``
        batches: the batches are counted, as Keras' optimizer counts them.
        """
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            self._per_step, self._batches = 1, self.step
            return
        self._per_step = optimizer.gradient_accumulation_steps or 1
        # Keras' batch counter (``iterations`` is it divided by k); the
        # accumulation's phase is in no public attribute.
        batches = getattr(optimizer, "_iterations", None)
        if batches is None or self._per_step == 1:
            batches = optimizer.iterations * self._per_step
        self._batches = int(keras.ops.convert_to_numpy(batches))
        self.step = self._batches // self._per_step

    def on_train_begin(self, logs=None):
        self._read_optimizer_steps()
        self._apply()

    def on_epoch_begin(self, epoch, logs=None):
        self._read_optimizer_steps()

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch
        self._apply()

    def on_train_batch_end(self, batch, logs=None):
        # `fit` calls this once per execution with the index of its last
        # batch: an execution runs ``batch - begin + 1`` batches (an
        # execution cut short by the end of the data runs fewer; the epoch's
        # end reads the exact count back from the optimizer).
        begin = getattr(self, "_begin", batch)
        self._batches += max(1, batch - begin + 1)
        self.step = self._batches // self._per_step

    def on_epoch_end(self, epoch, logs=None):
        self._read_optimizer_steps()
