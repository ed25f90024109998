"""The demo's fine-tuning runs: every method through `keras_masking.clue.finetune`."""

import pathlib
import statistics
import time

import keras
import numpy as np


class StepTimer(keras.callbacks.Callback):
    """Wall time of each training step; the first step (it compiles) is left out.

    Example:
    ```python
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    timer = StepTimer()
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=2, callbacks=[timer], verbose=0)
    assert len(timer.durations) == 3  # 4 steps, the first left out
    timer.median()  # seconds per step
    ```
    """

    def __init__(self):
        super().__init__()
        self.durations, self._started, self._steps = [], None, 0

    def on_train_batch_begin(self, batch, logs=None):
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps > 1:
            self.durations.append(time.perf_counter() - self._started)

    def median(self):
        """The median step time in seconds (None before a second step)."""
        return statistics.median(self.durations) if self.durations else None


def held_out_score(task, model, data_dir, tokenizer, max_length, batch_size):
    """The CLUE score of ``model`` on the labelled ``dev`` split of ``data_dir``."""
    from keras_masking.clue import decode_predictions
    from keras_masking.clue import encode_examples
    from keras_masking.clue import predict_in_batches
    from keras_masking.clue import read_split
    from keras_masking.clue import score

    examples = read_split(data_dir, task, "dev").examples
    encoded = encode_examples(task, examples, tokenizer, max_length)
    outputs = predict_in_batches(model, encoded.features, batch_size)
    return score(task, decode_predictions(task, outputs, encoded, examples), examples)["score"]


def fine_tune(task, name, switches, learning_rate, epochs, preset, data_dir, output, *,
              batch_size, max_length, seed, jit_compile, held_out=None, tokenizer=None,
              progress=1):  # fmt: skip
    """One method's run; returns its row of figures.

    Args:
        task: ``"eprstmt"`` (reviews) or ``"cluener"`` (entities).
        name: the method's name in the table.
        switches: `finetune` method arguments.
        learning_rate: the peak rate.
        epochs: fine-tuning epochs.
        preset: the pretrained encoder's preset folder.
        data_dir: the task's data folder.
        output: the run folder.
        batch_size: examples per step.
        max_length: tokens per example.
        seed: the run's seed.
        jit_compile: compile the steps with XLA.
        held_out: a data folder whose labelled ``dev`` split is the test
            split (entities); None to use the run's ``test_public`` score.
        tokenizer: the tokenizer, with ``held_out``.
        progress: 1 for progress bars, 0 for none.

    Returns:
        A dict: the dev score at the best epoch, the test score, the
        trainable parameters, the median step time, the mean seconds of
        the epochs after the first (which compiles; None for one epoch),
        the per-epoch dev scores and losses, the methods' evidence, the
        embedding correction's record (None without it), and the encoder's
        ``num_layers`` and ``vocabulary_size`` as the run recorded them.
        The run's resume state (every variable and the optimizer's, to
        continue an unfinished run) is deleted once the run finished.

    Example (not run by the docstring tests: a whole fine-tuning run)::

        row = fine_tune("eprstmt", "plain", {}, 5e-5, 1, "e5_preset", "data", "runs/plain",
                        batch_size=16, max_length=48, seed=0, jit_compile=False)
        row["dev"], row["test"]  # accuracy (%)
    """
    from keras_masking.clue import RunConfig
    from keras_masking.clue import finetune
    from keras_masking.clue.run_folder import STATE

    timer = StepTimer()
    config = RunConfig.from_options(preset=preset, epochs=epochs, batch_size=batch_size,
                                    max_length=max_length, learning_rate=learning_rate, seed=seed,
                                    jit_compile=jit_compile, **switches)  # fmt: skip
    result = finetune(task, data_dir, output, config, verbose=progress, callbacks=[timer])
    if result.status != "finished":
        raise RuntimeError(f"{name} on {task}: {result.record['failure']}")
    # A finished run is never resumed; its resume state is as big as the
    # model and its optimizer (about 300 MB for multilingual-e5-small).
    pathlib.Path(output, STATE).unlink(missing_ok=True)
    if held_out is None:
        test = result.test_public["score"]
    else:
        test = held_out_score(task, result.model, held_out, tokenizer, max_length, 64)
    later = result.history[1:]  # the first epoch compiles
    backbone = result.record["model"]["backbone"]
    return {
        "task": task,
        "method": name,
        "seed": seed,
        "learning_rate": learning_rate,
        "epochs": epochs,
        "dev": result.best_score,
        "test": test,
        "best_epoch": result.best_epoch,
        "trainable": result.record["model"]["trainable_parameters"],
        "total": result.record["model"]["total_parameters"],
        "step_seconds": timer.median(),
        "epoch_seconds": float(np.mean([entry["seconds"] for entry in later])) if later else None,
        "curve": [entry["dev"]["score"] for entry in result.history],
        "losses": [entry["loss"] for entry in result.history],
        "evidence": [entry["methods"] for entry in result.history],
        "embedding_correction": result.record["model"].get("embedding_correction"),
        "num_layers": backbone["num_layers"],
        "vocabulary_size": backbone["vocabulary_size"],
    }
