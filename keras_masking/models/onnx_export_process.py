"""The TensorFlow process of `export_onnx` on JAX: a saved model in, an ONNX file out.

``KERAS_BACKEND=tensorflow python -m keras_masking.models.onnx_export_process
MODEL.keras OUT.onnx`` loads the model (the package's layers registered) and
writes it with `export_onnx_here`.
"""

import sys


def main(argv):
    """Loads ``argv[0]`` (a ``.keras`` file) and writes it to ``argv[1]`` as ONNX."""
    import keras

    import keras_masking.models  # noqa: F401 (registers the package's layers and models)
    from keras_masking.models.onnx_export import export_onnx_here

    if keras.config.backend() != "tensorflow":
        raise SystemExit("Run with KERAS_BACKEND=tensorflow: ONNX is written through tf2onnx.")
    export_onnx_here(keras.saving.load_model(argv[0]), argv[1], verbose=True)


if __name__ == "__main__":
    main(sys.argv[1:])
