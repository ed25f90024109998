"""Keras callbacks."""

from keras_masking.callbacks.mlm_embedding_correction import MLMEmbeddingCorrection
