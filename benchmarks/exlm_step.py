"""An ExLM pretraining step over a plain MLM step, next to their FLOP ratio.

The same backbone (``position="rotary2d"``), the same masking (15%, all
[MASK]), k = 4, 128 tokens: `ExLMPretrainer(objective="exlm")` against
``objective="mlm"``, AdamW, compiled, side by side in alternating rounds.

FLOPs (multiply-adds, forward; backward scales both alike), per example:
    encoder   layers * (12 L d^2 + 2 L^2 d)       L = 128 (MLM) or the expanded length
    LM head   positions * (d^2 + d V)             M masks (MLM) or N = k (M + 3) states (ExLM)
    ExLM only transition N (2 (d + d) d + d H) + N^2 d, DAG loss 3 T N^2

Usage:
    KERAS_BACKEND=jax python benchmarks/exlm_step.py
"""

import argparse
import statistics
import time

import keras
import numpy as np

from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone

SIZES = {"small": (4, 256, 4, 16), "base": (12, 768, 12, 4)}
VOCABULARY = 21128


def flops(layers, hidden, length, expanded_length, masks, vertices, targets, heads):
    def encoder(n):
        return layers * (12 * n * hidden**2 + 2 * n**2 * hidden)

    mlm = encoder(length) + masks * (hidden**2 + hidden * VOCABULARY)
    exlm = (
        encoder(expanded_length)
        + vertices * (hidden**2 + hidden * VOCABULARY)
        + vertices * (4 * hidden * hidden + 2 * hidden * heads)
        + vertices**2 * hidden
        + 3 * targets * vertices**2
    )
    return mlm, exlm


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    layers, hidden, heads, batch = SIZES[args.size]
    backbone = TransformerBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=4 * hidden,
        max_sequence_length=1024,
        position="rotary2d",
        custom_position_ids=True,
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(200, VOCABULARY, (batch, args.length)).astype("int32")
    ids[:, 0], ids[:, -1] = 101, 102
    features = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": np.ones_like(ids),
    }
    models = {}
    for objective in ("mlm", "exlm"):
        model = ExLMPretrainer(
            backbone,
            k=args.k,
            mask_token_id=103,
            unselectable_token_ids=(101, 102),
            objective=objective,
            seed=0,
        )
        model.compile(optimizer=keras.optimizers.AdamW(1e-4), jit_compile=True)
        model.train_on_batch(features)
        model.train_on_batch(features)
        models[objective] = model
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                loss = model.train_on_batch(features)
            float(np.sum(loss))
            times[name].append((time.perf_counter() - start) / args.steps)
    exlm = models["exlm"]
    masks = exlm.max_picked(args.length)
    targets = exlm.max_targets(args.length)
    vertices = args.k * targets
    expanded = exlm.expansion(args.length).output_length(args.length)
    mlm_flops, exlm_flops = flops(
        layers, hidden, args.length, expanded, masks, vertices, targets, exlm.transition_heads
    )
    mlm_time, exlm_time = (statistics.median(times[n]) for n in ("mlm", "exlm"))
    print(
        f"backend={keras.config.backend()} size={args.size} ({layers} x {hidden}) batch={batch} "
        f"L={args.length} k={args.k}: expanded length {expanded}, {vertices} DAG states, "
        f"{targets} targets, {masks} masks"
    )
    print(f"  MLM step  {mlm_time * 1000:8.1f} ms")
    print(f"  ExLM step {exlm_time * 1000:8.1f} ms  = {exlm_time / mlm_time:.2f}x MLM")
    print(
        f"  FLOP ratio {exlm_flops / mlm_flops:.2f}x  (time / FLOP ratio "
        f"{exlm_time / mlm_time / (exlm_flops / mlm_flops):.2f})"
    )


if __name__ == "__main__":
    main()
