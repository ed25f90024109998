"""Optimizers that give the same update on every backend and engine."""

from keras_masking.optimizers.adamw import AdamW
from keras_masking.optimizers.dense_gradients import densify_gradients
