"""dag_loss forward + backward: ours vs a naive autodiff loop vs a PyTorch loop.

At (B, T, N) = (64, 21, 84) [ExLM base, 128 tokens], (16, 40, 320) and
(8, 80, 512), side by side in one run, on the current Keras backend:

* ``ours``: `keras_masking.losses.dag_loss` (probability space, custom
  forward-backward), compiled (``jit_compile=True`` / ``jax.jit``); the
  inputs are log-softmaxes of unit normals, which its fast pass serves;
* ``exact``: the same compiled call on log-probs 100 times sharper (scores
  hundreds of nats apart within a step, as a confident model gives), which
  its fast pass cannot vouch for, so its exact log-space pass serves them;
* ``naive``: the textbook log-space loop (one ``logsumexp`` over a
  ``(B, N, N)`` tensor per target step) differentiated by autodiff, compiled
  the same way;
* ``torch``: the same loop in PyTorch autograd, the way DA-Transformer's
  reference does it (``-inf`` for absent edges), in a subprocess of the torch
  environment given by ``--torch-python`` (2 threads);
* ``floor``: 3T batched ``(1 x N) @ (N x N)`` products (forward once,
  backward twice), compiled: the same matrix-vector work with nothing else;
* ``FLOP time``: ``3 B T N^2`` multiply-adds at the rate this machine reaches
  on a compiled 1024 x 1024 matrix product (the "matmul FLOPs alone" bound).
  ``floor / FLOP time`` shows how far the matrix-vector work alone is from
  it: a bound on any recursion that is sequential in the target steps.

On JAX it also prints XLA's temporary-buffer size for ours and naive.

Usage:
    KERAS_BACKEND=jax python benchmarks/dag_loss.py --torch-python /path/to/torch/python
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import keras
import numpy as np
from keras import ops

from keras_masking.losses import dag_loss

SIZES = ((64, 21, 84), (16, 40, 320), (8, 80, 512))

TORCH_SCRIPT = r"""
import json, sys, time, torch
torch.set_num_threads(2)
B, T, N, rounds = map(int, sys.argv[1:5])
g = torch.Generator().manual_seed(0)
match = torch.randn(B, T, N, generator=g).log_softmax(-1).requires_grad_()
edges = torch.randn(B, N, N, generator=g)
edges = edges.masked_fill(~torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
edges = edges.log_softmax(-1).nan_to_num(nan=float("-inf")).requires_grad_()
def step():
    alpha = torch.full((B, N), float("-inf"))
    alpha[:, 0] = match[:, 0, 0]
    for i in range(1, T):
        alpha = torch.logsumexp(alpha.unsqueeze(2) + edges, dim=1) + match[:, i]
    loss = -alpha[:, -1].sum()
    loss.backward()
    match.grad = None; edges.grad = None
step()
times = []
for _ in range(rounds):
    start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
print(json.dumps(sorted(times)[len(times) // 2]))
"""


def inputs(batch, steps, vertices, seed=0, sharpness=1.0):
    rng = np.random.default_rng(seed)
    match = (rng.normal(size=(batch, steps, vertices)) * sharpness).astype("float32")
    match = match - np.logaddexp.reduce(match, axis=-1, keepdims=True)
    edges = rng.normal(size=(batch, vertices, vertices)).astype("float32")
    upper = np.triu(np.ones((vertices, vertices)), 1) > 0
    edges = np.where(upper, edges, -np.inf)
    with np.errstate(invalid="ignore"):
        edges = edges - np.logaddexp.reduce(edges, axis=-1, keepdims=True)
    edges = np.where(upper, edges, -np.inf).astype("float32")
    lengths = np.full((batch,), vertices, "int32"), np.full((batch,), steps, "int32")
    return match, edges, lengths


def naive_log_likelihood(match, edges, output_length, target_length):
    del output_length, target_length  # full-size graphs in this benchmark
    steps, vertices = match.shape[1], match.shape[2]
    edges = ops.where(ops.isfinite(edges), edges, -1e30)
    first = ops.arange(vertices)[None] == 0
    alpha = ops.where(first, match[:, 0, :], -1e30)
    for i in range(1, steps):
        alpha = ops.logsumexp(alpha[:, :, None] + edges, axis=1) + match[:, i, :]
    return alpha[:, -1]


def fast_pass_serves(match, edges, output_length, target_length):
    """Whether `dag_loss`'s fast pass vouches for these inputs (else the exact one runs)."""
    module = sys.modules["keras_masking.losses.dag_loss"]
    prepared = module._prepare(match, edges, output_length, target_length)
    graph = module._graph(prepared["match"], prepared["log_transitions"], prepared)
    return bool(module._fast_pass(graph)[3])


def matmul_floor(match, edges, output_length, target_length):
    del output_length, target_length
    probabilities = ops.exp(edges)
    state = ops.exp(match[:, 0, :])
    for _ in range(3 * match.shape[1]):
        state = ops.squeeze(ops.matmul(state[:, None, :], probabilities), 1) * 0.5
    return state[:, -1]


def compiled_value_and_grad(function):
    """A compiled (match, edges, lengths...) -> (loss, grads) on this backend."""
    if keras.config.backend() == "jax":
        import jax

        def loss(match, edges, output_length, target_length):
            return -ops.sum(function(match, edges, output_length, target_length))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def step(match, edges, output_length, target_length):
        with tf.GradientTape() as tape:
            tape.watch([match, edges])
            value = -tf.reduce_sum(function(match, edges, output_length, target_length))
        return value, tape.gradient(value, [match, edges])

    return step


def compiled_forward(function):
    if keras.config.backend() == "jax":
        import jax

        return jax.jit(function)
    import tensorflow as tf

    return tf.function(function, jit_compile=True)


def median_time(function, arguments, rounds):
    result = function(*arguments)  # compile
    keras.ops.convert_to_numpy(keras.tree.flatten(result)[0])
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        result = function(*arguments)
        keras.ops.convert_to_numpy(keras.tree.flatten(result)[0])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def multiply_add_rate(rounds):
    """Multiply-adds per second of a compiled 1024^3 matrix product."""
    size = 1024
    a = ops.convert_to_tensor(np.random.default_rng(0).normal(size=(size, size)).astype("float32"))
    product = compiled_forward(lambda x: ops.matmul(x, x))
    return size**3 / median_time(product, [a], rounds)


def jax_temp_bytes(function, arguments):
    try:
        compiled = function.lower(*arguments).compile()
        return compiled.memory_analysis().temp_size_in_bytes
    except Exception:  # memory analysis is best-effort
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--torch-python", default=None)
    parser.add_argument(
        "--sizes", default=None, help="comma-separated BxTxN, e.g. 64x21x84 (default: all three)"
    )
    args = parser.parse_args()
    sizes = SIZES
    if args.sizes:
        sizes = tuple(tuple(int(v) for v in size.split("x")) for size in args.sizes.split(","))
    print(f"backend={keras.config.backend()} (median of {args.rounds} runs, forward + backward)")
    rate = multiply_add_rate(args.rounds)
    print(f"matrix-product rate: {rate / 1e9:.1f} G multiply-adds/s")
    header = (
        f"{'B, T, N':>14} {'ours':>9} {'exact':>9} {'naive':>9} {'torch':>9} {'floor':>9} "
        f"{'FLOP t':>9}"
    )
    columns = "  ours vs torch  ours vs naive  ours / floor  ours / FLOP time  floor / FLOP time"
    print(header + columns)
    for batch, steps, vertices in sizes:
        match, edges, (output_length, target_length) = inputs(batch, steps, vertices)
        arguments = [ops.convert_to_tensor(v) for v in (match, edges, output_length, target_length)]
        ours = compiled_value_and_grad(dag_loss)
        naive = compiled_value_and_grad(naive_log_likelihood)
        value = ours(*arguments)[0]
        reference = naive(*arguments)[0]
        gap = abs(float(value) - float(reference)) / abs(float(reference))
        sharp = inputs(batch, steps, vertices, sharpness=100.0)
        sharp_arguments = [ops.convert_to_tensor(v) for v in (sharp[0], sharp[1], *sharp[2])]
        passes = (fast_pass_serves(*arguments), fast_pass_serves(*sharp_arguments))
        if passes != (True, False):
            raise RuntimeError(f"Expected the fast pass, then the exact one. Got: {passes}.")
        sharp_gap = abs(float(ours(*sharp_arguments)[0]) / float(naive(*sharp_arguments)[0]) - 1)
        gap = max(gap, sharp_gap)
        timings = {
            "ours": median_time(ours, arguments, args.rounds),
            "exact": median_time(ours, sharp_arguments, args.rounds),
            "naive": median_time(naive, arguments, args.rounds),
            "floor": median_time(compiled_forward(matmul_floor), arguments, args.rounds),
        }
        torch_time = None
        if args.torch_python:
            output = subprocess.run(
                [
                    args.torch_python,
                    "-c",
                    TORCH_SCRIPT,
                    str(batch),
                    str(steps),
                    str(vertices),
                    str(max(3, args.rounds // 2)),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            torch_time = json.loads(output.strip().splitlines()[-1])
        memory = ""
        if keras.config.backend() == "jax":
            ours_bytes = jax_temp_bytes(ours, arguments)
            naive_bytes = jax_temp_bytes(naive, arguments)
            if ours_bytes is not None and naive_bytes is not None:
                btn = batch * steps * vertices * 4
                memory = (
                    f"  temp MiB ours {ours_bytes / 2**20:.1f} "
                    f"({ours_bytes / btn:.1f} x BTN fp32), naive {naive_bytes / 2**20:.1f}"
                )
        flop_time = 3 * batch * steps * vertices**2 / rate
        torch_text = f"{torch_time * 1000:8.1f}ms" if torch_time else f"{'-':>9}"
        speed_up = f"{torch_time / timings['ours']:12.1f}x" if torch_time else f"{'-':>13}"
        print(
            f"{batch:>4},{steps:>3},{vertices:>4} {timings['ours'] * 1000:8.1f}ms "
            f"{timings['exact'] * 1000:8.1f}ms "
            f"{timings['naive'] * 1000:8.1f}ms {torch_text} {timings['floor'] * 1000:8.1f}ms "
            f"{flop_time * 1000:8.1f}ms {speed_up} {timings['naive'] / timings['ours']:13.1f}x "
            f"{timings['ours'] / timings['floor']:12.2f}x {timings['ours'] / flop_time:16.2f}x"
            f"{timings['floor'] / flop_time:18.2f}x"
            f"{memory}  (|ours-naive|/|naive| {gap:.1e})"
        )


if __name__ == "__main__":
    sys.exit(main())
