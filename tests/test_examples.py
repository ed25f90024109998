"""examples/finetune_clue.py runs end to end on a tiny model and real FewCLUE lines."""

import importlib.util
import pathlib
import re

import keras
import numpy as np
import pytest
from conftest import tiny_backbone_kwargs

import keras_masking
from keras_masking.layers import AddFFN
from keras_masking.methods import DropTokenEncoder
from keras_masking.models import TransformerBackbone
from keras_masking.utils import xla_cpu_fusion_emitters_disabled

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
VOCAB = SHARED / "vocab" / "bert-base-chinese-vocab.txt"
needs_data = pytest.mark.skipif(
    not (SHARED / "fewclue").exists() or not VOCAB.exists(), reason="../shared/data not present"
)


def _example():
    spec = importlib.util.spec_from_file_location(
        "finetune_clue", ROOT / "examples" / "finetune_clue.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _preset(tmp_path, **overrides):
    keras.utils.set_random_seed(0)
    kwargs = tiny_backbone_kwargs(vocabulary_size=21128, max_sequence_length=64, **overrides)
    backbone = TransformerBackbone(**kwargs)
    folder = str(tmp_path / "preset")
    backbone.save_to_preset(folder)
    return folder, backbone


def _args(example, folder, *extra):
    return example.parse_args(
        [
            "--preset",
            folder,
            "--vocab",
            str(VOCAB),
            "--task",
            "eprstmt",
            "--epochs",
            "2",
            "--sequence-length",
            "32",
            "--learning-rate",
            "1e-3",
            *extra,
        ]
    )


@needs_data
def test_corrected_embeddings_and_drop_token_fine_tune_and_save(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # restored after the test
    example = _example()
    folder, backbone = _preset(tmp_path)
    output = str(tmp_path / "model.keras")
    model, history = example.run(
        _args(example, folder, "--correct-embeddings", "--drop-token", "0.1", "--output", output)
    )
    assert history["loss"][-1] < history["loss"][0]
    assert any(isinstance(layer, DropTokenEncoder) for layer in model._flatten_layers())
    assert xla_cpu_fusion_emitters_disabled()
    restored = keras.saving.load_model(output)
    features, labels = example.load_split(
        _args(example, folder), example.bert_tokenizer(str(VOCAB)), "dev"
    )
    logits = model.predict(features, verbose=0)
    np.testing.assert_allclose(restored.predict(features, verbose=0), logits, atol=1e-5)
    # The reported dev accuracy is the saved model's accuracy on the dev file.
    accuracy = np.mean(np.argmax(logits, -1) == np.asarray(labels))
    assert history["val_accuracy"][-1] == pytest.approx(accuracy, abs=1e-6)
    assert not list(tmp_path.glob("*.partial*"))


@needs_data
def test_the_classifier_starts_from_corrected_embeddings(tmp_path):
    example = _example()
    folder, _ = _preset(tmp_path)
    args = _args(example, folder, "--correct-embeddings")
    tokenizer = example.bert_tokenizer(str(VOCAB))
    backbone = example.load_backbone(args)
    original = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)
    example.build_classifier(backbone, tokenizer, args, num_classes=2)
    expected = TransformerBackbone.from_preset(folder)
    keras_masking.correct_mlm_embeddings(
        expected,
        mask_token_id=tokenizer.mask_token_id,
        unselectable_token_ids=tokenizer.special_token_ids,
    )
    corrected = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)
    np.testing.assert_allclose(
        corrected, keras.ops.convert_to_numpy(expected.token_embedding.embeddings), atol=1e-7
    )
    assert np.abs(corrected - original).max() > 1e-4


@needs_data
def test_fl_tuning_with_asa_trains_only_the_added_units_and_the_head(tmp_path):
    example = _example()
    folder, _ = _preset(tmp_path)
    output = str(tmp_path / "model.keras")
    model, history = example.run(
        _args(example, folder, "--fl-tune", "8", "--asa", "0.5", "--output", output)
    )
    trainable = {v.path.split("/")[-2] for v in model.trainable_variables}
    assert any(isinstance(layer, AddFFN) for layer in model._flatten_layers())
    assert "classifier" in trainable
    assert len(model.trainable_variables) == 2 * 4 + 2  # 2 layers x addFFN (W1, b1, W2, b2) + head
    # ASA ran (its metrics are in the history) and the saved model is the clean one.
    assert {"divergence", "mask_term", "masked_fraction_0"} <= set(history)
    assert not any("adversary" in v.path for v in keras.saving.load_model(output).weights)
    with pytest.raises(SystemExit):
        example.parse_args(["--preset", "x", "--asa", "0.5", "--drop-token", "0.1"])


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--output", "missing/model.keras"], "folder .* does not exist"),
        (["--output", "model.h5"], "must end in .keras"),
        (["--drop-token", "1.0"], r"--drop-token must be in \[0, 1\)"),
        (["--drop-token", "-0.1"], r"--drop-token must be in \[0, 1\)"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--sequence-length", "2"], "--sequence-length must be at least 3"),
        (["--learning-rate", "0"], "--learning-rate must be positive"),
        (["--fl-tune", "-4"], "--fl-tune must be at least 0"),
    ],
)
def test_bad_arguments_are_refused_before_anything_loads(tmp_path, capsys, extra, message):
    example = _example()
    with pytest.raises(SystemExit) as exit_info:
        example.parse_args(["--preset", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_an_existing_output_is_not_overwritten(tmp_path, capsys):
    existing = tmp_path / "model.keras"
    existing.write_bytes(b"earlier run")
    with pytest.raises(SystemExit):
        _example().parse_args(["--preset", str(tmp_path), "--output", str(existing)])
    assert "exists" in capsys.readouterr().err
    assert existing.read_bytes() == b"earlier run"


@needs_data
def test_an_exlm_backbone_fine_tunes_through_the_expanding_encoder(tmp_path):
    example = _example()
    folder, _ = _preset(tmp_path, position="rotary2d", custom_position_ids=True)
    model, history = example.run(_args(example, folder, "--exlm-k", "2"))
    assert np.isfinite(history["loss"]).all()
    features, labels = example.load_split(
        _args(example, folder), example.bert_tokenizer(str(VOCAB)), "dev"
    )
    accuracy = np.mean(np.argmax(model.predict(features, verbose=0), -1) == np.asarray(labels))
    assert history["val_accuracy"][-1] == pytest.approx(accuracy, abs=1e-6)
    with pytest.raises(SystemExit):
        example.parse_args(["--tf-checkpoint", "x", "--exlm-k", "2"])
