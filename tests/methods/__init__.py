"""Tests of keras_masking.methods."""
