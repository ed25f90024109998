"""Tests of keras_masking.losses."""
