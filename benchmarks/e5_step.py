"""Training-step speed at multilingual-e5-small's size: ours against keras-hub, FL against full.

multilingual-e5-small is a BERT layout (post-LN, learned absolute positions, 2 segment rows, no
pooler, exact GELU, LayerNorm eps 1e-12): 12 layers, hidden 384, 12 heads, FFN 1536 and 250,037
embedding rows, which a user often prunes to about 16,000 rows for a Chinese corpus. Speed does
not depend on the weights, so every model is built from its config with random weights.

Three sequence classifiers are trained side by side, per backend and per embedding-table size.
Each is the backbone, the first token's final hidden state (no pooler in either model) and a
Dense head, trained with `keras_masking.optimizers.AdamW` (the README's; ``--optimizer keras``
for Keras' own), ``jit_compile=True``, dropout 0.1, batch 16 x 64 tokens:

* ``ours``: `keras_masking.models.TransformerBackbone` (the bert family: ``position="absolute"``;
  ``use_pooler=False``, exact GELU), every weight trainable. This is also the "full" fine-tuning
  step of the FL comparison: one model, one measurement.
* ``keras-hub``: `keras_hub.models.BertBackbone` of the same size (its pooler is frozen and its
  output unused, so both train the same weights). keras-hub's BERT has the tanh GELU only.
* ``fl``: the same backbone as ``ours`` after ``backbone.enable_fl_tuning(units=160)``: the
  backbone frozen, 160 trainable FFN units added in every layer.

Each model is compiled and warmed up, then timed one step at a time in interleaved repeats (the
order rotates every repeat, so machine noise hits all three). Two tables give the median wall-clock
seconds per step and the median CPU seconds of the process (all threads) for the same steps, with
the ratios ours / keras-hub (target <= 1.05) and FL / full (target <= 0.75). On a machine shared
with other jobs, the CPU times are far steadier than the wall-clock ones. The targets refer to the
pruned 16,000-row table, the realistic and the harder case. At 250,037 rows, ours and keras-hub
both pay for the table, which pulls their ratio towards 1. In the FL pair only full fine-tuning
pays for it, since FL-tuning does not update the frozen table, which lowers FL / full.
BENCHMARKS.md ("Speed at multilingual-e5-small's size") has a run and what it means.

Usage (one command, both backends, each in its own process):
    python benchmarks/e5_step.py [--repeats 7]
    python benchmarks/e5_step.py --backend jax --vocabulary-size 16000 --quick
    KERAS_BACKEND=tensorflow python benchmarks/e5_step.py --backend current
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import keras
import keras_hub
import numpy as np
from backbone_step import _time_steps as time_steps

import keras_masking

BACKENDS = ("tensorflow", "jax")
FULL_ROWS = 250_037
PRUNED_ROWS = 16_000
TARGET_OURS_OVER_KERAS_HUB = 1.05
TARGET_FL_OVER_FULL = 0.75
NUM_CLASSES = 15
RESULT_PREFIX = "E5_STEP_RESULT "
OPTIMIZERS = {
    "keras_masking": keras_masking.optimizers.AdamW,
    "keras": keras.optimizers.AdamW,
}


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend",
        default="both",
        choices=("both", "current", *BACKENDS),
        help="'both': one child process per backend; 'current': this process's KERAS_BACKEND",
    )
    parser.add_argument(
        "--vocabulary-size",
        type=int,
        nargs="+",
        default=[FULL_ROWS, PRUNED_ROWS],
        help="embedding-table rows, one measurement per value",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 2 timed steps, 1 warm-up step"
    )
    parser.add_argument("--fl-units", type=int, default=160)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument(
        "--optimizer",
        default="keras_masking",
        choices=sorted(OPTIMIZERS),
        help="AdamW: the package's (exact embedding rows on TensorFlow; README's) or Keras' own",
    )
    parser.add_argument(
        "--activation",
        default="gelu",
        choices=("gelu", "gelu_approximate"),
        help="our FFN activation: e5's exact GELU, or keras-hub BERT's tanh form",
    )
    # multilingual-e5-small's sizes; smaller values make a miniature for tests.
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup = 2, 1
    return args


def backbone_config(args, rows):
    return dict(
        vocabulary_size=rows,
        num_layers=args.layers,
        num_heads=args.heads,
        hidden_dim=args.hidden,
        intermediate_dim=args.intermediate,
        dropout=args.dropout,
        max_sequence_length=args.max_length,
        num_segments=2,
    )


def our_backbone(args, rows, fl_units=0):
    keras.utils.set_random_seed(0)
    backbone = keras_masking.models.TransformerBackbone(
        **backbone_config(args, rows),
        position="absolute",
        activation=args.activation,
        layer_norm_epsilon=1e-12,
        use_pooler=False,
    )
    if fl_units:
        backbone.enable_fl_tuning(units=fl_units)
    return backbone


def keras_hub_backbone(args, rows):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(**backbone_config(args, rows))
    backbone.pooled_dense.trainable = False  # not on the classifier's path: nothing to train
    return backbone


def classifier(backbone, optimizer="keras_masking"):
    """The backbone, its first token's final hidden state, a Dense head; AdamW, XLA."""
    inputs = backbone.input
    first_token = backbone(inputs)["sequence_output"][:, 0, :]
    logits = keras.layers.Dense(NUM_CLASSES, name="head")(first_token)
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer=OPTIMIZERS[optimizer](1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model


def batch_of(args, rows, seed=0):
    rng = np.random.default_rng(seed)
    shape = (args.batch_size, args.length)
    token_ids = rng.integers(min(5, rows - 1), rows, shape).astype("int32")
    features = {
        "token_ids": token_ids,
        "segment_ids": np.zeros(shape, "int32"),
        "padding_mask": np.ones(shape, "int32"),
    }
    return features, rng.integers(0, NUM_CLASSES, args.batch_size)


def trainable_count(model):
    return int(sum(np.prod(variable.shape) for variable in model.trainable_weights))


def measure_rows(args, rows, log=print):
    """Wall-clock and CPU seconds per step of the three classifiers at one table size."""
    models = {
        "ours": classifier(our_backbone(args, rows), args.optimizer),
        "keras-hub": classifier(keras_hub_backbone(args, rows), args.optimizer),
        "fl": classifier(our_backbone(args, rows, fl_units=args.fl_units), args.optimizer),
    }
    features, labels = batch_of(args, rows)
    for name, model in models.items():  # compile and warm up, outside the timing
        log(f"  rows={rows}: compiling and warming up {name}")
        keras_masking.utils.build_optimizer(model, features, labels)  # TensorFlow: one trace
        time_steps(model, features, labels, max(args.warmup, 1))
    times = {name: [] for name in models}
    cpu_times = {name: [] for name in models}
    names = list(models)
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            cpu_start = time.process_time()
            times[name].append(time_steps(models[name], features, labels, 1))
            cpu_times[name].append(time.process_time() - cpu_start)
    return {
        "backend": keras.config.backend(),
        "rows": rows,
        **step_summary(times),
        "cpu": step_summary(cpu_times),
        "times_s": times,
        "cpu_times_s": cpu_times,
        "trainable": {name: trainable_count(model) for name, model in models.items()},
    }


def step_summary(samples):
    """Median seconds per step of each model and the two ratios."""
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "ours_s": medians["ours"],
        "keras_hub_s": medians["keras-hub"],
        "ours_over_keras_hub": medians["ours"] / medians["keras-hub"],
        "fl_s": medians["fl"],
        "full_s": medians["ours"],
        "fl_over_full": medians["fl"] / medians["ours"],
    }


def versions():
    found = {
        "python": platform.python_version(),
        "keras": keras.__version__,
        "keras-hub": keras_hub.__version__,
        "keras-masking": keras_masking.__version__,
    }
    if keras.config.backend() == "jax":
        import jax
        import jaxlib

        found.update(jax=jax.__version__, jaxlib=jaxlib.__version__)
    elif keras.config.backend() == "tensorflow":
        import tensorflow as tf

        found["tensorflow"] = tf.__version__
    return found


def machine():
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def measure(args, log=print):
    """Every table size on this process's backend: its versions and one result per size."""
    log(f"backend {keras.config.backend()}: {json.dumps(versions())}")
    results = []
    for rows in args.vocabulary_size:
        result = measure_rows(args, rows, log=log)
        for key in ("times_s", "cpu_times_s"):
            samples = {name: [round(t, 3) for t in times] for name, times in result[key].items()}
            log(f"  rows={rows}: {key} {json.dumps(samples)}")
        results.append(result)
        keras.backend.clear_session()
    return {"versions": versions(), "results": results}


def without_backend(argv):
    """``argv`` without its ``--backend X`` / ``--backend=X`` options."""
    kept, skip = [], False
    for argument in argv:
        if skip:
            skip = False
        elif argument == "--backend":
            skip = True
        elif not argument.startswith("--backend="):
            kept.append(argument)
    return kept


def measure_in_child(backend, argv):
    """Runs this script with ``--backend backend --json`` under ``KERAS_BACKEND=backend``."""
    command = [sys.executable, os.path.abspath(__file__), *argv, "--backend", backend, "--json"]
    env = {**os.environ, "KERAS_BACKEND": backend}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"$ KERAS_BACKEND={backend} {shlex.join(command)}", flush=True)
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as child:
        measured = None
        for line in child.stdout:
            if line.startswith(RESULT_PREFIX):
                measured = json.loads(line[len(RESULT_PREFIX) :])
            else:
                print(f"  [{backend}] {line.rstrip()}", flush=True)
    if child.returncode or measured is None:
        raise RuntimeError(f"the {backend} child failed with exit status {child.returncode}")
    return measured


def table(results, cpu=False):
    """The results as a Markdown table: wall-clock seconds, or process CPU seconds."""
    lines = [
        "| backend | rows | ours s/step | keras-hub s/step | ours / keras-hub "
        "| FL s/step | full s/step | FL / full |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for found in results:
        result = {**found, **found["cpu"]} if cpu else found
        lines.append(
            f"| {result['backend']} | {result['rows']:,} | {result['ours_s']:.3f} "
            f"| {result['keras_hub_s']:.3f} | {result['ours_over_keras_hub']:.3f} "
            f"| {result['fl_s']:.3f} | {result['full_s']:.3f} | {result['fl_over_full']:.3f} |"
        )
    return "\n".join(lines)


def verdicts(results):
    lines = []
    for result in results:
        ours_met = result["ours_over_keras_hub"] <= TARGET_OURS_OVER_KERAS_HUB
        fl_met = result["fl_over_full"] <= TARGET_FL_OVER_FULL
        scope = "(the targets' table)" if result["rows"] == PRUNED_ROWS else "(for reference)"
        lines.append(
            f"{result['backend']} rows={result['rows']:,} {scope}: ours/keras-hub "
            f"{result['ours_over_keras_hub']:.3f} "
            f"{'meets' if ours_met else 'misses'} <= {TARGET_OURS_OVER_KERAS_HUB}; FL/full "
            f"{result['fl_over_full']:.3f} {'meets' if fl_met else 'misses'} "
            f"<= {TARGET_FL_OVER_FULL} (CPU time: {result['cpu']['ours_over_keras_hub']:.3f}, "
            f"{result['cpu']['fl_over_full']:.3f}); trainable {result['trainable']}"
        )
    return "\n".join(lines)


def main(argv=None):
    """Measures, prints the tables and returns the results (one dict per backend and size)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_arguments(argv)
    if args.json:  # a child of the 'both' / other-backend run: one JSON line for the parent
        print(RESULT_PREFIX + json.dumps(measure(args, log=lambda text: print(text, flush=True))))
        return None
    print(f"command: {shlex.join([sys.executable, sys.argv[0], *argv])}")
    print(f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', '')}; machine: {json.dumps(machine())}")
    print(
        f"config: layers={args.layers} hidden={args.hidden} heads={args.heads} "
        f"intermediate={args.intermediate} max_length={args.max_length} "
        f"activation(ours)={args.activation} dropout={args.dropout} fl_units={args.fl_units} "
        f"optimizer={args.optimizer}.AdamW "
        f"batch={args.batch_size} x length={args.length}, median of {args.repeats} interleaved "
        f"steps after {args.warmup} warm-up steps"
    )
    if args.backend == "current" or args.backend == keras.config.backend():
        measured = {keras.config.backend(): measure(args)}
    else:
        backends = BACKENDS if args.backend == "both" else (args.backend,)
        child_argv = without_backend(argv)
        measured = {backend: measure_in_child(backend, child_argv) for backend in backends}
    results = []
    for backend, found in measured.items():
        print(f"versions ({backend}): {json.dumps(found['versions'])}")
        results += found["results"]
    print("Wall-clock seconds per step (median):")
    print(table(results))
    print(
        "CPU seconds per step (median; every thread of the process, so less of other jobs' noise):"
    )
    print(table(results, cpu=True))
    print(verdicts(results))
    print("full = ours: one model, one measurement (the full fine-tuning step of our backbone).")
    return results


if __name__ == "__main__":
    main()
