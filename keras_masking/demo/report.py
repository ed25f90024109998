"""The demo's results: a Markdown table, a JSON file and two PNG plots."""

import json
import pathlib
import statistics

from keras_masking.clue.run_folder import write_atomically

TASK_TITLES = {"eprstmt": "review sentiment (accuracy %)", "cluener": "entities (F1 %)"}


def _spread(values):
    values = [value for value in values if value is not None]
    if not values:
        return "-"
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {statistics.stdev(values):.1f}"


def summary_rows(rows):
    """One row per (task, method): means over seeds, step time against plain.

    Args:
        rows: the per-run dicts of `keras_masking.demo.runs.fine_tune`.

    Returns:
        A list of dicts in run order.

    Example:
    >>> row = {"task": "eprstmt", "method": "plain", "dev": 80.0, "test": 78.0,
    ...        "trainable": 10, "total": 10, "step_seconds": 0.02, "epoch_seconds": 3.0}
    >>> summary_rows([row])[0]["step_vs_plain"]
    1.0
    """
    groups = {}
    for row in rows:
        groups.setdefault((row["task"], row["method"]), []).append(row)
    plain_step = {}
    for (task, method), group in groups.items():
        if method == "plain":
            steps = [row["step_seconds"] for row in group if row["step_seconds"]]
            plain_step[task] = statistics.median(steps) if steps else None
    summary = []
    for (task, method), group in groups.items():
        steps = [row["step_seconds"] for row in group if row["step_seconds"]]
        step = statistics.median(steps) if steps else None
        base = plain_step.get(task)
        summary.append(
            {
                "task": task,
                "method": method,
                "seeds": len(group),
                "dev": _spread([row["dev"] for row in group]),
                "test": _spread([row["test"] for row in group]),
                "dev_mean": statistics.mean(row["dev"] for row in group),
                "test_mean": statistics.mean(row["test"] for row in group),
                "trainable": group[0]["trainable"],
                "trainable_share": group[0]["trainable"] / group[0]["total"],
                "step_vs_plain": round(step / base, 2) if step and base else None,
                "epoch_seconds": statistics.mean(row["epoch_seconds"] for row in group),
            }
        )
    return summary


def markdown_table(summary, pretraining, settings, machine):
    """The results as Markdown: pretraining, then one table per task."""
    lines = [
        "# keras-masking demo results",
        "",
        f"Machine: {machine}. Settings: {json.dumps(settings, ensure_ascii=False)}.",
        "",
        "## Pretraining (same steps, batch and learning rate; held-out People's Daily)",
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
        "alignment log-likelihood per target for ExLM); the entropies compare.",
    ]
    for task, title in TASK_TITLES.items():
        rows = [row for row in summary if row["task"] == task]
        if not rows:
            continue
        lines += [
            "",
            f"## {title}",
            "",
            "| method | dev (best epoch) | test | trainable | step vs plain | s / epoch |",
            "|---|---|---|---|---|---|",
        ]
        for row in rows:
            ratio = "-" if row["step_vs_plain"] is None else f"{row['step_vs_plain']:.2f}x"
            lines.append(
                f"| {row['method']} | {row['dev']} | {row['test']} | {row['trainable']:,} "
                f"({row['trainable_share']:.1%}) | {ratio} | {row['epoch_seconds']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def write_text(path, text):
    """Writes a UTF-8 file through a temporary name."""
    return write_atomically(path, lambda file: file.write(text))


def plot_learning_curves(rows, path):
    """Dev score per epoch of every run, one panel per task (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    tasks = [task for task in TASK_TITLES if any(row["task"] == task for row in rows)]
    figure, axes = pyplot.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        for row in rows:
            if row["task"] == task:
                epochs = range(1, len(row["curve"]) + 1)
                axis.plot(
                    epochs, row["curve"], marker="o", label=f"{row['method']} ({row['seed']})"
                )
        axis.set_title(TASK_TITLES[task])
        axis.set_xlabel("epoch")
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
