"""Encoders the methods attach to, and their checkpoint I/O."""

from keras_masking.models.exlm_encoder import ExLMEncoder
from keras_masking.models.exlm_encoder import plain_position_ids
from keras_masking.models.exlm_pretrainer import ExLMPretrainer
from keras_masking.models.keras_hub_conversion import to_keras_hub
from keras_masking.models.tf_checkpoint import CheckpointLoadReport
from keras_masking.models.tf_checkpoint import from_tf_checkpoint
from keras_masking.models.tf_checkpoint import load_tf_checkpoint_weights
from keras_masking.models.tf_checkpoint import read_tf_checkpoint
from keras_masking.models.tf_checkpoint import save_tf_checkpoint
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.models.transformer_backbone import from_keras_hub
from keras_masking.models.transformer_masked_lm import TransformerMaskedLM
from keras_masking.models.transformer_text_classifier import TransformerTextClassifier
from keras_masking.models.transformer_text_classifier_preprocessor import (
    TransformerTextClassifierPreprocessor,
)
from keras_masking.models.transformer_tokenizer import TransformerTokenizer
