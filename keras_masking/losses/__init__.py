"""Losses: ExLM's DAG alignment loss."""

from keras_masking.losses.dag_loss import DAGLoss
from keras_masking.losses.dag_loss import dag_alignment_feasible
from keras_masking.losses.dag_loss import dag_alignment_posterior
from keras_masking.losses.dag_loss import dag_loss
