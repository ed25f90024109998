"""Train-step speed-up of DropToken (gather mode) over plain fine-tuning.

A [CLS] classifier on a TransformerBackbone is fine-tuned (AdamW, compiled
with ``jit_compile=True``) at drop rates 0 (no DropToken), 0.1, 0.25, 0.5,
for sequence lengths 128 and 512, side by side in alternating rounds. For
each rate it prints the median step time, the speed-up over rate 0, and the
ideal speed-up from the encoder's FLOP count,

    F(L) = layers * L * (24 d^2 + 4 L d)      (forward; backward is ~2x)

evaluated at the full length L and at the kept slots: L - floor(rate L)
rounded up to a multiple of ``--slot-multiple`` (8, `enable_drop_token`'s
default; 1 for exact slots).
Embedding lookups, the classifier and the optimizer update do not shrink
with L, so measured speed-ups fall below the ideal when they matter.

On TensorFlow, XLA's CPU fusion emitters are turned off unless
``--keep-xla-cpu-fusion-emitters`` is given (see keras_masking.utils.xla_cpu).

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/drop_token.py [--size base] [--slot-multiple 1]
"""

import argparse
import statistics
import time

import keras
import numpy as np

import keras_masking
from keras_masking.ops.token_dropping import static_keep_length

SIZES = {
    # name: (layers, hidden, heads, {length: batch})
    "small": (4, 256, 4, {128: 16, 512: 4}),
    "base": (12, 768, 12, {128: 8, 512: 2}),
}
RATES = (0.0, 0.1, 0.25, 0.5)


def encoder_flops(layers, hidden, length):
    return layers * length * (24 * hidden**2 + 4 * length * hidden)


def classifier(backbone, rate, jit_compile=True, slot_multiple=8):
    if rate:
        # Each rate turns DropToken on on its own copy of the backbone (same weights).
        weights = backbone.get_weights()
        backbone = keras_masking.models.TransformerBackbone.from_config(backbone.get_config())
        backbone.set_weights(weights)
        backbone.enable_drop_token(
            rate, unselectable_token_ids=(101, 102), slot_multiple=slot_multiple
        )
    inputs = backbone.input
    logits = keras.layers.Dense(15)(backbone(inputs)["pooled_output"])
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer=keras.optimizers.AdamW(2e-5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    return model


def time_steps(model, features, labels, steps):
    start = time.perf_counter()
    for _ in range(steps):
        loss = model.train_on_batch(features, labels)
    float(np.sum(loss))
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lengths", default=None, help="comma-separated subset, e.g. 512")
    parser.add_argument(
        "--no-xla",
        action="store_true",
        help="compile without XLA (TensorFlow graph mode)",
    )
    parser.add_argument(
        "--slot-multiple",
        type=int,
        default=8,
        help="round the kept slots up to a multiple of this (1: exact slots)",
    )
    parser.add_argument(
        "--keep-xla-cpu-fusion-emitters",
        action="store_true",
        help="TensorFlow: do not turn XLA CPU's fusion emitters off (shows the slowdown)",
    )
    args = parser.parse_args()
    if not args.keep_xla_cpu_fusion_emitters:
        keras_masking.utils.disable_xla_cpu_fusion_emitters()
    layers, hidden, heads, batches = SIZES[args.size]
    print(
        f"backend={keras.config.backend()} xla={not args.no_xla} size={args.size} "
        f"layers={layers} hidden={hidden} slot_multiple={args.slot_multiple} "
        f"xla_cpu_fusion_emitters_off={keras_masking.utils.xla_cpu_fusion_emitters_disabled()}"
    )
    rng = np.random.default_rng(0)
    if args.lengths:
        wanted = {int(value) for value in args.lengths.split(",")}
        batches = {length: batch for length, batch in batches.items() if length in wanted}
    for length, batch in batches.items():
        backbone = keras_masking.models.TransformerBackbone(
            vocabulary_size=21128,
            num_layers=layers,
            num_heads=heads,
            hidden_dim=hidden,
            intermediate_dim=4 * hidden,
            max_sequence_length=512,
        )
        token_ids = rng.integers(200, 21128, (batch, length)).astype("int32")
        token_ids[:, 0], token_ids[:, -1] = 101, 102
        features = {
            "token_ids": token_ids,
            "segment_ids": np.zeros((batch, length), "int32"),
            "padding_mask": np.ones((batch, length), "int32"),
        }
        labels = rng.integers(0, 15, batch)
        models = {
            rate: classifier(backbone, rate, not args.no_xla, args.slot_multiple) for rate in RATES
        }
        for model in models.values():
            time_steps(model, features, labels, 2)  # compile outside the timing
        times = {rate: [] for rate in RATES}
        for _ in range(args.rounds):
            for rate, model in models.items():
                times[rate].append(time_steps(model, features, labels, args.steps))
        base = statistics.median(times[0.0])
        print(f"L={length} batch={batch} (median of {args.rounds} rounds x {args.steps} steps)")
        for rate in RATES:
            median = statistics.median(times[rate])
            kept = static_keep_length(length, rate, multiple=args.slot_multiple)
            ideal = encoder_flops(layers, hidden, length) / encoder_flops(layers, hidden, kept)
            print(
                f"  rate {rate:4.2f} kept {kept:3d}: {median * 1000:8.1f} ms/step  "
                f"speed-up {base / median:5.2f}x  ideal {ideal:5.2f}x  "
                f"({base / median / ideal:5.1%} of ideal)"
            )


if __name__ == "__main__":
    main()
