"""Keras callbacks."""

from keras_masking.callbacks.drop_token_schedule import DropTokenRateSchedule
from keras_masking.callbacks.mlm_embedding_correction import MLMEmbeddingCorrection
