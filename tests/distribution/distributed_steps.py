"""One training step of every method, on one device and data-parallel on two.

Run by tests/distribution/test_distribution.py in a fresh process, because the simulated
devices must exist before the backend starts: two host devices for JAX
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``, DataParallel) or
two logical CPUs for TensorFlow (MirroredStrategy). For each method the same
model (same initial weights, same seeds) takes one `fit` step on the same
global batch of 4, once on one device and once data-parallel; the script
prints, as one JSON line, the largest gap between the two weight updates,
the updates' size, and the logs of both. On JAX the backbone's dropout is on
(0.1): DataParallel runs one program over the global batch, so even its
masks are the same. On TensorFlow dropout is 0 in the comparison (each
replica draws its own dropout mask) and the random draws are checked apart:
the draws of DropToken, ExLM's masking and ASA's noise equal one device's
on the global batch, and the replicas' dropout masks differ.

Usage:
    KERAS_BACKEND=jax python tests/distribution/distributed_steps.py [--methods drop_token,asa]
    KERAS_BACKEND=tensorflow python tests/distribution/distributed_steps.py --timing
    KERAS_BACKEND=jax python tests/distribution/distributed_steps.py --clue  # only the CLUE runner
"""

import argparse
import json
import os
import sys

# Run as a script: the repository root, so that `tests.*` imports resolve.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import gc
import time

gc.set_threshold(50_000, 20, 100)  # as tests/conftest.py: fewer collections while tracing
BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
if BACKEND == "jax":
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0"
        + " --xla_cpu_use_fusion_emitters=false"  # as tests/conftest.py
    ).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if BACKEND == "tensorflow":
    import tensorflow as tf

    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_masking  # noqa: E402
from tests.distribution.models import ALL_METHODS  # noqa: E402
from tests.distribution.models import BATCH  # noqa: E402
from tests.distribution.models import CLS  # noqa: E402
from tests.distribution.models import LENGTH  # noqa: E402
from tests.distribution.models import MASK  # noqa: E402
from tests.distribution.models import METHODS  # noqa: E402
from tests.distribution.models import SEP  # noqa: E402
from tests.distribution.models import VOCABULARY  # noqa: E402
from tests.distribution.models import backbone  # noqa: E402
from tests.distribution.models import classifier  # noqa: E402
from tests.distribution.models import compile_classifier  # noqa: E402
from tests.distribution.models import features  # noqa: E402
from tests.distribution.models import fit_one_step  # noqa: E402

LAYOUTS = {}


def data_parallel():
    """The data-parallel engine of this backend, over the two simulated devices."""
    return keras_masking.distribution.data_parallel_engine()


def one_step(method, dropout, engine):
    """Builds the method's model under ``engine`` and takes one `fit` step."""
    with keras_masking.distribution.engine_scope(engine):
        model, before, after, logs = fit_one_step(method, dropout)
    if BACKEND == "jax" and isinstance(engine, keras.distribution.ModelParallel):
        LAYOUTS.update(
            {v.path: [str(axis) for axis in v.value.sharding.spec] for v in model.variables}
        )
    seeds = [np.array(v.numpy()) for v in model.non_trainable_variables if "seed" in v.path]
    return before, after, seeds, logs


def model_parallel():
    """JAX: ModelParallel on a (1, 2) mesh with `transformer_layout_map`."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "model"), devices)
    layout_map = keras_masking.distribution.transformer_layout_map(mesh)
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def compare(method, engine=None):
    dropout = 0.1 if BACKEND == "jax" else 0.0
    started = time.perf_counter()
    engine = data_parallel() if engine is None else engine
    before, single, single_seeds, single_logs = one_step(method, dropout, None)
    first, parallel, parallel_seeds, parallel_logs = one_step(method, dropout, engine)
    start_gap = max(float(np.abs(a - b).max()) for a, b in zip(before, first))
    update_gap = max(
        float(np.abs((s - b) - (p - b)).max()) for s, p, b in zip(single, parallel, before)
    )
    scale = max(float(np.abs(s - b).max()) for s, b in zip(single, before))
    seeds_equal = all(np.array_equal(a, b) for a, b in zip(single_seeds, parallel_seeds))
    return {
        "method": method,
        "dropout": dropout,
        "start_gap": start_gap,
        "update_gap": update_gap,
        "update_scale": scale,
        "seeds_equal": seeds_equal and len(single_seeds) == len(parallel_seeds),
        "single_logs": single_logs,
        "parallel_logs": parallel_logs,
        "seconds": round(time.perf_counter() - started, 2),
    }


# === Random draws under tf.distribute ===
def _per_replica(strategy, function, x):
    """``function(x_replica)`` on each replica of a step: the local results."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensors(x)
    distributed = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def run(batch):
        return strategy.run(function, args=(batch,))

    outputs = run(next(iter(distributed)))
    return [np.asarray(v) for v in strategy.experimental_local_results(outputs)]


def draws():
    """TensorFlow: the replicas' draws on a batch of two identical halves."""
    strategy = data_parallel()
    results = {}

    def halves_alike(x):
        x = {key: value.copy() for key, value in x.items()}
        for value in x.values():
            value[2:] = value[:2]
        return x

    def layer_draws(name, make, call, x):
        keras.utils.set_random_seed(0)
        single = np.asarray(call(make(), x))
        with strategy.scope():
            keras.utils.set_random_seed(0)
            layer = make()
        replicas = _per_replica(strategy, lambda batch: call(layer, batch), x)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            layer = make()
        again = _per_replica(strategy, lambda batch: call(layer, batch), x)
        results[name] = {
            "replicas_differ": not np.array_equal(replicas[0], replicas[1]),
            "equal_to_one_device": bool(np.array_equal(np.concatenate(replicas), single)),
            "reproducible": all(np.array_equal(a, b) for a, b in zip(again, replicas)),
        }

    def hidden_like(ids):
        return keras.ops.ones(tuple(keras.ops.shape(ids)) + (8,))

    x = halves_alike(features())
    layer_draws(
        "drop_token",
        lambda: keras_masking.layers.DropToken(0.5, protected_positions=(0,), seed=1),
        lambda layer, b: layer(hidden_like(b["token_ids"]), b["padding_mask"], training=True)[
            "keep_mask"
        ],
        x,
    )
    layer_draws(
        "asa_noise",
        lambda: keras_masking.layers.AttentionAdversary(noise=True, seed=1),
        lambda layer, b: layer(hidden_like(b["token_ids"]), b["padding_mask"], training=True),
        x,
    )
    exlm_backbone = backbone(0.0, position="rotary2d", custom_position_ids=True, num_segments=0)
    layer_draws(
        "exlm_masking",
        lambda: keras_masking.models.ExLMPretrainer(
            exlm_backbone, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP), seed=7
        ),
        lambda model, b: model.pick_tokens(b["token_ids"], b["padding_mask"]),
        halves_alike(features(rotary2d=True)),
    )
    ones = {"hidden": np.ones((BATCH, 16), "float32")}
    layer_draws(
        "replica_dropout",
        lambda: keras_masking.distribution.ReplicaDropout(0.5, seed=1),
        lambda layer, b: layer(b["hidden"], training=True),
        ones,
    )
    layer_draws(
        "keras_dropout",
        lambda: keras.layers.Dropout(0.5, seed=1),
        lambda layer, b: layer(b["hidden"], training=True),
        ones,
    )
    return results


# === The CLUE runner ===
def clue_runs(tasks=(("cluener", {"drop_token": 0.2}),)):
    """`finetune` on one device and data-parallel: each task's losses, dev
    scores and final weights. One run proves the runner's data-parallel
    wiring (engine, batches, callbacks, record); each method's data-parallel
    step is compared above (the runner only calls the `enable_*` gestures)."""
    import tempfile

    from keras_masking.clue import finetune
    from tests.clue import fixtures as clue_fixtures

    results = []
    with tempfile.TemporaryDirectory() as root:
        preset = clue_fixtures.tiny_preset(os.path.join(root, "preset"), max_sequence_length=64)
        for task, methods in tasks:
            data = os.path.join(root, task)
            clue_fixtures.WRITERS[task](data)
            runs = {}
            for name in ("single", "parallel"):
                started = time.perf_counter()
                result = finetune(
                    task,
                    data,
                    os.path.join(root, f"{task}_{name}"),
                    preset=preset,
                    epochs=2,
                    batch_size=4,
                    max_length=24,
                    learning_rate=3e-3,
                    verbose=0,
                    data_parallel=name == "parallel",
                    # TensorFlow's steps under a strategy run without XLA,
                    # whose random draws differ: compare like with like.
                    jit_compile=BACKEND == "jax",
                    **methods,
                )
                runs[name] = {
                    "status": result.status,
                    "distribution": result.record["distribution"],
                    "losses": [entry["loss"] for entry in result.history],
                    "dev": [entry["dev"]["score"] for entry in result.history],
                    "weights": [np.array(v.numpy()) for v in result.model.weights],
                    "paths": [v.path for v in result.model.weights],
                    "submission": result.submission_path is not None
                    and os.path.exists(result.submission_path),
                    "seconds": round(time.perf_counter() - started, 1),
                }
            gaps = {
                path: float(np.abs(a - b).max())
                for path, a, b in zip(
                    runs["single"]["paths"], runs["single"]["weights"], runs["parallel"]["weights"]
                )
            }
            for run in runs.values():
                run.pop("weights")
                run.pop("paths")
            worst = max(gaps, key=gaps.get)
            # A batch the two replicas cannot split evenly: refused, nothing written.
            odd = os.path.join(root, f"{task}_odd_batch")
            try:
                finetune(task, data, odd, preset=preset, batch_size=3, data_parallel=True)
                refused = None
            except ValueError as error:
                refused = str(error)
            results.append(
                {
                    "task": task,
                    "methods": methods,
                    "weight_gap": gaps[worst],
                    "worst": worst,
                    "odd_batch": {"refused": refused, "written": os.path.exists(odd)},
                    **runs,
                }
            )
    return results


# === Steps per second ===
def timing(steps=20):
    """Steps/s of a DropToken classifier on one device and data-parallel on two."""
    rates = {}
    for name, engine in (("1 device", None), ("2 devices", data_parallel())):
        with keras_masking.distribution.engine_scope(engine):
            keras.utils.set_random_seed(0)
            encoder = backbone(0.1, num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=256)
            encoder.enable_drop_token(0.15, unselectable_token_ids=(CLS, SEP), seed=3)
            model = compile_classifier(classifier(encoder))
            rng = np.random.default_rng(0)
            batch = 32
            x = {
                "token_ids": rng.integers(4, VOCABULARY, (batch * (steps + 2), LENGTH)).astype(
                    "int32"
                ),
                "segment_ids": np.zeros((batch * (steps + 2), LENGTH), "int32"),
                "padding_mask": np.ones((batch * (steps + 2), LENGTH), "int32"),
            }
            y = rng.integers(0, 3, batch * (steps + 2))
            warm = {k: v[: 2 * batch] for k, v in x.items()}
            model.fit(warm, y[: 2 * batch], batch_size=batch, verbose=0)  # compile
            timed = {k: v[2 * batch :] for k, v in x.items()}
            start = time.perf_counter()
            model.fit(timed, y[2 * batch :], batch_size=batch, verbose=0)
            rates[name] = steps / (time.perf_counter() - start)
    return {"steps_per_second": rates, "batch": 32, "length": LENGTH}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="or 'all'")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--clue", action="store_true", help="only the CLUE runner's runs")
    parser.add_argument("--no-clue", action="store_true", help="skip the CLUE runner's runs")
    parser.add_argument(
        "--no-draws", action="store_true", help="skip the draws (TF) / ModelParallel (JAX) checks"
    )
    args = parser.parse_args()
    import logging

    logging.getLogger("keras_masking").setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")
    if args.timing:
        print(json.dumps({"backend": BACKEND, **timing()}))
        return 0
    if args.clue:
        print(json.dumps({"backend": BACKEND, "clue": clue_runs()}))
        return 0
    result = {"backend": BACKEND}
    methods = ALL_METHODS if args.methods == "all" else args.methods.split(",")
    result["methods"] = [compare(method) for method in methods if method]
    if BACKEND == "tensorflow" and not args.no_draws:
        result["draws"] = draws()
    if BACKEND == "jax" and not args.no_draws:
        result["model_parallel"] = compare("masked_lm", model_parallel())
        result["model_parallel"]["layouts"] = LAYOUTS
    if not args.no_clue:
        result["clue"] = clue_runs()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
