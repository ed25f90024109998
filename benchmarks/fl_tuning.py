"""FL-tuning against full fine-tuning, P-tuning v2 and LoRA, side by side.

At one config (BERT-base shape by default: 12 layers, hidden 768, vocabulary
21,128) a [CLS] classifier is trained by each method:

* ``full``: every weight trainable;
* ``fl``: ``backbone.enable_fl_tuning(units=160)``;
* ``pv2``: ``backbone.enable_prefix_tuning(length=160)`` (P-tuning v2);
* ``lora``: keras-hub's ``Backbone.enable_lora(8)`` on query/value.

Printed per method: trainable parameters, train-step time (AdamW,
``jit_compile=True``, median over alternating rounds in one process), the
optimizer-state size, the peak resident memory of a separate process that only
builds and trains that method, and the adapter-file size against the full
weights. Then inference time of the base model, the FL model (branches) and
the merged FL model, side by side.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/fl_tuning.py [--size small]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np

import keras_masking
from keras_masking.methods import parameter_report
from keras_masking.methods import save_adapter

SIZES = {
    # name: (layers, hidden, heads, batch, length)
    "base": (12, 768, 12, 8, 128),
    "small": (4, 256, 4, 16, 128),
}
METHODS = ("full", "fl", "pv2", "lora")


def build_backbone(size, seed=0):
    layers, hidden, heads, _, _ = SIZES[size]
    keras.utils.set_random_seed(seed)
    return keras_masking.models.TransformerBackbone(
        vocabulary_size=21128,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=4 * hidden,
        max_sequence_length=512,
    )


def classifier(backbone, method, base_weights=None):
    if base_weights is not None:
        backbone.set_weights(base_weights)
    inputs = backbone.input
    model = keras.Model(
        inputs, keras.layers.Dense(15, name="head")(backbone(inputs)["pooled_output"])
    )
    if method == "fl":
        backbone.enable_fl_tuning(units=160)
    elif method == "pv2":
        backbone.enable_prefix_tuning(length=160)
    elif method == "lora":
        backbone.enable_lora(8)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model


def merged_classifier(model):
    """``model`` with its backbone's addFFN units merged (``merge_fl``), the same head."""
    (backbone,) = [
        layer
        for layer in model.layers
        if isinstance(layer, keras_masking.models.TransformerBackbone)
    ]
    merged = classifier(backbone.merge_fl(), "full")
    merged.get_layer("head").set_weights(model.get_layer("head").get_weights())
    return merged


def batch_of(size, seed=0):
    _, _, _, batch, length = SIZES[size]
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(200, 21128, (batch, length)).astype("int32")
    token_ids[:, 0], token_ids[:, -1] = 101, 102
    features = {
        "token_ids": token_ids,
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }
    return features, rng.integers(0, 15, batch)


def timed(function, steps):
    start = time.perf_counter()
    for _ in range(steps):
        result = function()
    float(np.sum(keras.ops.convert_to_numpy(result)))
    return (time.perf_counter() - start) / steps


def optimizer_state_bytes(model):
    return sum(int(np.prod(v.shape)) * 4 for v in model.optimizer.variables)


def child_peak_memory(size, method):
    """Builds and trains one method for 3 steps, prints the peak RSS (MiB)."""
    backbone = build_backbone(size)
    model = classifier(backbone, method)
    features, labels = batch_of(size)
    for _ in range(3):
        model.train_on_batch(features, labels)
    print(peak_resident_mib())


def peak_resident_mib():
    """This process's peak RSS (VmHWM; ru_maxrss would include the parent's)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory(size, method):
    output = subprocess.run(
        [sys.executable, __file__, "--size", size, "--child", method],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
    ).stdout
    return float(output.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--memory-only", action="store_true", help="only the per-method peak-memory processes"
    )
    args = parser.parse_args()
    if args.child:
        child_peak_memory(args.size, args.child)
        return
    layers, hidden, heads, batch, length = SIZES[args.size]
    print(
        f"backend={keras.config.backend()} size={args.size} layers={layers} hidden={hidden} "
        f"batch={batch} length={length}"
    )
    if args.memory_only:
        for method in METHODS:
            print(f"{method:6} peak RSS {peak_memory(args.size, method):.0f} MiB")
        return
    features, labels = batch_of(args.size)
    base_weights = build_backbone(args.size).get_weights()
    models = {m: classifier(build_backbone(args.size), m, base_weights) for m in METHODS}
    for model in models.values():
        model.train_on_batch(features, labels)  # compile outside the timing
    times = {m: [] for m in METHODS}
    for _ in range(args.rounds):
        for method, model in models.items():
            times[method].append(
                timed(lambda model=model: model.train_on_batch(features, labels), args.steps)
            )
    full_step = statistics.median(times["full"])
    full_bytes = sum(np.asarray(w).nbytes for w in models["full"].get_weights())
    print(
        f"{'method':6} {'trainable':>12} {'ratio':>7} {'step ms':>8} {'vs full':>8} "
        f"{'opt state MiB':>14} {'peak RSS MiB':>13} {'adapter MiB':>12}"
    )
    with tempfile.TemporaryDirectory() as folder:
        for method, model in models.items():
            report = parameter_report(model)
            step = statistics.median(times[method])
            memory = "-" if args.skip_memory else f"{peak_memory(args.size, method):.0f}"
            adapter = "-"
            if method in ("fl", "pv2"):
                path = save_adapter(model, os.path.join(folder, method))
                file_bytes = os.path.getsize(path)
                adapter = f"{file_bytes / 2**20:.1f} ({file_bytes / full_bytes:.1%})"
            print(
                f"{method:6} {report.trainable:>12,} {report.ratio:>7.2%} {step * 1000:>8.1f} "
                f"{step / full_step:>7.2f}x {optimizer_state_bytes(model) / 2**20:>14.1f} "
                f"{memory:>13} {adapter:>12}"
            )
    print(f"full weights: {full_bytes / 2**20:.1f} MiB")

    # Inference: the base model, FL with branches, FL merged.
    base = models["full"]
    fl = models["fl"]
    merged = merged_classifier(fl)
    predictors = {}
    for name, model in (("base", base), ("fl branches", fl), ("fl merged", merged)):
        predictors[name] = keras.Model(model.inputs, model.outputs)
        predictors[name].compile(jit_compile=True)
        predictors[name].predict_on_batch(features)
    infer = {name: [] for name in predictors}
    for _ in range(args.rounds):
        for name, model in predictors.items():
            infer[name].append(
                timed(lambda model=model: model.predict_on_batch(features), args.steps)
            )
    base_time = statistics.median(infer["base"])
    gap = np.abs(
        np.asarray(predictors["fl merged"].predict_on_batch(features))
        - np.asarray(predictors["fl branches"].predict_on_batch(features))
    ).max()
    for name in predictors:
        median = statistics.median(infer[name])
        print(f"inference {name:12}: {median * 1000:7.1f} ms  {median / base_time:5.3f}x base")
    print(f"merged vs branches: max |logit difference| {gap:.2e}")


if __name__ == "__main__":
    main()
