"""A fine-tuning run's folder, every file written under a temporary name and
renamed when complete (`keras_masking.utils.files`):

* ``run.json``: the run record (arguments, versions, data files with their
  hashes and counts, metrics per epoch, times, the methods' evidence, the
  status and, for a failed run, why);
* ``resume_state.npz``: every model, trainer and optimizer variable after
  the last finished epoch (random-seed states included), so a resumed run
  continues exactly where it stopped;
* ``best_weights.npz``: the trainable variables at the best dev score (for
  FL-tuning, P-tuning v2 and LoRA: the adapter and the head only, LoRA's
  with the biases of the layers it adapts);
* ``dev_predictions/epoch_<n>.json``: each finished epoch's dev predictions,
  so an epoch can be chosen afterwards on part of dev
  (`keras_masking.clue.compare`); with ``dev_noise``, the noised dev's in
  ``dev_noised_predictions/``;
* the submission file, named as CLUE expects.
"""

import json
import os
import pathlib
import warnings
import zipfile

import numpy as np

from keras_masking.utils.files import write_atomically
from keras_masking.utils.files import write_json_atomically

RECORD = "run.json"
STATE = "resume_state.npz"
BEST = "best_weights.npz"
DEV_PREDICTIONS = "dev_predictions"


class RunFolder:
    """The files of one fine-tuning run.

    Args:
        path: the run's output folder (created when the run starts).

    Example:
    >>> folder = RunFolder("runs/tnews")
    >>> folder.read_record({"task": "tnews", "epochs": 3}) is None  # a new run
    True
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.record_path = self.path / RECORD
        self.state_path = self.path / STATE
        self.best_path = self.path / BEST

    def dev_predictions_path(self, epoch, split="dev"):
        """The file of epoch ``epoch``'s predictions on ``split`` (epochs count from 1).

        ``"dev"``'s are in ``dev_predictions/``; another split's (the noised
        dev, ``"dev_noised"``) in ``<split>_predictions/``.
        """
        folder = DEV_PREDICTIONS if split == "dev" else f"{split}_predictions"
        return self.path / folder / f"epoch_{int(epoch)}.json"

    def read_record(self, arguments):
        """The record of an earlier run with the same arguments, or None.

        Args:
            arguments: the new run's arguments (a JSON-ready dict).

        Returns:
            None when the folder is new or empty; else the earlier record.

        Raises:
            ValueError: the folder holds other files but no run record, the
                record is corrupt, or the earlier run had other arguments
                (each named with both values).
        """
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(
                f"The output folder {os.fspath(self.path)!r} is a file; expected a folder."
            )
        if not self.path.is_dir() or not any(self.path.iterdir()):
            return None
        if not self.record_path.is_file():
            raise ValueError(
                f"The output folder {os.fspath(self.path)!r} holds files but no {RECORD}: it is "
                "not a fine-tuning run's folder. Choose a new or empty folder."
            )
        try:
            record = json.loads(self.record_path.read_text(encoding="utf-8"))
            earlier = record["arguments"]
            if not isinstance(earlier, dict):
                raise TypeError("arguments is not an object")
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{os.fspath(self.record_path)}: a corrupt run record ({error}); the run cannot "
                "resume from it. Remove the folder to start again."
            ) from error
        changed = {
            name: (earlier.get(name), arguments.get(name))
            for name in {**earlier, **arguments}
            if name not in earlier or name not in arguments or earlier[name] != arguments[name]
        }
        if changed:
            listed = "; ".join(
                f"{name}: {old!r} there, {new!r} now"
                for name, (old, new) in sorted(changed.items())
            )
            raise ValueError(
                f"{os.fspath(self.path)!r} holds a run with other arguments ({listed}). Use "
                "another output folder, or the same arguments to resume it."
            )
        return record

    def write_record(self, record):
        """Writes ``run.json`` (atomically)."""
        self.path.mkdir(parents=True, exist_ok=True)
        return write_json_atomically(self.record_path, record)

    def save_state(self, variables, epoch):
        """Saves every variable's value after ``epoch`` (atomically)."""
        return _save_variables(self.state_path, variables, {"epoch": int(epoch)})

    def load_state(self, variables):
        """Assigns the saved state to ``variables``; returns its epoch.

        Raises:
            ValueError: a missing, unreadable or mismatched state file (never
                a silent fresh start).
        """
        meta = _load_variables(self.state_path, variables, "resume state")
        return int(meta["epoch"])

    def save_best(self, variables, epoch, score):
        """Saves the best epoch's trainable variables (atomically)."""
        meta = {"epoch": int(epoch), "score": float(score)}
        return _save_variables(self.best_path, variables, meta)

    def load_best(self, variables):
        """Assigns the best weights to ``variables``; returns their metadata."""
        return _load_variables(self.best_path, variables, "best weights")

    def save_dev_predictions(self, epoch, predictions, split="dev"):
        """Writes epoch ``epoch``'s dev predictions (atomically).

        Args:
            epoch: the epoch, from 1.
            predictions: dict id -> prediction, as `decode_predictions`
                returns it.
            split: ``"dev"``, or the scored copy of dev they are of
                (``"dev_noised"``).

        Returns:
            The file's path.
        """
        path = self.dev_predictions_path(epoch, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        document = {"epoch": int(epoch), "predictions": [[k, v] for k, v in predictions.items()]}
        return write_atomically(
            path,
            lambda file: json.dump(document, file, ensure_ascii=False, default=_json_scalar),
        )

    def read_dev_predictions(self, epoch, split="dev"):
        """Epoch ``epoch``'s predictions on ``split``, as `save_dev_predictions` got them.

        Ids keep their type (int or str); an entity prediction's
        ``(type, start, end)`` entries are tuples again.

        Raises:
            ValueError: the file is missing (a run of a version that did not
                keep them) or corrupt.
        """
        path = self.dev_predictions_path(epoch, split)
        if not path.is_file():
            raise ValueError(
                f"{os.fspath(path)} is missing: the run kept no dev predictions for epoch "
                f"{int(epoch)} (a run made before finetune kept them?). Remove the run folder "
                "to run it again."
            )
        try:
            pairs = json.loads(path.read_text(encoding="utf-8"))["predictions"]
            return {key: _tuples(value) for key, value in pairs}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{os.fspath(path)}: corrupt dev predictions ({error}). Remove the run folder to "
                "run it again."
            ) from error

    def check_resumable(self, record):
        """Refuses a folder whose record lists epochs its files lack.

        Args:
            record: the folder's run record (`read_record`).

        Raises:
            ValueError: the resume state or the best weights are missing.
        """
        finished = len(record.get("epochs") or [])
        missing = []
        if record.get("status") != "finished" and finished and not self.state_path.is_file():
            missing.append(STATE)
        if record.get("best") and not self.best_path.is_file():
            missing.append(BEST)
        if missing:
            raise ValueError(
                f"{os.fspath(self.path)!r}: its {RECORD} records {finished} finished epoch(s) "
                f"but {' and '.join(missing)} is missing, so the run can neither resume nor use "
                "its best weights (it would silently start again from epoch 0). Restore the "
                "file, or remove the folder (or use another output folder) to start again."
            )


def __getattr__(name):
    if name == "write_json":  # the old name, for one release
        warnings.warn(
            "keras_masking.clue.run_folder.write_json is deprecated; use "
            "keras_masking.utils.files.write_json_atomically.",
            DeprecationWarning,
            stacklevel=2,
        )
        return write_json_atomically
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _json_scalar(value):
    """NumPy scalars as Python numbers (``json.dump``'s ``default``)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _tuples(value):
    """A list of lists (entities) as a list of tuples; anything else as it is."""
    if isinstance(value, list):
        return [tuple(item) if isinstance(item, list) else item for item in value]
    return value


def variable_names(variables):
    """Unique names for a list of variables (their paths, numbered if repeated)."""
    names, seen = [], {}
    for variable in variables:
        name = getattr(variable, "path", None) or variable.name
        count = seen.get(name, 0)
        seen[name] = count + 1
        names.append(name if count == 0 else f"{name}#{count}")
    return names


def _save_variables(path, variables, meta):
    path.parent.mkdir(parents=True, exist_ok=True)
    names = variable_names(variables)
    arrays = {f"value_{index}": np.array(v.numpy()) for index, v in enumerate(variables)}
    manifest = {"meta": meta, "names": names, "shapes": [list(a.shape) for a in arrays.values()]}
    arrays["manifest"] = np.array(json.dumps(manifest))
    return write_atomically(path, lambda file: np.savez(file, **arrays), mode="wb")


def _load_variables(path, variables, what):
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"{os.fspath(path)}: the {what} file is missing; the run cannot resume.")
    try:
        with np.load(path, allow_pickle=False) as data:
            manifest = json.loads(str(data["manifest"]))
            values = [data[f"value_{index}"] for index in range(len(manifest["names"]))]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(
            f"{os.fspath(path)}: a corrupt {what} file ({type(error).__name__}: {error}); remove "
            "the run folder to start again."
        ) from error
    # Variables match by position (their order is fixed by how the model is
    # built); names may carry a different counter in another process.
    names = variable_names(variables)
    if len(values) != len(variables):
        raise ValueError(
            f"{os.fspath(path)}: the {what} holds {len(values)} variables, this model "
            f"{len(variables)}; was the model built with other arguments?"
        )
    for variable, value, name, saved in zip(variables, values, names, manifest["names"]):
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"{os.fspath(path)}: {saved} has shape {tuple(value.shape)} in the {what}; "
                f"the model's {name} has {tuple(variable.shape)}."
            )
    for variable, value in zip(variables, values):
        variable.assign(value)
    return manifest["meta"]
