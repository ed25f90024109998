"""`keras-masking export`: a finished run's best model as a SavedModel of token ids."""

import importlib.util
import json

import keras
import numpy as np
import pytest

from keras_masking import clue
from keras_masking.cli import main
from tests.clue import fixtures as clue_fixtures
from tests.clue.helpers import VOCABULARY
from tests.testing import eager_predict

METHODS = dict(fl_tuning=4, drop_token=0.3, asa=0.5)  # merged, off, off at serving


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    preset = clue_fixtures.tiny_preset(root / "preset", max_sequence_length=32)
    clue_fixtures.eprstmt(root / "data")
    result = clue.finetune(
        "eprstmt", root / "data", root / "run", preset=preset, epochs=1, batch_size=8,
        max_length=24, learning_rate=3e-3, verbose=0, jit_compile=False, **METHODS,
    )  # fmt: skip
    assert result.status == "finished"
    return root, result


def _features(rows=3, length=24):
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, len(VOCABULARY), (rows, length)).astype("int32")
    token_ids[:, 0], token_ids[:, -1] = 2, 3
    return {
        "token_ids": token_ids,
        "segment_ids": np.zeros((rows, length), "int32"),
        "padding_mask": np.ones((rows, length), "int32"),
    }


@pytest.fixture(scope="module")
def predicted(finished):
    """The run's best model's ``predict`` of `_features()` (what every export must serve)."""
    _, result = finished
    return result.model.predict(_features(), verbose=0)


def test_the_exported_run_serves_its_best_model_without_its_training_methods(
    finished, predicted, capsys, caplog
):
    import tensorflow as tf

    root, _ = finished
    output = root / "served"
    with caplog.at_level("INFO", logger="keras_masking"):
        assert main(["export", str(root / "run"), str(output), "--quiet"]) == 0
    # The run's rebuild says nothing (no "Read ... examples", no "finished earlier").
    assert [record.getMessage() for record in caplog.records] == []
    assert capsys.readouterr().out == f"Wrote {output} (a SavedModel: tf.saved_model.load)\n"
    served = tf.saved_model.load(str(output))
    features = _features()
    outputs = served.serve({name: tf.constant(value) for name, value in features.items()})
    np.testing.assert_allclose(np.asarray(outputs), predicted, atol=1e-5)
    names = [variable.name for variable in served.variables]
    assert not [name for name in names if "adversary" in name or "add_ffn" in name], names
    record = json.loads((output / "keras_masking_run.json").read_text(encoding="utf-8"))
    assert record["arguments"]["fl_tuning"] == 4 and record["status"] == "finished"
    assert not list(root.glob(".served*"))  # no staging folder left


def test_what_cannot_be_exported_is_refused_before_anything_is_written(finished, tmp_path):
    root, _ = finished
    with pytest.raises(FileNotFoundError, match="No run record"):
        clue.export_run(tmp_path, tmp_path / "a")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(ValueError, match="Expected a new or empty folder for output"):
        clue.export_run(root / "run", tmp_path / "busy")
    running = tmp_path / "running"
    running.mkdir()
    record = json.loads((root / "run" / "run.json").read_text(encoding="utf-8"))
    (running / "run.json").write_text(json.dumps({**record, "status": "running"}))
    with pytest.raises(ValueError, match=r"has not finished \(status 'running'\)"):
        clue.export_run(running, tmp_path / "b")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["busy", "running"]
    assert keras.config.backend() in ("tensorflow", "jax")


def test_an_output_inside_what_the_export_reads_is_refused(finished):
    """An export into the run's preset wrote files there, which the run's record
    hashes: the run could no longer resume or be exported ("The model files
    changed"). Into the run's folder, or a preset into itself, likewise."""
    root, _ = finished

    def listing():
        return sorted(str(path) for path in root.rglob("*"))

    before = listing()
    for source, output in (
        (root / "run", root / "run" / "exported"),
        (root / "run", root / "preset" / "served"),
        (root / "preset", root / "preset"),
        (root / "preset", root / "preset" / "served"),
    ):
        with pytest.raises(ValueError, match="that the export reads, or inside it"):
            export = clue.export_run if source.name == "run" else clue.export_preset
            export(source, output)
        assert main(["export", str(source), str(output), "--quiet"]) == 1
    assert listing() == before


def test_the_export_and_presets_carry_a_model_card(finished, tmp_path):
    root, result = finished
    output = root / "served"
    if not output.exists():
        clue.export_run(root / "run", output)
    card = (output / "README.md").read_text(encoding="utf-8")
    assert card.startswith("# eprstmt (fewclue)")
    assert "FFN 36" in card  # FL-tuning merged: 32 + 4 units
    assert '"fl_tuning": 4' in card and '"best"' in card
    assert f'"score": {result.best_score}' in card
    from keras_masking.models import TransformerBackbone

    backbone = [layer for layer in result.model.layers if isinstance(layer, TransformerBackbone)][0]
    backbone.save_to_preset(tmp_path / "preset")
    card = (tmp_path / "preset" / "README.md").read_text(encoding="utf-8")
    assert "- FL-tuning (addFFN units): " in card and "ASA" in card and "DropToken" in card
    restored = TransformerBackbone.from_preset(str(tmp_path / "preset"))
    assert restored.add_ffn == backbone.add_ffn  # the preset loads with the card beside it


def test_an_onnx_export_serves_the_best_model(finished, predicted):
    """From either backend (on JAX a TensorFlow process writes it from the same weights)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("tf2onnx")
    root, _ = finished
    output = root / "served_onnx"
    assert main(["export", str(root / "run"), str(output), "--quiet", "--format", "onnx"]) == 0
    assert sorted(path.name for path in output.iterdir()) == [
        "README.md", "keras_masking_run.json", "model.onnx",
    ]  # fmt: skip
    session = onnxruntime.InferenceSession(str(output / "model.onnx"))
    features = _features()
    # Keras' ONNX export names the inputs args_0_<name> (docs/serving.md).
    feed = {
        entry.name: features[entry.name.removeprefix("args_0_")] for entry in session.get_inputs()
    }
    assert sorted(feed) == sorted(f"args_0_{name}" for name in features)
    (served,) = session.run(None, feed)
    np.testing.assert_allclose(served, predicted, atol=1e-5)


def test_an_unknown_format_is_refused(finished, tmp_path):
    root, _ = finished
    with pytest.raises(
        ValueError, match=r"Expected format in \['saved_model', 'onnx', 'transformers'\]"
    ):
        clue.export_run(root / "run", tmp_path / "out", format="pt")
    assert not (tmp_path / "out").exists()


def test_a_hugging_face_folder_holds_the_runs_encoder_and_tokenizer(finished):
    pytest.importorskip("safetensors")
    from keras_masking.models import TransformerBackbone

    root, result = finished
    assert main(["export", str(root / "run"), str(root / "hf2"), "--format", "transformers"]) == 0
    names = sorted(path.name for path in (root / "hf2").iterdir())
    for name in ("config.json", "model.safetensors", "vocab.txt", "keras_masking_run.json",
                 "README.md"):  # fmt: skip
        assert name in names, names
    config = json.loads((root / "hf2" / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "bert"
    # FL-tuning's 4 units merged into the FFN: a plain model of a wider FFN.
    backbone = next(layer for layer in result.model.layers if hasattr(layer, "serving_copy"))
    assert config["intermediate_size"] == backbone.intermediate_dim + 4
    assert (root / "hf2" / "vocab.txt").read_text(encoding="utf-8").split() == VOCABULARY
    # transformers' truncation=True cuts where the run's inputs were cut (24), not at 32 positions.
    tokenizer_config = json.loads((root / "hf2" / "tokenizer_config.json").read_text("utf-8"))
    assert tokenizer_config["model_max_length"] == 24
    # The package reads the folder back: the run's encoder, equal.
    loaded = TransformerBackbone.from_preset(str(root / "hf2"))
    features = _features()
    expected = backbone.serving_copy().predict(features, verbose=0)["sequence_output"]
    found = loaded.predict(features, verbose=0)["sequence_output"]
    np.testing.assert_allclose(found, expected, atol=1e-5)


# === Presets (keras-masking export PRESET OUTPUT) ===
def test_a_backbone_preset_exports_its_serving_copy_and_a_hugging_face_folder(finished, tmp_path):
    import tensorflow as tf

    from keras_masking.models import TransformerBackbone

    root, _ = finished
    preset = root / "preset"
    backbone = TransformerBackbone.from_preset(str(preset))
    features = _features()
    expected = backbone.predict(features, verbose=0)["sequence_output"]
    assert main(["export", str(preset), str(tmp_path / "saved"), "--quiet"]) == 0
    served = tf.saved_model.load(str(tmp_path / "saved"))
    outputs = served.serve({name: tf.constant(value) for name, value in features.items()})
    np.testing.assert_allclose(np.asarray(outputs["sequence_output"]), expected, atol=1e-5)
    if importlib.util.find_spec("safetensors") is None:
        return
    assert main(["export", str(preset), str(tmp_path / "hf"), "--format", "transformers"]) == 0
    assert (tmp_path / "hf" / "vocab.txt").read_text(encoding="utf-8").split() == VOCABULARY
    loaded = TransformerBackbone.from_preset(str(tmp_path / "hf"))
    np.testing.assert_allclose(
        loaded.predict(features, verbose=0)["sequence_output"], expected, atol=1e-5
    )


def test_a_classifier_preset_exports_strings_in_and_its_labels(tmp_path, capsys):
    import tensorflow as tf

    from keras_masking.data import bert_tokenizer
    from keras_masking.models import TransformerBackbone
    from keras_masking.models import TransformerTextClassifier
    from keras_masking.models import TransformerTextClassifierPreprocessor

    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=32,
    )  # fmt: skip
    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(VOCABULARY), sequence_length=16
    )
    classifier = TransformerTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    classifier.save_to_preset(str(tmp_path / "preset"))
    texts = ["好评", "差评很差"]
    assert main(["export", str(tmp_path / "preset"), str(tmp_path / "saved")]) == 0
    # The endpoints, without Keras' "Captures:" lists (a line per variable) or
    # the temporary folder the export was written to.
    printed = capsys.readouterr().out
    assert "* Endpoint 'serving_default'" in printed and "* Endpoint 'serve_texts'" in printed
    assert "Captures:" not in printed and "TensorSpec(shape=(), dtype=tf.resource" not in printed
    assert ".partial" not in printed
    assert printed.splitlines()[-1] == (
        f"Wrote {tmp_path / 'saved'} (a SavedModel: tf.saved_model.load)"
    )
    served = tf.saved_model.load(str(tmp_path / "saved")).signatures["serving_default"]
    logits = served(tf.constant(texts))["logits"].numpy()
    np.testing.assert_allclose(logits, eager_predict(classifier, texts), atol=1e-5)
    if importlib.util.find_spec("safetensors") is None:
        return
    hf = tmp_path / "hf"
    argv = ["export", str(tmp_path / "preset"), str(hf), "--format", "transformers"]
    assert main(argv + ["--labels", "neg,pos"]) == 0
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "neg", "1": "pos"}


def test_what_is_not_a_preset_or_a_run_is_refused_before_anything_is_written(finished, tmp_path):
    root, _ = finished
    with pytest.raises(FileNotFoundError, match="expected a preset folder"):
        clue.export_preset(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="labels= names a classifier's classes"):
        clue.export_preset(root / "preset", tmp_path / "out", labels=["a", "b"])
    with pytest.raises(ValueError, match=r"Expected format in"):
        clue.export_preset(root / "preset", tmp_path / "out", format="pt")
    assert main(["export", str(root / "run"), str(tmp_path / "out"), "--labels", "a,b"]) == 1
    assert not (tmp_path / "out").exists()


def test_an_exlm_run_exports_with_its_card_and_refuses_a_hugging_face_folder_first(tmp_path):
    """On JAX the SavedModel failed (its signature left the length open, which ExLM's
    expansion refuses), the Hugging Face folder failed with an IndexError after the
    rebuild, and the SavedModel had no model card."""
    import tensorflow as tf

    preset = clue_fixtures.tiny_preset(
        tmp_path / "preset", position="rotary2d", custom_position_ids=True
    )
    clue_fixtures.eprstmt(tmp_path / "data")
    result = clue.finetune(
        "eprstmt", tmp_path / "data", tmp_path / "run", preset=preset, exlm_k=2, epochs=1,
        batch_size=8, max_length=24, learning_rate=3e-3, verbose=0, jit_compile=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match="2D rotary positions .*'saved_model' or 'onnx'"):
        clue.export_run(tmp_path / "run", tmp_path / "hf", format="transformers")
    assert not (tmp_path / "hf").exists()
    clue.export_run(tmp_path / "run", tmp_path / "served")
    assert "ExLM" in (tmp_path / "served" / "README.md").read_text(encoding="utf-8")
    features = _features()
    served = tf.saved_model.load(str(tmp_path / "served"))
    outputs = served.serve({name: tf.constant(value) for name, value in features.items()})
    np.testing.assert_allclose(
        np.asarray(outputs), result.model.predict(features, verbose=0), atol=1e-5
    )
