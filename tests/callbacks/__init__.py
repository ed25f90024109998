"""Tests of keras_masking.callbacks."""
