"""`compare`: whether a method helps on your data, over several seeds.

Each (method, seed) is a `finetune` run whose epoch is chosen on one half of dev and scored on the
other, so the reported score never saw the choice. Written to the output folder: ``compare.json``
(everything), ``compare.md`` (the table) and ``compare.png`` (the scores).
"""

import collections
import dataclasses
import json
import logging
import math
import os
import pathlib
import re
import warnings

import keras
import numpy as np

from keras_masking.clue.compare_report import BASELINE
from keras_masking.clue.compare_report import PLOT
from keras_masking.clue.compare_report import markdown_report
from keras_masking.clue.compare_report import plot_scores
from keras_masking.clue.decoding import score
from keras_masking.clue.method_plan import MethodPlan
from keras_masking.clue.readers import check_held_out
from keras_masking.clue.readers import detect_benchmark
from keras_masking.clue.readers import read_labelled_file
from keras_masking.clue.readers import read_split
from keras_masking.clue.readers import read_task_splits
from keras_masking.clue.run_config import RunConfig
from keras_masking.clue.run_folder import RunFolder
from keras_masking.clue.runner import finetune
from keras_masking.clue.runner import model_source_of
from keras_masking.clue.runner import recorded_data_and_model
from keras_masking.clue.tasks import get_task
from keras_masking.utils.arguments import MAX_SEED
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.files import write_atomically
from keras_masking.utils.files import write_json_atomically
from keras_masking.version import __version__

logger = logging.getLogger(__name__)

RECORD = "compare.json"
TABLE = "compare.md"
# Scores are shares of examples (``100 * k / n``): two differences of the same
# number of examples differ by float rounding only (about 1e-14), two of a
# different number by at least ``100 / n``. Relative to the largest difference.
_SAME_DIFFERENCE = 1e-9
# A method spec's name -> (the value's type, its value when the spec gives
# none; None: the spec must give one). `plain` takes no value, and
# `correct_embeddings` none either (it is on or off).
METHOD_VALUES = {
    "correct_embeddings": (bool, True),
    "drop_token": (float, None),
    "asa": (float, 0.5),
    "fl_tuning": (int, 160),
    "prefix_tuning": (int, 160),
    "lora": (int, None),
    "exlm_k": (int, None),
}
_SPEC = re.compile(r"(?P<name>[a-z_]+)(=(?P<value>[0-9.eE+-]+))?")
# Student t's 0.975 quantile for 1..30 degrees of freedom.
T_975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157,
    2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922,
    2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831,
    2.048407, 2.045230, 2.042272,
)  # fmt: skip
Z_975 = 1.959963984540054
# The training settings a compare records (as given: None is the task's default).
COMPARED_SETTINGS = ("epochs", "batch_size", "learning_rate", "max_length", "accumulation",
                     "warmup_proportion", "weight_decay", "jit_compile")  # fmt: skip


@dataclasses.dataclass
class CompareResult:
    """What `compare` returns.

    Attributes:
        rows: one dict per method (``method``, ``trainable_parameters``,
            ``seeds``, ``scores``: the held-out score of each seed, ``mean``,
            ``sd``, ``difference``: the paired difference from plain as
            `paired_difference` gives it, or None for plain, and
            ``verdict``: ``"baseline"``, ``"helps"``, ``"hurts"`` or
            ``"cannot tell"``).
        json_path: ``compare.json``.
        markdown_path: ``compare.md``.
        plot_path: ``compare.png``, or None when matplotlib is missing.
        noised_rows: with ``dev_noise``, the same rows from the noised half B's
            scores (at the epochs chosen on the clean half A); else None.
        test_rows: with ``test_file``, the same rows from the test file's
            scores at the epochs chosen on half A; else None.
    """

    rows: list
    json_path: pathlib.Path
    markdown_path: pathlib.Path
    plot_path: pathlib.Path | None
    noised_rows: list | None = None
    test_rows: list | None = None


def compare(task, data_dir, output_dir, methods, seeds=(0, 1, 2), run_config=None, *,
            learning_rates=None, split_seed=0, noise=None, verbose=1, **options):  # fmt: skip
    """Fine-tunes a task with each method and seed, and says whether each method helps.

    Each (method, seed) is a `finetune` run in ``output_dir/<method>/seed<k>``
    (an interrupted compare resumes: finished runs are returned as they are).
    Dev is split once into halves A and B (a shuffle of its example ids with
    ``split_seed``, the same for every run); each run's epoch is the one
    whose score on half A is best (the earliest of ties), and its held-out
    score is half B's at that epoch. Each method's held-out scores are
    compared with plain fine-tuning's of the same seed: the mean difference
    with a 95% Student t interval over the seeds (n - 1 degrees of freedom),
    and the verdict ``"helps"`` (the interval above 0), ``"hurts"`` (below)
    or ``"cannot tell"``.

    Args:
        task: a task name or `ClueTask`.
        data_dir: the data folder, as `finetune` reads it.
        output_dir: the compare's folder: new or empty, or an earlier
            compare of the same arguments (resumed).
        methods: method specs, each a `finetune` method with its value:
            ``"plain"``, ``"drop_token=0.1"``, ``"asa"`` (tau 0.5) or
            ``"asa=0.3"``, ``"fl_tuning"`` (160 units) or ``"fl_tuning=64"``,
            ``"prefix_tuning"`` (length 160) or ``"prefix_tuning=16"``,
            ``"lora=8"``, ``"correct_embeddings"``, ``"exlm_k=4"``. A spec is
            its method's label. ``"plain"`` is added (first) when missing.
        seeds: the seeds, ints >= 0, distinct (each run's ``seed``).
        run_config: a `RunConfig` for every run (the model, the training
            settings, the data options; its methods and seed are the
            compare's), or None: the defaults.
        learning_rates: a dict method label or name -> learning rate for its
            runs, fixed beforehand (``{"fl_tuning": 5e-3}``; a label wins over
            a name); the other methods take ``learning_rate``.
        split_seed: int >= 0, the seed of dev's halves.
        noise: the old name of ``dev_noise`` (deprecated, goes in 0.7.0).
        verbose: `finetune`'s progress output (0, 1 or 2).
        **options: `RunConfig` fields, flat (``preset=...``, ``epochs=3``),
            over ``run_config``. With ``dev_noise`` above 0, each run also
            scores dev with that share of its characters replaced (text
            classification and sentence-pair tasks), and the methods are
            compared a second time on the noised half B, at the epochs chosen
            on the clean half A (`CompareResult.noised_rows`).

    Returns:
        A `CompareResult`.

    Raises:
        ValueError: an unknown or repeated method spec, no or negative seeds,
            a learning rate for no method, an output folder that holds
            another compare or other files, a dev split of fewer than 2
            labelled examples (each before any run starts).

    Example:
    ```python
    result = keras_masking.clue.compare(
        "tnews", "fewclue", "runs/tnews_compare",
        ["plain", "drop_token=0.1", "fl_tuning=160"],
        checkpoint="chinese_L-12_H-768_A-12/bert_model.ckpt",
        learning_rates={"fl_tuning": 5e-3}, epochs=10,
    )
    print(result.markdown_path.read_text())  # the table: mean ± sd, difference, verdict
    ```
    """
    task = get_task(task)
    if noise is not None:
        if "dev_noise" in options:
            raise ValueError(
                "The dev noise given twice, as noise= and dev_noise=: pass dev_noise=."
            )
        warnings.warn("compare(noise=...) is deprecated and goes in 0.7.0; pass dev_noise=...",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        options["dev_noise"] = noise
    config = RunConfig.from_options(run_config, **options)
    if config.methods.active() or "seed" in options or config.seed != RunConfig.seed:
        raise ValueError(
            "compare takes its methods as specs (methods=['plain', 'fl_tuning=160']) and its "
            "seeds as seeds=[...]; run_config and the options carry neither. Received: "
            f"methods {config.methods.active()}, seed {options.get('seed', config.seed)}."
        )
    specs, added = _method_specs(methods)
    seeds = list(
        check_int_list("seeds", seeds, minimum=0, maximum=MAX_SEED, allow_empty=False, unique=True)
    )
    rates = _learning_rates(specs, config.learning_rate, learning_rates)
    split_seed = check_int("split_seed", split_seed, minimum=0, maximum=MAX_SEED)
    model_source, files = model_source_of(config, output_dir)
    for spec in specs:  # every method fits the task and model before the first run writes
        run = dataclasses.replace(config, methods=MethodPlan(**spec["switches"]))
        run.resolved(task)
        run.methods.check_source(model_source)
    benchmark, _ = detect_benchmark(data_dir, task, config.benchmark)
    config = dataclasses.replace(config, benchmark=benchmark)
    dev = read_split(data_dir, task, "dev", benchmark, config.few_shot).examples
    halves = split_halves([example.id for example in dev], split_seed)
    test_examples = None
    if config.test_file:  # a bad file is refused before the first run writes
        test = read_labelled_file(config.test_file, task, benchmark)
        check_held_out(test, read_task_splits(data_dir, task, benchmark, config.few_shot))
        test_examples = len(test)
    arguments = {
        **recorded_data_and_model(task, benchmark, config, data_dir, files),
        "methods": [spec["label"] for spec in specs],
        "seeds": seeds,
        "split_seed": split_seed,
        **{name: getattr(config, name) for name in COMPARED_SETTINGS},
        "learning_rates": rates,
        **({"dev_noise": config.dev_noise} if config.dev_noise else {}),
        **({"data_parallel": True} if config.data_parallel else {}),
        **({"test_file": os.path.abspath(config.test_file)} if config.test_file else {}),
    }
    output = pathlib.Path(output_dir)
    _check_output(output, arguments, halves)
    if added:
        logger.info("compare: added %r, the baseline the differences are taken from.", BASELINE)
    record = {
        "keras_masking": __version__,
        "arguments": arguments,
        "halves": {"split_seed": split_seed, **halves},
        "rule": "epoch chosen on dev half A, reported on dev half B"
        + (" and on the test file" if test_examples else ""),
        **({"test_examples": test_examples} if test_examples else {}),
        "notes": [f"{BASELINE!r} was added: the baseline."] if added else [],
        "runs": [],
        "summary": None,
        "status": "running",
    }
    output.mkdir(parents=True, exist_ok=True)
    write_json_atomically(output / RECORD, record)
    noised, tested = bool(config.dev_noise), bool(config.test_file)
    for seed in seeds:  # seed by seed: an interrupted compare has whole pairs first
        for spec in specs:
            logger.info(
                "compare: %s, seed %d (run %d of %d)",
                spec["label"], seed, len(record["runs"]) + 1, len(specs) * len(seeds),
            )  # fmt: skip
            run = dataclasses.replace(config, seed=seed, learning_rate=rates[spec["label"]],
                                      methods=MethodPlan(**spec["switches"]))  # fmt: skip
            result = finetune(task, data_dir, output / spec["label"] / f"seed{seed}", run,
                              verbose=verbose)  # fmt: skip
            entry = _run_entry(task, spec["label"], seed, result, dev, halves, noised, tested)
            record["runs"].append(entry)
            write_json_atomically(output / RECORD, record)
            # Each run builds its own models: free them, or a long compare
            # holds every run's weights and compiled steps in memory.
            del result
            keras.backend.clear_session(free_memory=True)
    return _finish(record, output, task)


def _finish(record, output, task):
    """Summarizes the runs and writes the record, the table and the plot."""
    arguments = record["arguments"]
    runs, labels, seeds = record["runs"], arguments["methods"], arguments["seeds"]
    rows = summarize(runs, labels, seeds)
    record["notes"] += _notes(runs, seeds) + _zero_spread_notes(rows)
    record["summary"] = rows
    for argument, key, scored, where in (
        ("dev_noise", "summary_noised", "held_out_noised", "under noise, "),
        ("test_file", "summary_test", "test", "on the test file, "),
    ):
        if arguments.get(argument):
            record[key] = summarize(runs, labels, seeds, score=scored)
            record["notes"] += _zero_spread_notes(record[key], where)
    record["status"] = "finished"
    json_path = write_json_atomically(output / RECORD, record)
    markdown = markdown_report(record, task)
    markdown_path = write_atomically(output / TABLE, lambda file: file.write(markdown))
    noised_rows, test_rows = record.get("summary_noised"), record.get("summary_test")
    plot_path = plot_scores(output / PLOT, rows, task, noised_rows)
    logger.info("compare: wrote %s", os.fspath(markdown_path))
    return CompareResult(rows, json_path, markdown_path, plot_path, noised_rows, test_rows)


# === Methods ===
def parse_method(spec):
    """A method spec as `finetune`'s method keywords.

    Args:
        spec: ``"plain"``, or a method name with an optional value
            (``"drop_token=0.1"``, ``"fl_tuning"``, ``"lora=8"``; see
            `compare`).

    Returns:
        A dict: ``label`` (the spec), ``name`` and ``switches`` (the
        keywords, ``{}`` for plain).

    Raises:
        ValueError: an unknown name, a missing or bad value, a value that
            turns the method off.

    Example:
    >>> parse_method("fl_tuning=64")
    {'label': 'fl_tuning=64', 'name': 'fl_tuning', 'switches': {'fl_tuning': 64}}
    """
    known = ", ".join([BASELINE, *METHOD_VALUES])
    match = _SPEC.fullmatch(spec.strip()) if isinstance(spec, str) else None
    name = match and match["name"]
    if not match or name not in (BASELINE, *METHOD_VALUES):
        raise ValueError(
            f"Expected method specs such as 'plain', 'drop_token=0.1' or 'fl_tuning=160' "
            f"(methods: {known}). Received: methods entry {spec!r}."
        )
    label, value = spec.strip(), match["value"]
    if name in (BASELINE, "correct_embeddings"):
        if value is not None:
            raise ValueError(f"Method {name!r} takes no value. Received: methods entry {spec!r}.")
        switches = {} if name == BASELINE else {name: True}
        return {"label": label, "name": name, "switches": switches}
    kind, default = METHOD_VALUES[name]
    if value is None and default is None:
        raise ValueError(
            f"Method {name!r} needs a value, such as {name}=... . Received: methods entry {spec!r}."
        )
    try:
        switches = {name: default if value is None else kind(value)}
        plan = MethodPlan(**switches)
    except ValueError as error:
        raise ValueError(f"Bad method spec {spec!r}: {error}") from None
    if not plan.active():
        raise ValueError(f"Method spec {spec!r} turns the method off; use 'plain' for no method.")
    return {"label": label, "name": name, "switches": switches}


def _method_specs(methods):
    if isinstance(methods, str) or not methods:
        raise ValueError(
            "Expected a non-empty list of method specs for methods, such as ['plain', "
            f"'drop_token=0.1']. Received: methods={methods!r}."
        )
    specs = [parse_method(spec) for spec in methods]
    for index, spec in enumerate(specs):
        for earlier in specs[:index]:
            if earlier["label"] == spec["label"]:
                raise ValueError(
                    f"Duplicate method label {spec['label']!r} in methods; each method once."
                )
            if earlier["switches"] == spec["switches"]:
                raise ValueError(
                    f"Method specs {earlier['label']!r} and {spec['label']!r} are the same "
                    "run; give each method once."
                )
    added = not any(spec["name"] == BASELINE for spec in specs)
    if added:
        specs.insert(0, parse_method(BASELINE))
    return specs, added


def _learning_rates(specs, learning_rate, given):
    """Each method label's learning rate (None: the task's default)."""
    given = dict(given or {})
    names = {spec["label"] for spec in specs} | {spec["name"] for spec in specs}
    unknown = sorted(key for key in given if key not in names)
    if unknown:
        raise ValueError(
            f"learning_rates names no method of methods: {unknown}. Expected method labels "
            f"or names among {sorted(names)}."
        )
    for key, value in given.items():
        check_float(f"learning_rates[{key!r}]", value, minimum=0.0, open_minimum=True)
    return {
        spec["label"]: given.get(spec["label"], given.get(spec["name"], learning_rate))
        for spec in specs
    }


def split_halves(ids, seed=0):
    """Splits dev's example ids into halves A and B with a seeded shuffle.

    Args:
        ids: the dev example ids (distinct), in file order.
        seed: the shuffle's seed.

    Returns:
        ``{"A": [...], "B": [...]}``, each in file order; A holds
        ``len(ids) // 2`` ids, B the rest.

    Raises:
        ValueError: fewer than 2 ids, or a repeated id.

    Example:
    >>> halves = split_halves([10, 11, 12, 13, 14], seed=0)
    >>> len(halves["A"]), len(halves["B"]), sorted(halves["A"] + halves["B"])
    (2, 3, [10, 11, 12, 13, 14])
    """
    ids = list(ids)
    if len(ids) < 2:
        raise ValueError(
            f"The dev split has {len(ids)} labelled example(s); choosing an epoch on one half "
            "and scoring on the other needs at least 2."
        )
    repeated = [key for key, count in collections.Counter(ids).items() if count > 1]
    if repeated:
        raise ValueError(
            f"The dev split repeats example ids (e.g. {repeated[:5]}); halves of dev need "
            "distinct ids."
        )
    order = np.random.default_rng(seed).permutation(len(ids))
    in_a = set(order[: len(ids) // 2].tolist())
    return {
        "A": [key for index, key in enumerate(ids) if index in in_a],
        "B": [key for index, key in enumerate(ids) if index not in in_a],
    }


def half_score(task, predictions, examples):
    """The task's metric on a subset of dev: ``examples`` and their predictions only.

    Args:
        task: a `ClueTask` or task name.
        predictions: the whole dev's predictions (id -> prediction; CHID: by
            blank id).
        examples: the subset's records.

    Returns:
        The score (x100), as `score` gives it.
    """
    task = get_task(task)
    if task.kind == "idiom":
        keys = {blank for example in examples for blank in example.blank_ids}
    else:
        keys = {example.id for example in examples}
    kept = {key: value for key, value in predictions.items() if key in keys}
    return score(task, kept, examples)["score"]


def choose_epoch(epochs):
    """The epoch whose half-A score is best (the earliest of ties).

    Args:
        epochs: dicts with ``epoch``, ``half_a`` and ``half_b``.

    Returns:
        ``(epoch, half_b at that epoch)``, or ``(None, None)`` for no epoch.

    Example:
    >>> choose_epoch([{"epoch": 1, "half_a": 80.0, "half_b": 50.0},
    ...               {"epoch": 2, "half_a": 60.0, "half_b": 90.0}])
    (1, 50.0)
    """
    if not epochs:
        return None, None
    best = max(epochs, key=lambda entry: (entry["half_a"], -entry["epoch"]))
    return best["epoch"], best["half_b"]


def _run_entry(task, label, seed, result, dev, halves, noised=False, tested=False):
    """One run's per-epoch half scores and its chosen epoch; ``noised``: the noised
    half B's too; ``tested``: the test file's (the run scored it at every epoch)."""
    by_id = {example.id: example for example in dev}
    half_examples = {name: [by_id[key] for key in halves[name]] for name in ("A", "B")}
    folder = RunFolder(result.record_path.parent)
    epochs = []
    for entry in result.history:
        predictions = folder.read_dev_predictions(entry["epoch"])
        epochs.append({
            "epoch": entry["epoch"],
            "dev": entry["dev"]["score"],
            "half_a": half_score(task, predictions, half_examples["A"]),
            "half_b": half_score(task, predictions, half_examples["B"]),
        })  # fmt: skip
        if noised:
            # The noised dev keeps dev's ids and labels: score it on the same half.
            found = folder.read_dev_predictions(entry["epoch"], "dev_noised")
            epochs[-1]["half_b_noised"] = half_score(task, found, half_examples["B"])
        if tested:
            epochs[-1]["test"] = entry["test_file"]["score"]
    finished = result.status == "finished"
    chosen, held_out = choose_epoch(epochs) if finished else (None, None)
    model = result.record.get("model", {})
    run = {
        "method": label,
        "seed": seed,
        "folder": f"{label}/seed{seed}",
        "status": result.status,
        "failure": result.record.get("failure"),
        "learning_rate": result.record["arguments"]["learning_rate"],
        "trainable_parameters": model.get("trainable_parameters"),
        "epochs": epochs,
        "chosen_epoch": chosen,
        "held_out": held_out,
    }
    at_chosen = next((entry for entry in epochs if entry["epoch"] == chosen), {})
    if noised:
        run["held_out_noised"] = at_chosen.get("half_b_noised")
    if tested:
        run["test"] = at_chosen.get("test")  # never used to choose
    return run


# === Statistics ===
def t_quantile_975(df):
    """Student t's 0.975 quantile with ``df`` degrees of freedom.

    A table for 1..30; beyond, the Cornish-Fisher expansion around the
    normal quantile (within 3e-8 of the exact value from 31 on).

    Example:
    >>> t_quantile_975(2)
    4.302653
    """
    df = check_int("df", df, minimum=1)
    if df <= len(T_975):
        return T_975[df - 1]
    z, v = Z_975, float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def paired_difference(scores, baseline):
    """The mean of ``scores - baseline`` (paired) with its 95% Student t interval.

    Args:
        scores: the method's score per seed.
        baseline: plain's score for the same seeds, in the same order.

    Returns:
        A dict: ``n``, ``mean``, ``sd`` (n - 1 in the denominator; None for
        n = 1), ``t`` (the quantile used), ``low`` and ``high`` (None for
        n = 1: one seed gives no interval), ``half_width`` (``t * sd /
        sqrt(n)``: the smallest mean difference these seeds could have told
        from 0 at this spread; None for n = 1 or sd 0, where the spread is
        unknown), and the ``verdict``: ``"helps"``
        (low > 0), ``"hurts"`` (high < 0) or ``"cannot tell"``. The same
        difference on every seed (sd 0, an interval of width 0) is "cannot
        tell": the spread of so few seeds is then unknown, not zero (with
        80 examples, a difference of 6.25 points is five examples).
        Differences equal up to float rounding are the same difference
        (``100 * 485 / 671 - 100 * 480 / 671`` differs from ``100 * 500 /
        671 - 100 * 495 / 671`` in the last bits): their sd is 0.

    Example:
    >>> found = paired_difference([3.0, 5.0, 4.0], [1.0, 2.0, 1.0])
    >>> found["mean"], round(found["low"], 4), round(found["high"], 4)
    (2.6666666666666665, 1.2324, 4.1009)
    """
    differences = np.asarray(scores, "float64") - np.asarray(baseline, "float64")
    n = len(differences)
    if n == 0:
        raise ValueError("paired_difference needs at least one pair of scores. Received: none.")
    mean = float(differences.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "t": None, "low": None, "high": None,
                "half_width": None, "verdict": "cannot tell"}  # fmt: skip
    sd = float(differences.std(ddof=1))
    if np.ptp(differences) <= _SAME_DIFFERENCE * max(1.0, float(np.abs(differences).max())):
        sd = 0.0  # the same difference on every seed, but for float rounding
    t = t_quantile_975(n - 1)
    half_width = t * sd / math.sqrt(n)
    low, high = mean - half_width, mean + half_width
    verdict = "helps" if low > 0 else "hurts" if high < 0 else "cannot tell"
    if sd == 0.0:
        verdict = "cannot tell"  # a zero-width interval says nothing about the spread
    return {"n": n, "mean": mean, "sd": sd, "t": t, "low": low, "high": high,
            "half_width": half_width if sd > 0.0 else None, "verdict": verdict}  # fmt: skip


def summarize(runs, labels, seeds, score="held_out"):
    """One summary row per method from the runs' held-out scores.

    Args:
        runs: the run entries (``method``, ``seed``, ``held_out``: None for
            a failed run).
        labels: the method labels, plain among them.
        seeds: the seeds, in order.
        score: the entries' score to summarize: ``"held_out"``,
            ``"held_out_noised"`` (the noised half B) or ``"test"`` (the
            labelled test file).

    Returns:
        The rows of `CompareResult.rows`.
    """
    held_out = {(run["method"], run["seed"]): run.get(score) for run in runs}
    parameters = {  # each method's first known count
        run["method"]: run["trainable_parameters"]
        for run in reversed(runs)
        if run["trainable_parameters"] is not None
    }
    rows = []
    for label in labels:
        done = [seed for seed in seeds if held_out.get((label, seed)) is not None]
        scores = [held_out[(label, seed)] for seed in done]
        row = {
            "method": label,
            "trainable_parameters": parameters.get(label),
            "seeds": done,
            "scores": scores,
            "mean": float(np.mean(scores)) if scores else None,
            "sd": float(np.std(scores, ddof=1)) if len(scores) > 1 else None,
            "difference": None,
            "verdict": "baseline" if label == BASELINE else "cannot tell",
        }
        if label != BASELINE:
            paired = [seed for seed in done if held_out.get((BASELINE, seed)) is not None]
            if paired:
                row["difference"] = paired_difference(
                    [held_out[(label, seed)] for seed in paired],
                    [held_out[(BASELINE, seed)] for seed in paired],
                )
                row["difference"]["seeds"] = paired
                row["verdict"] = row["difference"]["verdict"]
        rows.append(row)
    return rows


def _notes(runs, seeds):
    notes = [
        f"{run['method']} seed {run['seed']} failed ({run['failure']}); left out of its mean "
        f"and of the differences at seed {run['seed']}."
        for run in runs
        if run["status"] != "finished"
    ]
    if len(seeds) == 1:
        notes.append(
            "One seed: the 95% interval cannot be computed; every verdict is 'cannot tell'."
        )
    return notes


def _zero_spread_notes(rows, where=""):
    """A note for each method whose difference was the same on every seed."""
    return [
        f"{where}{row['method']}: the same difference ({row['difference']['mean']:+.2f}) on "
        "every seed; an interval of width 0 proves nothing about the spread, so the verdict is "
        "'cannot tell'. Run more seeds, or score more examples."
        for row in rows
        if row["difference"] and row["difference"]["sd"] == 0.0
    ]


def _check_output(output, arguments, halves):
    """Refuses a folder that holds other files or a compare of other arguments."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"output_dir {os.fspath(output)!r} is a file; expected a folder.")
    if not output.is_dir() or not any(output.iterdir()):
        return
    path = output / RECORD
    if not path.is_file():
        raise ValueError(
            f"output_dir {os.fspath(output)!r} holds files but no {RECORD}: it is not a "
            "compare's folder. Choose a new or empty folder."
        )
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        before, split = earlier["arguments"], earlier["halves"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{os.fspath(path)}: a corrupt compare record ({error}); remove it to start again."
        ) from error
    before = {"dev_noise" if name == "noise" else name: v for name, v in before.items()}  # < 0.6.0
    changed = sorted(
        name for name in set(before) | set(arguments) if before.get(name) != arguments.get(name)
    )
    if changed:
        listed = "; ".join(
            f"{name}: {before.get(name)!r} there, {arguments.get(name)!r} now" for name in changed
        )
        raise ValueError(
            f"output_dir {os.fspath(output)!r} holds a compare of other arguments ({listed}). "
            "Use another output folder, or the same arguments to resume it."
        )
    if [split.get("A"), split.get("B")] != [halves["A"], halves["B"]]:
        raise ValueError(
            f"{os.fspath(path)}: the dev halves differ from this dev split's; did the dev file "
            "change? Use another output folder."
        )
