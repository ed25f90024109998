"""keras_masking: masking methods for BERT-family encoders in Keras 3.

Subpackages:
    models: `TransformerBackbone` (BERT, RoBERTa, RoFormer, NEZHA), the tied
        MLM task, Google TF checkpoint and keras-hub conversion.
    layers: the attention, FFN, embedding and head layers with their hooks.
    ops: position-encoding, mask and embedding-correction maths as plain
        functions.
    methods: the "apply to a model" functions (`correct_mlm_embeddings`,
        `with_drop_token`, `with_asa`, `fl_tune`, ...).
    callbacks: `MLMEmbeddingCorrection` for `fit`.
    clue: CLUE / FewCLUE readers, task models, metrics, `finetune` runs and
        submission files.
    losses: ExLM's `dag_loss` / `DAGLoss`, ASA's divergences.
    utils: backend-edge helpers (`disable_xla_cpu_fusion_emitters`).
"""

from keras_masking import callbacks
from keras_masking import clue
from keras_masking import data
from keras_masking import distribution
from keras_masking import layers
from keras_masking import losses
from keras_masking import methods
from keras_masking import models
from keras_masking import ops
from keras_masking import optimizers
from keras_masking import utils
from keras_masking.methods import correct_mlm_embeddings
from keras_masking.methods import fl_tune
from keras_masking.methods import merge_fl
from keras_masking.methods import mlm_model_average
from keras_masking.methods import prefix_tune
from keras_masking.methods import undo_mlm_embedding_correction
from keras_masking.methods import unmerge_fl
from keras_masking.methods import with_asa
from keras_masking.methods import with_drop_token
from keras_masking.version import __version__
