"""pytest set-up: XLA and JAX cache flags before anything compiles; the shared
fixtures. The helpers the tests import live in tests/testing.py."""

import os
import pathlib
import tempfile

# Tiny test models compile far more than they run: XLA's LLVM optimisations
# (level 0 here) would cost more than they save. Set before any XLA compile.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

# JAX compiles every eager op once per shape: a persistent cache lets the test
# processes (pytest-xdist workers, later runs) reuse each other's compiles. The
# cache key holds the JAX version, the flags and the program, so it is never stale.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    str(pathlib.Path(tempfile.gettempdir()) / "keras_masking_tests_jax_cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

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
