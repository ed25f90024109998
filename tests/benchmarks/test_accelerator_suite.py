"""benchmarks/accelerator_suite.py: the plan, the filters, failures, deadlines and its files.

No real benchmark runs here (each compiles for tens of seconds): the children are short
``python -c`` commands put in through `build_plan(commands=...)`. One real smoke child is in a
test marked slow.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import sys

import pytest

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
SUITE_PATH = REPOSITORY / "benchmarks" / "accelerator_suite.py"
_spec = importlib.util.spec_from_file_location("accelerator_suite", SUITE_PATH)
suite = importlib.util.module_from_spec(_spec)
sys.modules["accelerator_suite"] = suite
_spec.loader.exec_module(suite)

SIX = ("backbone_step", "drop_token", "asa", "fl_tuning", "dag_loss", "exlm_step")


def _printer(text):
    return [sys.executable, "-c", f"print({text!r})"]


FAIL = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]


def test_the_suite_covers_the_six_speed_benchmarks():
    assert suite.BENCHMARKS == SIX
    for name in SIX:
        assert (SUITE_PATH.parent / f"{name}.py").is_file()


def test_dry_run_lists_every_benchmark_at_base_size_within_eight_minutes(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OUT", raising=False)
    assert suite.main(["--dry-run", "--backend", "jax"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if "KERAS_BACKEND=jax python benchmarks/" in line]
    for name in SIX:
        commands = [line for line in rows if f"benchmarks/{name}.py" in line]
        assert commands, name
        for line in commands:
            assert "skip" not in line.split("KERAS_BACKEND")[0], line
            if name != "dag_loss":  # dag_loss has no --size: its sizes are fixed
                assert "--size base" in line, line
    assert "--skip-memory" in next(line for line in rows if "fl_tuning.py" in line)
    total, budget = map(
        int, re.search(r"planned total: (\d+) s of a (\d+) s budget", printed).groups()
    )
    assert budget == 450 and total <= budget < suite.EIGHT_MINUTES
    assert "warm-up" in printed
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_the_time_plan_fits_the_budget_and_marks_what_would_not():
    runs = suite.build_plan(backends=["jax"], mode="base", prewarm_jobs=8)
    assert {run.name for run in runs} == set(SIX)
    assert all(
        run.warm_argv and "--rounds" in run.warm_argv for run in runs if run.name != "dag_loss"
    )
    plan = suite.time_plan(runs, 450, 8, "base")
    assert all(row["fits"] for row in plan["rows"])
    assert plan["total_s"] < suite.EIGHT_MINUTES
    # Both backends: every benchmark on the first one comes first, the second pass after.
    both = suite.build_plan(backends=["jax", "tensorflow"], mode="base", prewarm_jobs=8)
    assert [run.backend for run in both] == ["jax"] * len(runs) + ["tensorflow"] * len(runs)
    plan = suite.time_plan(both, 450, 8, "base")
    assert all(row["fits"] for row in plan["rows"][: len(runs)])
    assert plan["total_s"] <= 450


def test_only_and_backend_filter(capsys):
    assert suite.main(["--dry-run", "--only", "asa,dag_loss", "--backend", "tensorflow"]) == 0
    printed = capsys.readouterr().out
    assert "KERAS_BACKEND=tensorflow python benchmarks/asa.py --size base" in printed
    assert "KERAS_BACKEND=tensorflow python benchmarks/dag_loss.py" in printed
    for name in set(SIX) - {"asa", "dag_loss"}:
        assert f"benchmarks/{name}.py" not in printed
    assert "KERAS_BACKEND=jax" not in printed
    runs = suite.build_plan(("asa",), ["jax", "tensorflow"], mode="smoke")
    assert [(run.name, run.backend) for run in runs] == [("asa", "jax"), ("asa", "tensorflow")]
    assert all("--size" in run.argv and "small" in run.argv for run in runs)
    with pytest.raises(SystemExit):
        suite.main(["--dry-run", "--only", "asa,nope"])


def test_a_failing_child_is_recorded_and_the_suite_goes_on(tmp_path):
    commands = {name: _printer(f"| {name} | 1.00x |") for name in SIX}
    commands["dag_loss"] = FAIL
    runs = suite.build_plan(SIX, ["jax"], mode="smoke", commands=commands)
    output = tmp_path / "results"
    lines = []
    report = suite.run_suite(runs, output, budget_s=120, probe=False, log=lines.append)

    statuses = {run["name"]: run["status"] for run in report["runs"]}
    assert statuses == {name: "failed" if name == "dag_loss" else "ok" for name in SIX}
    failed = next(run for run in report["runs"] if run["name"] == "dag_loss")
    assert failed["rc"] == 3 and "boom" in failed["stderr_tail"]
    assert SIX.index("exlm_step") > SIX.index("dag_loss")  # a later run still ran

    assert sorted(path.name for path in output.iterdir()) == sorted(
        [suite.JSON_NAME, suite.MARKDOWN_NAME]
    )  # no temporary files left
    saved = json.loads((output / suite.JSON_NAME).read_text())
    assert [run["name"] for run in saved["runs"]] == list(SIX)
    assert saved["machine"]["cores"] == os.cpu_count()
    for run in saved["runs"]:
        assert run["argv"] and run["wall_s"] >= 0 and "rc" in run
        if run["status"] == "ok":
            assert run["stdout"].strip() == f"| {run['name']} | 1.00x |"
    text = (output / suite.MARKDOWN_NAME).read_text()
    for name in SIX:
        assert f"\n## {name} (jax)\n" in text
        if name != "dag_loss":
            assert f"| {name} | 1.00x |" in text
    assert "**failed**, rc 3" in text and "boom" in text
    assert any("dag_loss (jax): failed, rc 3" in line for line in lines)


def test_timeouts_and_the_deadline(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    runs = suite.build_plan(("asa", "dag_loss"), ["jax"], mode="smoke", commands={"asa": sleeper})
    runs = [dataclasses.replace(run, estimate_s=1, cold_estimate_s=1) for run in runs]
    report = suite.run_suite(runs, tmp_path, budget_s=2, probe=False, log=lambda line: None)
    first, second = report["runs"]
    assert first["status"] == "timeout" and first["rc"] is None
    assert first["wall_s"] < 15
    assert second["status"] == "skipped" and "deadline" in second["reason"]
    text = (tmp_path / suite.MARKDOWN_NAME).read_text()
    assert "**timed out**" in text and "Skipped: deadline" in text
    assert "Skipped: dag_loss (jax)." in text


def test_the_warm_up_pass_runs_before_the_timed_runs(tmp_path):
    marker = tmp_path / "warmed"
    warm = [
        sys.executable,
        "-c",
        f"open({str(marker)!r} + '.' + __import__('os').environ['KERAS_BACKEND'], 'w')",
    ]
    timed = [sys.executable, "-c", f"import os; print(os.path.exists({str(marker) + '.jax'!r}))"]
    runs = suite.build_plan(("asa", "exlm_step"), ["jax"], mode="smoke", prewarm_jobs=2)
    assert all(run.warm_argv and run.estimate_s <= run.cold_estimate_s for run in runs)
    runs = [dataclasses.replace(run, argv=timed, warm_argv=warm) for run in runs]
    report = suite.run_suite(
        runs,
        tmp_path / "out",
        prewarm_jobs=2,
        jax_cache_dir=tmp_path / "cache",
        probe=False,
        log=lambda line: None,
    )
    assert [run["rc"] for run in report["warm_up"]["runs"]] == [0, 0]
    assert [run["stdout"].strip() for run in report["runs"]] == ["True", "True"]
    assert report["runs"][0]["env"]["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache")
    assert "warm-up pass" in (tmp_path / "out" / suite.MARKDOWN_NAME).read_text()


def test_the_output_goes_to_OUT_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert suite.default_output() == str(tmp_path)
    monkeypatch.delenv("OUT")
    monkeypatch.chdir(tmp_path)
    assert suite.default_output() == os.path.join(str(tmp_path), "accelerator_results")


def test_children_get_the_backend_and_find_the_package(tmp_path):
    env, changes = suite.child_env("jax", tmp_path, no_preallocation=True, paths=["/site"])
    assert env["KERAS_BACKEND"] == "jax"
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[:2] == [str(suite.REPO), "/site"]
    assert changes["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path)
    assert changes["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    env, changes = suite.child_env("tensorflow", tmp_path)
    assert env["KERAS_BACKEND"] == "tensorflow" and "JAX_COMPILATION_CACHE_DIR" not in changes


def test_warm_up_arguments_keep_the_compiled_programs():
    arguments = ["--size", "base", "--rounds", "5", "--steps", "10", "--lengths", "512"]
    assert suite._warm_arguments(arguments) == [
        "--size",
        "base",
        "--rounds",
        "1",
        "--steps",
        "1",
        "--lengths",
        "512",
    ]


@pytest.mark.slow
def test_a_real_smoke_child(tmp_path):
    import keras

    backend = keras.config.backend()
    code = suite.main(
        [
            "--smoke",
            "--only",
            "dag_loss",
            "--backend",
            backend,
            "--no-probe",
            "--output",
            str(tmp_path),
        ]
    )
    saved = json.loads((tmp_path / suite.JSON_NAME).read_text())
    assert code == 0, saved["runs"][0]["stderr_tail"]
    assert "64, 21,  84" in saved["runs"][0]["stdout"]
