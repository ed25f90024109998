"""`export_onnx`: a model of token ids as an ONNX file, from either backend.

Keras writes ONNX from TensorFlow through tf2onnx; its JAX path (jax2onnx)
does not convert these models. On JAX the model is saved as a ``.keras``
file and a TensorFlow-backend Python process (the same interpreter, with
``KERAS_BACKEND=tensorflow``) loads it and writes the ONNX file: the weights
are the same, the graph is TensorFlow's. The exact GELU traces with ``erf``
(`keras_masking.layers.activations.gelu_as_erf`): ONNX has no op for
TensorFlow's fused one.

The second process is ``python -m keras_masking.models.onnx_export_process
MODEL.keras OUT.onnx``.
"""

import os
import subprocess
import sys
import tempfile

import keras

from keras_masking.utils.layer_walk import walk_layers


def export_onnx(model, filepath, verbose=False):
    """Writes ``model`` (a dict of ``(batch, sequence)`` ids in) as an ONNX file.

    Args:
        model: a Keras model whose inputs are token-id tensors (a serving
            copy: `serving_copy`, `serving_task_model`).
        filepath: the ``.onnx`` file to write.
        verbose: bool, whether Keras prints the signature.

    Raises:
        ValueError: onnx or tf2onnx missing (``pip install
            "keras-masking[export]"``), a layer computing in 16 bits (a
            mixed-precision model: ONNX Runtime refuses tf2onnx's file), or the
            TensorFlow process failed (with the end of its error output).

    Example:
    ```python
    serving = keras_masking.models.serving_task_model(classifier)  # methods off or merged
    keras_masking.models.onnx_export.export_onnx(serving, "classifier.onnx")
    ```
    """
    import importlib.util

    missing = [name for name in ("onnx", "tf2onnx") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f'ONNX export needs {", ".join(missing)}: pip install "keras-masking[export]".'
        )
    mixed = sorted({layer.dtype_policy.name for layer in (model, *walk_layers(model))
                    if layer.dtype_policy.compute_dtype in ("float16", "bfloat16")})  # fmt: skip
    if mixed:
        raise ValueError(
            f"The model computes under {', '.join(mixed)}: tf2onnx writes such a graph with "
            "16-bit and float32 inputs to one op, which ONNX Runtime refuses to load. Export "
            "the SavedModel (format='tf_saved_model'), or build the model under float32, load "
            "these weights (model.get_weights()) and export that."
        )
    filepath = os.fspath(filepath)
    if keras.config.backend() == "tensorflow":
        export_onnx_here(model, filepath, verbose)
        return
    with tempfile.TemporaryDirectory() as folder:
        saved = os.path.join(folder, "model.keras")
        model.save(saved)
        done = subprocess.run(
            [sys.executable, "-m", "keras_masking.models.onnx_export_process", saved, filepath],
            env=dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2"),
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise ValueError(
            "The TensorFlow process that writes the ONNX file failed:\n" + done.stderr[-2000:]
        )
    if verbose:
        print(done.stdout, end="")


def export_onnx_here(model, filepath, verbose=False):
    """`export_onnx` in this process (TensorFlow backend): Keras' tf2onnx export."""
    from keras_masking.layers.activations import gelu_as_erf
    from keras_masking.models.text_classifier_export import token_id_signature

    signature = token_id_signature(model)[0]  # a never-called copy has no traced inputs
    with gelu_as_erf():
        keras.Model.export(model, filepath, format="onnx", verbose=verbose,
                           input_signature=signature)  # fmt: skip
