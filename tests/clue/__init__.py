"""Tests of keras_masking.clue."""
