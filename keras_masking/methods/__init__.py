"""Method mechanisms and helpers.

Each fine-tuning method is turned on by one call on the model
(``backbone.enable_drop_token(...)``, ``classifier.enable_asa(...)``...);
this package holds what the calls do not: ASA's trainer for a user's own
head, adapter files, parameter reports and the MLM
embedding correction.
"""

from keras_masking.methods.adapters import AdapterSet
from keras_masking.methods.adapters import load_adapter
from keras_masking.methods.adapters import read_adapter
from keras_masking.methods.adapters import save_adapter
from keras_masking.methods.asa import ASATrainer
from keras_masking.methods.asa import asa_training_pass
from keras_masking.methods.asa import masked_fraction
from keras_masking.methods.asa_plots import masked_fractions_by_layer
from keras_masking.methods.asa_plots import plot_masked_fractions
from keras_masking.methods.fl_tuning import add_ffn_parameter_count
from keras_masking.methods.fl_tuning import model_backbone
from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings
from keras_masking.methods.mlm_embedding_correction import correction_record
from keras_masking.methods.mlm_embedding_correction import masker_vocabulary_size
from keras_masking.methods.mlm_embedding_correction import masking_configuration
from keras_masking.methods.mlm_embedding_correction import undo_mlm_embedding_correction
from keras_masking.methods.mlm_model_average import mlm_model_average
from keras_masking.methods.mlm_model_average import sample_mlm_maskings
from keras_masking.methods.parameter_report import ParameterReport
from keras_masking.methods.parameter_report import parameter_report
from keras_masking.methods.token_embedding_lookup import find_token_embedding
