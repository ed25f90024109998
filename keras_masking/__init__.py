"""keras_masking: masking methods for BERT-family encoders in Keras 3.

Subpackages:
    models: `TransformerBackbone` (BERT, RoBERTa, RoFormer, NEZHA), the tied
        MLM task, Google TF checkpoint and keras-hub conversion.
    layers: the attention, FFN, embedding and head layers with their hooks.
    ops: position-encoding and mask maths as plain functions.
"""

from keras_masking import layers
from keras_masking import models
from keras_masking import ops
from keras_masking.version import __version__
