"""Tests of keras_masking.layers."""
