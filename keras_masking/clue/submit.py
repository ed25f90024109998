"""`keras-masking clue submit`: check every run's submission file, then zip them."""

import datetime
import json
import os
import pathlib

from keras_masking.clue.readers import read_split
from keras_masking.clue.run_folder import RECORD
from keras_masking.clue.submission import build_submission_zip
from keras_masking.clue.submission import check_submission
from keras_masking.clue.submission import default_zip_name


def _find_runs(runs_dir):
    """The sorted ``(folder, record)`` of the run folders under ``runs_dir`` (itself included)."""
    runs_dir = pathlib.Path(runs_dir)
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"RUNS_DIR {os.fspath(runs_dir)!r}: no such folder.")
    runs = []
    for path in sorted(runs_dir.rglob(RECORD)):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            record["arguments"]["task"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{os.fspath(path)}: not a readable run record ({error}).") from error
        runs.append((path.parent, record))
    if not runs:
        raise FileNotFoundError(
            f"RUNS_DIR {os.fspath(runs_dir)!r} holds no run folder (no {RECORD} under it)."
        )
    return runs


def check_date(date):
    """Returns ``date`` if it is a real calendar date written ``YYYYMMDD``.

    Args:
        date: a string such as ``"20261201"``.

    Returns:
        ``date``.

    Raises:
        ValueError: not eight digits, or no such day (``"20261340"``).

    Example:
    >>> check_date("20240229")
    '20240229'
    """
    if not isinstance(date, str) or len(date) != 8 or not (date.isascii() and date.isdigit()):
        raise ValueError(f"Expected date as YYYYMMDD. Received: date={date!r}.")
    try:
        datetime.datetime.strptime(date, "%Y%m%d")
    except ValueError:
        raise ValueError(
            f"Expected date as YYYYMMDD, a day of the calendar. Received: date={date!r}."
        ) from None
    return date


def submit(runs_dir, team="team", date=None, output=None):
    """Checks each finished run's submission file (`check_submission`) and zips them.

    Files are checked against the run's test split while its data folder is
    there. Nothing is written unless every file passes.

    Args:
        runs_dir: the folder holding the run folders.
        team: the team name in the zip's name.
        date: ``YYYYMMDD``, a real day (default: today).
        output: the zip's path (default: ``runs_dir/`` and `default_zip_name`).

    Returns:
        ``(zip_path, files)``.

    Raises:
        ValueError: a problem in any file (all listed), unfinished runs, two
            runs of one task, or runs of both CLUE and FewCLUE.

    Example:
    ```python
    zip_path, files = submit("runs", team="mylab")
    ```
    """
    if not team or any(character in team for character in "/\\ "):
        raise ValueError(f"Expected a team name without spaces or slashes. Received: {team!r}.")
    date = datetime.date.today().strftime("%Y%m%d") if date is None else check_date(date)
    problems, files, by_task, benchmarks = [], [], {}, set()
    for folder, record in _find_runs(runs_dir):
        arguments = record["arguments"]
        where = os.fspath(folder)
        if record.get("status") != "finished":
            problems.append(f"{where}: the run is {record.get('status')!r}, not finished")
            continue
        name = record.get("submission")
        if name is None:
            continue  # no unlabelled test split in its data
        task, benchmark = arguments["task"], arguments["benchmark"]
        benchmarks.add(benchmark)
        if task in by_task:
            problems.append(
                f"{where} and {by_task[task]} both hold {task}: CLUE takes one file per task"
            )
            continue
        by_task[task] = where
        # CLUE's baselines submit CLUE 1.0's file beside 1.1's where the
        # data folder has both test files (TNEWS, CLUEWSC2020).
        for key, split in (("submission", "test"), ("submission_1.0", "test1.0")):
            if record.get(key) is None:
                continue
            test = _test_split(arguments, split)
            path = folder / record[key]
            problems += [
                f"{os.fspath(path)}: {problem}"
                for problem in check_submission(path, task, benchmark, test)
            ]
            if test is None:
                problems.append(
                    f"{os.fspath(path)}: its test file under {arguments['data_dir']!r} is gone, "
                    "so the test ids could not be checked"
                )
            files.append(path)
    if len(benchmarks) > 1:
        problems.append(
            "the runs mix CLUE and FewCLUE tasks; each benchmark takes its own zip (submit "
            "their folders separately)"
        )
    if problems:
        raise ValueError("The submission is not ready:\n- " + "\n- ".join(problems))
    if not files:
        raise ValueError(f"No finished run under {os.fspath(runs_dir)!r} has a submission file.")
    zip_name = default_zip_name(next(iter(benchmarks)), team, date)
    zip_path = pathlib.Path(output or pathlib.Path(runs_dir) / zip_name)
    if zip_path.exists():
        raise ValueError(f"{os.fspath(zip_path)} exists; remove it or pass another --output.")
    return build_submission_zip(files, zip_path), files


def _test_split(arguments, split="test"):
    try:
        return read_split(arguments["data_dir"], arguments["task"], split, arguments["benchmark"])
    except FileNotFoundError:
        return None
