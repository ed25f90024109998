"""A finished CLUE run's chosen model, exported for serving (``keras-masking export``)."""

import importlib.util
import json
import logging
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
    export through TensorFlow, `export_onnx`). With ``format="transformers"`` it is the
    fine-tuned encoder as a Hugging Face folder with the run's tokenizer
    files (`keras_masking.models.export_to_transformers` on the task model's
    backbone; the CLUE task head stays in the SavedModel and ONNX exports).
    Each way ``run.json`` is copied beside it as ``keras_masking_run.json``,
    and ``README.md`` is its model card (the model, the methods, the data,
    the settings and the run's scores).

    Args:
        run_folder: a finished ``keras-masking clue`` / `finetune` run folder;
            its model source and data folder (and its ``test_file``, if it
            had one) must still be where the record says.
        output: a new (or empty) folder to write.
        verbose: bool, whether Keras prints the signature.
        format: ``"saved_model"``, ``"onnx"`` (``pip install
            "keras-masking[export]"``) or ``"transformers"``
            (needs ``safetensors``, in the same extra).

    Returns:
        The output folder, a `pathlib.Path`.

    Raises:
        FileNotFoundError: no run record in ``run_folder``.
        ValueError: the run has not finished, ``output`` holds files, an
            unknown format, or a missing export package (each before the run
            is rebuilt).

    Example:
    ```python
    keras_masking.clue.export_run("runs/tnews_fl", "served/tnews")
    # import tensorflow as tf; tf.saved_model.load("served/tnews").serve(features)
    ```
    """
    from keras_masking.clue.run_config import RunConfig
    from keras_masking.clue.runner import finetune
    from keras_masking.models.model_card import model_card
    from keras_masking.models.model_card import write_model_card
    from keras_masking.models.serving_copy import serving_task_model
    from keras_masking.utils.files import write_atomically

    run_folder, output = pathlib.Path(run_folder), pathlib.Path(output)
    _check_format(format)
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
    sources = [run_folder, arguments["preset"]] if arguments.get("preset") else [run_folder]
    _check_output(output, sources)
    if format == "transformers" and arguments.get("exlm_k"):
        raise ValueError(
            f"The run {os.fspath(run_folder)} fine-tuned through ExLM's expanding encoder "
            f"(exlm_k={arguments['exlm_k']}), whose 2D rotary positions no transformers model "
            "has. Expected format='saved_model' or 'onnx' for it."
        )
    config = RunConfig.from_record(arguments)
    # The rebuild's own lines (the splits read, the methods' parameter counts,
    # "finished earlier") are not the export's: warnings and errors only.
    package_logger = logging.getLogger("keras_masking")
    level = package_logger.level
    package_logger.setLevel(max(logging.WARNING, package_logger.getEffectiveLevel()))
    try:
        result = finetune(arguments["task"], arguments["data_dir"], run_folder, config, verbose=0)
    finally:
        package_logger.setLevel(level)
    model = serving_task_model(result.model)
    staging = output.with_name(f".{output.name}.partial")
    # The encoder: the backbone, or the one ExLM's expanding encoder runs.
    encoders = [getattr(layer, "backbone", layer) for layer in model.layers]
    backbones = [layer for layer in encoders if hasattr(layer, "serving_copy")]
    if format == "transformers":
        # The tokenizer's model_max_length: the run's length, as the other exports cut.
        length = arguments.get("max_length")
        _write(backbones[0], staging, format, verbose, tokenizer=result.tokenizer, length=length)
    else:
        _write(model, staging, format, verbose)
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


def export_preset(preset, output, format="saved_model", labels=None, verbose=False):  # noqa: A002
    """Exports a preset folder for serving: a SavedModel, ONNX or a Hugging Face folder.

    A classifier preset (``TransformerTextClassifier.save_to_preset``: its
    ``task.json``) exports as `TransformerTextClassifier.export` does (a
    SavedModel that takes strings when it has a preprocessor) or as a
    ``BertForSequenceClassification`` folder; a backbone preset (this
    package's, keras-hub's, a Hugging Face BERT folder) exports its serving
    copy (token ids in) or a ``BertModel`` / ``RoFormerModel`` folder with
    the preset's tokenizer files. Methods are merged or left out as in every
    export (`serving_copy`).

    Args:
        preset: a preset folder.
        output: a new (or empty) folder to write.
        format: ``"saved_model"``, ``"onnx"`` (``pip install
            "keras-masking[export]"``) or ``"transformers"``.
        labels: a classifier's class names for a Hugging Face folder
            (``id2label``), or None.
        verbose: bool, whether Keras prints the signature.

    Returns:
        The output folder, a `pathlib.Path`.

    Raises:
        ValueError / FileNotFoundError: an unknown format, a missing export package, a
            folder that is not a preset, ``labels`` for a backbone, or an
            ``output`` that holds files (each before anything is written).

    Example:
    ```python
    keras_masking.clue.export_preset("my_classifier", "for_torch", format="transformers")
    ```
    """
    from keras_masking.clue.model_source import ModelSource
    from keras_masking.models import TransformerTextClassifier

    preset, output = pathlib.Path(preset), pathlib.Path(output)
    _check_format(format)
    if not (preset / "config.json").is_file():
        raise FileNotFoundError(
            f"No preset config {os.fspath(preset / 'config.json')}: expected a preset folder "
            "(save_to_preset, keras-masking convert) or a finished clue run's folder."
        )
    _check_output(output, [preset])
    classifier = (preset / "task.json").is_file()
    if labels is not None and not (classifier and format == "transformers"):
        raise ValueError("labels= names a classifier's classes in a Hugging Face folder only.")
    staging = output.with_name(f".{output.name}.partial")
    if classifier:
        model = TransformerTextClassifier.from_preset(os.fspath(preset))
        if format == "transformers":
            _write(model, staging, format, verbose, labels=labels)
        elif format == "saved_model" and model.preprocessor is not None:
            model.export(os.fspath(staging), verbose=verbose)  # strings in
        else:
            _write(model.serving_copy(), staging, format, verbose)
    else:
        backbone, tokenizer = ModelSource(preset=os.fspath(preset)).load()
        model = backbone if format == "transformers" else backbone.serving_copy()
        _write(model, staging, format, verbose, tokenizer=tokenizer)
    if output.exists():
        output.rmdir()
    staging.rename(output)
    return output


def _check_format(format):  # noqa: A002 (Keras' name)
    """Refuses a format this process cannot write, before anything is loaded."""
    if format not in FORMATS:
        raise ValueError(f"Expected format in {list(FORMATS)}. Received: format={format!r}.")
    needed = {"onnx": ("onnx", "tf2onnx"), "transformers": ("safetensors",)}.get(format, ())
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f'{format} export needs {", ".join(missing)}: pip install "keras-masking[export]".'
        )


def _check_output(output, sources):
    """Refuses an output that is not a new or empty folder, or that lies in a
    source folder (a run's folder or its preset, whose files the run's record
    hashes: a folder written there would stop the run from resuming)."""
    from keras_masking.utils.files import is_same_or_inside

    for source in sources:
        if is_same_or_inside(output, source):
            raise ValueError(
                f"The output {os.fspath(output)} is the folder {os.fspath(source)} that the "
                "export reads, or inside it. Expected a folder outside it."
            )
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(f"Expected a new or empty folder for output. Received: {output}.")


def _write(model, staging, format, verbose, tokenizer=None, labels=None, length=None):  # noqa: A002
    """Writes ``model`` (a serving model; for transformers, a backbone or classifier)."""
    import keras

    from keras_masking.models.onnx_export import export_onnx
    from keras_masking.models.text_classifier_export import token_id_signature
    from keras_masking.models.transformers_export import export_to_transformers

    if staging.exists():
        shutil.rmtree(staging)  # what an interrupted export left
    if format == "transformers":
        export_to_transformers(
            model, staging, tokenizer=tokenizer, labels=labels, sequence_length=length
        )
    elif format == "onnx":
        staging.mkdir(parents=True)
        export_onnx(model, staging / "model.onnx", verbose=verbose)
    else:
        signature, kwargs = token_id_signature(model)
        if keras.config.backend() != "jax":
            kwargs = {}  # TensorFlow traces the model's own symbolic shapes
        keras.Model.export(model, os.fspath(staging), verbose=verbose, input_signature=signature,
                           **kwargs)  # fmt: skip
