"""Two processes on loopback train as one: JAX multi-process or TF multi-worker.

Run by tests/distribution/test_distribution.py (a slow test). Each process is started
with its index; together they take `--steps` `fit` steps of each method on
the same global batches, data-parallel across the processes:

* JAX: ``jax.distributed.initialize`` (CPU collectives over gloo), then
  `keras.distribution.DataParallel` over the global devices; each process
  feeds its half of every global batch.
* TensorFlow: ``TF_CONFIG`` with two workers on localhost, then
  `tf.distribute.MultiWorkerMirroredStrategy`; each process passes the
  global batches and the strategy splits them.

With ``--processes 1`` the same steps run in one process on one device (the
reference). Each process writes its final weights to ``OUT/<method>_<processes>_<index>.npz``
and prints one JSON line with its losses.

Usage:
    KERAS_BACKEND=jax python tests/distribution/multi_worker_steps.py --index 0 --processes 2 \
        --port 29411 --out /tmp/run &
    KERAS_BACKEND=jax python tests/distribution/multi_worker_steps.py --index 1 --processes 2 \
        --port 29411 --out /tmp/run
"""

import argparse
import json
import os
import sys

# Run as a script: the repository root, so that `tests.*` imports resolve.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _start(index, processes, port):
    """Joins the cluster before Keras touches a device."""
    if processes == 1:
        return None
    if BACKEND == "jax":
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"localhost:{port}", num_processes=processes, process_id=index
        )
        return None
    workers = [f"localhost:{port + worker}" for worker in range(processes)]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    )
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--port", type=int, default=29411)
    parser.add_argument("--methods", default="drop_token,exlm")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = _start(args.index, args.processes, args.port)

    import warnings

    import keras
    import numpy as np

    import keras_masking
    from tests.distribution.models import BATCH
    from tests.distribution.models import build
    from tests.distribution.models import features
    from tests.distribution.models import randomize

    warnings.filterwarnings("ignore")
    keras.config.disable_traceback_filtering()
    engine = strategy
    if BACKEND == "jax" and args.processes > 1:
        # Each process feeds its own rows (below): no sharding by Keras.
        engine = keras.distribution.DataParallel(
            devices=keras.distribution.list_devices(), auto_shard_dataset=False
        )
    results = {}
    for method in args.methods.split(","):
        # `steps` global batches: the method's batch, with other token ids.
        x, y = None, None
        with keras_masking.distribution.engine_scope(engine):
            keras.utils.set_random_seed(0)
            model, x, y, weights, callbacks = build(method, 0.0)
            randomize(model)
            rotary2d = "segment_ids" not in x
            batches = [features(seed=step, rotary2d=rotary2d) for step in range(args.steps)]
            x = {key: np.concatenate([b[key] for b in batches]) for key in x}
            if y is not None:
                y = np.concatenate([y] * args.steps)
            batch = BATCH
            if BACKEND == "jax" and args.processes > 1:
                # Each process feeds its rows of every global batch.
                batch = BATCH // args.processes
                rows = np.arange(len(next(iter(x.values())))).reshape(args.steps, BATCH)
                mine = rows[:, args.index * batch : (args.index + 1) * batch].reshape(-1)
                x = {key: value[mine] for key, value in x.items()}
                y = None if y is None else y[mine]
            history = model.fit(
                x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=callbacks
            ).history
        arrays = {f"w{i}": np.asarray(v.numpy()) for i, v in enumerate(model.trainable_variables)}
        path = os.path.join(args.out, f"{method}_{args.processes}_{args.index}.npz")
        np.savez(path + ".tmp.npz", **arrays)
        os.replace(path + ".tmp.npz", path)
        results[method] = {name: float(values[-1]) for name, values in history.items()}
    print(json.dumps({"index": args.index, "processes": args.processes, "logs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
