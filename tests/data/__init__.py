"""Tests of keras_masking.data."""
