"""The fine-tuning optimizer: AdamW, linear warmup then linear decay, no weight
decay on biases and LayerNorm.

This is Hugging Face's recipe (``transformers``' AdamW, with bias correction,
and ``get_linear_schedule_with_warmup``) without its gradient clipping, and
with Keras' epsilon (1e-7). Google's BERT ``optimization.py`` differs: no bias
correction (its first updates are about 3 times as large), epsilon 1e-6,
clipping by global norm 1.0, and a decay of ``1 - t / total_steps`` (ours
decays from the peak after warmup: 11% higher through the decay for a 10%
warmup). Pass ``global_clipnorm`` to `keras_masking.optimizers.AdamW` for
clipping in your own runs.
"""

import keras
from keras import ops

from keras_masking.optimizers import AdamW
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

# Variable names that AdamW does not decay (every bias, LayerNorm's gamma and beta).
NO_DECAY_NAMES = ("bias", "gamma", "beta")


@keras.saving.register_keras_serializable(package="keras_masking")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``learning_rate``, then linear decay to 0.

    ``lr(t) = learning_rate * t / warmup_steps`` for ``t < warmup_steps``,
    then ``learning_rate * (total_steps - t) / (total_steps - warmup_steps)``,
    and 0 from ``total_steps`` on (``t`` counts optimizer steps from 0).

    Args:
        learning_rate: float > 0, the peak rate.
        total_steps: int >= 1, the optimizer steps of the whole run.
        warmup_steps: int in ``[0, total_steps)``.

    Example:
    >>> schedule = WarmupLinearDecay(1e-3, total_steps=10, warmup_steps=2)
    >>> [round(float(schedule(step)), 6) for step in (0, 1, 2, 6, 10)]
    [0.0, 0.0005, 0.001, 0.0005, 0.0]
    """

    def __init__(self, learning_rate, total_steps, warmup_steps=0):
        self.learning_rate = check_float(
            "learning_rate", learning_rate, minimum=0.0, open_minimum=True
        )
        self.total_steps = check_int("total_steps", total_steps, minimum=1)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)
        if self.warmup_steps >= self.total_steps:
            raise ValueError(
                "Expected warmup_steps smaller than total_steps. Received: "
                f"warmup_steps={self.warmup_steps}, total_steps={self.total_steps}."
            )

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = float(max(self.warmup_steps, 1))
        rising = step / warmup
        falling = (self.total_steps - step) / float(self.total_steps - self.warmup_steps)
        factor = ops.where(step < self.warmup_steps, rising, falling)
        return self.learning_rate * ops.clip(factor, 0.0, 1.0)

    def get_config(self):
        return {
            "learning_rate": self.learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }


def fine_tuning_optimizer(
    learning_rate,
    total_steps,
    warmup_proportion=0.1,
    weight_decay=0.01,
    accumulation=1,
):
    """AdamW with `WarmupLinearDecay`; no weight decay on biases and LayerNorm.

    Args:
        learning_rate: float > 0, the peak rate.
        total_steps: int >= 1, optimizer steps of the run (batches divided by
            ``accumulation``).
        warmup_proportion: float in [0, 1), the share of steps that warm up.
        weight_decay: float >= 0.
        accumulation: int >= 1, batches whose gradients are averaged into
            one step (Keras' ``gradient_accumulation_steps``).

    Returns:
        A `keras_masking.optimizers.AdamW`, whose schedule counts updates (not
        batches) under accumulation.

    Example:
    >>> optimizer = fine_tuning_optimizer(2e-5, total_steps=100)
    >>> round(float(optimizer.learning_rate), 8)  # step 0 of the warmup
    0.0
    """
    warmup_proportion = check_float(
        "warmup_proportion", warmup_proportion, 0.0, 1.0, open_maximum=True
    )
    weight_decay = check_float("weight_decay", weight_decay, minimum=0.0)
    accumulation = check_int("accumulation", accumulation, minimum=1)
    total_steps = check_int("total_steps", total_steps, minimum=1)
    # round(..., 9): 0.57 * 100 is 56.99999999999999 in floats, and 57 warmup steps.
    warmup_steps = min(int(round(warmup_proportion * total_steps, 9)), total_steps - 1)
    schedule = WarmupLinearDecay(learning_rate, total_steps, warmup_steps)
    optimizer = AdamW(
        learning_rate=schedule,
        weight_decay=weight_decay,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
    )
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY_NAMES))
    return optimizer
