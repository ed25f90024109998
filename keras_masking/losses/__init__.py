"""Losses: ExLM's DAG alignment loss, ASA's divergences, the CLUE heads' losses."""

from keras_masking.losses.asa_divergence import ASA_TASKS
from keras_masking.losses.asa_divergence import asa_divergence
from keras_masking.losses.asa_divergence import batch_softmax_divergence
from keras_masking.losses.asa_divergence import span_position_divergence
from keras_masking.losses.asa_divergence import symmetric_kl_divergence
from keras_masking.losses.dag_loss import DAGLoss
from keras_masking.losses.dag_loss import dag_alignment_feasible
from keras_masking.losses.dag_loss import dag_alignment_posterior
from keras_masking.losses.dag_loss import dag_loss
from keras_masking.losses.multilabel_crossentropy import MultilabelCategoricalCrossentropy
from keras_masking.losses.multilabel_crossentropy import multilabel_categorical_crossentropy
from keras_masking.losses.span_crossentropy import SpanCrossentropy
