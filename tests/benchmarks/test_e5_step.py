"""benchmarks/e5_step.py on a miniature config, on the current backend, in this process."""

import importlib.util
import math
import pathlib
import sys

import keras
import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
MINIATURE = [
    "--backend", "current",
    "--vocabulary-size", "64",
    "--layers", "1", "--hidden", "16", "--heads", "2", "--intermediate", "32",
    "--max-length", "16", "--batch-size", "2", "--length", "8", "--fl-units", "4",
    "--repeats", "3", "--warmup", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def e5_step():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports backbone_step's timer
    try:
        spec = importlib.util.spec_from_file_location("e5_step", BENCHMARKS / "e5_step.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_miniature_run_reports_positive_times_and_their_ratios(e5_step, capsys):
    results = e5_step.main(MINIATURE)
    assert [(r["backend"], r["rows"]) for r in results] == [(keras.config.backend(), 64)]
    for result in results:
        for summary in (result, result["cpu"]):  # wall-clock and process CPU seconds
            for key in ("ours_s", "keras_hub_s", "fl_s", "full_s"):
                assert math.isfinite(summary[key]) and summary[key] > 0, (key, result)
            assert summary["ours_over_keras_hub"] == pytest.approx(
                summary["ours_s"] / summary["keras_hub_s"]
            )
            assert summary["fl_over_full"] == pytest.approx(summary["fl_s"] / summary["full_s"])
            assert summary["full_s"] == summary["ours_s"]  # one model, one measurement
        for key in ("times_s", "cpu_times_s"):
            assert all(len(times) == 3 for times in result[key].values())
        trainable = result["trainable"]
        assert trainable["ours"] == trainable["keras-hub"]  # the same weights train
        assert trainable["fl"] < trainable["ours"]
    printed = capsys.readouterr().out
    assert "| backend | rows | ours s/step | keras-hub s/step |" in printed
    assert f"| {keras.config.backend()} | 64 |" in printed
    assert "command: " in printed and '"cpus": ' in printed and '"keras-hub": ' in printed


def test_the_children_get_the_arguments_without_the_backend(e5_step):
    argv = ["--backend", "both", "--quick", "--backend=jax", "--length", "8"]
    assert e5_step.without_backend(argv) == ["--quick", "--length", "8"]
    assert e5_step.parse_arguments(["--quick"]).repeats == 2
    assert e5_step.parse_arguments([]).vocabulary_size == [e5_step.FULL_ROWS, e5_step.PRUNED_ROWS]
