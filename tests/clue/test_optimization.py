"""The fine-tuning optimizer: AdamW with linear warmup and decay, counted in updates."""

import keras
import numpy as np
import pytest

from keras_masking.clue import WarmupLinearDecay
from keras_masking.clue import fine_tuning_optimizer


class _KernelSteps(keras.callbacks.Callback):
    """The change of the one Dense kernel at every batch of `fit`."""

    def on_train_begin(self, logs=None):
        self.kernels = [np.array(self.model.layers[0].kernel.numpy())]

    def on_train_batch_end(self, batch, logs=None):
        self.kernels.append(np.array(self.model.layers[0].kernel.numpy()))

    def steps(self):
        return [float(np.abs(b - a).max()) for a, b in zip(self.kernels, self.kernels[1:])]


@pytest.mark.parametrize("accumulation, warmup", [(1, 0.0), (3, 0.0), (3, 2 / 6), (4, 0.5)])
def test_the_schedule_warms_up_then_decays_linearly(accumulation, warmup):
    schedule = WarmupLinearDecay(1.0, total_steps=10, warmup_steps=4)
    values = [float(schedule(step)) for step in range(12)]
    expected = [0, 0.25, 0.5, 0.75, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0.0, 0.0]
    np.testing.assert_allclose(values, expected, atol=1e-6)
    # Under `fit` with gradient accumulation the schedule counts updates, not
    # batches: a constant gradient makes Adam move every weight by exactly the
    # update's rate, so each update's step is its rate.
    updates, peak = 6, 1e-2
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(
        optimizer=fine_tuning_optimizer(
            peak, updates, warmup_proportion=warmup, weight_decay=0.0, accumulation=accumulation
        ),
        loss=lambda y_true, y_pred: keras.ops.mean(y_pred),
        jit_compile=True,
    )
    steps = _KernelSteps()
    batches = updates * accumulation
    x, y = np.ones((batches * 2, 2), "float32"), np.zeros((batches * 2, 1), "float32")
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[steps])
    rates = WarmupLinearDecay(peak, updates, int(warmup * updates))
    expected = [0.0] * batches
    for update in range(updates):
        expected[(update + 1) * accumulation - 1] = float(rates(update))
    np.testing.assert_allclose(steps.steps(), expected, rtol=1e-4, atol=1e-9)
    moved = [step > 0 for step in steps.steps()[accumulation - 1 :: accumulation]]
    assert moved == [warmup == 0.0] + [True] * (updates - 1)  # BERT's warmup starts at 0
    assert int(model.optimizer.iterations) == updates
    assert (
        WarmupLinearDecay.from_config(schedule.get_config()).get_config() == schedule.get_config()
    )
    with pytest.raises(ValueError, match="warmup_steps smaller than total_steps"):
        WarmupLinearDecay(1.0, total_steps=4, warmup_steps=4)


@pytest.mark.parametrize("proportion, steps", [(0.57, 57), (0.29, 29), (0.125, 12), (0.1, 10)])
def test_the_warmup_is_the_proportion_of_the_updates(proportion, steps):
    # 0.57 * 100 is 56.99999999999999 in floats: one warmup step was missing.
    optimizer = fine_tuning_optimizer(1e-3, total_steps=100, warmup_proportion=proportion)
    assert optimizer.get_config()["learning_rate"]["config"]["warmup_steps"] == steps


def test_weight_decay_skips_biases_and_layer_norm():
    layer_norm = keras.layers.LayerNormalization()
    dense = keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((2,)), dense, layer_norm])
    for variable in model.trainable_variables:
        variable.assign(np.ones(variable.shape, "float32"))
    optimizer = fine_tuning_optimizer(0.5, total_steps=10, warmup_proportion=0.0, weight_decay=0.1)
    zero = [np.zeros(v.shape, "float32") for v in model.trainable_variables]
    optimizer.apply_gradients(zip(zero, model.trainable_variables))
    # With zero gradients, AdamW only decays: w <- w - lr * wd * w = 1 - 0.5 * 0.1.
    assert np.allclose(dense.kernel.numpy(), 0.95)
    for variable in (dense.bias, layer_norm.gamma, layer_norm.beta):
        assert np.allclose(variable.numpy(), 1.0), variable.path
