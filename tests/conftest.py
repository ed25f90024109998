"""pytest set-up: XLA and JAX cache flags before anything compiles; the shared
fixtures. The helpers the tests import live in tests/testing.py."""

import gc
import os
import pathlib
import tempfile

# Tiny test models compile far more than they run: XLA's LLVM optimisations
# (level 0 here) would cost more than they save, and so do XLA's CPU fusion
# emitters (off here: the elemental emitters compile faster; measured on the
# five most XLA-heavy test files with empty compile caches, 37% less CPU time
# on JAX, 10% on TensorFlow). Set before any XLA compile.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
for _flag in TEST_XLA_FLAGS:
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# JAX compiles every eager op once per shape: a persistent cache lets the test
# processes (pytest-xdist workers, later runs) reuse each other's compiles. The
# cache key holds the JAX version, the flags and the program, so it is never stale.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    str(pathlib.Path(tempfile.gettempdir()) / "keras_masking_tests_jax_cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# TensorFlow's XLA steps likewise (`jit_compile=True`): a persistent cache of
# the compiled programs, one folder per TensorFlow version. TensorFlow still
# lowers every step to XLA (where an op XLA cannot compile fails); a program
# it has compiled before, on this machine, loads instead of compiling again.
if "--tf_xla_persistent_cache_directory" not in os.environ.get("TF_XLA_FLAGS", ""):
    from importlib import metadata

    try:
        _tf_version = metadata.version("tensorflow")
    except metadata.PackageNotFoundError:  # tensorflow-cpu and the like
        _tf_version = "unknown"
    _tf_cache = pathlib.Path(tempfile.gettempdir(), "keras_masking_tests_tf_xla_cache", _tf_version)
    os.environ["TF_XLA_FLAGS"] = (
        os.environ.get("TF_XLA_FLAGS", "") + f" --tf_xla_persistent_cache_directory={_tf_cache}"
    ).strip()

# Two test processes share the cores (`pytest -n 2`), and a tiny model's ops
# are too small to split across threads: one TensorFlow thread per op
# (measured on four method and layer test files: 9-16% less CPU time).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

# Building a model and tracing its steps allocates many short-lived Python
# objects; with the default thresholds (700) the cyclic collector runs often.
# Measured: a tiny classifier's build, fit and predict 7% faster on TensorFlow,
# 13% on JAX, with these.
gc.set_threshold(50_000, 20, 100)

import keras  # noqa: E402
import pytest  # noqa: E402

from tests.testing import random_features  # noqa: E402


@pytest.fixture
def features():
    return random_features()


# The global dtype policy, restored after a test that changes it.
@pytest.fixture(params=["mixed_bfloat16", "mixed_float16"])
def mixed_policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    try:
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def restore_policy():
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


# CI runs `pytest -n 2 --dist loadfile`: each test file is one unit of work,
# handed out in the order of this list. xdist's default order (most tests per
# file first) hands out the files with few but long tests (README's code,
# docstring examples, the quick demo) last, and one worker then runs them alone
# while the other idles. Heaviest first (measured, TensorFlow and JAX), then the
# rest in collection order; the order within a file is unchanged.
HEAVY_FILES_FIRST = (
    "tests/demo/test_pipeline.py",
    "tests/methods/test_enable.py",
    "tests/models/test_text_classifier_export.py",
    "tests/test_docstring_examples.py",
    "tests/distribution/test_distribution.py",
    "tests/test_readme.py",
    "tests/clue/test_compare.py",
    "tests/models/test_mixed_precision.py",
    "tests/clue/test_runner.py",
    "tests/layers/test_contracts.py",
    "tests/models/test_multilingual_e5.py",
    "tests/methods/test_asa.py",
    "tests/test_examples.py",
    "tests/models/test_unigram_graph.py",
)


def pytest_configure(config):
    # Keep the file order pytest_collection_modifyitems sets (xdist's option).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# The application end to end (the quick demo, README's code, `compare`) runs once, on
# TensorFlow: the backend the CLI, the demo and README's commands run on by
# default. Everything it is made of runs on both backends in its own tests.
# So do the application's tests that run no backend op (the demo's corpora).
APPLICATION_SKIP = pytest.mark.skip(
    reason="the application end to end (or plain Python) runs once, on TensorFlow; "
    "its layers, models and losses are tested on both backends"
)


def pytest_collection_modifyitems(config, items):
    if keras.config.backend() != "tensorflow":
        for item in items:
            if item.get_closest_marker("application"):
                item.add_marker(APPLICATION_SKIP)

    rank = {path: i for i, path in enumerate(HEAVY_FILES_FIRST)}

    def file_rank(item):
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(rank))

    items.sort(key=file_rank)  # stable: the rest keeps collection order
