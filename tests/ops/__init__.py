"""Tests of keras_masking.ops."""
