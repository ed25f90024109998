"""Every speed benchmark at BERT-base size, from one short command, for a GPU machine.

Runs `backbone_step`, `drop_token`, `asa`, `fl_tuning`, `dag_loss` and `exlm_step`, each in its
own process (``sys.executable benchmarks/X.py --size base --rounds R --steps S ...``) and one at
a time, so that no two are timed at once, under an overall deadline (``--budget-s``). A benchmark
that fails or runs past its timeout is recorded (return code, the last lines of its stderr) and
the suite goes on; when the deadline nears, the runs that would not finish are skipped and named.
Each benchmark still prints its own ratios, measured side by side in one process.

It records the machine (the GPU from ``nvidia-smi``, else the CPU; the packages; the devices
each backend sees) and writes, after every benchmark and atomically, ``accelerator_suite.json``
(each run's command, wall time, return code and full stdout) and ``accelerator_suite.md`` (one
section per run, its command and printed table, ready to paste into BENCHMARKS.md) into
``--output``: ``$OUT`` when set (the GPU machine returns the files written there), else
``accelerator_results/`` in the current folder.

At base size compiling, not the timed steps, takes most of the time: 26 compiled BERT-base
programs besides dag_loss's (four models in backbone_step, four rates per length in drop_token,
...), guessed at 15-25 s each on JAX on a GPU host and 40-60 s on TensorFlow, against 10-30 ms a
step. So on JAX a warm-up pass first runs
every JAX benchmark with one round of one step, several at a time, into a persistent
compilation cache (``--prewarm-jobs``; its GPU autotuning then runs beside other processes'),
and the timed pass, one benchmark at a time, loads the compiled programs instead of compiling
them again. ``--dry-run`` prints the commands and the time plan; its estimates are for an H200
host at base size, and for a 2-core x86_64 CPU at small and smoke size.

On a GPU machine that has JAX but neither Keras nor a package index, bring the wheels of keras,
keras-hub, namex and optree (4.5 MiB) in a folder such as ``.whl/``, downloaded elsewhere with

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        -d .whl keras==3.15.1 keras-hub==0.32.0 namex==0.1.0 optree==0.20.0

and give ``--wheels .whl``: the suite installs them into a temporary folder (pip, no index, no
dependencies) and puts it, and the repository, on the children's ``PYTHONPATH``.

Usage:
    python benchmarks/accelerator_suite.py
    python benchmarks/accelerator_suite.py --dry-run
    python benchmarks/accelerator_suite.py --smoke --backend tensorflow
    python benchmarks/accelerator_suite.py --only asa,dag_loss --backend jax --budget-s 200

    On a GPU machine without Keras installed, writing into $OUT:
    python3 benchmarks/accelerator_suite.py --wheels .whl > $OUT/log 2>&1; tail -n 30 $OUT/log
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS = ("backbone_step", "drop_token", "asa", "fl_tuning", "dag_loss", "exlm_step")
BACKENDS = ("jax", "tensorflow")  # the order of the passes under --backend both
EIGHT_MINUTES = 480
JSON_NAME = "accelerator_suite.json"
MARKDOWN_NAME = "accelerator_suite.md"
STDERR_LINES = 40

# The runs of each mode: (benchmark, variant, arguments), a benchmark possibly twice. base:
# BERT-base (12 x 768) on a GPU, 5 rounds of 10 steps (a step there takes 10-30 ms: the timed
# steps take seconds); drop_token's two lengths as two runs, L = 512 last, so that each warm-up
# process compiles 4 models and a short deadline drops L = 512 first; fl_tuning without its
# per-method peak-RSS processes (host memory, not the GPU's; each would compile again). small:
# the same at 4 x 256. smoke: the cheapest settings each script takes, to check on a CPU that
# every child runs with these flags.
_TIMED = ["--rounds", "5", "--steps", "10"]


def _runs(size, timed, dag):
    return [
        ("backbone_step", "", ["--size", size, *timed]),
        ("drop_token", "L=128", ["--size", size, *timed, "--lengths", "128"]),
        ("asa", "", ["--size", size, *timed]),
        ("fl_tuning", "", ["--size", size, *timed, "--skip-memory"]),
        ("dag_loss", "", dag),
        ("exlm_step", "", ["--size", size, *timed]),
        ("drop_token", "L=512", ["--size", size, *timed, "--lengths", "512"]),
    ]


_ONE = ["--rounds", "1", "--steps", "1"]
ARGUMENTS = {
    "base": _runs("base", _TIMED, ["--rounds", "15"]),
    "small": _runs("small", _TIMED, ["--rounds", "15"]),
    "smoke": [
        ("backbone_step", "", ["--size", "small", *_ONE]),
        ("drop_token", "", ["--size", "small", *_ONE, "--lengths", "128"]),
        ("asa", "", ["--size", "small", *_ONE, "--batch", "2", "--length", "32"]),
        ("fl_tuning", "", ["--size", "small", *_ONE, "--skip-memory"]),
        ("dag_loss", "", ["--rounds", "1", "--sizes", "64x21x84"]),
        ("exlm_step", "", ["--size", "small", *_ONE, "--length", "32"]),
    ],
}

# What each benchmark does, for the time plan, counted from the scripts: models built, compiled
# training steps (an ASA or ExLM step counts 2, its graph being about twice as large), compiled
# predict functions, and the training and predict calls per round and step. `drop_token` does
# this per length (two unless --lengths). `dag_loss` compiles 1 + 3 small functions per size
# (ours, naive, floor) and makes 4 calls per size and round.
_WORK = {
    "backbone_step": dict(builds=4, trains=4, predicts=0, train_calls=4, predict_calls=0),
    "drop_token": dict(builds=1, trains=4, predicts=0, train_calls=4, predict_calls=0),
    "asa": dict(builds=2, trains=3, predicts=3, train_calls=3, predict_calls=9),
    "fl_tuning": dict(builds=6, trains=4, predicts=3, train_calls=4, predict_calls=3),
    "exlm_step": dict(builds=1, trains=3, predicts=0, train_calls=3, predict_calls=0),
}

# Seconds per unit of work. "base": one H200 and its 16-core host, guessed from the scripts'
# structure and CPU measurements (a BERT-base training step compiles in 11 s on JAX and 39 s on
# TensorFlow on a 2-core x86_64 CPU; GPU autotuning adds to that). "small": this project's
# shared 2-core CPU, from --smoke runs. CACHED: a program loaded from JAX's persistent cache
# (measured on the CPU: a timed pass of the smoke runs added no cache entry).
COSTS = {
    ("base", "jax"): dict(
        startup=12, build=4, train=20, predict=5, loss=4, train_call=0.03, predict_call=0.01
    ),
    ("base", "tensorflow"): dict(
        startup=15, build=3, train=50, predict=12, loss=8, train_call=0.03, predict_call=0.01
    ),
    ("small", "jax"): dict(
        startup=12, build=2, train=10, predict=2, loss=6, train_call=0.3, predict_call=0.05
    ),
    ("small", "tensorflow"): dict(
        startup=10, build=1, train=18, predict=4, loss=9, train_call=0.3, predict_call=0.05
    ),
}
CACHED = dict(build=0.5, train=1.0, predict=0.5, loss=0.5)
PROBE_SECONDS = {"base": 15, "small": 10}
# Slow-down of warm-up processes sharing the host's cores (and the GPU): a guess for the 16-core
# host; measured on the 2-core CPU (2 at a time).
WARM_CONTENTION = {"base": 1.3, "small": 1.8}

PROBE = r"""
import json, keras
backend = keras.config.backend()
if backend == "jax":
    import jax
    devices = [f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}" for d in jax.devices()]
    version = jax.__version__
else:
    import tensorflow as tf
    devices = [f"{d.device_type}:{d.name}" for d in tf.config.list_physical_devices()]
    version = tf.__version__
print(json.dumps({"backend": backend, "version": version, "keras": keras.__version__,
                  "devices": devices}))
"""


@dataclasses.dataclass
class Run:
    """One benchmark on one backend.

    Args:
        name: the benchmark, one of `BENCHMARKS`.
        variant: what tells two runs of one benchmark apart ("L=512"), or "".
        backend: "jax" or "tensorflow" (KERAS_BACKEND of the child).
        argv: the command, run in the repository root.
        display: the command as shown in the Markdown (``KERAS_BACKEND=... python ...``).
        estimate_s: planned wall time, compiled programs loaded from the cache if warmed.
        cold_estimate_s: planned wall time when it compiles everything itself.
        warm_argv: the warm-up command (one round of one step), or None for no warm-up.
        warm_estimate_s: planned wall time of the warm-up command.
    """

    name: str
    variant: str
    backend: str
    argv: list
    display: str
    estimate_s: float
    cold_estimate_s: float
    warm_argv: list = None
    warm_estimate_s: float = 0.0

    @property
    def label(self):
        """The benchmark, its variant and its backend, e.g. "drop_token, L=512 (jax)"."""
        return f"{self.name}{', ' + self.variant if self.variant else ''} ({self.backend})"


def available_backends():
    """The backends whose package this interpreter can import, in pass order."""
    return [b for b in BACKENDS if importlib.util.find_spec(b) is not None]


def _value(arguments, flag, default):
    return arguments[arguments.index(flag) + 1] if flag in arguments else default


def _warm_arguments(arguments):
    """The same arguments with one round of one step: the same compiled programs."""
    warm = list(arguments)
    for flag in ("--rounds", "--steps"):
        if flag in warm:
            warm[warm.index(flag) + 1] = "1"
    return warm


def estimate_seconds(name, arguments, backend, mode, cached=False):
    """Planned wall time of one benchmark.

    Args:
        name: the benchmark.
        arguments: its command-line arguments (rounds, steps, lengths are read from them).
        backend: "jax" or "tensorflow".
        mode: "base", "small" or "smoke" (smoke uses the small costs).
        cached: whether its compiled programs come from a warmed compilation cache.

    Returns:
        Seconds, rounded.
    """
    costs = dict(COSTS[("base" if mode == "base" else "small", backend)])
    if cached:
        costs.update(CACHED)
    rounds = int(_value(arguments, "--rounds", 5))
    if name == "dag_loss":
        sizes = len(_value(arguments, "--sizes", "all,three,sizes").split(","))
        calls = 4 * sizes * (rounds + 1) * costs["predict_call"]
        return round(costs["startup"] + (1 + 3 * sizes) * costs["loss"] + calls)
    work = _WORK[name]
    if name == "drop_token":
        lengths = len(_value(arguments, "--lengths", "128,512").split(","))
        work = {key: value * lengths for key, value in work.items()}
    calls = rounds * int(_value(arguments, "--steps", 3)) + 2  # + the calls before the timing
    seconds = (
        costs["startup"]
        + work["builds"] * costs["build"]
        + work["trains"] * costs["train"]
        + work["predicts"] * costs["predict"]
        + work["train_calls"] * calls * costs["train_call"]
        + work["predict_calls"] * calls * costs["predict_call"]
    )
    return round(seconds)


def build_plan(names=BENCHMARKS, backends=None, mode="base", prewarm_jobs=0, commands=None):
    """The runs of one suite, in order: every benchmark on the first backend, then the next.

    Args:
        names: the benchmarks to run, a subset of `BENCHMARKS`.
        backends: the backends, in pass order (default: those importable).
        mode: "base", "small" or "smoke".
        prewarm_jobs: how many JAX warm-up processes run at once (0: no warm-up pass).
        commands: optional {benchmark: argv} replacing a benchmark's command in every run of
            it (and dropping its warm-up), for tests or a one-off variant.

    Returns:
        A list of `Run`.
    """
    backends = list(backends or available_backends())
    commands = commands or {}
    runs = []
    for backend in backends:
        for name, variant, arguments in ARGUMENTS[mode]:
            if name not in names:
                continue
            argv = [sys.executable, f"benchmarks/{name}.py", *arguments]
            display = f"KERAS_BACKEND={backend} python benchmarks/{name}.py {shlex.join(arguments)}"
            cold = estimate_seconds(name, arguments, backend, mode)
            run = Run(name, variant, backend, argv, display, cold, cold)
            if name in commands:
                run.argv = list(commands[name])
                run.display = shlex.join(run.argv)
            elif prewarm_jobs > 0 and backend == "jax":
                warm_arguments = _warm_arguments(arguments)
                run.warm_argv = [sys.executable, f"benchmarks/{name}.py", *warm_arguments]
                run.warm_estimate_s = estimate_seconds(name, warm_arguments, backend, mode)
                run.estimate_s = estimate_seconds(name, arguments, backend, mode, cached=True)
            runs.append(run)
    return runs


def warm_up_seconds(runs, jobs, mode="base"):
    """Planned wall time of the warm-up pass: longest first on `jobs` slots, with contention."""
    slots = [0.0] * max(1, jobs)
    for estimate in sorted((r.warm_estimate_s for r in runs if r.warm_argv), reverse=True):
        slots[slots.index(min(slots))] += estimate
    contention = WARM_CONTENTION["base" if mode == "base" else "small"] if jobs > 1 else 1.0
    return round(max(slots) * contention)


def time_plan(runs, budget_s, prewarm_jobs, mode, probe=True):
    """The schedule: probe, warm-up, then each run with its planned start, end and timeout.

    Returns:
        A dict with "probe_s", "warm_up_s", "rows" (one per run: run, estimate_s, timeout_s,
        end_s, fits) and "total_s" (the planned end of the last run that fits the budget).
    """
    backends = sorted({r.backend for r in runs})
    probe_s = PROBE_SECONDS["base" if mode == "base" else "small"] * len(backends) if probe else 0
    warm_s = warm_up_seconds(runs, prewarm_jobs, mode) if any(r.warm_argv for r in runs) else 0
    clock = probe_s + warm_s
    rows = []
    for run in runs:
        fits = clock + run.estimate_s <= budget_s
        if fits:
            clock += run.estimate_s
        rows.append(
            dict(
                run=run,
                estimate_s=run.estimate_s,
                timeout_s=timeout_seconds(run),
                end_s=round(clock),
                fits=fits,
            )
        )
    return dict(probe_s=probe_s, warm_up_s=warm_s, rows=rows, total_s=round(clock))


def timeout_seconds(run):
    """A run's own time limit: thrice its estimate, and room to compile all if the cache missed."""
    return round(max(60, 3 * run.estimate_s, 1.5 * run.cold_estimate_s))


def format_plan(plan, budget_s, prewarm_jobs, mode):
    """The time plan as printed by --dry-run and at the start of a run."""
    where = "one H200 and its host" if mode == "base" else "a 2-core x86_64 CPU"
    lines = [f"time plan ({mode} size; estimates for {where}; budget {budget_s:.0f} s):"]
    if plan["probe_s"]:
        lines.append(f"  device probe, one process per backend            ~{plan['probe_s']:4d} s")
    if plan["warm_up_s"]:
        warmed = sum(1 for row in plan["rows"] if row["run"].warm_argv)
        lines.append(
            f"  warm-up: {warmed} JAX runs, {min(warmed, prewarm_jobs)} at a time, 1 round x 1 step"
            f" ~{plan['warm_up_s']:4d} s"
        )
    lines.append(f"  {'run':30} {'est s':>6} {'limit s':>7} {'by s':>5}  command")
    for row in plan["rows"]:
        run = row["run"]
        end = f"{row['end_s']:5d}" if row["fits"] else " skip"
        lines.append(
            f"  {run.label:30} {row['estimate_s']:6d} {row['timeout_s']:7d} {end}  {run.display}"
        )
    over = [row["run"] for row in plan["rows"] if not row["fits"]]
    lines.append(
        f"planned total: {plan['total_s']} s of a {budget_s:.0f} s budget "
        f"(limit {EIGHT_MINUTES} s); {len(plan['rows']) - len(over)} of {len(plan['rows'])} "
        "runs fit"
    )
    if over:
        lines.append(
            "over the budget if the estimates hold (skipped unless earlier runs are faster): "
            + ", ".join(r.label for r in over)
        )
    return "\n".join(lines)


def _versions():
    names = ("keras", "keras-hub", "tensorflow", "jax", "jaxlib", "numpy", "keras-masking")
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def machine_record():
    """The machine: GPUs from nvidia-smi (if any), CPU model and cores, memory, packages."""
    record = {
        "gpus": [],
        "cpu": None,
        "cores": os.cpu_count(),
        "memory_gib": None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "packages": _versions(),
    }
    if shutil.which("nvidia-smi"):
        try:
            output = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            record["gpus"] = [line.strip() for line in output.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError) as error:
            record["gpus"] = [f"nvidia-smi failed: {error}"]
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            record["cpu"] = next(
                (
                    line.split(":", 1)[1].strip()
                    for line in cpuinfo
                    if line.startswith("model name")
                ),
                None,
            )
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            total = next(line for line in meminfo if line.startswith("MemTotal:"))
            record["memory_gib"] = round(int(total.split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        record["cpu"] = record["cpu"] or platform.processor() or None
    return record


def machine_line(machine):
    """One line naming the machine, for the Markdown and the log."""
    what = "; ".join(machine["gpus"]) if machine["gpus"] else "no GPU"
    versions = ", ".join(f"{k} {v}" for k, v in machine["packages"].items() if v)
    return (
        f"{what}; {machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB; "
        f"{machine['platform']}; Python {machine['python']}; {versions}"
    )


def child_env(backend, jax_cache_dir=None, no_preallocation=False, paths=()):
    """The environment of a benchmark process.

    Args:
        backend: its KERAS_BACKEND.
        jax_cache_dir: JAX's persistent compilation cache (JAX only; None: none).
        no_preallocation: JAX: take GPU memory as needed (several warm-up processes share it).
        paths: more folders for PYTHONPATH, after the repository (e.g. installed wheels).

    Returns:
        (the full environment, the variables set here)
    """
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [str(REPO), *map(str, paths), *inherited]
    changes = {
        "KERAS_BACKEND": backend,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }
    if backend == "jax" and jax_cache_dir:
        changes.update(
            JAX_COMPILATION_CACHE_DIR=str(jax_cache_dir),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    if backend == "jax" and no_preallocation:
        changes["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return {**os.environ, **changes}, changes


class _Child:
    """A process in its own session, its stdout and stderr in unnamed temporary files."""

    def __init__(self, argv, env):
        self.stdout = tempfile.TemporaryFile()
        self.stderr = tempfile.TemporaryFile()
        self.start = time.monotonic()
        self.process = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.stdout,
            stderr=self.stderr,
            start_new_session=True,
        )

    def wait(self, timeout):
        """Waits up to `timeout` seconds; returns the return code, or None if it was stopped."""
        try:
            return self.process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.stop()
            return None

    def stop(self):
        """Stops the child and whatever it started (its process group)."""
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue

    def outputs(self):
        """(stdout, the last lines of stderr), and closes the files."""
        texts = []
        for handle in (self.stdout, self.stderr):
            handle.seek(0)
            texts.append(handle.read().decode("utf-8", "replace"))
            handle.close()
        return texts[0], "\n".join(texts[1].splitlines()[-STDERR_LINES:])


def probe_backend(backend, timeout=120, paths=()):
    """What a backend sees: its version and devices, from one short child process."""
    env, _ = child_env(backend, paths=paths)
    child = _Child([sys.executable, "-c", PROBE], env)
    rc = child.wait(timeout)
    stdout, stderr = child.outputs()
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"backend": backend, "error": f"rc {rc}", "stderr_tail": stderr}


def _cache_entries(folder):
    if not folder or not os.path.isdir(folder):
        return 0
    return sum(1 for name in os.listdir(folder) if name.endswith("-cache"))


def warm_up(runs, jobs, deadline, env_for):
    """Runs the runs' warm-up commands, `jobs` at a time, longest first, until `deadline`.

    Args:
        runs: the `Run` list; those with a `warm_argv` are warmed.
        jobs: how many at a time.
        deadline: `time.monotonic()` by which every warm-up process is stopped.
        env_for: run -> the environment of its process.

    Returns:
        {index of the run: {"rc", "wall_s", "stderr_tail"}}; rc None where it was stopped.
    """
    queue = sorted(
        (i for i, run in enumerate(runs) if run.warm_argv),
        key=lambda i: -runs[i].warm_estimate_s,
    )
    active, results = {}, {}
    while queue or active:
        while queue and len(active) < jobs and time.monotonic() < deadline:
            index = queue.pop(0)
            active[index] = _Child(runs[index].warm_argv, env_for(runs[index]))
        if not active:
            break
        time.sleep(0.2)
        for index, child in list(active.items()):
            rc = child.process.poll()
            if rc is None and time.monotonic() >= deadline:
                child.stop()
            elif rc is None:
                continue
            _, stderr = child.outputs()
            results[index] = dict(
                rc=child.process.returncode if rc is not None else None,
                wall_s=round(time.monotonic() - child.start, 1),
                stderr_tail="" if rc == 0 else stderr,
            )
            del active[index]
    for index in queue:
        results[index] = dict(rc=None, wall_s=0.0, stderr_tail="not started: warm-up deadline")
    return results


def write_atomically(path, text):
    """Writes `text` to a temporary name beside `path`, then renames it over `path`."""
    path = pathlib.Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def _fence(text):
    text = text.rstrip("\n")
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def markdown(report):
    """The Markdown: a header naming the machine, then one section per run."""
    machine = report["machine"]
    lines = [
        "# Speed benchmarks on " + ("; ".join(machine["gpus"]) or "a machine without a GPU"),
        "",
        f"Machine: {machine_line(machine)}.",
    ]
    for probe in report.get("devices", []):
        seen = ", ".join(probe.get("devices", [])) or probe.get("error", "?")
        lines.append(f"{probe['backend']} sees: {seen}.")
    lines += [
        "",
        f"Suite: `{report['command']}`, started {report['started']}, {report['wall_s']:.0f} s "
        f"of a {report['budget_s']:.0f} s budget.",
    ]
    if report.get("warm_up"):
        warm = report["warm_up"]
        lines.append(
            f"Compiled first in a warm-up pass ({warm['jobs']} processes at a time, "
            f"{warm['wall_s']:.0f} s, XLA autotuning beside the other processes) into JAX's "
            "persistent cache; the timed runs loaded the compiled programs, one run at a time."
        )
    by_status = {}
    for run in report["runs"]:
        by_status.setdefault(run["status"], []).append(run["label"])
    for status in ("failed", "timeout", "skipped"):
        if status in by_status:
            lines.append(f"{status.capitalize()}: {', '.join(by_status[status])}.")
    for run in report["runs"]:
        lines += ["", f"## {run['label']}", "", f"```bash\n{run['display']}\n```", ""]
        if run["status"] == "skipped":
            lines.append(f"Skipped: {run['reason']}.")
            continue
        state = {"ok": "ok", "failed": f"**failed**, rc {run['rc']}", "timeout": "**timed out**"}
        lines += [f"Wall {run['wall_s']:.1f} s, {state[run['status']]}.", ""]
        if run["stdout"].strip():
            lines.append(_fence(run["stdout"]))
        if run["status"] != "ok" and run["stderr_tail"].strip():
            lines += ["", "Last lines of stderr:", "", _fence(run["stderr_tail"])]
    return "\n".join(lines) + "\n"


def write_report(report, output):
    """Writes the JSON and the Markdown into `output`, each atomically."""
    output = pathlib.Path(output)
    output.mkdir(parents=True, exist_ok=True)
    write_atomically(output / JSON_NAME, json.dumps(report, indent=1) + "\n")
    write_atomically(output / MARKDOWN_NAME, markdown(report))


def run_suite(
    runs,
    output,
    budget_s=450,
    prewarm_jobs=0,
    jax_cache_dir=None,
    probe=True,
    mode="base",
    command="",
    paths=(),
    log=print,
):
    """Runs the plan under a deadline and writes the results after every run.

    Args:
        runs: the `Run` list from `build_plan` (its argv may be replaced, e.g. in tests).
        output: the folder for accelerator_suite.json and accelerator_suite.md.
        budget_s: the overall deadline, in seconds from the start.
        prewarm_jobs: warm-up processes at a time for the runs that have a warm-up command.
        jax_cache_dir: JAX's persistent compilation cache for the JAX children (None: none).
        probe: whether to start one short process per backend to record its devices.
        mode: "base", "small" or "smoke" (recorded, and names the plan's estimates).
        command: the suite's own command line, recorded.
        paths: more PYTHONPATH folders for the children (e.g. installed wheels).
        log: where progress lines go.

    Returns:
        The report (also written as JSON).
    """
    start = time.monotonic()
    deadline = start + budget_s
    warmed = prewarm_jobs > 0 and any(run.warm_argv for run in runs)
    report = dict(
        command=command,
        started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        budget_s=budget_s,
        mode=mode,
        machine=machine_record(),
        devices=[],
        warm_up=None,
        runs=[],
        wall_s=0.0,
    )
    log(f"machine: {machine_line(report['machine'])}")

    def env_for(run):
        return child_env(run.backend, jax_cache_dir, no_preallocation=warmed, paths=paths)

    def save():
        report["wall_s"] = round(time.monotonic() - start, 1)
        write_report(report, output)

    if probe:
        for backend in dict.fromkeys(run.backend for run in runs):
            left = max(1, deadline - time.monotonic())
            seen = probe_backend(backend, timeout=min(120, left), paths=paths)
            report["devices"].append(seen)
            log(f"{backend} sees: {seen.get('devices', seen.get('error'))}")
            gpu_seen = any(
                "cuda" in d.lower() or "gpu" in d.lower() for d in seen.get("devices", [])
            )
            if report["machine"]["gpus"] and not gpu_seen:
                log(f"WARNING: nvidia-smi lists a GPU, but {backend} does not see one")
    save()
    if warmed:
        timed_total = sum(run.estimate_s for run in runs if run.warm_argv)
        warm_deadline = min(start + 0.6 * budget_s, deadline - timed_total)
        warm_deadline = max(warm_deadline, start + 0.3 * budget_s)
        log(
            f"warm-up: {sum(1 for r in runs if r.warm_argv)} runs, {prewarm_jobs} at a time, "
            f"until {warm_deadline - start:.0f} s"
        )
        warm_start = time.monotonic()
        results = warm_up(runs, prewarm_jobs, warm_deadline, lambda run: env_for(run)[0])
        report["warm_up"] = dict(
            jobs=prewarm_jobs,
            wall_s=round(time.monotonic() - warm_start, 1),
            cache_dir=str(jax_cache_dir),
            cache_entries=_cache_entries(jax_cache_dir),
            runs=[
                dict(label=runs[i].label, argv=runs[i].warm_argv, **result)
                for i, result in sorted(results.items())
            ],
        )
        for i, result in sorted(results.items()):
            log(f"  warm-up {runs[i].label}: rc {result['rc']}, {result['wall_s']} s")
        save()
    for run in runs:
        record = dict(
            name=run.name,
            variant=run.variant,
            label=run.label,
            backend=run.backend,
            argv=run.argv,
            display=run.display,
            estimate_s=run.estimate_s,
        )
        left = deadline - time.monotonic()
        if left < run.estimate_s:
            record.update(
                status="skipped",
                reason=f"deadline: {left:.0f} s left, about {run.estimate_s} s needed",
            )
            report["runs"].append(record)
            log(f"skipped {run.label}: {record['reason']}")
            save()
            continue
        timeout = min(timeout_seconds(run), left)
        env, changes = env_for(run)
        entries = _cache_entries(jax_cache_dir) if run.backend == "jax" else 0
        log(f"running {run.display}  (limit {timeout:.0f} s)")
        child = _Child(run.argv, env)
        rc = child.wait(timeout)
        wall = time.monotonic() - child.start
        stdout, stderr = child.outputs()
        status = "timeout" if rc is None else ("ok" if rc == 0 else "failed")
        record.update(
            status=status,
            rc=rc,
            wall_s=round(wall, 1),
            timeout_s=round(timeout),
            env=changes,
            stdout=stdout,
            stderr_tail=stderr,
        )
        if run.backend == "jax" and jax_cache_dir:
            record["new_cache_entries"] = _cache_entries(jax_cache_dir) - entries
        report["runs"].append(record)
        log(f"{run.label}: {status}, rc {rc}, {wall:.1f} s")
        log(stdout.rstrip() or "(no output)")
        if status != "ok":
            log("stderr tail:\n" + "\n".join(stderr.splitlines()[-10:]))
        save()
    save()
    return report


def summary(report):
    """A short table of every run, printed last."""
    lines = [f"{'run':30} {'status':8} {'wall s':>7}"]
    for run in report["runs"]:
        wall = f"{run['wall_s']:7.1f}" if "wall_s" in run else f"{'-':>7}"
        lines.append(f"{run['label']:30} {run['status']:8} {wall}")
    lines.append(f"suite: {report['wall_s']:.0f} s of a {report['budget_s']:.0f} s budget")
    return "\n".join(lines)


def install_wheels(folder, target):
    """Installs every wheel in `folder` into `target` (no index, no dependencies).

    Returns:
        `target`, to go on PYTHONPATH; this process sees the packages' versions too.
    """
    wheels = sorted(str(path) for path in pathlib.Path(folder).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {folder}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        + ["--no-cache-dir", "--upgrade", "--target", str(target), *wheels],
        check=True,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    return str(target)


def default_output():
    """$OUT when set (the GPU machine returns what is written there), else ./accelerator_results."""
    return os.environ.get("OUT") or os.path.join(os.getcwd(), "accelerator_results")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "both"),
        default="both",
        help="both: every importable one, JAX first",
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated benchmarks, e.g. asa,dag_loss"
    )
    parser.add_argument("--size", choices=("base", "small"), default="base")
    parser.add_argument(
        "--smoke", action="store_true", help="each benchmark at its cheapest settings (CPU check)"
    )
    parser.add_argument("--budget-s", type=float, default=450, help="overall deadline, seconds")
    parser.add_argument("--output", default=None, help="folder for the JSON and Markdown")
    parser.add_argument(
        "--prewarm-jobs",
        type=int,
        default=None,
        help="JAX warm-up processes at a time (default 8 at base size, else 0: no warm-up)",
    )
    parser.add_argument(
        "--jax-cache-dir",
        default=os.path.join(tempfile.gettempdir(), "keras_masking_accelerator_jax_cache"),
        help="JAX's persistent compilation cache for the children ('' for none, no warm-up)",
    )
    parser.add_argument(
        "--wheels",
        default=None,
        help="a folder of wheels to install into a temporary folder for the children first "
        "(the GPU image lacks keras: see the module docstring)",
    )
    parser.add_argument("--no-probe", action="store_true", help="do not record the devices seen")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    arguments = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(arguments)

    names = BENCHMARKS
    if args.only:
        names = tuple(name.strip() for name in args.only.split(",") if name.strip())
        unknown = sorted(set(names) - set(BENCHMARKS))
        if unknown:
            parser.error(f"unknown benchmarks {unknown}; choose from {', '.join(BENCHMARKS)}")
    site = None
    if args.wheels and not args.dry_run:
        site = tempfile.TemporaryDirectory(prefix="accelerator_suite_site_")
        install_wheels(args.wheels, site.name)
    importable = available_backends()
    backends = importable if args.backend == "both" else [args.backend]
    if not backends or not set(backends) <= set(importable):
        parser.error(f"backend {args.backend} is not importable here (importable: {importable})")
    mode = "smoke" if args.smoke else args.size
    prewarm_jobs = args.prewarm_jobs
    if prewarm_jobs is None:
        prewarm_jobs = 8 if mode == "base" else 0
    if not args.jax_cache_dir:
        prewarm_jobs = 0
    runs = build_plan(names, backends, mode, prewarm_jobs)
    plan = time_plan(runs, args.budget_s, prewarm_jobs, mode, probe=not args.no_probe)
    print(format_plan(plan, args.budget_s, prewarm_jobs, mode), flush=True)
    if args.dry_run:
        return 0
    output = args.output or default_output()
    report = run_suite(
        runs,
        output,
        budget_s=args.budget_s,
        prewarm_jobs=prewarm_jobs,
        jax_cache_dir=args.jax_cache_dir or None,
        probe=not args.no_probe,
        mode=mode,
        command=shlex.join(["python", "benchmarks/accelerator_suite.py", *arguments]),
        paths=[site.name] if site else [],
        log=lambda line: print(line, flush=True),
    )
    print(summary(report))
    print(f"results: {os.path.join(output, JSON_NAME)}, {os.path.join(output, MARKDOWN_NAME)}")
    if site:
        site.cleanup()
    return 0 if all(run["status"] == "ok" for run in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
