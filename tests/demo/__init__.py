"""Tests of keras_masking.demo."""
