"""Tests of keras_masking.optimizers."""
