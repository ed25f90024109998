"""FewCLUE dev scores of the small Chinese BERT: plain fine-tuning against each method.

Every run is `keras_masking.clue.finetune` (the code behind ``keras-masking
clue``), from the small Chinese BERT of `small_chinese_bert.py` (pretrained
here on People's Daily, cached). The best epoch is chosen on one half of
FewCLUE's ``dev_few_all`` and reported on the other half, which no choice
saw ("held-out"); FewCLUE's own test files are not used. Each method's
learning rate is chosen from its grid by the mean over seeds of the choice
half's score, so no choice sees the held-out half. Each cell is the mean +-
standard deviation over the seeds at the chosen learning rate; the time per
epoch is the mean over those runs.

Usage:
    pip install ".[bench]"
    KERAS_BACKEND=tensorflow python benchmarks/clue_methods.py \\
        [--tasks eprstmt,tnews] [--seeds 0,1,2] [--methods plain,drop_token,...]
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import tempfile

# DropToken's gathered steps need TensorFlow's XLA CPU fusion emitters off, a
# flag XLA reads at its first compile: every method runs with it, for the
# same conditions (keras_masking.utils.disable_xla_cpu_fusion_emitters).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false"
).strip()

from small_chinese_bert import DEFAULT_VOCAB  # noqa: E402
from small_chinese_bert import FEWCLUE  # noqa: E402
from small_chinese_bert import chinese_tokenizer  # noqa: E402
from small_chinese_bert import pretrained_small_chinese_bert  # noqa: E402

import keras_masking  # noqa: E402

# Each method's switches and its learning-rate grid. Full fine-tuning's
# methods around 1e-3, the parameter-efficient ones around 5e-3: the best of
# the FL-tuning benchmark's sweep on this model (BENCHMARKS.md).
FULL = (3e-4, 1e-3)
EFFICIENT = (1e-3, 5e-3)
METHODS = {
    "plain": ({}, FULL),
    "correct_embeddings": ({"correct_embeddings": True}, FULL),
    "drop_token": ({"drop_token": 0.1}, FULL),
    "asa": ({"asa": 0.5}, FULL),
    "fl_tuning": ({"fl_tuning": 160}, EFFICIENT),
    "fl_tuning_512": ({"fl_tuning": 512}, EFFICIENT),
    "prefix_tuning": ({"prefix_tuning": 160}, EFFICIENT),
    "lora": ({"lora": 8}, EFFICIENT),
}


def held_out_folder(task, root):
    """FewCLUE's task with dev split in two: dev (choice) and test_public (report)."""
    source = FEWCLUE / task
    folder = pathlib.Path(root) / task
    folder.mkdir(parents=True)
    shutil.copy(source / "train_few_all.json", folder / "train_few_all.json")
    lines = (source / "dev_few_all.json").read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) // 2
    (folder / "dev_few_all.json").write_text("".join(lines[:half]), encoding="utf-8")
    (folder / "test_public.json").write_text("".join(lines[half:]), encoding="utf-8")
    return pathlib.Path(root)


def pretrained_preset(folder):
    backbone, info = pretrained_small_chinese_bert(chinese_tokenizer())
    backbone.save_to_preset(str(folder))
    shutil.copy(DEFAULT_VOCAB, pathlib.Path(folder) / "vocab.txt")
    return pathlib.Path(folder), info


def mean_std(values):
    mean = statistics.mean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f} +- {spread:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="eprstmt,tnews")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument(
        "--learning-rates", help="one grid for every method, e.g. 1e-3,5e-3 (default: each its own)"
    )
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--output", help="write the results as JSON here")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    methods = args.methods.split(",")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; expected some of {sorted(METHODS)}")
    if not FEWCLUE.exists():
        parser.error(f"{FEWCLUE} is missing (FewCLUE files)")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        preset, info = pretrained_preset(scratch / "preset")
        print(f"small Chinese BERT: {info}")
        for task in tasks:
            data = held_out_folder(task, scratch / "data")
            for method in methods:
                switches, grid = METHODS[method]
                if args.learning_rates:
                    grid = [float(rate) for rate in args.learning_rates.split(",")]
                for learning_rate in grid:
                    for seed in seeds:
                        run = scratch / "runs" / f"{task}-{method}-{learning_rate}-{seed}"
                        result = keras_masking.clue.finetune(
                            task,
                            data,
                            run,
                            preset=preset,
                            epochs=args.epochs,
                            batch_size=args.batch_size,
                            max_length=args.max_length,
                            learning_rate=learning_rate,
                            seed=seed,
                            verbose=0,
                            **switches,
                        )
                        later = result.history[1:] or result.history  # epoch 1 compiles
                        row = {
                            "task": task,
                            "method": method,
                            "seed": seed,
                            "learning_rate": learning_rate,
                            "dev": result.best_score,
                            "held_out": result.test_public["score"],
                            "best_epoch": result.best_epoch,
                            "epochs": args.epochs,
                            "curve": [entry["dev"]["score"] for entry in result.history],
                            "seconds_per_epoch": statistics.mean(e["seconds"] for e in later),
                            "trainable": result.record["model"]["trainable_parameters"],
                            "evidence": result.history[-1]["methods"],
                        }
                        results.append(row)
                        print(json.dumps(row), flush=True)
                        shutil.rmtree(run)
            shutil.rmtree(data)
    print()
    print(
        "| task | method | lr (chosen on dev) | dev (choice half) | held-out half | s / epoch "
        "| trainable |"
    )
    print("|---|---|---|---|---|---|---|")
    for task in tasks:
        for method in methods:
            rows = [r for r in results if r["task"] == task and r["method"] == method]
            by_rate = {}
            for row in rows:
                by_rate.setdefault(row["learning_rate"], []).append(row)
            rate = max(by_rate, key=lambda lr: statistics.mean(r["dev"] for r in by_rate[lr]))
            chosen = by_rate[rate]
            dev = mean_std([r["dev"] for r in chosen])
            held = mean_std([r["held_out"] for r in chosen])
            seconds = statistics.mean(r["seconds_per_epoch"] for r in chosen)
            print(
                f"| {task} | {method} | {rate:g} | {dev} | {held} | {seconds:.1f} "
                f"| {chosen[0]['trainable']:,} |"
            )
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
