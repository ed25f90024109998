"""keras_masking.clue.compare and `keras-masking compare`, on a tiny model and FewCLUE EPRSTMT.

`compare` schedules `finetune` runs and scores their records in plain Python:
it runs once, on TensorFlow (``application``: tests/conftest.py); `finetune`
itself runs on both backends in tests/clue/test_runner.py.
"""

import importlib
import json
import math
import statistics

import keras
import pytest

from keras_masking.cli import main
from keras_masking.clue import compare
from keras_masking.clue import finetune
from keras_masking.clue import read_split
from keras_masking.clue.compare import choose_epoch
from keras_masking.clue.compare import half_score
from keras_masking.clue.compare import paired_difference
from keras_masking.clue.compare import parse_method
from keras_masking.clue.compare import split_halves
from keras_masking.clue.compare import summarize
from keras_masking.clue.compare import t_quantile_975
from keras_masking.clue.compare_report import markdown_report
from keras_masking.clue.compare_report import markdown_table
from keras_masking.clue.examples import TextExample
from keras_masking.clue.run_config import RunConfig
from keras_masking.clue.run_folder import RunFolder
from keras_masking.clue.tasks import get_task
from tests.clue import fixtures as clue_fixtures

# Large enough a learning rate that the tiny model's dev scores move between
# epochs; no XLA (slower to compile than these tiny runs take).
SETTINGS = dict(epochs=3, batch_size=4, max_length=24, learning_rate=3e-2, jit_compile=False)
SEEDS = [0, 1]
pytestmark = pytest.mark.application
METHOD = "drop_token=0.5"  # plain is added


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return clue_fixtures.tiny_preset(
        tmp_path_factory.mktemp("model") / "preset", max_sequence_length=64
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return clue_fixtures.eprstmt(tmp_path_factory.mktemp("data"), train=32, dev=16)


@pytest.fixture(scope="module")
def compared(data, preset, tmp_path_factory):
    output = tmp_path_factory.mktemp("compare") / "out"
    result = compare("eprstmt", data, output, [METHOD], SEEDS, preset=preset, verbose=0,
                     test_file=data / "eprstmt" / "test_public.json", **SETTINGS)  # fmt: skip
    record = json.loads((output / "compare.json").read_text(encoding="utf-8"))
    return output, result, record


def _dev(data):
    return read_split(data, "eprstmt", "dev").examples


def _saved_predictions(folder, epoch):
    document = json.loads(
        (folder / "dev_predictions" / f"epoch_{epoch}.json").read_text(encoding="utf-8")
    )
    return dict(document["predictions"])


def _accuracy(predictions, gold, ids):
    return 100.0 * sum(predictions[key] == gold[key] for key in ids) / len(ids)


# === Dev halves and the epoch rule ===
def test_the_halves_split_dev_once_and_every_run_is_scored_on_them(compared, data):
    output, _, record = compared
    halves = record["halves"]
    dev = _dev(data)
    ids = [example.id for example in dev]
    assert not set(halves["A"]) & set(halves["B"])
    assert sorted(halves["A"] + halves["B"]) == sorted(ids)
    assert (len(halves["A"]), len(halves["B"])) == (8, 8)
    assert {"A": halves["A"], "B": halves["B"]} == split_halves(ids, 0)
    assert split_halves(ids, 0) == split_halves(ids, 0)
    assert split_halves(ids, 1) != split_halves(ids, 0)
    gold = {example.id: example.label for example in dev}
    assert len(record["runs"]) == 2 * len(SEEDS)
    for run in record["runs"]:
        folder = output / run["folder"]
        history = json.loads((folder / "run.json").read_text(encoding="utf-8"))["epochs"]
        assert len(run["epochs"]) == SETTINGS["epochs"] == len(history)
        for entry, logged in zip(run["epochs"], history):
            predictions = _saved_predictions(folder, entry["epoch"])
            assert entry["dev"] == logged["dev"]["score"] == _accuracy(predictions, gold, ids)
            assert entry["half_a"] == _accuracy(predictions, gold, halves["A"])
            assert entry["half_b"] == _accuracy(predictions, gold, halves["B"])
    # The runs learn: their scores are not all one value.
    assert len({entry["half_a"] for run in record["runs"] for entry in run["epochs"]}) > 1


def test_each_run_reports_half_b_at_the_epoch_best_on_half_a(compared):
    _, _, record = compared
    for run in record["runs"]:
        best = max(entry["half_a"] for entry in run["epochs"])
        first_best = next(entry for entry in run["epochs"] if entry["half_a"] == best)
        assert run["chosen_epoch"] == first_best["epoch"]
        assert run["held_out"] == first_best["half_b"]
    # A and B disagree: the choice follows A, the report is B's at A's epoch.
    epochs = [
        {"epoch": 1, "half_a": 50.0, "half_b": 100.0},
        {"epoch": 2, "half_a": 87.5, "half_b": 62.5},
        {"epoch": 3, "half_a": 87.5, "half_b": 75.0},
    ]
    assert choose_epoch(epochs) == (2, 62.5)
    assert choose_epoch([]) == (None, None)


def test_a_half_is_scored_on_its_own_examples_only():
    examples = [TextExample(key, "很好", None, "Positive") for key in range(4)]
    predictions = {0: "Positive", 1: "Positive", 2: "Negative", 3: "Negative"}
    assert half_score("eprstmt", predictions, examples[:2]) == 100.0
    assert half_score("eprstmt", predictions, examples[2:]) == 0.0
    assert half_score("eprstmt", predictions, examples[1:3]) == 50.0


# === Statistics ===
def test_t_quantiles_are_student_t():
    known = {1: 12.706205, 2: 4.302653, 4: 2.776445, 10: 2.228139, 30: 2.042272}
    for df, value in known.items():
        assert t_quantile_975(df) == pytest.approx(value, abs=1e-6)
    # Beyond the table: t_{0.975} at 31, 60 and 120 degrees of freedom.
    assert t_quantile_975(31) == pytest.approx(2.039513, abs=1e-6)
    assert t_quantile_975(60) == pytest.approx(2.000298, abs=1e-6)
    assert t_quantile_975(120) == pytest.approx(1.979930, abs=1e-6)
    assert t_quantile_975(10**6) == pytest.approx(1.959966, abs=1e-6)
    with pytest.raises(ValueError, match="df"):
        t_quantile_975(0)


def test_t_quantiles_match_scipy_where_it_is_installed():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 201):
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-6)


def test_the_paired_difference_and_its_interval_by_hand():
    # Differences 2, 3, 3: mean 8/3, sd sqrt(1/3), half width t_{0.975,2} sd / sqrt(3).
    found = paired_difference([3.0, 5.0, 4.0], [1.0, 2.0, 1.0])
    half_width = 4.302653 * math.sqrt(1 / 3) / math.sqrt(3)
    assert found["n"] == 3 and found["t"] == 4.302653
    assert found["mean"] == pytest.approx(8 / 3)
    assert found["sd"] == pytest.approx(math.sqrt(1 / 3))
    assert found["low"] == pytest.approx(8 / 3 - half_width)
    assert found["high"] == pytest.approx(8 / 3 + half_width)
    assert found["verdict"] == "helps"
    # The smallest mean difference these seeds could tell from 0 at this spread.
    assert found["half_width"] == pytest.approx(half_width)
    assert paired_difference([1.0, 2.0, 1.0], [3.0, 5.0, 4.0])["verdict"] == "hurts"
    assert paired_difference([1.0, 5.0], [2.0, 2.0])["verdict"] == "cannot tell"
    one = paired_difference([3.0], [1.0])
    assert one["mean"] == 2.0 and one["low"] is None and one["high"] is None
    assert one["verdict"] == "cannot tell" and one["half_width"] is None


def test_the_same_difference_on_every_seed_proves_nothing():
    # +6.25 on every seed of an 80-example half is five examples, not proof.
    found = paired_difference([56.25, 62.5, 50.0], [50.0, 56.25, 43.75])
    assert found["sd"] == 0.0 and found["low"] == found["high"] == pytest.approx(6.25)
    assert found["verdict"] == "cannot tell"
    assert found["half_width"] is None  # the spread is unknown, not a resolution of 0
    rows = summarize(
        [{"method": m, "seed": s, "held_out": v, "status": "finished", "trainable_parameters": 1}
         for m, values in (("plain", (50.0, 56.25, 43.75)), ("fl", (56.25, 62.5, 50.0)))
         for s, v in zip((0, 1, 2), values)],
        ["plain", "fl"], [0, 1, 2],
    )  # fmt: skip
    assert rows[1]["verdict"] == "cannot tell"
    compare_module = importlib.import_module("keras_masking.clue.compare")
    (note,) = compare_module._zero_spread_notes(rows)
    assert note.startswith("fl: the same difference (+6.25) on every seed")
    table = "\n".join(markdown_table(rows, "held-out accuracy", [0, 1, 2]))
    assert "| fl | 1 | 56.25 ± 6.25 | +6.25 [+6.25, +6.25] | unknown | cannot tell |" in table


def test_a_failed_run_is_named_and_each_row_says_which_seeds_it_holds():
    # The note said "left out, with its pair" while each mean kept the
    # method's other seeds: the means and the difference covered different seeds, unsaid.
    scores = {"plain": (60.0, None, 55.0, 58.75), "fl": (65.0, 61.25, 57.5, None)}
    runs = [
        {"method": m, "seed": s, "held_out": v, "trainable_parameters": 1,
         "status": "finished" if v is not None else "failed", "failure": "nan loss"}
        for m, values in scores.items() for s, v in enumerate(values)
    ]  # fmt: skip
    compare_module = importlib.import_module("keras_masking.clue.compare")
    rows = summarize(runs, ["plain", "fl"], [0, 1, 2, 3])
    assert rows[0]["mean"] == pytest.approx((60.0 + 55.0 + 58.75) / 3)
    assert rows[1]["difference"]["seeds"] == [0, 2]
    assert rows[1]["difference"]["mean"] == pytest.approx(3.75)
    assert compare_module._notes(runs, [0, 1, 2, 3]) == [
        "plain seed 1 failed (nan loss); left out of its mean and of the differences at seed 1.",
        "fl seed 3 failed (nan loss); left out of its mean and of the differences at seed 3.",
    ]
    table = "\n".join(markdown_table(rows, "held-out accuracy", [0, 1, 2, 3]))
    assert "| plain | 1 | 57.92 ± 2.60 (seeds 0, 2, 3) | (baseline) |" in table
    assert "| fl | 1 | 61.25 ± 3.75 (seeds 0, 1, 2) | +3.75 [" in table
    assert "] (seeds 0, 2) |" in table


def test_the_table_names_seeds_only_where_a_mean_misses_some_of_those_run():
    """Seeds given out of order are every seed (the note said "(seeds 2, 0, 1)" on
    each row); a seed failed by every method is missing from every mean (no row said so)."""
    scores = {"plain": (60.0, 55.0, 58.75), "fl": (65.0, 61.25, 57.5)}
    runs = [
        {"method": m, "seed": s, "held_out": v, "trainable_parameters": 1, "status": "finished"}
        for m, values in scores.items() for s, v in zip((2, 0, 1), values)
    ]  # fmt: skip
    rows = summarize(runs, ["plain", "fl"], [2, 0, 1])
    assert "(seeds" not in "\n".join(markdown_table(rows, "held-out accuracy", [2, 0, 1]))
    for run in runs:
        if run["seed"] == 1:
            run.update(held_out=None, status="failed", failure="nan loss")
    rows = summarize(runs, ["plain", "fl"], [2, 0, 1])
    table = "\n".join(markdown_table(rows, "held-out accuracy", [2, 0, 1]))
    assert "| plain | 1 | 57.50 ± 3.54 (seeds 2, 0) | (baseline) |" in table
    assert "| fl | 1 | 63.12 ± 2.65 (seeds 2, 0) | +5.62 [" in table and "] (seeds 2, 0) |" in table


def test_the_noise_heading_keeps_a_rate_below_one_percent():
    runs = [
        {"method": "plain", "seed": 0, "held_out": 50.0, "trainable_parameters": 1,
         "status": "finished"}
    ]  # fmt: skip
    rows = summarize(runs, ["plain"], [0])
    arguments = {"checkpoint": None, "preset": "p", "benchmark": "fewclue", "seeds": [0]}
    record = {"arguments": {**arguments, "dev_noise": 0.005}, "halves": {"A": [1], "B": [2]},
              "summary": rows, "summary_noised": rows, "notes": []}  # fmt: skip
    text = markdown_report(record, get_task("eprstmt"))
    assert "## Under character noise (0.5% of dev's characters replaced)" in text
    assert "with 0.5% of its letters and digits replaced" in text


def test_differences_equal_up_to_float_rounding_are_the_same_difference():
    # +5 examples of 671 on every seed: 100 * k / 671 is not exact in binary,
    # so the three differences differ in their last bits (an sd of 8e-15 made
    # an interval of width 4e-14 and the verdict "helps").
    baseline = [100 * k / 671 for k in (480, 495, 502)]
    method = [100 * (k + 5) / 671 for k in (480, 495, 502)]
    assert len({m - b for m, b in zip(method, baseline)}) > 1  # not equal bit for bit
    found = paired_difference(method, baseline)
    assert found["sd"] == 0.0 and found["half_width"] is None
    assert found["verdict"] == "cannot tell" and found["mean"] == pytest.approx(500 / 671)
    # Equal differences whose float mean is not their value (0.1 three times).
    assert paired_difference([0.1] * 3, [0.0] * 3)["verdict"] == "cannot tell"
    # One example more on one seed is a spread: the interval decides.
    spread = [100 * (k + 5 + (k == 502)) / 671 for k in (480, 495, 502)]
    spread = paired_difference(spread, baseline)
    assert spread["sd"] > 0.0 and spread["verdict"] == "helps"


# === A labelled test file: scored at the epoch half A chose, choosing nothing ===
def test_the_test_file_is_scored_at_the_epoch_half_a_chose_and_chooses_nothing(compared, data):
    output, result, record = compared
    test = read_split(data, "eprstmt", "test_public").examples
    gold = {example.id: example.label for example in test}
    assert record["test_examples"] == len(test) == 16
    for run in record["runs"]:
        folder = output / run["folder"]
        history = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        for entry, logged in zip(run["epochs"], history["epochs"]):
            document = json.loads(
                (folder / "test_file_predictions" / f"epoch_{entry['epoch']}.json").read_text(
                    encoding="utf-8"
                )
            )
            predictions = dict(document["predictions"])
            assert entry["test"] == logged["test_file"]["score"]
            assert entry["test"] == _accuracy(predictions, gold, list(gold))
        chosen = next(entry for entry in run["epochs"] if entry["epoch"] == run["chosen_epoch"])
        assert run["test"] == chosen["test"]
        # The run's best epoch is dev's, whatever the test file scored.
        dev_scores = [entry["dev"]["score"] for entry in history["epochs"]]
        assert history["best"]["epoch"] == dev_scores.index(max(dev_scores)) + 1
    # The test file's epochs are half A's, not the test file's own best.
    assert [run["chosen_epoch"] for run in record["runs"]] == [
        choose_epoch(run["epochs"])[0] for run in record["runs"]
    ]
    rows = summarize(record["runs"], record["arguments"]["methods"], SEEDS, score="test")
    assert record["summary_test"] == result.test_rows == rows
    assert rows[1]["scores"] == [
        next(r["test"] for r in record["runs"] if (r["method"], r["seed"]) == (METHOD, seed))
        for seed in SEEDS
    ]
    markdown = (output / "compare.md").read_text(encoding="utf-8")
    assert f"## On the test file ({data / 'eprstmt' / 'test_public.json'}, n=16)" in markdown
    assert "one example is 12.50 points" in markdown  # half B: 8 examples
    assert "resolves ±" in markdown


@pytest.mark.parametrize(
    "name, content, error, message",
    [
        ("missing.json", None, FileNotFoundError, "no such file"),
        ("bad.json", '{"id": 1, "sentence": "好", "label": "Positive"}\nnot json\n', ValueError,
         "bad.json:2"),
        ("wrong_label.json", '{"id": 1, "sentence": "好", "label": "Great"}\n', ValueError,
         "wrong_label.json:1"),
    ],
)  # fmt: skip
def test_a_bad_test_file_is_refused_before_anything_is_written(
    data, preset, tmp_path, name, content, error, message
):
    path = tmp_path / name
    if content is not None:
        path.write_text(content, encoding="utf-8")
    for run in (compare, finetune):
        output = tmp_path / run.__name__
        arguments = ([METHOD], SEEDS) if run is compare else ()
        with pytest.raises(error, match=message):
            run("eprstmt", data, output, *arguments, preset=preset, test_file=path, **SETTINGS)
        assert not output.exists()


@pytest.mark.parametrize("split", ["dev_few_all", "train_few_all"])
def test_the_runs_own_dev_or_train_file_is_refused_as_a_test_file(data, preset, tmp_path, split):
    # Scoring dev as the "test" would report on the examples that choose the epoch.
    for run in (compare, finetune):
        output = tmp_path / run.__name__
        arguments = ([METHOD], SEEDS) if run is compare else ()
        with pytest.raises(ValueError, match=f"has the bytes of the {split[:-8]} split's file"):
            run("eprstmt", data, output, *arguments, preset=preset,
                test_file=data / "eprstmt" / f"{split}.json", **SETTINGS)  # fmt: skip
        assert not output.exists()


def test_a_test_file_sharing_examples_with_train_or_dev_is_named(tmp_path, caplog):
    from keras_masking.clue.readers import check_held_out
    from keras_masking.clue.readers import read_labelled_file
    from keras_masking.clue.readers import read_task_splits

    def write(path, rows):
        lines = [json.dumps({"id": key, "sentence": text, "label": label}, ensure_ascii=False)
                 for key, (text, label) in enumerate(rows)]  # fmt: skip
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    folder = tmp_path / "fewclue" / "eprstmt"
    folder.mkdir(parents=True)
    write(folder / "train_few_all.json", [("好吃", "Positive"), ("难吃", "Negative")])
    write(folder / "dev_few_all.json", [("很好", "Positive"), ("很差", "Negative")])
    splits = read_task_splits(tmp_path / "fewclue", "eprstmt")
    # Under other ids: one train example, one dev example, one of its own.
    write(
        tmp_path / "mixed.json", [("不错", "Positive"), ("好吃", "Positive"), ("很差", "Negative")]
    )
    write(tmp_path / "own.json", [("不错", "Positive"), ("太差", "Negative")])
    with caplog.at_level("WARNING", logger="keras_masking"):
        check_held_out(read_labelled_file(tmp_path / "own.json", "eprstmt", "fewclue"), splits)
        assert caplog.records == []
        check_held_out(read_labelled_file(tmp_path / "mixed.json", "eprstmt", "fewclue"), splits)
    (record,) = caplog.records
    assert "1 train, 1 dev of its 3 examples equal a train or dev example" in record.getMessage()


def test_a_test_file_for_chid_is_refused():
    from keras_masking.clue.readers import read_labelled_file

    with pytest.raises(ValueError, match="CHID's labels are in a separate answer file"):
        read_labelled_file("anything.json", "chid", "clue")


def test_the_summary_is_the_hand_computation_of_the_runs(compared):
    output, result, record = compared
    held = {(run["method"], run["seed"]): run["held_out"] for run in record["runs"]}
    plain = [held[("plain", seed)] for seed in SEEDS]
    method = [held[(METHOD, seed)] for seed in SEEDS]
    rows = {row["method"]: row for row in record["summary"]}
    assert [row["method"] for row in record["summary"]] == ["plain", METHOD]
    assert record["arguments"]["methods"] == ["plain", METHOD]
    assert record["notes"][0] == "'plain' was added: the baseline."
    # A method whose difference is the same on every seed gets its note (and "cannot tell").
    zero = [
        r["method"] for r in record["summary"] if r["difference"] and r["difference"]["sd"] == 0
    ]
    zero += [  # and so does one on the test file
        "on the test file, " + r["method"]
        for r in record["summary_test"]
        if r["difference"] and r["difference"]["sd"] == 0
    ]
    assert [note.split(":")[0] for note in record["notes"][1:]] == zero
    assert rows["plain"]["scores"] == plain and rows[METHOD]["scores"] == method
    assert rows[METHOD]["mean"] == pytest.approx(statistics.mean(method))
    assert rows[METHOD]["sd"] == pytest.approx(statistics.stdev(method))
    assert rows["plain"]["verdict"] == "baseline" and rows["plain"]["difference"] is None
    differences = [m - p for m, p in zip(method, plain)]
    mean = statistics.mean(differences)
    half_width = 12.706205 * statistics.stdev(differences) / math.sqrt(2)  # df 1
    difference = rows[METHOD]["difference"]
    assert difference["mean"] == pytest.approx(mean)
    assert difference["low"] == pytest.approx(mean - half_width)
    assert difference["high"] == pytest.approx(mean + half_width)
    expected = "helps" if mean - half_width > 0 else "hurts" if mean + half_width < 0 else None
    assert rows[METHOD]["verdict"] == (expected or "cannot tell")
    assert result.rows == record["summary"]
    parameters = json.loads((output / "plain" / "seed0" / "run.json").read_text("utf-8"))
    assert rows["plain"]["trainable_parameters"] == parameters["model"]["trainable_parameters"]
    table = result.markdown_path.read_text(encoding="utf-8")
    assert "epoch chosen on dev half A (n=8), reported on half B (n=8; one example is" in table
    assert "seeds 0, 1;" in table and "Task eprstmt (fewclue)" in table
    shown = f"{mean:+.2f} [{mean - half_width:+.2f}, {mean + half_width:+.2f}]"
    assert f"| {METHOD} | " in table and shown in table
    assert result.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# === Resuming ===
def test_a_second_compare_runs_nothing_and_writes_the_same_record(compared, data, preset):
    output, result, record = compared
    before = (output / "compare.json").read_bytes()
    files = sorted(output.glob("*/seed*/run.json")) + sorted(output.glob("*/seed*/*/*.json"))
    # Each run: run.json and each epoch's dev and test-file predictions.
    assert len(files) == 2 * len(SEEDS) * (1 + 2 * SETTINGS["epochs"])
    times = [path.stat().st_mtime_ns for path in files]
    again = compare("eprstmt", data, output, [METHOD], SEEDS, preset=preset, verbose=0,
                    test_file=data / "eprstmt" / "test_public.json", **SETTINGS)  # fmt: skip
    assert [path.stat().st_mtime_ns for path in files] == times  # no run trained or wrote
    assert (output / "compare.json").read_bytes() == before
    assert again.rows == result.rows


class _Interrupt(keras.callbacks.Callback):
    """Raises KeyboardInterrupt after the first batch of epoch ``epoch`` (from 0)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.current = epoch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch:
            raise KeyboardInterrupt


def test_a_resumed_run_keeps_every_epochs_dev_predictions(compared, data, preset, tmp_path):
    output, _, _ = compared
    folder = tmp_path / "run"
    kwargs = dict(preset=preset, seed=0, verbose=0, **SETTINGS)
    with pytest.raises(KeyboardInterrupt):
        finetune("eprstmt", data, folder, callbacks=[_Interrupt(1)], **kwargs)
    assert sorted(p.name for p in (folder / "dev_predictions").iterdir()) == ["epoch_1.json"]
    finetune("eprstmt", data, folder, **kwargs)
    whole = output / "plain" / "seed0" / "dev_predictions"  # the same run, uninterrupted
    for epoch in range(1, SETTINGS["epochs"] + 1):
        name = f"epoch_{epoch}.json"
        assert (folder / "dev_predictions" / name).read_bytes() == (whole / name).read_bytes()


# === Character noise ===
@pytest.fixture(scope="module")
def noised(compared, data, preset):
    output = compared[0].parent / "noised"
    result = compare(
        "eprstmt",
        data,
        output,
        [METHOD],
        SEEDS,
        preset=preset,
        verbose=0,
        dev_noise=0.3,
        **SETTINGS,
    )
    record = json.loads((output / "compare.json").read_text(encoding="utf-8"))
    return output, result, record


def test_noise_scores_half_b_of_the_noised_dev_at_the_epoch_chosen_on_clean_half_a(
    compared, noised, data, preset
):
    _, plain_result, plain_record = compared
    output, result, record = noised
    # Recorded as RunConfig and run.json name it.
    assert record["arguments"]["dev_noise"] == 0.3 and "dev_noise" not in plain_record["arguments"]
    gold = {example.id: example.label for example in _dev(data)}
    half_b = record["halves"]["B"]
    for run, clean in zip(record["runs"], plain_record["runs"]):
        # The noised dev changes no training and no choice.
        assert [entry["half_a"] for entry in run["epochs"]] == [
            entry["half_a"] for entry in clean["epochs"]
        ]
        assert (run["chosen_epoch"], run["held_out"]) == (clean["chosen_epoch"], clean["held_out"])
        for entry in run["epochs"]:
            found = RunFolder(output / run["folder"]).read_dev_predictions(
                entry["epoch"], "dev_noised"
            )
            assert entry["half_b_noised"] == _accuracy(found, gold, half_b)
        chosen = run["epochs"][run["chosen_epoch"] - 1]
        assert run["held_out_noised"] == chosen["half_b_noised"]
    assert result.rows == plain_result.rows
    assert result.noised_rows == record["summary_noised"]
    by_hand = summarize(
        [dict(run, held_out=run["held_out_noised"]) for run in record["runs"]],
        record["arguments"]["methods"],
        SEEDS,
    )
    assert result.noised_rows == by_hand
    assert plain_result.noised_rows is None and "summary_noised" not in plain_record
    markdown = result.markdown_path.read_text(encoding="utf-8")
    assert "## Under character noise (30% of dev's characters replaced)" in markdown
    assert "## Under character noise" not in plain_result.markdown_path.read_text(encoding="utf-8")
    # The two spellings together, or a seed in run_config (compare runs its seeds), refused.
    with pytest.raises(ValueError, match="dev noise given twice"):
        compare("eprstmt", data, output, [METHOD], SEEDS, preset=preset, noise=0.3, dev_noise=0.3)
    with pytest.raises(ValueError, match="seed 9"):
        compare("eprstmt", data, output, [METHOD], SEEDS, RunConfig(preset=str(preset), seed=9))
    # Resumed with the same noise (0.5's spelling, with a warning), nothing reruns.
    with pytest.warns(DeprecationWarning, match=r"compare\(noise=...\) is deprecated"):
        again = compare(
            "eprstmt", data, output, [METHOD], SEEDS, preset=preset, verbose=0,
            noise=0.3, **SETTINGS,
        )  # fmt: skip
    assert again.noised_rows == result.noised_rows


def test_noise_on_a_task_that_is_not_text_classification_is_refused(preset, tmp_path):
    with pytest.raises(ValueError, match="noise applies to text classification"):
        compare("cmrc2018", tmp_path / "none", tmp_path / "out", ["plain"], [0], preset=preset,
                dev_noise=0.1)  # fmt: skip
    assert not (tmp_path / "out").exists()


# === Bad input ===
@pytest.mark.parametrize(
    "methods, seeds, options, message",
    [
        (["dropout=0.1"], [0], {}, r"methods entry 'dropout=0.1'"),
        (["drop_token"], [0], {}, r"'drop_token' needs a value"),
        (["drop_token=0"], [0], {}, r"turns the method off; use 'plain'"),
        (["drop_token=1.5"], [0], {}, r"Bad method spec 'drop_token=1.5'.*drop_token"),
        (["plain=1"], [0], {}, r"'plain' takes no value"),
        (["lora=8", "lora=8"], [0], {}, r"Duplicate method label 'lora=8'"),
        (["asa", "asa=0.5"], [0], {}, r"'asa' and 'asa=0.5' are the same run"),
        (["fl_tuning"], [], {}, r"non-empty list of integers for seeds"),
        (["fl_tuning"], [-1], {}, r"seeds"),
        (["fl_tuning"], [0, 0], {}, r"distinct entries in seeds"),
        (["fl_tuning"], [0], {"learning_rates": {"lora": 1e-3}}, r"learning_rates names no"),
        (["fl_tuning"], [0], {"learning_rates": {"fl_tuning": 0.0}}, r"learning_rates"),
        (["fl_tuning"], [0], {"epochs": 0}, r"epochs"),
        (["fl_tuning"], [0], {"dev_noise": 1.5}, r"dev_noise in \[0.0, 1.0\]"),
        (["fl_tuning"], [0], {"seed": 3}, r"seeds as seeds=\[...\]"),
        (["plain"], [0], {"fl_tuning": 8}, r"compare takes its methods as specs"),
        (["fl_tuning"], [0], {"bogus": 1}, r"Unknown run settings \['bogus'\]"),
        # numpy refused such a seed only after compare.json was written.
        (["fl_tuning"], [99999999999], {}, r"seeds in \[0, 4294967295\]"),
        # refused only after the first run had trained.
        (["exlm_k=2"], [0], {}, r"--exlm-k needs an ExLM-pretrained backbone.*'absolute'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(
    methods, seeds, options, message, data, preset, tmp_path
):
    output = tmp_path / "out"
    with pytest.raises((ValueError, TypeError), match=message):
        compare("eprstmt", data, output, methods, seeds, preset=preset, verbose=0, **options)
    assert not output.exists()


def test_a_dev_split_too_small_to_halve_is_refused(preset, tmp_path):
    data = clue_fixtures.eprstmt(tmp_path / "data", train=4, dev=1)
    with pytest.raises(ValueError, match=r"dev split has 1 labelled example\(s\).*at least 2"):
        compare("eprstmt", data, tmp_path / "out", ["plain"], [0], preset=preset)
    assert not (tmp_path / "out").exists()


def test_a_folder_of_another_compare_or_of_other_files_is_refused(compared, data, preset, tmp_path):
    output, _, _ = compared
    before = (output / "compare.json").read_bytes()
    with pytest.raises(ValueError, match=r"other arguments \(seeds: \[0, 1\] there, \[0\] now\)"):
        compare("eprstmt", data, output, [METHOD], [0], preset=preset, verbose=0,
                test_file=data / "eprstmt" / "test_public.json", **SETTINGS)  # fmt: skip
    assert (output / "compare.json").read_bytes() == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files but no compare.json"):
        compare("eprstmt", data, foreign, [METHOD], [0], preset=preset, verbose=0)
    assert [path.name for path in foreign.iterdir()] == ["notes.txt"]


def test_method_specs_map_to_finetune_keywords():
    assert parse_method(" plain ") == {"label": "plain", "name": "plain", "switches": {}}
    assert parse_method("drop_token=0.15")["switches"] == {"drop_token": 0.15}
    assert parse_method("asa")["switches"] == {"asa": 0.5}
    assert parse_method("fl_tuning")["switches"] == {"fl_tuning": 160}
    assert parse_method("prefix_tuning=16")["switches"] == {"prefix_tuning": 16}
    assert parse_method("lora=8")["switches"] == {"lora": 8}
    assert parse_method("correct_embeddings")["switches"] == {"correct_embeddings": True}
    with pytest.raises(ValueError, match="fl_tuning"):
        parse_method("fl_tuning=1.5")


# === The command line ===
def test_the_command_line_compares_end_to_end(data, preset, tmp_path, capsys):
    output = tmp_path / "out"
    argv = ["compare", "eprstmt", str(data), str(output), "--preset", str(preset), "--quiet"]
    # One seed, two runs (several seeds: the `compared` runs above).
    argv += ["--methods", "plain", METHOD, "--seeds", "1", "--epochs", "1"]
    argv += ["--batch-size", "4", "--max-length", "24", "--learning-rate", "3e-2"]
    argv += ["--learning-rate-for", "drop_token=1e-2"]
    argv += ["--test", str(data / "eprstmt" / "test_public.json")]
    argv += [] if SETTINGS["jit_compile"] else ["--no-jit-compile"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    record = json.loads((output / "compare.json").read_text(encoding="utf-8"))
    assert record["status"] == "finished" and len(record["runs"]) == 2
    assert record["arguments"]["seeds"] == [1] and record["arguments"]["epochs"] == 1
    assert record["arguments"]["learning_rates"] == {"plain": 0.03, METHOD: 0.01}
    assert [run["learning_rate"] for run in record["runs"]] == [0.03, 0.01]
    assert all(run["chosen_epoch"] == 1 for run in record["runs"])
    assert record["arguments"]["test_file"] == str(data / "eprstmt" / "test_public.json")
    assert all(run["test"] is not None for run in record["runs"])
    assert f"| {METHOD} | " in printed and "compare.md" in printed
    assert main(argv[:4] + ["--preset", str(preset), "--methods", "dropout=1"]) == 2
    assert "methods entry 'dropout=1'" in capsys.readouterr().err
    for flag in ("--dev-noise", "--noise"):  # --noise: 0.5's spelling
        assert main(argv[:4] + ["--preset", str(preset), "--methods", "plain", flag, "2"]) == 2
        assert "noise in [0.0, 1.0]" in capsys.readouterr().err
    # --seeds takes several values, all passed on (a repeated one is refused).
    assert main(argv[:4] + ["--preset", str(preset), "--methods", "plain", "--seeds", "0", "1",
                            "0"]) == 1  # fmt: skip
    assert "Received: seeds=[0, 1, 0]" in capsys.readouterr().err


def test_the_command_line_reads_each_setting_once_and_whole(monkeypatch, capsys, tmp_path):
    """`--seed 3` was read as `--seeds 3` (argparse's abbreviations), a flag
    given twice kept its last value, `--noise` replaced a `--dev-noise` given
    beside it, a label holding "=" could not take its own rate, and `--model` /
    `--config` beside `--preset` were ignored."""
    from keras_masking import clue

    received = {}

    def stub(*args, **kwargs):  # records what reached compare, runs nothing
        received.update(args=args, kwargs=kwargs)
        raise ValueError("stub")

    monkeypatch.setattr(clue, "compare", stub)
    base = ["compare", "eprstmt", "data", str(tmp_path / "out"), "--preset", "p"]
    methods = ["--methods", "plain", "fl_tuning=64", "fl_tuning=160"]
    assert main(base + methods + ["--seed", "3"]) == 2
    assert "unrecognized arguments: --seed 3" in capsys.readouterr().err
    for noises in (
        ["--dev-noise", "0.1", "--noise", "0.3"],
        ["--noise", "0.3", "--dev-noise", "0"],
    ):
        assert main(base + methods + noises) == 2  # an explicit 0 was replaced, without a word
        assert "given twice: give each setting once" in capsys.readouterr().err
    assert main(base + methods + ["--noise", "0.3"]) == 1
    assert received["args"][5].dev_noise == 0.3
    assert "--noise is deprecated" in capsys.readouterr().err
    assert main(base + methods + ["--learning-rate-for", "fl_tuning=64=5e-3"]) == 1
    assert received["kwargs"]["learning_rates"] == {"fl_tuning=64": 5e-3}
    assert "stub" in capsys.readouterr().err
    # A flag given twice kept its last value: one method, or one of two rates.
    assert main(base + methods + ["--methods", "asa"]) == 2
    assert "--methods given twice" in capsys.readouterr().err
    rates = ["--learning-rate-for", "fl_tuning=64=5e-3", "--learning-rate-for", "fl_tuning=64=1e-3"]
    assert main(base + methods + rates) == 2
    assert "'fl_tuning=64' given twice" in capsys.readouterr().err
    assert main(base + methods + ["--model", "nezha"]) == 1
    assert "a preset carries its own" in capsys.readouterr().err


def test_a_compare_recorded_with_the_old_noise_name_resumes(tmp_path):
    """Before 0.6.0 compare.json named the dev noise ``noise``, where run.json and
    RunConfig say ``dev_noise``: such a folder still resumes, and still refuses
    another rate."""
    from keras_masking.clue.compare import _check_output

    halves = {"A": ["1"], "B": ["2"]}
    record = {"arguments": {"task": "eprstmt", "noise": 0.3}, "halves": {"split_seed": 0, **halves}}
    (tmp_path / "compare.json").write_text(json.dumps(record), encoding="utf-8")
    _check_output(tmp_path, {"task": "eprstmt", "dev_noise": 0.3}, halves)
    with pytest.raises(ValueError, match="dev_noise: 0.3 there, 0.1 now"):
        _check_output(tmp_path, {"task": "eprstmt", "dev_noise": 0.1}, halves)
