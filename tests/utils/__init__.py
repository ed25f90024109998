"""Tests of keras_masking.utils."""
