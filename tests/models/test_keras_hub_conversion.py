"""keras-hub BertBackbone / RobertaBackbone <-> TransformerBackbone."""

import keras
import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.models import TransformerBackbone
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


def _hub_bert():
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    randomize_weights(hub)
    return hub


def test_from_keras_hub_bert_matches_outputs():
    hub = _hub_bert()
    ours = keras_masking.models.from_keras_hub(hub)
    assert isinstance(ours, TransformerBackbone)
    features = random_features()
    expected, actual = hub(features), ours(features)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(actual[key], expected[key], atol=1e-5)


def test_from_keras_hub_with_exact_gelu_differs():
    """Matching needs keras-hub's tanh GELU: the test above can fail."""
    hub = _hub_bert()
    ours = keras_masking.models.from_keras_hub(hub, activation="gelu")
    features = random_features()
    difference = np.abs(
        np.asarray(ours(features)["sequence_output"]) - np.asarray(hub(features)["sequence_output"])
    ).max()
    assert difference > 1e-5


def test_to_keras_hub_round_trip_bert():
    ours = TransformerBackbone(**tiny_backbone_kwargs(activation="gelu_approximate"))
    randomize_weights(ours, seed=1)
    hub = ours.to_keras_hub()
    assert isinstance(hub, keras_hub.models.BertBackbone)
    features = random_features()
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(hub(features)[key], ours(features)[key], atol=1e-5)
    back = keras_masking.models.from_keras_hub(hub)
    for a, b in zip(back.get_weights(), ours.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_roberta_both_ways():
    hub = keras_hub.models.RobertaBackbone(**HUB_SIZES)
    randomize_weights(hub, seed=2)
    ours = keras_masking.models.from_keras_hub(hub)
    assert ours.num_segments == 0 and not ours.use_pooler
    assert "segment_ids" not in ours.input
    features = random_features()
    features.pop("segment_ids")
    sequence = ours(features)["sequence_output"]
    np.testing.assert_allclose(sequence, hub(features), atol=1e-5)
    np.testing.assert_allclose(ours(features)["pooled_output"], sequence[:, 0], atol=0)
    again = ours.to_keras_hub()
    assert isinstance(again, keras_hub.models.RobertaBackbone)
    np.testing.assert_allclose(again(features), hub(features), atol=1e-5)


def test_to_keras_hub_rejects_rotary_and_warns_on_activation(caplog):
    rotary = TransformerBackbone(**tiny_backbone_kwargs(position="rotary"))
    with pytest.raises(ValueError, match="absolute positions only"):
        rotary.to_keras_hub()
    exact = TransformerBackbone(**tiny_backbone_kwargs(activation="gelu"))
    with caplog.at_level("WARNING", logger="keras_masking"):
        exact.to_keras_hub()
    assert "gelu_approximate" in caplog.text


def test_from_keras_hub_rejects_other_models():
    with pytest.raises(TypeError, match="BertBackbone"):
        keras_masking.models.from_keras_hub(keras.Sequential())


# === TransformerBackbone.from_keras_hub, next to to_keras_hub ===
@pytest.mark.parametrize("kind", ["BertBackbone", "RobertaBackbone"])
def test_from_keras_hub_classmethod_matches_keras_hub(kind):
    hub = getattr(keras_hub.models, kind)(**HUB_SIZES)
    randomize_weights(hub, seed=5)
    ours = TransformerBackbone.from_keras_hub(hub)
    assert type(ours) is TransformerBackbone and ours.position == "absolute"
    features = random_features()
    if kind == "RobertaBackbone":
        features.pop("segment_ids")
    expected = hub(features)
    actual = ours(features)
    if kind == "RobertaBackbone":
        expected = {"sequence_output": expected}
    else:
        np.testing.assert_allclose(actual["pooled_output"], expected["pooled_output"], atol=1e-5)
    np.testing.assert_allclose(actual["sequence_output"], expected["sequence_output"], atol=1e-5)
    # The module-level function is the same conversion.
    again = keras_masking.models.from_keras_hub(hub)
    for a, b in zip(again.get_weights(), ours.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_from_keras_hub_classmethod_keeps_overrides_and_subclass():
    class Sub(TransformerBackbone):
        pass

    hub = _hub_bert()
    ours = Sub.from_keras_hub(hub, dropout=0.25, custom_position_ids=True, activation="gelu")
    assert type(ours) is Sub
    assert (ours.dropout, ours.activation, ours.custom_position_ids) == (0.25, "gelu", True)
    assert "position_ids" in ours.input
    np.testing.assert_array_equal(
        ours.token_embedding.embeddings, hub.get_layer("token_embedding").embeddings
    )


def test_conversion_imports_one_way():
    """keras_hub_conversion never imports the backbone module (no cycle)."""
    import ast
    import inspect

    from keras_masking.models import keras_hub_conversion

    tree = ast.parse(inspect.getsource(keras_hub_conversion))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert "keras_masking.models.google_checkpoint_layout" in imported
    assert not [name for name in imported if "transformer_backbone" in str(name)]
    assert not [name for name in imported if name == "keras_masking.models"]


def test_messages_name_conversion_functions_that_exist():
    """Every ``...from_keras_hub`` the package's code or messages name resolves."""
    import importlib
    import pathlib
    import re

    root = pathlib.Path(keras_masking.__file__).parent
    mentions = set()
    for path in root.rglob("*.py"):
        mentions |= set(re.findall(r"([\w.]+)\.from_keras_hub\b", path.read_text()))
    mentions = {m for m in mentions if m.startswith(("keras_masking", "TransformerBackbone"))}
    assert "keras_masking.models.TransformerBackbone" in mentions
    for owner in mentions:
        if owner == "TransformerBackbone":
            target = TransformerBackbone
        else:
            parts = owner.split(".")
            target = importlib.import_module(parts[0])
            for part in parts[1:]:
                target = getattr(target, part)
        assert callable(getattr(target, "from_keras_hub")), owner


def test_model_backbone_refusal_names_the_classmethod():
    from keras_masking.methods import model_backbone

    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    task = keras.Model(hub.input, keras.layers.Dense(2)(hub(hub.input)["pooled_output"]))
    with pytest.raises(TypeError, match=r"TransformerBackbone\.from_keras_hub\(backbone\)"):
        model_backbone(task)


# === Bad inputs: from_keras_hub 7 cases, to_keras_hub 8 cases ===
def test_from_keras_hub_bad_inputs():
    hub = _hub_bert()
    before = [np.array(w) for w in hub.get_weights()]
    cases = [
        (dict(backbone=keras.Sequential()), TypeError, "BertBackbone or RobertaBackbone.*Seq"),
        (dict(backbone=None), TypeError, "Received: backbone of type NoneType"),
        (
            dict(backbone=TransformerBackbone(**tiny_backbone_kwargs())),
            TypeError,
            "Received: backbone of type TransformerBackbone",
        ),
        (dict(backbone=hub, num_layers=1), ValueError, r"cannot override \['num_layers'\]"),
        (dict(backbone=hub, position="rotary"), ValueError, "position='rotary'"),
        (dict(backbone=hub, dropout=1.5), ValueError, "dropout=1.5"),
        (dict(backbone=hub, activation="swishy"), ValueError, "activation='swishy'"),
        (dict(backbone=hub, bogus_arg=1), ValueError, r"Unknown .* argument\(s\) \['bogus_arg'\]"),
    ]
    assert len(cases) == 8
    for arguments, error, message in cases:
        with pytest.raises(error, match=message):
            TransformerBackbone.from_keras_hub(**arguments)
    for a, b in zip(hub.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_a_keras_hub_backbone_with_trained_lora_converts_merged():
    hub = _hub_bert()
    hub.enable_lora(2)
    for variable in hub.weights:
        if "lora_kernel" in variable.path:  # a trained LoRA: B is no longer zero
            variable.assign(np.random.default_rng(0).normal(0, 0.5, variable.shape))
    features = random_features()
    expected = hub(features)
    ours = TransformerBackbone.from_keras_hub(hub)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(ours(features)[key], expected[key], atol=1e-5)


def test_a_keras_hub_backbone_with_a_nan_weight_is_refused():
    hub = _hub_bert()
    table = hub.token_embedding.embeddings
    table.assign(np.where(np.arange(table.shape[0])[:, None] == 3, np.nan, np.asarray(table)))
    with pytest.raises(ValueError, match="token_embedding/embeddings.*NaN or infinite"):
        TransformerBackbone.from_keras_hub(hub)


def test_to_keras_hub_bad_inputs():
    cases = [
        (keras.Sequential(), TypeError, "TransformerBackbone. Received: backbone of type Seq"),
        (
            TransformerBackbone(**tiny_backbone_kwargs(position="relative")),
            ValueError,
            "absolute positions only.*position='relative'",
        ),
        (
            TransformerBackbone(**tiny_backbone_kwargs(num_segments=0)),
            ValueError,
            r"BertBackbone needs segments \(num_segments >= 1\)",
        ),
        (
            TransformerBackbone(**tiny_backbone_kwargs(use_pooler=False)),
            ValueError,
            "no segments; this one has num_segments=2",
        ),
    ]
    tuned = TransformerBackbone(**tiny_backbone_kwargs())
    tuned.attach_add_ffn(2)
    cases.append((tuned, ValueError, "addFFN branches. .*merge_fl"))
    # Prefixes cannot be merged: the message said "Merge addFFN first".
    prefixed = TransformerBackbone(**tiny_backbone_kwargs())
    prefixed.enable_prefix_tuning(2)
    cases.append((prefixed, ValueError, "prefixes. .*prefixes and attention units do not merge"))
    # BertBackbone pools the first token: a mean-pooled one converted with a
    # pooled_output 0.34 off, without a word.
    mean = TransformerBackbone(**tiny_backbone_kwargs(pooling="mean"))
    cases.append((mean, ValueError, "pools the first token.*Received: pooling='mean'"))
    # keras-hub fixes a GELU: a relu backbone converted 0.32 off with a warning
    # that its outputs "differ slightly".
    relu = TransformerBackbone(**tiny_backbone_kwargs(activation="relu"))
    cases.append((relu, ValueError, "computes gelu_approximate.*activation='relu'"))
    assert len(cases) == 8
    for backbone, error, message in cases:
        with pytest.raises(error, match=message):
            keras_masking.models.to_keras_hub(backbone)


def test_the_mlm_correction_record_crosses_to_keras_hub_and_back():
    """Corrected once, on either side: a second correct_mlm_embeddings after
    a conversion changes nothing (it corrected the table again)."""
    ours = TransformerBackbone(**tiny_backbone_kwargs())
    randomize_weights(ours, seed=1)
    keras_masking.correct_mlm_embeddings(ours, mask_token_id=4, unselectable_token_ids=[0])
    hub = ours.to_keras_hub()
    back = keras_masking.models.from_keras_hub(hub)
    for model in (hub, back):
        table = np.array(model.token_embedding.embeddings.numpy())
        assert keras_masking.methods.correction_record(model).mask_token_id == 4
        assert keras_masking.correct_mlm_embeddings(model, mask_token_id=4) is None
        np.testing.assert_array_equal(model.token_embedding.embeddings.numpy(), table)
    corrected_hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    keras_masking.correct_mlm_embeddings(corrected_hub, mask_token_id=4)
    converted = keras_masking.models.from_keras_hub(corrected_hub)
    assert keras_masking.correct_mlm_embeddings(converted, mask_token_id=4) is None
