"""keras_masking: masking methods for BERT-family encoders in Keras 3.

Each fine-tuning method is one call on the model:
``backbone.enable_drop_token(rate)``, ``enable_asa(tau)``,
``enable_fl_tuning(units)``, ``enable_prefix_tuning(length)``,
``enable_lora(rank)``, on a `TransformerBackbone` or a
`TransformerTextClassifier`.

Subpackages:
    models: `TransformerBackbone` (BERT, RoBERTa, RoFormer, NEZHA), the text
        classifier, the tied MLM task, ExLM's pretrainer, Google TF checkpoint
        and keras-hub conversion.
    layers: the attention, FFN, embedding and head layers with their hooks.
    ops: position-encoding, mask and embedding-correction maths as plain
        functions.
    methods: the embedding correction (`correct_mlm_embeddings`), model
        averaging, adapters, ASA's trainer for a custom head.
    callbacks: `MLMEmbeddingCorrection` for `fit`.
    losses: ExLM's `dag_loss` / `DAGLoss`, ASA's divergences.
    utils: backend-edge helpers (`disable_xla_cpu_fusion_emitters`).

The applications built on the library load only when asked for:
``keras_masking.clue`` (CLUE / FewCLUE readers, task models, metrics,
`finetune` runs and submission files), ``keras_masking.demo`` (the main
job) and ``keras_masking.cli`` (the ``keras-masking`` command).
"""

import importlib
import os
import sys


def _quiet_command_line():
    """True in the ``keras-masking`` command (or ``python -m keras_masking.cli``)
    run without ``--verbose``: there the backend's C++ lines (start-up lines such
    as "Could not find cuda drivers", and run-time ones such as "failed call to
    cuInit") are hidden. Library users see whatever their own settings show."""
    argv = getattr(sys, "orig_argv", sys.argv)  # the interpreter's own command line
    script = sys.argv[0] if sys.argv else ""
    as_module = any(a == "-m" and b == "keras_masking.cli" for a, b in zip(argv, argv[1:]))
    is_cli = (
        as_module
        or os.path.basename(script) == "keras-masking"
        or script.endswith(os.path.join("keras_masking", "cli.py"))
    )
    return is_cli and "--verbose" not in argv


if _quiet_command_line():
    # TensorFlow reads its C++ log level once, when it loads; 3 hides its ERROR
    # lines too ("failed call to cuInit" on a machine without a GPU). The
    # user's own setting is kept.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _stderr, _null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(_null, 2)  # the C++ start-up lines bypass Python's sys.stderr
    try:
        import keras  # noqa: F401  (loads the backend, quietly)
        import tensorflow  # noqa: F401  (the readers' and tf.data's, on any backend)
    finally:
        os.dup2(_stderr, 2)
        os.close(_stderr)
        os.close(_null)

from keras_masking import callbacks
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
from keras_masking.methods import mlm_model_average
from keras_masking.methods import undo_mlm_embedding_correction
from keras_masking.version import __version__


# The applications: imported on first use (`keras_masking.clue.finetune`), so
# that `import keras_masking` loads the library alone.
_APPLICATIONS = ("clue", "demo", "cli")


def __getattr__(name):
    if name in _APPLICATIONS:
        return importlib.import_module(f"keras_masking.{name}")
    raise AttributeError(f"module 'keras_masking' has no attribute {name!r}")
