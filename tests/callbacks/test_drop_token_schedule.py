"""DropTokenRateSchedule: the drop-rate ramp in fit, and its bad input."""

import re

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.callbacks import DropTokenRateSchedule
from tests.drop_token_cases import SCHEDULE_CASES
from tests.drop_token_cases import _kept_count_model
from tests.drop_token_cases import _raises


def test_rate_schedule_changes_rates_in_fit():
    """A one-layer model whose loss is the square of the kept-token count: each
    compiled step's loss shows the rate that step used."""
    length = 12
    model, drop = _kept_count_model(length)
    schedule = keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=6, levels=3
    )
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((drop.rate, model.train_function))

    x = [np.ones((4, length, 1), "float32"), np.ones((4, length), "int32")]
    history = model.fit(
        x, np.zeros((4, 1)), batch_size=4, epochs=8, verbose=0, callbacks=[schedule, Spy()]
    )

    def formula(step):  # initial + (final - initial) * quantised progress
        return 0.5 - 0.5 * round(min(step / 6, 1.0) * 2) / 2

    rates = [formula(step) for step in range(8)]
    assert rates == [0.5, 0.5, 0.25, 0.25, 0.25, 0.0, 0.0, 0.0]
    assert [rate for rate, _ in seen] == rates
    assert schedule.history == [(0, 0.5), (2, 0.25), (5, 0.0)]
    # Full rows of 12 keep 12 - 12 * rate tokens: 6, 9, then all 12.
    expected = [float(length - length * rate) ** 2 for rate in rates]
    np.testing.assert_array_equal(history.history["loss"], expected)
    assert len({id(function) for _, function in seen}) == 3  # one trace per rate
    with pytest.raises(ValueError, match="final_rate"):
        keras_masking.callbacks.DropTokenRateSchedule(final_rate=1.0, ramp_steps=5)


@pytest.mark.parametrize("steps_per_execution", [2, 3])
def test_rate_schedule_counts_optimizer_steps_with_steps_per_execution(steps_per_execution):
    """8 steps an epoch, 2 or 3 a call: the schedule counts optimizer steps, not
    executions, and each execution runs at the rate of its first step (the
    last execution of 3 is cut short at step 8)."""
    length = 12
    model, drop = _kept_count_model(length, steps_per_execution)
    schedule = keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=6, levels=3
    )
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((batch, drop.rate, float(logs["loss"])))

    x = [np.ones((8, length, 1), "float32"), np.ones((8, length), "int32")]
    model.fit(x, np.zeros((8, 1)), batch_size=1, epochs=2, verbose=0, callbacks=[schedule, Spy()])
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 16
    assert schedule.step == 16
    if steps_per_execution == 2:  # executions start at steps 0, 2, 4, 6 | 8, ...
        assert [rate for _, rate, _ in seen[:4]] == [0.5, 0.25, 0.25, 0.0]
        assert schedule.history == [(0, 0.5), (2, 0.25), (6, 0.0)]
    else:  # 0, 3, 6 (two steps) | 8, 11, 14 (two steps)
        assert [rate for _, rate, _ in seen[:3]] == [0.5, 0.25, 0.0]
        assert schedule.history == [(0, 0.5), (3, 0.25), (6, 0.0)]
    assert all(rate == 0.0 for _, rate, _ in seen[len(seen) // 2 :])
    # The first epoch's running mean loss: each step kept 12 - 12 * rate tokens.
    steps, total = 0, 0.0
    for end, rate, mean in seen[: len(seen) // 2]:
        done = min(end + 1, 8)  # the last execution of 3 runs 2 steps
        total += (done - steps) * (length - length * rate) ** 2
        steps = done
        np.testing.assert_allclose(mean, total / steps, rtol=1e-6)
    # A new schedule on the trained model continues from the optimizer's count.
    later = keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=32, levels=3
    )
    model.fit(x, np.zeros((8, 1)), batch_size=4, epochs=1, verbose=0, callbacks=[later])
    assert later.history == [(16, 0.25)] and later.step == 18


def test_rate_schedule_counts_optimizer_steps_under_gradient_accumulation():
    """Two batches an optimizer step: each batch runs at the rate of the
    optimizer steps done before it. Counting batches as steps ran the ramp
    twice as fast within an epoch and reset it at the next (0.5, 0.25, 0, 0.25,
    0: five compiles where three rates are)."""
    length = 12
    model, drop = _kept_count_model(length)
    model.compile(optimizer=keras.optimizers.SGD(0.0, gradient_accumulation_steps=2), loss="mse")
    schedule = keras_masking.callbacks.DropTokenRateSchedule(
        final_rate=0.0, initial_rate=0.5, ramp_steps=4, levels=3
    )
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(drop.rate)

    x = [np.ones((3, length, 1), "float32"), np.ones((3, length), "int32")]
    model.fit(x, np.zeros((3, 1)), batch_size=1, epochs=3, verbose=0, callbacks=[schedule, Spy()])
    # Batches 0..8 (3 an epoch: an update straddles the epochs) are steps 0,0,1,1,2,2,3,3,4.
    assert seen == [schedule.rate_at(batch // 2) for batch in range(9)]
    assert seen == [0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.0, 0.0, 0.0]
    assert schedule.history == [(0, 0.5), (2, 0.25), (3, 0.0)] and schedule.step == 4
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4


@pytest.mark.parametrize("kwargs, pattern", SCHEDULE_CASES)
def test_schedule_bad_input(kwargs, pattern):
    _raises(pattern, DropTokenRateSchedule, **{"final_rate": 0.1, "ramp_steps": 4, **kwargs})


@pytest.mark.parametrize(
    "step, pattern",
    [
        (-1, r"integer >= 0 for step\. Received: step=-1"),
        (1.5, r"Expected an integer for step\. Received: step=1\.5"),
        (True, r"Expected an integer for step\. Received: step=True"),
    ],
)
def test_schedule_rate_at_bad_input(step, pattern):
    _raises(pattern, DropTokenRateSchedule(0.1, 4).rate_at, step)


def test_schedule_on_a_model_without_drop_token_fails_before_training():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs), name="plain")
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x, y = np.ones((4, 3), "float32"), np.ones((4, 1), "float32")
    weights = [np.array(w) for w in model.get_weights()]
    schedule = DropTokenRateSchedule(0.1, 4)
    with pytest.raises(ValueError, match=re.escape("Received: a model 'plain' with none")):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[schedule])
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    assert schedule.history == [] and schedule.step == 0
