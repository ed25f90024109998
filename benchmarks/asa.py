"""An ASA training step over a plain one, next to their FLOP ratio.

The same [CLS] classifier on a `TransformerBackbone`, compiled with AdamW and
``jit_compile=True``: plain fine-tuning against ASA (``backbone.enable_asa()``,
every layer attacked, trained by `keras_masking.methods.ASATrainer`), timed
side by side in alternating rounds at the same batch, so machine noise hits
both. Also times ``predict`` of the trainer against its own task model's and
the plain model's (ASA adds nothing at inference).

FLOPs (2 x multiply-adds), per example, L tokens, width d, FFN 4d:
    encoder forward F = layers (24 L d^2 + 4 L^2 d) (+ pooler and head)
    plain step        = F + 2F (backward)
    ASA step          = 2F (clean + adversarial) + 4F (backward through both)
                        + layers (4 L d^2 + 2 L^2 d)   adversaries' forward
                        + layers (4 L d^2 + 4 L^2 d)   their backward (no gradient to H)
The ratio does not depend on the batch: 2.12x at BERT-base, L = 128.

Usage:
    KERAS_BACKEND=jax python benchmarks/asa.py [--size base] [--batch 32]
"""

import argparse
import statistics
import time

import keras
import numpy as np

import keras_masking

SIZES = {
    # name: (layers, hidden, heads, default batch)
    "small": (4, 256, 4, 16),
    "base": (12, 768, 12, 8),
}
VOCABULARY = 21128
CLASSES = 15


def step_flops(layers, hidden, length, classes=CLASSES):
    """(plain, ASA) training-step FLOPs per example."""
    encoder = layers * (24 * length * hidden**2 + 4 * length**2 * hidden)
    head = 2 * hidden**2 + 2 * hidden * classes
    forward = encoder + head
    adversary_forward = layers * (4 * length * hidden**2 + 2 * length**2 * hidden)
    adversary_backward = layers * (4 * length * hidden**2 + 4 * length**2 * hidden)
    plain = 3 * forward
    asa = 6 * forward + adversary_forward + adversary_backward
    return plain, asa


def _classifier(layers, hidden, heads, asa=False):
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=4 * hidden,
        dropout=0.1,
    )
    pooled = keras.layers.Dropout(0.1)(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, keras.layers.Dense(CLASSES)(pooled))
    if asa:
        backbone.enable_asa()
    return model


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model


def _time(function, steps):
    start = time.perf_counter()
    for _ in range(steps):
        result = function()
    np.asarray(result if not isinstance(result, (list, dict)) else 0)
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    layers, hidden, heads, default_batch = SIZES[args.size]
    batch = args.batch or default_batch
    rng = np.random.default_rng(0)
    features = {
        "token_ids": rng.integers(1, VOCABULARY, (batch, args.length)).astype("int32"),
        "segment_ids": np.zeros((batch, args.length), "int32"),
        "padding_mask": np.ones((batch, args.length), "int32"),
    }
    labels = rng.integers(0, CLASSES, (batch,))
    plain = _compile(_classifier(layers, hidden, heads))
    asa_model = _classifier(layers, hidden, heads, asa=True)
    trainer = _compile(keras_masking.methods.ASATrainer(asa_model))
    _compile(asa_model)  # its own predict function, to compare with the trainer's
    runs = {
        "plain step": lambda: plain.train_on_batch(features, labels),
        "ASA step": lambda: trainer.train_on_batch(features, labels),
        "plain predict": lambda: plain.predict_on_batch(features),
        "task model predict": lambda: asa_model.predict_on_batch(features),
        "ASA trainer predict": lambda: trainer.predict_on_batch(features),
    }
    for run in runs.values():  # compile once, outside the timing
        _time(run, 2)
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            steps = args.steps if name.endswith("step") else 3 * args.steps
            times[name].append(_time(run, steps))
    medians = {name: statistics.median(values) for name, values in times.items()}
    plain_flops, asa_flops = step_flops(layers, hidden, args.length)
    flop_ratio = asa_flops / plain_flops
    step_ratio = medians["ASA step"] / medians["plain step"]
    print(
        f"backend={keras.config.backend()} size={args.size} layers={layers} hidden={hidden} "
        f"batch={batch} length={args.length} (median of {args.rounds} rounds x "
        f"{args.steps} steps)"
    )
    for name, median in medians.items():
        print(f"  {name:22s} {median * 1000:9.1f} ms")
    print(
        f"  ASA / plain step: {step_ratio:.3f}x; FLOP ratio {flop_ratio:.3f}x; "
        f"step / FLOP ratio {step_ratio / flop_ratio:.3f} (goal <= 1.05)"
    )
    print(
        f"  predict: ASA trainer / its task model "
        f"{medians['ASA trainer predict'] / medians['task model predict']:.3f}x, "
        f"/ the plain model {medians['ASA trainer predict'] / medians['plain predict']:.3f}x"
    )
    adversary_parameters = sum(
        int(np.prod(v.shape)) for adversary in trainer.adversaries for v in adversary.weights
    )
    print(f"  adversary (training-only) parameters: {adversary_parameters:,}")


if __name__ == "__main__":
    main()
