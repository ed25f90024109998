"""A finished CLUE run's chosen model, exported for serving (``keras-masking export``)."""

import importlib.util
import json
import os
import pathlib
import shutil

#: The formats `export_run` writes.
FORMATS = ("saved_model", "onnx", "transformers")


def export_run(run_folder, output, verbose=False, format="saved_model"):  # noqa: A002 (Keras' name)
    """Exports a finished `finetune` run's best weights (SavedModel, ONNX, Hugging Face folder).

    The run is rebuilt from its ``run.json`` as `finetune` resumes a
    finished run (the same model source, data folder and methods; the best
    epoch's weights), then its serving copy is exported: DropToken and ASA
    off, FL-tuning and LoRA merged (`keras_masking.models.serving_task_model`).
    The SavedModel's ``serve`` signature takes the task model's inputs, int32
    ``(batch, sequence)`` ids as `keras_masking.clue.encode_examples` makes
    them, and returns its outputs; with ``format="onnx"`` the folder holds
    ``model.onnx`` with the same inputs and outputs instead (Keras' ONNX
    export, TensorFlow backend). With ``format="transformers"`` it is the
    fine-tuned encoder as a Hugging Face folder with the run's tokenizer
    files (`keras_masking.models.export_to_transformers` on the task model's
    backbone; the CLUE task head stays in the SavedModel and ONNX exports).
    Each way ``run.json`` is copied beside it as ``keras_masking_run.json``,
    and ``README.md`` is its model card (the model, the methods, the data,
    the settings and the run's scores).

    Args:
        run_folder: a finished ``keras-masking clue`` / `finetune` run folder;
            its model source and data folder must still be where the record
            says.
        output: a new (or empty) folder to write.
        verbose: bool, whether Keras prints the signature.
        format: ``"saved_model"``, ``"onnx"`` (needs the TensorFlow backend
            and ``pip install "keras-masking[export]"``) or ``"transformers"``
            (needs ``safetensors``, in the same extra).

    Returns:
        The output folder, a `pathlib.Path`.

    Raises:
        FileNotFoundError: no run record in ``run_folder``.
        ValueError: the run has not finished, ``output`` holds files, an
            unknown format, or ONNX on the JAX backend (each before the run
            is rebuilt).

    Example:
    ```python
    keras_masking.clue.export_run("runs/tnews_fl", "served/tnews")
    # import tensorflow as tf; tf.saved_model.load("served/tnews").serve(features)
    ```
    """
    import keras

    from keras_masking.clue.run_config import RunConfig
    from keras_masking.clue.runner import finetune
    from keras_masking.layers.activations import gelu_as_erf
    from keras_masking.models.model_card import model_card
    from keras_masking.models.model_card import write_model_card
    from keras_masking.models.serving_copy import serving_task_model
    from keras_masking.models.text_classifier_export import token_id_signature
    from keras_masking.models.transformers_export import export_to_transformers
    from keras_masking.utils.files import write_atomically

    run_folder, output = pathlib.Path(run_folder), pathlib.Path(output)
    if format not in FORMATS:
        raise ValueError(f"Expected format in {list(FORMATS)}. Received: format={format!r}.")
    if format == "onnx":
        _check_onnx_export()
    if format == "transformers" and importlib.util.find_spec("safetensors") is None:
        raise ValueError(
            'A Hugging Face folder needs safetensors: pip install "keras-masking[export]".'
        )
    record_path = run_folder / "run.json"
    if not record_path.is_file():
        raise FileNotFoundError(
            f"No run record {os.fspath(record_path)}: expected the folder of a finished "
            "keras-masking clue run."
        )
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        arguments = dict(record["arguments"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{os.fspath(record_path)}: a corrupt run record ({error}).") from None
    if record.get("status") != "finished":
        raise ValueError(
            f"The run {os.fspath(run_folder)} has not finished (status "
            f"{record.get('status')!r}): finish it first (run the same keras-masking clue "
            "command) and export it then."
        )
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(f"Expected a new or empty folder for output. Received: {output}.")
    config = RunConfig.from_record(arguments)
    result = finetune(arguments["task"], arguments["data_dir"], run_folder, config, verbose=0)
    model = serving_task_model(result.model)
    kwargs = {}
    signature = None
    if keras.config.backend() == "jax":
        signature, kwargs = token_id_signature(model)
    staging = output.with_name(f".{output.name}.partial")
    backbones = [layer for layer in model.layers if hasattr(layer, "serving_copy")]
    if format == "transformers":
        if staging.exists():
            shutil.rmtree(staging)
        export_to_transformers(backbones[0], staging, tokenizer=result.tokenizer)
    elif format == "onnx":
        staging.mkdir(parents=True, exist_ok=True)
        with gelu_as_erf():  # ONNX has no op for TensorFlow's fused exact GELU
            model.export(os.fspath(staging / "model.onnx"), format="onnx", verbose=verbose,
                         input_signature=token_id_signature(model)[0])  # fmt: skip
    else:
        model.export(os.fspath(staging), verbose=verbose, input_signature=signature, **kwargs)
    write_atomically(
        staging / "keras_masking_run.json", lambda file: file.write(json.dumps(record, indent=1))
    )
    training = {
        "task": arguments.get("task"),
        "benchmark": arguments.get("benchmark"),
        "data_dir": arguments.get("data_dir"),
        "model": arguments.get("preset") or arguments.get("checkpoint"),
        "methods": {name: arguments[name] for name in record.get("methods") or ()},
        "best": record.get("best"),
        "test_public": record.get("test_public"),
        "settings": config.training_record(),
    }
    if backbones:
        card = model_card(
            backbones[0], f"{arguments.get('task')} ({arguments.get('benchmark')})",
            head=(
                f"the fine-tuned encoder of a CLUE {arguments.get('task')} run (its task head is "
                "in the SavedModel and ONNX exports)" if format == "transformers" else
                f"the CLUE {arguments.get('task')} task model; inputs: {sorted(model.input)}"
            ),
            training=training,
        )  # fmt: skip
        write_model_card(staging, card)
    if output.exists():
        output.rmdir()
    staging.rename(output)
    return output


def _check_onnx_export():
    """Refuses ONNX where Keras cannot write it, before a run is rebuilt."""
    import keras

    if keras.config.backend() != "tensorflow":
        raise ValueError(
            "ONNX export runs on the TensorFlow backend (tf2onnx): run the command with "
            "KERAS_BACKEND=tensorflow (the run's weights load there unchanged)."
        )
    missing = [name for name in ("onnx", "tf2onnx") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f'ONNX export needs {", ".join(missing)}: pip install "keras-masking[export]".'
        )
