"""TransformerBackbone's door: bad ids, bad constructor and attachment arguments.

Each case gets a clear error naming the argument, and nothing is half-built or
half-attached.
"""

import json

import keras
import numpy as np
import pytest

from keras_masking.models import TransformerBackbone
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


def test_token_ids_out_of_vocabulary():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    features = random_features()
    features["token_ids"][0, 3] = 64
    with pytest.raises(
        ValueError,
        match=r"Expected token_ids in \[0, 64\).*Received: token_ids with the values \[64\]",
    ):
        backbone(features)
    features["token_ids"][0, 3] = -1
    with pytest.raises(ValueError, match="token_ids"):
        backbone(features)


def test_segment_and_position_ids_out_of_range():
    backbone = TransformerBackbone(**tiny_backbone_kwargs(custom_position_ids=True))
    features = random_features()
    bad_segments = {
        **features,
        "segment_ids": features["segment_ids"] + 1,
        "position_ids": np.tile(np.arange(10), (2, 1)),
    }
    with pytest.raises(ValueError, match="segment_ids"):
        backbone(bad_segments)
    bad_positions = {**features, "position_ids": np.tile(np.arange(20, 30), (2, 1))}
    with pytest.raises(ValueError, match="position_ids.*max_sequence_length=24"):
        backbone(bad_positions)


@pytest.mark.parametrize(
    "field, value, jit_compile",
    [
        ("token_ids", 64, True),
        ("token_ids", -1, True),
        ("segment_ids", 2, True),
        ("position_ids", 24, True),
        pytest.param(  # TensorFlow's CPU gather raised a raw error
            "token_ids",
            64,
            False,
            marks=pytest.mark.skipif(
                keras.config.backend() == "jax",
                reason="JAX without jit runs eagerly, where the id is refused",
            ),
        ),
    ],
)
def test_out_of_range_ids_in_compiled_calls_give_nan_rows(field, value, jit_compile):
    # A compiled step cannot raise on values: the row with the bad id is NaN
    # on every backend (not clamped to a real row, as XLA's gather is).
    backbone = randomize_weights(
        TransformerBackbone(**tiny_backbone_kwargs(custom_position_ids=True))
    )
    features = random_features()
    features["position_ids"] = np.tile(np.arange(10, dtype="int32"), (2, 1))
    expected = keras.ops.convert_to_numpy(backbone(features)["sequence_output"])
    features[field] = features[field].copy()
    features[field][0, 3] = value
    model = keras.Model(backbone.input, backbone.output)
    model.compile(jit_compile=jit_compile)
    outputs = model.predict_on_batch(features)
    assert np.isnan(outputs["sequence_output"][0]).all()
    assert np.isnan(outputs["pooled_output"][0]).all()
    np.testing.assert_allclose(outputs["sequence_output"][1], expected[1], atol=1e-5)


@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_a_compiled_call_reads_any_nonzero_mask_value_as_a_real_token(pooling):
    """A compiled step cannot raise on values: a mask of 2 became a +1e9
    attention bias (pooled output 6.7e-4 off); it now reads as 1, in the
    backbone and in the functions that take a mask (ASA's masked fraction)."""
    from keras_masking.models.asa_objective import masked_fraction
    from keras_masking.ops import padding_mask_to_bias

    mask = np.array([[1, 1, 0]])
    adversary = np.array([[[1, 0, 1], [0, 1, 1], [1, 1, 0]]], "float32")
    for twice, once in (
        (padding_mask_to_bias(mask * 2), padding_mask_to_bias(mask)),
        (masked_fraction(adversary, mask * 2)[0], masked_fraction(adversary, mask)[0]),
    ):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(twice), keras.ops.convert_to_numpy(once)
        )
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(pooling=pooling)))
    features = random_features()
    expected = keras.ops.convert_to_numpy(backbone(features)["pooled_output"])
    model = keras.Model(backbone.input, backbone.output)
    model.compile(jit_compile=True)
    doubled = {**features, "padding_mask": features["padding_mask"] * 2}
    outputs = model.predict_on_batch(doubled)
    np.testing.assert_allclose(outputs["pooled_output"], expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"padding_mask of 0s and 1s.*\[2\]"):
        backbone(doubled)  # concrete values are still refused


def test_tensorflow_tensors_are_checked_on_every_backend():
    """On JAX, `predict` skipped the value checks of tf tensors: out-of-range
    segment ids reached the step (NaN rows), out-of-range labels a 0.0 loss."""
    import tensorflow as tf

    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    features = random_features()
    features["segment_ids"] = features["segment_ids"] + 2
    with pytest.raises(ValueError, match=r"Expected segment_ids in \[0, 2\)"):
        backbone.predict({name: tf.constant(value) for name, value in features.items()})


def test_a_list_where_a_dict_is_expected_is_refused_before_a_step_and_the_model_still_works():
    """On JAX the refusal came from inside the compiled step, after Keras had
    taken the weights out of the model: every later call failed."""
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()))
    model = keras.Model(backbone.input, backbone.output["pooled_output"])
    features = random_features()
    expected = model.predict(features, verbose=0)
    ordered = [features[name] for name in ("token_ids", "segment_ids", "padding_mask")]
    with pytest.raises(ValueError, match="Expected a dict of inputs"):
        backbone.predict(ordered, verbose=0)
    np.testing.assert_allclose(model.predict(features, verbose=0), expected, atol=1e-6)
    np.testing.assert_allclose(
        backbone.predict(features, verbose=0)["pooled_output"], expected, atol=1e-6
    )


def test_sequence_longer_than_position_table():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    with pytest.raises(ValueError, match="30 tokens.*max_sequence_length=24"):
        backbone(random_features(length=30))


BAD_CONSTRUCTOR_ARGUMENTS = [
    ({"position": "sinusoid"}, "position.*Received: position='sinusoid'"),
    ({"position": None}, "position.*Received: position=None"),
    ({"hidden_dim": 30}, "divisible.*hidden_dim=30, num_heads=4"),
    ({"num_layers": 0}, r"integer >= 1 for num_layers. Received: num_layers=0"),
    ({"num_layers": 2.5}, r"integer for num_layers. Received: num_layers=2.5"),
    ({"hidden_dim": 31.9}, r"integer for hidden_dim. Received: hidden_dim=31.9"),
    ({"num_layers": True}, r"integer for num_layers. Received: num_layers=True"),
    ({"vocabulary_size": 0}, "vocabulary_size=0"),
    ({"num_heads": -4}, "num_heads=-4"),
    ({"intermediate_dim": "48"}, "intermediate_dim='48'"),
    ({"max_sequence_length": None}, "max_sequence_length=None"),
    ({"num_segments": -1}, r"integer >= 0 for num_segments. Received: num_segments=-1"),
    ({"num_segments": 1.5}, "num_segments=1.5"),
    ({"max_relative_position": 0}, "max_relative_position=0"),
    ({"dropout": 1.5}, r"dropout in \[0.0, 1.0\). Received: dropout=1.5"),
    ({"dropout": -0.1}, "dropout=-0.1"),
    ({"dropout": "0.1"}, "number for dropout. Received: dropout='0.1'"),
    ({"attention_dropout": 1.0}, "attention_dropout=1.0"),
    ({"attention_dropout": float("nan")}, "attention_dropout=nan"),
    ({"layer_norm_epsilon": 0}, "layer_norm_epsilon=0.0"),
    ({"layer_norm_epsilon": -1e-12}, "layer_norm_epsilon=-1e-12"),
    ({"activation": "swishy"}, "Unknown activation.*activation='swishy'"),
    ({"activation": 3}, "activation name or a callable.*activation=3"),
    ({"use_pooler": "no"}, "True or False for use_pooler. Received: use_pooler='no'"),
    ({"custom_position_ids": 1}, "custom_position_ids=1"),
    ({"frozen_base": "yes"}, "frozen_base='yes'"),
    ({"position": "rotary", "hidden_dim": 36}, "even head size.*hidden_dim=36"),
    ({"position": "rotary2d", "num_heads": 16}, "divisible by 4.*num_heads=16"),
    ({"add_ffn": {"unit": 4}}, r"add_ffn to hold only the keys.*\['unit'\]"),
    ({"add_ffn": 4}, "dict or None for add_ffn. Received: add_ffn=4"),
    ({"mlm_embedding_correction": "yes"}, "mlm_embedding_correction='yes'"),
    ({"add_ffn": {"units": 2.5}}, "units=2.5"),
    (
        {"add_ffn": {"units": 2, "layers": [5]}},
        r"every entry of layers in \[0, 1\]. Received: layers=\[5\]",
    ),
    ({"key_value_prefix": {"length": -1}}, "length=-1"),
    ({"add_attention_units": {"units_per_head": 0}}, "units_per_head=0"),
    ({"pruned_from": {"vocabulary_size": 80}}, "pruned_from to be None or a dict"),
    (
        {"pruned_from": {"vocabulary_size": 80, "token_embedding_mean": [0.0] * 8}},
        "hidden_dim=32 floats",
    ),
    (
        {"pruned_from": {"vocabulary_size": 60, "token_embedding_mean": [0.0] * 32}},
        r">= 64 for pruned_from vocabulary_size",
    ),
]


@pytest.mark.parametrize("changes, message", BAD_CONSTRUCTOR_ARGUMENTS)
def test_bad_constructor_arguments(changes, message):
    with pytest.raises(ValueError, match=message):
        TransformerBackbone(**tiny_backbone_kwargs(**changes))


def test_an_unknown_argument_is_refused_in_code_and_in_a_preset(tmp_path):
    """Keras' functional models drop unknown keywords: a preset whose config.json
    spelled `drop_token` as `droptoken` loaded with DropToken off, without a word."""
    with pytest.raises(ValueError, match=r"unknown argument\(s\) \['num_layer'\] \(did you "
                                         r"mean 'num_layers'\?\)"):  # fmt: skip
        TransformerBackbone(**tiny_backbone_kwargs(num_layer=2))
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    backbone.enable_drop_token(0.5)
    backbone.save_to_preset(str(tmp_path / "preset"))
    path = tmp_path / "preset" / "config.json"
    saved = json.loads(path.read_text())
    saved["config"]["droptoken"] = saved["config"].pop("drop_token")
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"\['droptoken'\] \(did you mean 'drop_token'\?\)"):
        TransformerBackbone.from_preset(str(tmp_path / "preset"))


def test_numpy_numbers_are_accepted_as_python_ones():
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(
            num_layers=np.int64(2),
            hidden_dim=np.int32(32),
            dropout=np.float32(0.25),
            use_pooler=np.bool_(True),
        )
    )
    config = backbone.get_config()
    assert config["num_layers"] == 2 and type(config["num_layers"]) is int
    assert type(config["hidden_dim"]) is int and config["dropout"] == 0.25
    assert type(config["dropout"]) is float and config["use_pooler"] is True
    assert len(backbone.transformer_layers) == 2
    json.dumps(config)  # plain Python numbers only


BAD_ATTACHMENTS = [
    ("attach_add_ffn", {"units": 2.5}, "units=2.5"),
    ("attach_add_ffn", {"units": 0}, "units=0"),
    (
        "attach_add_ffn",
        {"units": 2, "layers": [0.5]},
        r"list of integers for layers. Received: layers=\[0.5\]",
    ),
    (
        "attach_add_ffn",
        {"units": 2, "layers": [True]},
        r"list of integers for layers. Received: layers=\[True\]",
    ),
    (
        "attach_add_ffn",
        {"units": 2, "layers": "0"},
        "list of integers for layers. Received: layers='0'",
    ),
    ("attach_add_ffn", {"units": 2, "layers": []}, r"non-empty list.*layers=\[\]"),
    ("attach_key_value_prefixes", {"length": 1.5}, "length=1.5"),
    ("attach_key_value_prefixes", {"length": 2, "dropout": 1.0}, "dropout=1.0"),
    ("attach_key_value_prefixes", {"length": 2, "reparameterize": "yes"}, "reparameterize"),
    ("attach_key_value_prefixes", {"length": 2, "hidden_units": 0}, "hidden_units=0"),
    ("attach_attention_units", {"units_per_head": -1}, "units_per_head=-1"),
    (
        "enable_drop_token",
        {"rate": 0.1, "unselectable_token_ids": [1000]},
        r"in \[0, 63\]. Received: unselectable_token_ids=\[1000\]",
    ),
]


@pytest.mark.parametrize("method, arguments, message", BAD_ATTACHMENTS)
def test_bad_attachment_arguments_attach_nothing(method, arguments, message):
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    weights = len(backbone.weights)
    with pytest.raises(ValueError, match=message):
        getattr(backbone, method)(**arguments)
    assert backbone.add_ffn is None and backbone.key_value_prefix is None
    assert backbone.add_attention_units is None and len(backbone.weights) == weights
    for block in backbone.transformer_layers:
        assert block.feed_forward_branch is None and block.key_value_prefix is None
        assert block.attention_units is None


def _models_taking_features():
    """Every model of the package that takes the backbone's feature dict."""
    from keras_masking.methods import ASATrainer
    from keras_masking.models import TransformerTextClassifier

    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    classifier = TransformerTextClassifier(backbone, num_classes=2)
    head = keras.layers.Dense(2)(backbone(backbone.input)["pooled_output"])
    dropping = TransformerBackbone(**tiny_backbone_kwargs())
    dropping.enable_drop_token(0.1, mode="attention")
    return {
        "backbone": backbone,
        "classifier": classifier,
        "drop_token_backbone": dropping,
        "asa_trainer": ASATrainer(keras.Model(backbone.input, head)),
    }


@pytest.mark.parametrize("entry", ("call", "predict"))
def test_an_unknown_input_key_is_refused_by_every_model(entry):
    # Keras matches an unknown key of a functional model's dict to another
    # input by position: predictions changed silently (by 0.26 for ASATrainer).
    features = random_features()
    extra = {**features, "labels": np.ones_like(features["token_ids"])}
    for name, model in _models_taking_features().items():
        run = model if entry == "call" else lambda x, m=model: m.predict(x, verbose=0)
        with pytest.raises(ValueError, match=r"unknown key\(s\) \['labels'\]"):
            run(extra)
        assert run(features) is not None, name


def test_the_asa_trainer_checks_ids_before_a_compiled_step():
    trainer = _models_taking_features()["asa_trainer"]
    features = random_features()
    with pytest.raises(ValueError, match="Expected token_ids in"):
        trainer.predict({**features, "token_ids": features["token_ids"] + 1000}, verbose=0)
    with pytest.raises(ValueError, match="token_ids"):
        trainer.predict({**features, "token_ids": features["token_ids"] + 0.5}, verbose=0)


def test_a_sequence_longer_than_the_table_is_refused_before_a_step_after_a_fit():
    """After a step traced on short rows, TensorFlow's retrace left the length
    unknown: a longer batch passed, came out NaN and `fit` wrote NaN into the
    weights; on JAX the refusal came from inside the step, which left the
    model without its weights. (Your own Keras model does not check its data
    before the step: see docs/backbone.md.) `fit`, `evaluate` and `predict`
    in turn, on one model."""
    from keras_masking.models import TransformerTextClassifier

    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()))
    model = TransformerTextClassifier(backbone, num_classes=2, dropout=0.0)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=True)
    short, labels = random_features(), np.array([0, 1])
    model.fit(short, labels, epochs=1, verbose=0)
    model.evaluate(short, labels, verbose=0)
    weights = [np.array(weight) for weight in model.get_weights()]
    expected = model.predict(short, verbose=0)
    for run in (
        lambda x: model.fit(x, labels, verbose=0),
        lambda x: model.evaluate(x, labels, verbose=0),
        lambda x: model.predict(x, verbose=0),
    ):
        with pytest.raises(ValueError, match="30 tokens.*max_sequence_length=24"):
            run(random_features(length=30))
        for before, after in zip(weights, model.get_weights()):
            np.testing.assert_array_equal(before, after)
        np.testing.assert_array_equal(model.predict(short, verbose=0), expected)


def test_an_error_inside_a_step_leaves_the_model_its_weights():
    """A `tf.data` batch whose padding mask is shorter than its ids is refused
    while the step traces; on JAX, Keras had taken the weights out of the
    model first, and every later call failed ("'NoneType' object is not
    callable"). `fit`, `evaluate` and `predict` in turn, on one model."""
    import tensorflow as tf

    from keras_masking.models import TransformerTextClassifier

    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()))
    model = TransformerTextClassifier(backbone, num_classes=2, dropout=0.0)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    features, labels = random_features(), np.array([0, 1])
    model.fit(features, labels, verbose=0)
    bad = {**features, "padding_mask": features["padding_mask"][:, :7]}
    dataset = tf.data.Dataset.from_tensor_slices((bad, labels)).batch(2)
    # TensorFlow retraced for any length (reduce_retracing) and fails as it runs.
    jax = keras.config.backend() == "jax"
    for entry in ("fit", "evaluate", "predict"):
        expected = model.predict(features, verbose=0)
        weights = [np.array(weight) for weight in model.get_weights()]
        data = dataset.map(lambda x, y: x) if entry == "predict" else dataset
        with pytest.raises(ValueError if jax else Exception, match="padding_mask" if jax else None):
            getattr(model, entry)(data, verbose=0)
        for before, after in zip(weights, model.get_weights()):
            np.testing.assert_array_equal(before, after)
        np.testing.assert_array_equal(model.predict(features, verbose=0), expected)
        model.fit(features, labels, verbose=0)  # and it trains on
