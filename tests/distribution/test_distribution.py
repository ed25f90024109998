"""Every method trains data-parallel on Keras' own engines, as on one device.

The multi-device checks run tests/distribution/distributed_steps.py in a fresh process
(two simulated CPU devices must exist before the backend starts): for each
method, one `fit` step data-parallel on two devices against the same step on
one device, from the same weights on the same global batch; the random draws
of every replica (TensorFlow); ModelParallel with `transformer_layout_map`
(JAX); and `keras_masking.clue.finetune(..., data_parallel=True)`. The
two-process run (tests/distribution/multi_worker_steps.py) is a slow test.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.distribution import batch_randint
from keras_masking.distribution import batch_uniform
from keras_masking.distribution import replica_dropout
from keras_masking.distribution import replica_position
from keras_masking.distribution import replica_share
from keras_masking.distribution import replica_sum
from keras_masking.distribution import transformer_layout_map

HERE = pathlib.Path(__file__).parent
BACKEND = keras.config.backend()
METHODS = ("drop_token", "asa+drop_token+fl_tuning", "asa_regression", "peft", "masked_lm", "exlm")


def _run_script(script, *args, timeout=600, env=None):
    environment = dict(os.environ, KERAS_BACKEND=BACKEND, **(env or {}))
    environment.pop("XLA_FLAGS", None)  # the script sets its own device count
    done = subprocess.run(
        [sys.executable, str(HERE / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        cwd=HERE,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def two_devices():
    if BACKEND not in ("tensorflow", "jax"):
        pytest.skip("data-parallel engines here: tensorflow and jax")
    return _run_script("distributed_steps.py")


def _by_method(result):
    return {entry["method"]: entry for entry in result["methods"]}


def _assert_same_step(entry):
    assert entry["start_gap"] == 0.0  # the same weights before the step
    assert entry["update_scale"] > 1e-3, entry  # the step moved the weights
    # The step's update on two devices equals one device's, to float rounding.
    assert entry["update_gap"] <= 1e-5 * max(1.0, entry["update_scale"]), entry
    assert entry["seeds_equal"], entry  # the seed generators advanced alike
    single, parallel = entry["single_logs"], entry["parallel_logs"]
    assert set(single) == set(parallel)
    for name, value in single.items():
        assert parallel[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("method", METHODS)
def test_a_data_parallel_step_equals_the_single_device_step(two_devices, method):
    entry = _by_method(two_devices)[method]
    _assert_same_step(entry)
    if BACKEND == "jax":
        assert entry["dropout"] == 0.1  # even the dropout masks agree on JAX


def test_asa_regression_takes_its_batch_softmax_over_the_global_batch(two_devices):
    """The official regression divergence is a softmax over the batch: each
    tf.distribute replica gathers the others' outputs (per-replica softmaxes
    moved the weights 0.22 apart, on an update of 0.27); JAX's DataParallel
    step is one program over the global batch."""
    entry = _by_method(two_devices)["asa_regression"]
    _assert_same_step(entry)
    divergence = entry["single_logs"]["divergence"]
    assert divergence > 0.0
    assert entry["parallel_logs"]["divergence"] == pytest.approx(divergence, rel=1e-5)


def test_the_metrics_that_average_add_up_across_replicas(two_devices):
    """ASA's masked fraction and divergence, ExLM's entropies and shares: the
    replicas of the step hold rows with different counts (padded and full), so
    a plain mean of the replicas' means would differ from the global value."""
    methods = _by_method(two_devices)
    asa = methods["asa+drop_token+fl_tuning"]
    for name in ("masked_fraction_0", "divergence", "mask_term"):
        assert name in asa["parallel_logs"]
        assert 0.0 < asa["single_logs"][name]
    exlm = methods["exlm"]
    for name in ("entropy", "aligned_entropy", "impossible", "overflow"):
        assert exlm["parallel_logs"][name] == pytest.approx(
            exlm["single_logs"][name], rel=1e-5, abs=1e-6
        )
    assert exlm["single_logs"]["entropy"] > 0.0


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute replicas draw on TensorFlow")
@pytest.mark.parametrize("draw", ["drop_token", "asa_noise", "exlm_masking"])
def test_replicas_draw_their_rows_of_the_global_draw(two_devices, draw):
    """A batch of two identical halves: the replicas' draws still differ,
    together they equal one device's draw on the global batch, and a second
    run from the same seed draws the same."""
    result = two_devices["draws"][draw]
    assert result == {"replicas_differ": True, "equal_to_one_device": True, "reproducible": True}


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute replicas draw on TensorFlow")
def test_replica_dropout_differs_across_replicas_where_keras_dropout_does_not(two_devices):
    draws = two_devices["draws"]
    assert draws["replica_dropout"]["replicas_differ"]
    assert draws["replica_dropout"]["reproducible"]
    # What the encoder layers' ReplicaDropout fixes: Keras' Dropout under
    # MirroredStrategy gives every replica the same mask.
    assert not draws["keras_dropout"]["replicas_differ"]


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution.ModelParallel runs on JAX")
def test_model_parallel_shards_the_backbone_by_its_layout_map(two_devices):
    entry = two_devices["model_parallel"]
    _assert_same_step(entry)
    layouts = entry["layouts"]
    assert layouts["embeddings/token_embedding/embeddings"] == ["model", "None"]
    block = "transformer_layer_0"
    for name in ("query", "key", "value"):
        assert layouts[f"{block}/self_attention/{name}/kernel"] == ["None", "model"]
        assert layouts[f"{block}/self_attention/{name}/bias"] == ["model"]
    assert layouts[f"{block}/self_attention/attention_output/kernel"] == ["model", "None"]
    assert layouts[f"{block}/feed_forward/intermediate_dense/kernel"] == ["None", "model"]
    assert layouts[f"{block}/feed_forward/output_dense/kernel"] == ["model", "None"]
    assert layouts["mlm_head/output_bias"] == ["model"]
    for name in ("embeddings/layer_norm/gamma", "embeddings/position_embedding/embeddings"):
        assert set(layouts[name]) == {"None"}  # replicated


def test_the_clue_runner_trains_data_parallel(two_devices):
    """A token task with DropToken: `finetune(data_parallel=True)` ends with
    one device's weights, losses and dev scores."""
    (run,) = two_devices["clue"]
    single, parallel = run["single"], run["parallel"]
    assert single["status"] == parallel["status"] == "finished"
    assert single["submission"] and parallel["submission"]
    assert parallel["distribution"]["replicas"] == 2
    assert parallel["distribution"]["engine"] == (
        "DataParallel" if BACKEND == "jax" else "MirroredStrategy"
    )
    assert single["distribution"] == {"engine": None, "replicas": 1}
    assert run["task"] == "cluener"
    assert run["weight_gap"] <= 1e-5, run
    assert parallel["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert parallel["dev"] == pytest.approx(single["dev"])
    # An odd global batch cannot split across two replicas: refused before anything is written.
    assert "batch_size that the 2 data-parallel replicas divide" in run["odd_batch"]["refused"]
    assert not run["odd_batch"]["written"]


# === The functions, on one device (no replicas: each is the plain call) ===
def test_outside_replicas_every_function_is_the_call_it_replaces():
    assert replica_position() == (0, 1)
    value = keras.ops.convert_to_tensor(0.25)
    assert float(replica_share(value, 4)) == 0.25
    assert float(replica_sum(value)) == 0.25
    seed = keras.random.SeedGenerator(3)
    expected = keras.random.uniform((2, 5), seed=keras.random.SeedGenerator(3))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(batch_uniform((2, 5), seed)),
        keras.ops.convert_to_numpy(expected),
    )
    expected = keras.random.randint((2, 5), 0, 9, seed=keras.random.SeedGenerator(3))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(batch_randint((2, 5), 0, 9, keras.random.SeedGenerator(3))),
        keras.ops.convert_to_numpy(expected),
    )
    ones = keras.ops.ones((4, 6))
    expected = keras.random.dropout(ones, 0.5, seed=keras.random.SeedGenerator(3))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(replica_dropout(ones, 0.5, keras.random.SeedGenerator(3))),
        keras.ops.convert_to_numpy(expected),
    )


def test_replica_dropout_is_keras_dropout_on_one_device():
    keras.utils.set_random_seed(0)
    ours = keras_masking.distribution.ReplicaDropout(0.4, seed=5)
    theirs = keras.layers.Dropout(0.4, seed=5)
    x = keras.ops.ones((3, 8))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ours(x, training=True)),
        keras.ops.convert_to_numpy(theirs(x, training=True)),
    )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x)), np.ones((3, 8)))


def test_layout_map_refuses_what_is_not_a_mesh_or_has_no_such_axis():
    with pytest.raises(ValueError, match="DeviceMesh"):
        transformer_layout_map("mesh")
    devices = keras.distribution.list_devices()[:1]
    mesh = keras.distribution.DeviceMesh((1,), ("batch",), devices)
    with pytest.raises(ValueError, match="model_parallel_dim_name"):
        transformer_layout_map(mesh)
    mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"), devices)
    layout_map = transformer_layout_map(mesh)
    assert tuple(layout_map["embeddings/token_embedding/embeddings"].axes) == ("model", None)


def test_the_data_parallel_engine_is_made_once_per_process():
    engine = keras_masking.distribution.data_parallel_engine()
    assert engine is keras_masking.distribution.data_parallel_engine()
    assert keras_masking.distribution.replicas_in_sync(engine) >= 1


@pytest.mark.parametrize("engine", ["x", 3, object()])
def test_engine_scope_refuses_what_is_not_an_engine(engine):
    with pytest.raises(
        ValueError,
        match=r"Expected a keras.distribution.Distribution, a tf.distribute.Strategy or None "
        rf"for engine\. Received: engine=.* of type {type(engine).__name__}\.",
    ):
        keras_masking.distribution.engine_scope(engine)
    with pytest.raises(ValueError, match="Expected a keras.distribution.Distribution"):
        keras_masking.distribution.replicas_in_sync(engine)  # was 1, silently
    with keras_masking.distribution.engine_scope(None):
        assert keras_masking.distribution.replicas_in_sync() == 1


@pytest.mark.parametrize(
    "value, message",
    [
        ("{cluster: 1}", r"It is not JSON \(.*\)\. Received: TF_CONFIG='\{cluster: 1\}'\."),
        ("[1, 2]", r"to hold a JSON object\. Received: TF_CONFIG='\[1, 2\]'\."),
        ('{"cluster": ["a:1"]}', r"cluster of TF_CONFIG to map each job name to a list"),
        ('{"cluster": {"worker": "a:1"}}', r"cluster of TF_CONFIG to map each job name"),
    ],
)
def test_malformed_tf_config_is_named(value, message, monkeypatch):
    from keras_masking.distribution import engines

    monkeypatch.setenv("TF_CONFIG", value)
    with pytest.raises(ValueError, match=message):
        engines.tf_config_cluster()
    if BACKEND == "tensorflow":
        monkeypatch.setattr(engines, "_ENGINES", {})
        with pytest.raises(ValueError, match=r"TF_CONFIG"):
            engines.data_parallel_engine()
    for empty in ("", "  ", "{}", '{"task": {"type": "worker", "index": 0}}'):
        monkeypatch.setenv("TF_CONFIG", empty)
        assert engines.tf_config_cluster() is None
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster}))
    assert engines.tf_config_cluster() == cluster


def test_finetune_refuses_a_data_parallel_that_is_not_a_bool(tmp_path):
    from keras_masking.clue import finetune

    with pytest.raises(ValueError, match="data_parallel"):
        finetune("eprstmt", tmp_path, tmp_path / "run", data_parallel="yes")


# === Two processes on loopback ===
def _free_port(count):
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            port = probe.getsockname()[1]
        if port + count < 65536:
            return port
    raise RuntimeError("no free port")


@pytest.mark.slow
def test_two_processes_train_as_one(tmp_path):
    """JAX multi-process (gloo) on loopback: two processes take two steps of
    DropToken and ExLM data-parallel; each ends with the weights of the same
    steps in one process on one device."""
    if BACKEND != "jax":
        pytest.skip(
            "Keras 3.15's TensorFlow trainer cannot fit a model with dict inputs under "
            "MultiWorkerMirroredStrategy (its symbolic build reduces the first batch "
            "with strategy.reduce, which refuses a dict); multi-host runs use JAX"
        )
    port = _free_port(2)
    environment = dict(os.environ, KERAS_BACKEND=BACKEND)
    environment.pop("XLA_FLAGS", None)
    common = ["--out", str(tmp_path), "--steps", "2"]
    reference = _run_script("multi_worker_steps.py", "--processes", "1", *common)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "multi_worker_steps.py"),
                "--index",
                str(index),
                "--processes",
                "2",
                "--port",
                str(port),
                *common,
            ],  # fmt: skip
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            cwd=HERE,
        )
        for index in range(2)
    ]
    try:
        outputs = [worker.communicate(timeout=300) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-4000:]
    for method in ("drop_token", "exlm"):
        single = np.load(tmp_path / f"{method}_1_0.npz")
        for index in range(2):
            parallel = np.load(tmp_path / f"{method}_2_{index}.npz")
            assert sorted(parallel.files) == sorted(single.files)
            for name in single.files:
                np.testing.assert_allclose(parallel[name], single[name], atol=1e-5, err_msg=name)
    assert reference["processes"] == 1
