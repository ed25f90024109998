"""Tests of keras_masking.models."""
