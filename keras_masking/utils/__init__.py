"""Small helpers at the backend edge."""

from keras_masking.utils.training_state import build_optimizer
from keras_masking.utils.training_state import outermost_caller
from keras_masking.utils.training_state import refresh_training
from keras_masking.utils.training_state import restart_loaded_lora
from keras_masking.utils.training_state import unbuilt_optimizer_copy
from keras_masking.utils.training_state import weights_kept_on_error
from keras_masking.utils.xla_cpu import disable_xla_cpu_fusion_emitters
from keras_masking.utils.xla_cpu import xla_cpu_fusion_emitters_disabled
