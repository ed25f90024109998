"""Train-step time of TransformerBackbone against keras-hub's BertBackbone.

Both models get the same config and the same weights; a training step
(forward, backward, SGD update) is compiled with ``jit_compile=True`` and
timed side by side, alternating rounds so machine noise hits both. Prints the
median step time of each and their ratio (goal: ours / keras-hub <= 1.1 on
TensorFlow: the hooks cost nothing when unused), and the other position
schemes for reference.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/backbone_step.py [--size base]
"""

import argparse
import statistics
import time

import keras
import keras_hub
import numpy as np

import keras_masking

SIZES = {
    # name: (layers, hidden, heads, intermediate, batch, length)
    "small": (4, 256, 4, 1024, 8, 128),
    "base": (12, 768, 12, 3072, 8, 128),
}


def _trainer(backbone):
    inputs = backbone.input
    outputs = backbone(inputs)
    model = keras.Model(inputs, [outputs["sequence_output"], outputs["pooled_output"]])
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=["mse", "mse"], jit_compile=True)
    return model


def _time_steps(model, features, targets, steps):
    start = time.perf_counter()
    for _ in range(steps):
        loss = model.train_on_batch(features, targets)
    float(np.sum(loss))
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    layers, hidden, heads, intermediate, batch, length = SIZES[args.size]
    config = dict(
        vocabulary_size=21128,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=intermediate,
        dropout=0.1,
        max_sequence_length=512,
    )
    rng = np.random.default_rng(0)
    features = {
        "token_ids": rng.integers(1, 21128, (batch, length)).astype("int32"),
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }
    targets = [np.zeros((batch, length, hidden), "float32"), np.zeros((batch, hidden), "float32")]

    hub = keras_hub.models.BertBackbone(**config)
    models = {
        "keras-hub BertBackbone": _trainer(hub),
        "TransformerBackbone absolute": _trainer(keras_masking.models.from_keras_hub(hub)),
        "TransformerBackbone rotary": _trainer(
            keras_masking.models.TransformerBackbone(**config, position="rotary")
        ),
        "TransformerBackbone relative": _trainer(
            keras_masking.models.TransformerBackbone(**config, position="relative")
        ),
    }
    for model in models.values():  # compile once, outside the timing
        _time_steps(model, features, targets, 2)
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            times[name].append(_time_steps(model, features, targets, args.steps))
    print(
        f"backend={keras.config.backend()} size={args.size} layers={layers} "
        f"hidden={hidden} batch={batch} length={length} "
        f"(median of {args.rounds} rounds x {args.steps} steps)"
    )
    reference = statistics.median(times["keras-hub BertBackbone"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:32s} {median * 1000:8.1f} ms/step  ratio {median / reference:5.3f}")


if __name__ == "__main__":
    main()
