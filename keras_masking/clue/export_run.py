"""A finished CLUE run's chosen model, exported for serving (``keras-masking export``)."""

import json
import os
import pathlib


def export_run(run_folder, output, verbose=False):
    """Exports a finished `finetune` run's best weights as a SavedModel of token ids.

    The run is rebuilt from its ``run.json`` as `finetune` resumes a
    finished run (the same model source, data folder and methods; the best
    epoch's weights), then its serving copy is exported: DropToken and ASA
    off, FL-tuning and LoRA merged (`keras_masking.models.serving_task_model`).
    The SavedModel's ``serve`` signature takes the task model's inputs, int32
    ``(batch, sequence)`` ids as `keras_masking.clue.encode_examples` makes
    them, and returns its outputs; ``run.json`` is copied beside it as
    ``keras_masking_run.json``, and ``README.md`` is its model card (the
    model, the methods, the data, the settings and the run's scores).

    Args:
        run_folder: a finished ``keras-masking clue`` / `finetune` run folder;
            its model source and data folder must still be where the record
            says.
        output: a new (or empty) folder to write.
        verbose: bool, whether Keras prints the signature.

    Returns:
        The output folder, a `pathlib.Path`.

    Raises:
        FileNotFoundError: no run record in ``run_folder``.
        ValueError: the run has not finished, or ``output`` holds files.

    Example:
    ```python
    keras_masking.clue.export_run("runs/tnews_fl", "served/tnews")
    # import tensorflow as tf; tf.saved_model.load("served/tnews").serve(features)
    ```
    """
    import keras

    from keras_masking.clue.run_config import RunConfig
    from keras_masking.clue.runner import finetune
    from keras_masking.models.model_card import model_card
    from keras_masking.models.model_card import write_model_card
    from keras_masking.models.serving_copy import serving_task_model
    from keras_masking.models.text_classifier_export import token_id_signature
    from keras_masking.utils.files import write_atomically

    run_folder, output = pathlib.Path(run_folder), pathlib.Path(output)
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
    backbones = [layer for layer in model.layers if hasattr(layer, "serving_copy")]
    if backbones:
        card = model_card(
            backbones[0], f"{arguments.get('task')} ({arguments.get('benchmark')})",
            head=f"the CLUE {arguments.get('task')} task model; inputs: {sorted(model.input)}",
            training=training,
        )  # fmt: skip
        write_model_card(staging, card)
    if output.exists():
        output.rmdir()
    staging.rename(output)
    return output
