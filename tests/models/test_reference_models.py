"""Each family against Hugging Face transformers' outputs on the same weights.

The fixtures (tests/fixtures/*.npz, made by make_reference.py with torch)
hold random weights in Google's TF checkpoint layout and the PyTorch
outputs; here they are written as a real TF checkpoint, loaded with
`from_tf_checkpoint`, and compared.
"""

import json

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.models.google_config import backbone_kwargs_from_google_config
from tests.testing import FAMILIES
from tests.testing import load_reference
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs
from tests.testing import write_reference_checkpoint


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_hugging_face_outputs(family, tmp_path):
    config_path, prefix, expected = write_reference_checkpoint(family, tmp_path)
    masked_lm = keras_masking.models.from_tf_checkpoint(
        config_path, prefix, model=family, with_mlm=True
    )
    features = {
        "token_ids": expected["token_ids"],
        "segment_ids": expected["segment_ids"],
        "padding_mask": expected["padding_mask"],
    }
    outputs = masked_lm.backbone(features)
    np.testing.assert_allclose(outputs["sequence_output"], expected["sequence_output"], atol=2e-5)
    if "pooled_output" in expected:
        assert masked_lm.backbone.use_pooler
        np.testing.assert_allclose(outputs["pooled_output"], expected["pooled_output"], atol=2e-5)
    else:
        assert not masked_lm.backbone.use_pooler
    length = features["token_ids"].shape[1]
    positions = np.tile(np.arange(length, dtype="int32"), (2, 1))
    logits = masked_lm({**features, "mask_positions": positions})
    np.testing.assert_allclose(logits, expected["mlm_logits"], atol=5e-5)


@pytest.mark.parametrize("family", ["roformer", "nezha"])
def test_outputs_differ_under_another_position_scheme(family, tmp_path):
    """The comparison above can fail: the wrong scheme gives other numbers."""
    config_path, prefix, expected = write_reference_checkpoint(family, tmp_path)
    backbone = keras_masking.models.from_tf_checkpoint(config_path, prefix, model=family)
    kwargs = backbone.get_config()
    kwargs["position"] = {"roformer": "relative", "nezha": "rotary"}[family]
    for key in ("name", "trainable", "dtype"):
        kwargs.pop(key)
    swapped = keras_masking.models.TransformerBackbone(**kwargs)
    swapped.set_weights(backbone.get_weights())
    features = {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    difference = np.abs(
        np.asarray(swapped(features)["sequence_output"]) - expected["sequence_output"]
    ).max()
    assert difference > 1e-2


# === A checkpoint is refused when its config, family or values contradict it ===
def _features(expected):
    return {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}


def test_head_count_of_the_checkpoint_config_is_enforced(tmp_path):
    """8 heads on weights trained with 4 run (same shapes) but compute other numbers;
    the config beside the checkpoint, or the config passed, says 4: refused."""
    config_path, prefix, expected = write_reference_checkpoint("bert", tmp_path / "ckpt")
    wrong = json.loads(open(config_path).read())
    wrong["num_attention_heads"] = 8
    wrong_path = tmp_path / "other_config.json"
    wrong_path.write_text(json.dumps(wrong))
    # What loading it would give: outputs far from the reference.
    eight = keras_masking.models.TransformerBackbone(
        **{**backbone_kwargs_from_google_config(wrong, "bert"), "use_pooler": True}
    )
    eight.set_weights(keras_masking.models.from_tf_checkpoint(config_path, prefix).get_weights())
    difference = np.abs(eight(_features(expected))["sequence_output"] - expected["sequence_output"])
    assert difference.max() > 0.1
    with pytest.raises(
        ValueError,
        match=r"bert_config.json: the checkpoint was trained with num_attention_heads=4.*"
        r"Expected num_heads=4\. Received: num_heads=8\.",
    ):
        keras_masking.models.from_tf_checkpoint(wrong_path, prefix)
    with pytest.raises(ValueError, match=r"Expected num_heads=4\. Received: num_heads=8\."):
        keras_masking.models.load_tf_checkpoint_weights(eight, prefix)
    with pytest.raises(
        ValueError,
        match=r"fixes num_heads=4.*Expected num_heads=4 or no num_heads argument\. "
        r"Received: num_heads=8\.",
    ):
        keras_masking.models.from_tf_checkpoint(config_path, prefix, num_heads=8)
    # A Hugging Face config.json beside the weights is read the same way.
    right = open(config_path).read()
    (tmp_path / "ckpt" / "bert_config.json").unlink()
    (tmp_path / "ckpt" / "config.json").write_text(right)
    with pytest.raises(ValueError, match=r"/config.json: .*num_attention_heads=4"):
        keras_masking.models.load_tf_checkpoint_weights(eight, prefix)
    backbone = keras_masking.models.from_tf_checkpoint(tmp_path / "ckpt" / "config.json", prefix)
    np.testing.assert_allclose(
        backbone(_features(expected))["sequence_output"], expected["sequence_output"], atol=2e-5
    )


def test_roformer_checkpoint_is_not_loaded_as_nezha(tmp_path):
    config_path, prefix, expected = write_reference_checkpoint("roformer", tmp_path)
    with pytest.raises(
        ValueError, match=r"cannot tell this checkpoint from a RoFormer one.*model='roformer'"
    ):
        keras_masking.models.from_tf_checkpoint(config_path, prefix, model="nezha")
    # Saying it is NEZHA (an explicit max_relative_position) loads it as such.
    as_nezha = keras_masking.models.from_tf_checkpoint(
        config_path, prefix, model="nezha", max_relative_position=64
    )
    assert as_nezha.position == "relative"
    config = json.loads(open(config_path).read())
    config["model_type"] = "roformer"
    open(config_path, "w").write(json.dumps(config))
    with pytest.raises(ValueError, match=r"declares a RoFormer model.*Received: model='nezha'"):
        keras_masking.models.from_tf_checkpoint(config_path, prefix, model="nezha", strict=False)
    backbone = keras_masking.models.from_tf_checkpoint(config_path, prefix, model="roformer")
    np.testing.assert_allclose(
        backbone(_features(expected))["sequence_output"], expected["sequence_output"], atol=2e-5
    )
    # A NEZHA checkpoint, whose config declares its relative positions, loads.
    nezha = keras_masking.models.from_tf_checkpoint(
        *write_reference_checkpoint("nezha", tmp_path / "nezha")[:2], model="nezha"
    )
    assert nezha.max_relative_position == 4


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_checkpoint_with_non_finite_values_is_refused(bad, tmp_path):
    name = "bert/embeddings/word_embeddings"
    _, weights, _ = load_reference("bert")
    table = weights[name].copy()
    table[3, 5] = bad
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path, extra={name: table})
    with pytest.raises(
        ValueError,
        match=rf"bert_model.ckpt: variable '{name}' holds 1 NaN or infinite value\(s\) "
        r"\(first at index \(3, 5\)\); nothing was loaded",
    ):
        keras_masking.models.from_tf_checkpoint(config_path, prefix)
    backbone = keras_masking.models.TransformerBackbone(
        **backbone_kwargs_from_google_config(json.loads(open(config_path).read()), "bert")
    )
    before = [np.array(w) for w in backbone.get_weights()]
    with pytest.raises(ValueError, match=f"'{name}' holds 1 NaN"):
        keras_masking.models.load_tf_checkpoint_weights(backbone, prefix)
    for after, was in zip(backbone.get_weights(), before):
        np.testing.assert_array_equal(after, was)


# === The backbone's door: one input check shared by every entry point ===
def _tiny(**overrides):
    return keras_masking.models.TransformerBackbone(**tiny_backbone_kwargs(**overrides))


def _bad_inputs():
    features = random_features()
    float_ids = features["token_ids"].astype("float32") + 0.7
    half = np.full((2, 10), 0.5, "float32")
    return [
        (
            {"token_ids": float_ids},
            r"Expected integer token_ids\. Received: token_ids of dtype "
            r"float32 with the values \[0\.7, ",
        ),
        (
            {"padding_mask": half},
            r"Expected padding_mask of 0s and 1s\. Received: padding_mask "
            r"with the values \[0\.5\]\.",
        ),
        (
            {"padding_mask": features["padding_mask"][:, :5]},
            r"Expected padding_mask of the "
            r"shape of token_ids \(2, 10\)\. Received: padding_mask.shape=\(2, 5\)\.",
        ),
        (
            {"segment_ids": features["segment_ids"][:, :5]},
            r"Expected segment_ids of the shape "
            r"of token_ids \(2, 10\)\. Received: segment_ids.shape=\(2, 5\)\.",
        ),
        (
            {"token_ids": features["token_ids"] + 60},
            r"Expected token_ids in \[0, 64\) "
            r"\(vocabulary_size=64\)\. Received: token_ids with the values \[65, 72, ",
        ),
        ({"segment_ids": features["segment_ids"] * 3}, r"Expected segment_ids in \[0, 2\)"),
    ]


@pytest.mark.parametrize("index", range(6))
@pytest.mark.parametrize("entry", ["call", "predict", "predict_on_batch", "evaluate"])
def test_backbone_refuses_bad_inputs_at_every_entry(index, entry):
    changes, message = _bad_inputs()[index]
    backbone = _tiny()
    inputs = {**random_features(), **changes}
    run = {
        "call": lambda: backbone(inputs),
        "predict": lambda: backbone.predict(inputs, verbose=0),
        "predict_on_batch": lambda: backbone.predict_on_batch(inputs),
        "evaluate": lambda: backbone.evaluate(inputs, verbose=0),
    }[entry]
    if entry == "evaluate":
        backbone.compile(loss=None, jit_compile=True)
    with pytest.raises(ValueError, match=message):
        run()


def test_good_inputs_pass_the_door_unchanged():
    backbone = randomize_weights(_tiny())
    features = random_features()
    eager = np.asarray(backbone(features)["sequence_output"])
    mask_as_bool = {**features, "padding_mask": features["padding_mask"].astype(bool)}
    np.testing.assert_allclose(backbone(mask_as_bool)["sequence_output"], eager, atol=1e-6)
    predicted = backbone.predict(features, verbose=0)["sequence_output"]
    np.testing.assert_allclose(predicted, eager, atol=1e-5)


def test_masked_lm_and_drop_token_encoder_share_the_door():
    backbone = _tiny()
    features = random_features()
    positions = np.array([[1, 2], [3, 4]])
    masked_lm = keras_masking.models.TransformerMaskedLM(backbone)
    with pytest.raises(ValueError, match=r"Expected integer token_ids.*\[0\.5, "):
        masked_lm(
            {**features, "token_ids": features["token_ids"] + 0.5, "mask_positions": positions}
        )
    with pytest.raises(ValueError, match=r"Expected token_ids in \[0, 64\)"):
        masked_lm.predict(
            {**features, "token_ids": features["token_ids"] + 64, "mask_positions": positions},
            verbose=0,
        )
    with pytest.raises(
        ValueError,
        match=r"Expected mask_positions in \[0, 10\) \(sequence length=10\)\. "
        r"Received: mask_positions with the values \[11, 12, 13, 14\]\.",
    ):
        masked_lm.predict({**features, "mask_positions": positions + 10}, verbose=0)
    assert masked_lm.predict({**features, "mask_positions": positions}, verbose=0).shape == (
        2,
        2,
        64,
    )
    encoder = keras_masking.models.TransformerBackbone.from_config(backbone.get_config())
    encoder.enable_drop_token(0.2, mode="attention")
    with pytest.raises(ValueError, match=r"Expected integer token_ids.*\[0\.7"):
        encoder({**features, "token_ids": features["token_ids"] + 0.7}, training=True)
    with pytest.raises(ValueError, match=r"Expected padding_mask of 0s and 1s"):
        encoder.predict({**features, "padding_mask": features["padding_mask"] * 0.5}, verbose=0)


def test_compiled_calls_keep_static_shape_checks():
    """Shapes are static, so a compiled call refuses them too; values give NaN rows there."""
    backbone = _tiny()
    features = random_features()
    model = keras.Model(backbone.input, backbone.output)
    model.compile(jit_compile=True)
    with pytest.raises(ValueError, match=r"Expected padding_mask of the shape of token_ids"):
        backbone.forward_stages({**features, "padding_mask": features["padding_mask"][:, :5]})
    outputs = model.predict_on_batch(features)
    assert np.isfinite(outputs["sequence_output"]).all()
