"""Method mechanisms and helpers.

Each fine-tuning method is turned on by one call on the model
(``backbone.enable_drop_token(...)``, ``classifier.enable_asa(...)``...);
the functions `with_drop_token`, `with_asa`, `fl_tune`, `prefix_tune`,
`merge_fl` and `unmerge_fl` are deprecated spellings kept for one release.
"""

from keras_masking.methods.adapters import AdapterSet
from keras_masking.methods.adapters import load_adapter
from keras_masking.methods.adapters import read_adapter
from keras_masking.methods.adapters import save_adapter
from keras_masking.methods.asa import ASATrainer
from keras_masking.methods.asa import masked_fraction
from keras_masking.methods.asa import with_asa
from keras_masking.methods.asa_plots import masked_fractions_by_layer
from keras_masking.methods.asa_plots import plot_masked_fractions
from keras_masking.methods.drop_token import DropTokenEncoder
from keras_masking.methods.drop_token import with_drop_token
from keras_masking.methods.fl_tuning import add_ffn_parameter_count
from keras_masking.methods.fl_tuning import fl_tune
from keras_masking.methods.fl_tuning import merge_fl
from keras_masking.methods.fl_tuning import model_backbone
from keras_masking.methods.fl_tuning import prefix_tune
from keras_masking.methods.fl_tuning import unmerge_fl
from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings
from keras_masking.methods.mlm_embedding_correction import correction_record
from keras_masking.methods.mlm_embedding_correction import masking_configuration
from keras_masking.methods.mlm_embedding_correction import undo_mlm_embedding_correction
from keras_masking.methods.mlm_model_average import mlm_model_average
from keras_masking.methods.mlm_model_average import sample_mlm_maskings
from keras_masking.methods.parameter_report import ParameterReport
from keras_masking.methods.parameter_report import parameter_report
from keras_masking.methods.token_embedding_lookup import find_token_embedding


def __getattr__(name):
    # The deprecated record name warns where it is used, not when the package loads.
    if name == "MLMEmbeddingCorrection":
        from keras_masking.methods import mlm_embedding_correction

        return getattr(mlm_embedding_correction, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
