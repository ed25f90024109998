"""The examples/ scripts, each run once on a tiny preset and tiny CLUE data.

Every script is loaded from its file and its ``main(argv)`` called in this
process. Each fine-tunes one epoch (one compiled fit); the checks read what it
wrote (model.keras, results.json, adapter.npz, the run folder) and recompute
the numbers a wrong script would get wrong from the saved files.
"""

import importlib.util
import json
import pathlib

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.clue import ModelSource
from keras_masking.clue import check_submission
from keras_masking.clue import decode_predictions
from keras_masking.clue import encode_examples
from keras_masking.clue import read_split
from keras_masking.clue import score
from keras_masking.clue.batches import predict_in_batches
from keras_masking.methods import load_adapter
from keras_masking.methods import read_adapter
from keras_masking.models import ExLMEncoder
from keras_masking.models import TransformerBackbone
from keras_masking.utils import xla_cpu_fusion_emitters_disabled
from tests.clue import fixtures as clue_fixtures
from tests.clue.helpers import CLS
from tests.clue.helpers import MASK
from tests.clue.helpers import PAD
from tests.clue.helpers import SEP
from tests.clue.helpers import tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MAX_LENGTH = 16
TRAINING = ["--epochs", "1", "--batch-size", "8", "--max-length", str(MAX_LENGTH)]


@pytest.fixture(scope="module", autouse=True)
def examples_on_path():
    """The scripts import their shared module, clue_common, from their folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))
        yield


def _script(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return clue_fixtures.tiny_preset(tmp_path_factory.mktemp("model") / "preset")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """FewCLUE EPRSTMT (single sentences) and OCNLI (pairs), every split a full batch of 8."""
    root = clue_fixtures.eprstmt(tmp_path_factory.mktemp("data"))
    premises = ["今天天气很好", "他去公园玩", "小明喜欢看书", "北京是中国的首都"]
    hypotheses = {"entailment": "天气很好", "neutral": "他喜欢电影", "contradiction": "不好"}

    def lines(count, start, labelled=True):
        records = []
        for index in range(count):
            label = list(hypotheses)[index % 3]
            record = {
                "id": start + index,
                "sentence1": premises[index % 4],
                "sentence2": hypotheses[label],
            }
            if labelled:
                record["label"] = label
            records.append(record)
        return records

    folder = root / "ocnli"
    clue_fixtures.write_lines(folder / "train_few_all.json", lines(16, 0))
    clue_fixtures.write_lines(folder / "dev_few_all.json", lines(8, 100))
    clue_fixtures.write_lines(folder / "test.json", lines(8, 200, labelled=False))
    return root


def _run(name, output_dir, *flags):
    """Runs examples/NAME.py's main; returns its results.json."""
    assert _script(name).main([*flags, "--output-dir", str(output_dir)]) == 0
    return json.loads((output_dir / "results.json").read_text(encoding="utf-8"))


def _logits(model, features):
    """Full batches of 8 (the last one padded): one predict compile per model."""
    return np.concatenate(list(predict_in_batches(model, features, batch_size=8)))


def _predictions(model, data, task, split_name):
    """The model's predictions (id -> label) on a split."""
    split = read_split(data, task, split_name)
    encoded = encode_examples(task, split.examples, tokenizer(), MAX_LENGTH)
    return decode_predictions(task, _logits(model, encoded.features), encoded, split.examples)


def _dev_score(model, data, task):
    dev = read_split(data, task, "dev")
    return score(task, _predictions(model, data, task, "dev"), dev.examples)["score"]


def _weights(model):
    return {variable.path: keras.ops.convert_to_numpy(variable) for variable in model.weights}


def _only(model, kind):
    (layer,) = [layer for layer in model.layers if isinstance(layer, kind)]
    return layer


def _assert_submission_holds(predictions, output_dir, submission, data, task):
    """The submission file is valid for CLUE and holds exactly ``predictions``."""
    path = output_dir / submission
    assert check_submission(path, task, "fewclue", read_split(data, task, "test")) == []
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert {line["id"]: line["label"] for line in lines} == predictions


# === One script per method ===
def test_embedding_correction_starts_fine_tuning_from_the_corrected_table(tmp_path, preset, data):
    # At a learning rate of 1e-9 one epoch moves no weight by more than ~1e-9, so
    # the saved table is the one training started from.
    flags = ["--preset", str(preset), "--task", "eprstmt", "--data-dir", str(data), *TRAINING]
    results = _run("clue_embedding_correction", tmp_path, *flags, "--learning-rate", "1e-9")
    model = keras.saving.load_model(tmp_path / "model.keras")
    table = keras.ops.convert_to_numpy(_only(model, TransformerBackbone).token_embedding.embeddings)
    original = TransformerBackbone.from_preset(str(preset))
    raw = keras.ops.convert_to_numpy(original.token_embedding.embeddings)
    keras_masking.correct_mlm_embeddings(
        original, mask_token_id=MASK, unselectable_token_ids=[PAD, CLS, SEP, MASK]
    )
    corrected = keras.ops.convert_to_numpy(original.token_embedding.embeddings)
    np.testing.assert_allclose(table, corrected, atol=1e-6)
    assert np.abs(corrected - raw).max() > 1e-3
    assert results["dev"]["score"] == pytest.approx(_dev_score(model, data, "eprstmt"))


def test_drop_token_protects_cls_and_sep_and_reports_the_saved_models_scores(
    tmp_path, preset, data, monkeypatch
):
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the script sets it; restored afterwards
    flags = ["--preset", str(preset), "--task", "eprstmt", "--data-dir", str(data), *TRAINING]
    results = _run("clue_drop_token", tmp_path, *flags, "--rate", "0.25", "--learning-rate", "1e-3")
    assert xla_cpu_fusion_emitters_disabled()
    model = keras.saving.load_model(tmp_path / "model.keras")
    drop_token = _only(model, TransformerBackbone).drop_token
    assert (drop_token.rate, list(drop_token.unselectable_token_ids)) == (0.25, [CLS, SEP])
    assert results["dev"]["score"] == pytest.approx(_dev_score(model, data, "eprstmt"))
    # FewCLUE's labelled test_public is scored and the unlabelled test submitted.
    test_public = read_split(data, "eprstmt", "test_public").examples
    expected = score("eprstmt", _predictions(model, data, "eprstmt", "test_public"), test_public)
    assert results["test_public"] == pytest.approx(expected)
    test = _predictions(model, data, "eprstmt", "test")
    _assert_submission_holds(test, tmp_path, results["submission"], data, "eprstmt")


def test_asa_trains_the_model_and_saves_its_adversaries_for_resuming(tmp_path, preset, data):
    flags = ["--preset", str(preset), "--task", "ocnli", "--data-dir", str(data), *TRAINING]
    results = _run("clue_asa", tmp_path, *flags, "--tau", "0.5", "--learning-rate", "1e-3")
    assert {"divergence", "mask_term", "masked_fraction_0"} <= set(results["history"])
    model = keras.saving.load_model(tmp_path / "model.keras")
    backbone = _only(model, TransformerBackbone)
    assert backbone.asa["tau"] == 0.5 and backbone.asa["layers"] == [0]
    assert [variable.path for variable in model.weights if "advers" in variable.path]
    # The trainer's steps changed the saved model's backbone.
    trained = _weights(_only(model, TransformerBackbone))
    pretrained = _weights(TransformerBackbone.from_preset(str(preset)))
    assert max(np.abs(trained[path] - pretrained[path]).max() for path in pretrained) > 1e-4
    assert results["dev"]["score"] == pytest.approx(_dev_score(model, data, "ocnli"))
    test = _predictions(model, data, "ocnli", "test")
    _assert_submission_holds(test, tmp_path, results["submission"], data, "ocnli")


def test_fl_tuning_trains_only_the_added_units_and_merges_exactly(tmp_path, preset, data):
    flags = ["--preset", str(preset), "--task", "eprstmt", "--data-dir", str(data), *TRAINING]
    results = _run("clue_fl_tuning", tmp_path, *flags, "--units", "4", "--learning-rate", "1e-2")
    description, arrays = read_adapter(tmp_path / "adapter.npz")
    assert description["method"]["add_ffn"] == {"units": 4, "layers": [0]}
    w1, b1, w2, b2, head_kernel, head_bias = arrays  # addFFN, then the head
    assert [w1.shape, w2.shape, head_kernel.shape] == [(16, 4), (4, 16), (16, 2)]

    merged = keras.saving.load_model(tmp_path / "model.keras")
    weights = _weights(merged)
    pretrained = _weights(TransformerBackbone.from_preset(str(preset)))
    ffn = "transformer_layer_0/feed_forward/"
    for path, value in pretrained.items():  # everything else stayed frozen
        if not path.startswith(ffn):
            np.testing.assert_array_equal(weights[path], value, err_msg=path)
    merged_units = (  # the pretrained units, then the trained ones
        ("intermediate_dense/kernel", w1, 1),
        ("intermediate_dense/bias", b1, 0),
        ("output_dense/kernel", w2, 0),
    )
    for name, added, axis in merged_units:
        expected = np.concatenate([pretrained[ffn + name], added], axis)
        np.testing.assert_array_equal(weights[ffn + name], expected, err_msg=name)
    bias = pretrained[ffn + "output_dense/bias"] + b2
    np.testing.assert_allclose(weights[ffn + "output_dense/bias"], bias, atol=1e-7)
    np.testing.assert_array_equal(weights["logits/kernel"], head_kernel)

    # The adapter on a fresh copy of the preset (branches) computes what the merged model does.
    branched = keras_masking.clue.build_task_model(
        "eprstmt", TransformerBackbone.from_preset(str(preset)), max_length=MAX_LENGTH
    )
    load_adapter(branched, tmp_path / "adapter.npz")
    dev = read_split(data, "eprstmt", "dev").examples
    features = encode_examples("eprstmt", dev, tokenizer(), MAX_LENGTH).features
    np.testing.assert_allclose(_logits(merged, features), _logits(branched, features), atol=1e-5)
    assert results["dev"]["score"] == pytest.approx(_dev_score(branched, data, "eprstmt"))


def test_exlm_fine_tunes_through_the_expanding_encoder(tmp_path, data):
    preset = clue_fixtures.tiny_preset(
        tmp_path / "exlm_preset", position="rotary2d", custom_position_ids=True
    )
    flags = ["--preset", str(preset), "--task", "eprstmt", "--data-dir", str(data), *TRAINING]
    # k=1: the encoder read [CLS] and [SEP] at (index, 0), not at (index, 1) where
    # ExLM pretraining (and the CLUE runner's encoder) put them.
    results = _run("clue_exlm", tmp_path / "run", *flags, "--k", "1", "--learning-rate", "1e-3")
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    encoder = _only(model, ExLMEncoder)
    assert (encoder.k, encoder.mask_token_id, tuple(encoder.unselectable_token_ids)) == (
        1,
        MASK,
        (CLS, SEP),
    )
    assert encoder.objective == "exlm"
    assert results["dev"]["score"] == pytest.approx(_dev_score(model, data, "eprstmt"))
    test = _predictions(model, data, "eprstmt", "test")
    _assert_submission_holds(test, tmp_path / "run", results["submission"], data, "eprstmt")


def test_text_classifier_fits_raw_sentence_pairs_and_saves_a_keras_hub_preset(
    tmp_path, preset, data
):
    import keras_hub

    flags = ["--preset", str(preset), "--task", "ocnli", "--data-dir", str(data), *TRAINING]
    results = _run("clue_text_classifier", tmp_path, *flags, "--learning-rate", "1e-3")
    classifier = keras_hub.models.TextClassifier.from_preset(str(tmp_path / "preset"))
    assert isinstance(classifier, keras_masking.models.TransformerTextClassifier)

    # Raw sentence pairs in (dev and test in one call), label strings out.
    dev, test = (read_split(data, "ocnli", name) for name in ("dev", "test"))
    examples = dev.examples + test.examples
    pairs = ([e.text_a for e in examples], [e.text_b for e in examples])
    classes = classifier.predict(pairs, batch_size=8, verbose=0).argmax(-1)
    labels = [dev.labels[i] for i in classes]
    on_dev = {e.id: label for e, label in zip(dev.examples, labels[: len(dev.examples)])}
    on_test = {e.id: label for e, label in zip(test.examples, labels[len(dev.examples) :])}
    assert results["dev"] == pytest.approx(score("ocnli", on_dev, dev.examples))
    _assert_submission_holds(on_test, tmp_path, results["submission"], data, "ocnli")
    assert isinstance(keras.saving.load_model(tmp_path / "model.keras"), type(classifier))


# === Flags ===
BAD_FLAGS = [
    ("clue_embedding_correction", ["--epochs", "0"], "--epochs"),
    ("clue_embedding_correction", ["--learning-rate", "0"], "--learning-rate"),
    ("clue_embedding_correction", ["--max-length", "4"], "--max-length"),
    ("clue_embedding_correction", ["--task", "c3"], "--task"),
    ("clue_embedding_correction", ["--vocab", "missing.txt"], "--vocab"),
    ("clue_drop_token", ["--rate", "1.0"], "--rate"),
    ("clue_asa", ["--tau", "-1"], "--tau"),
    ("clue_fl_tuning", ["--units", "0"], "--units"),
    ("clue_exlm", ["--k", "0"], "--k"),
    ("clue_text_classifier", ["--batch-size", "0"], "--batch-size"),
]


@pytest.fixture
def nothing_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(ModelSource, "load", refuse)


@pytest.mark.parametrize("name, flags, message", BAD_FLAGS)
def test_bad_flags_exit_2_naming_the_flag_before_anything_loads(
    name, flags, message, tmp_path, preset, data, capsys, nothing_loads
):
    argv = ["--preset", str(preset), "--data-dir", str(data), "--output-dir", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as exit_info:
        _script(name).main([*argv, *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


MODEL_AND_DATA_FLAGS = [
    ("clue_drop_token", ["--preset", "missing", "--data-dir", "DATA"], "--preset 'missing'"),
    ("clue_asa", ["--preset", "PRESET", "--data-dir", "missing"], "--data-dir 'missing'"),
    ("clue_exlm", ["--checkpoint", "bert_model.ckpt"], "--checkpoint: an ExLM backbone"),
]


@pytest.mark.parametrize("name, flags, message", MODEL_AND_DATA_FLAGS)
def test_missing_files_and_models_that_do_not_fit_are_refused_by_flag(
    name, flags, message, preset, data, capsys, nothing_loads
):
    places = {"PRESET": str(preset), "DATA": str(data)}
    argv = [places.get(flag, flag) for flag in flags]
    if "--data-dir" not in argv:
        argv += ["--data-dir", str(data)]
    with pytest.raises(SystemExit) as exit_info:
        _script(name).main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_used_output_dir_is_never_written_over(tmp_path, preset, data, capsys, nothing_loads):
    used = tmp_path / "used"
    used.mkdir()
    (used / "results.json").write_text("earlier run", encoding="utf-8")
    argv = ["--preset", str(preset), "--data-dir", str(data), "--task", "eprstmt"]
    with pytest.raises(SystemExit):
        _script("clue_asa").main([*argv, "--output-dir", str(used)])
    assert "--output-dir" in capsys.readouterr().err
    assert (used / "results.json").read_text(encoding="utf-8") == "earlier run"


def test_data_dir_defaults_to_the_fewclue_folder_of_keras_masking_data(tmp_path, monkeypatch):
    (tmp_path / "fewclue").mkdir()
    monkeypatch.setenv("KERAS_MASKING_DATA", str(tmp_path))
    parser = _script("clue_common").argument_parser("A script.\n")
    assert parser.parse_args(["--preset", "p"]).data_dir == str(tmp_path / "fewclue")


def test_data_dir_is_required_without_a_fewclue_folder(monkeypatch, capsys):
    common = _script("clue_common")
    monkeypatch.setattr(common, "DEFAULT_DATA_DIR", pathlib.Path("no") / "such" / "folder")
    with pytest.raises(SystemExit) as exit_info:
        common.argument_parser("A script.\n").parse_args(["--preset", "p"])
    assert exit_info.value.code == 2
    assert "--data-dir" in capsys.readouterr().err


def test_the_default_output_dir_is_a_new_folder_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = _script("clue_common")
    (tmp_path / "runs" / "tnews").mkdir(parents=True)
    (tmp_path / "runs" / "tnews" / "run.json").write_text("{}", encoding="utf-8")
    assert common.new_run_folder("tnews") == str(pathlib.Path("runs") / "tnews-2")
    assert common.new_run_folder("ocnli_asa") == str(pathlib.Path("runs") / "ocnli_asa")


@pytest.mark.parametrize(
    "script, task, flags, expected",
    [
        ("clue_fl_tuning", "ocnli", [], 5e-4),  # the FL-tuning code's rate for the task
        ("clue_fl_tuning", "eprstmt", [], 5e-5),  # not in its recipe: the script's own
        ("clue_fl_tuning", "ocnli", ["--learning-rate", "1e-3"], 1e-3),
        ("clue_asa", "ocnli", [], 1e-5),  # the method's, whatever the task
        ("clue_common", "eprstmt", [], 2e-5),  # None: the task's (it stayed None)
    ],
)
def test_the_learning_rate_left_out_is_the_methods_for_the_task_or_the_tasks(
    script, task, flags, expected, tmp_path, preset, data, nothing_loads
):
    argv = ["--preset", str(preset), "--data-dir", str(data), "--task", task, *flags]
    argv += ["--output-dir", str(tmp_path / "o")]
    if script == "clue_common":
        common = _script("clue_common")
        parser = common.argument_parser("A script.\n", learning_rate=None)
        args = common.parse_args(parser, argv, method=None)
    else:
        args = _script(script).parse_args(argv)
    assert args.learning_rate == expected
