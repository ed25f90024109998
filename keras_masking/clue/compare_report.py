"""`compare`'s report: the Markdown table (``compare.md``) and the plot (``compare.png``)."""

import logging

import numpy as np

from keras_masking.utils.files import write_atomically

logger = logging.getLogger(__name__)

BASELINE = "plain"
PLOT = "compare.png"


def _number(value, signed=False):
    return "–" if value is None else f"{value:+.2f}" if signed else f"{value:.2f}"


def markdown_report(record, task):
    """``compare.md``: the table of a finished compare record, and its notes.

    Args:
        record: the ``compare.json`` dict, with its ``summary`` rows.
        task: the `keras_masking.clue.tasks` task.

    Returns:
        The Markdown text.
    """
    arguments, halves, rows = record["arguments"], record["halves"], record["summary"]
    if arguments["checkpoint"] is not None:
        model = f"checkpoint {arguments['checkpoint']} ({arguments['model']})"
    else:
        model = f"preset {arguments['preset']}"
    seeds = ", ".join(str(seed) for seed in arguments["seeds"])
    lines = [
        f"# Methods compared on {task.name}",
        "",
        f"Task {task.name} ({arguments['benchmark']}), model {model}, seeds {seeds}; epoch chosen "
        f"on dev half A (n={len(halves['A'])}), reported on half B (n={len(halves['B'])}"
        + (
            f"; one example is {100 / len(halves['B']):.2f} points"
            if task.metric == "accuracy" and task.kind != "idiom"  # CHID scores blanks
            else ""
        )
        + ").",
        "",
        *markdown_table(rows, f"held-out {task.metric}", arguments["seeds"]),
    ]
    if arguments.get("test_file"):
        count = record.get("test_examples")
        lines += [
            "",
            f"## On the test file ({arguments['test_file']}, n={count})",
            "",
            "The same runs at the same epochs (chosen on half A); the test file chose nothing.",
            "",
            *markdown_table(record["summary_test"], f"test {task.metric}", arguments["seeds"]),
        ]
    noise = arguments.get("dev_noise")
    if noise:
        lines += [
            "",
            f"## Under character noise ({noise * 100:g}% of dev's characters replaced)",
            "",
            f"The same runs at the same epochs (chosen on the clean half A), scored on half B "
            f"with {noise * 100:g}% of its letters and digits replaced by others (seed 0).",
            "",
            *markdown_table(
                record["summary_noised"], f"noised held-out {task.metric}", arguments["seeds"]
            ),
        ]
    lines += [
        "",
        f"Differences are paired by seed (method minus {BASELINE}); the interval is Student t's "
        'over the seeds (n - 1 degrees of freedom). "helps": the interval is above 0; '
        '"hurts": below 0. "resolves ±": the interval\'s half-width, the smallest mean '
        "difference these seeds could have told from 0 at the spread they showed: a "
        '"cannot tell" says no more than that a difference, if any, is smaller than about this.',
    ]
    lines += [f"- {note}" for note in record["notes"]]
    return "\n".join(lines) + "\n"


def markdown_table(rows, scored, seeds):
    """The Markdown table of `summarize` rows, as lines.

    Args:
        rows: the rows of `keras_masking.clue.compare.summarize`.
        scored: what the scores are, for the header (``"held-out accuracy"``).
        seeds: the seeds the compare ran; a mean over fewer names its own.

    Example:
    >>> markdown_table([], "held-out accuracy", [0, 1])[0][:30]
    '| method | trainable parameter'
    """
    lines = [
        f"| method | trainable parameters | {scored}, mean ± sd | difference from "
        f"{BASELINE}, mean [95% interval] | resolves ± | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    every_seed = sorted(seeds)
    for row in rows:
        parameters = row["trainable_parameters"]
        parameters = "–" if parameters is None else f"{parameters:,}"
        held = "–" if row["mean"] is None else f"{_number(row['mean'])} ± {_number(row['sd'])}"
        if row["mean"] is not None and sorted(row["seeds"]) != every_seed:
            held += f" (seeds {', '.join(map(str, row['seeds']))})"  # a run failed
        difference = row["difference"]
        resolves = "–" if not difference else _number(difference["half_width"])
        if difference and difference["sd"] == 0.0:
            resolves = "unknown"  # no spread seen: not a resolution of 0
        if row["method"] == BASELINE:
            shown = "(baseline)"
        elif difference is None:
            shown = "–"
        elif difference["low"] is None:
            shown = f"{_number(difference['mean'], True)} (one seed: no interval)"
        else:
            low, high = _number(difference["low"], True), _number(difference["high"], True)
            shown = f"{_number(difference['mean'], True)} [{low}, {high}]"
        if difference and sorted(difference["seeds"]) != every_seed:
            shown += f" (seeds {', '.join(map(str, difference['seeds']))})"
        lines.append(
            f"| {row['method']} | {parameters} | {held} | {shown} | {resolves} | {row['verdict']} |"
        )
    return lines


def plot_scores(path, rows, task, noised_rows=None):
    """``compare.png``: one point per seed and the mean per method.

    Args:
        path: the PNG to write (through a temporary name).
        rows: `summarize` rows; ``noised_rows``: those under dev noise, or None.
        task: the task, for the axis and the title.

    Returns:
        The path written, or None when matplotlib is missing.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.info("compare: matplotlib is not installed; %s not drawn.", PLOT)
        return None
    figure = Figure(figsize=(max(4.0, 1.2 * len(rows) + 1.5), 3.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    shown = [(rows, "tab:blue", "black", "")]
    if noised_rows is not None:
        shown.append((noised_rows, "tab:orange", "tab:red", ", noised dev"))
    for kind, (summary, color, mean_color, suffix) in enumerate(shown):
        shift = 0.0 if len(shown) == 1 else (kind - 0.5) * 0.3
        for index, row in enumerate(summary):
            count = len(row["scores"])
            offsets = np.linspace(-0.08, 0.08, count) if count > 1 else np.zeros(count)
            axes.scatter(index + shift + offsets, row["scores"], color=color, s=18,
                         label=f"a seed{suffix}" if index == 0 else None)  # fmt: skip
            if row["mean"] is not None:
                label = f"mean{suffix}" if index == 0 else None
                center = index + shift
                axes.hlines(
                    row["mean"], center - 0.14, center + 0.14, color=mean_color, label=label
                )
    axes.set_xticks(range(len(rows)), [row["method"] for row in rows], rotation=20)
    axes.set_ylabel(f"held-out {task.metric} (dev half B)")
    axes.set_title(f"{task.name}: epoch chosen on dev half A")
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    return write_atomically(path, lambda file: figure.savefig(file, format="png"), mode="wb")
