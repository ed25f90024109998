"""Tests of keras_masking.distribution."""
