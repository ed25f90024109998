"""Every method, turned on with one call, on each model kind the package supports.

Kinds: a `TransformerBackbone` under a user's head, a keras-hub `BertBackbone`
converted at the door (`TransformerBackbone.from_keras_hub`) under a user's
head, and a `TransformerTextClassifier` fitted on raw strings. For each: one
training step (XLA-compiled, but for the keras-hub kind on TensorFlow, whose
layers the backbone kind's step compiles) moves the weights it should and no other,
inference is the plain model's where the method is inference-identity, and
``model.save`` / ``keras.saving.load_model`` give the same predictions
without custom objects.
"""

import keras
import keras_hub
import numpy as np
import pytest

from keras_masking.data import bert_tokenizer
from keras_masking.methods import ASATrainer
from keras_masking.methods import asa_training_pass
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor
from keras_masking.utils import build_optimizer
from tests.models import exlm_testing
from tests.testing import HUB_SIZES

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("今天很好坏我喜欢讨厌电影音乐真")
VOCABULARY += [f"[unused{i}]" for i in range(64 - len(VOCABULARY))]
TEXTS = ["今天很好", "我喜欢电影", "今天很坏", "我讨厌电影"]
LABELS = np.array([1, 1, 0, 0])
CLS, SEP = 2, 3
KINDS = ("backbone", "keras_hub", "classifier")
METHODS = {
    "drop_token": lambda model: model.enable_drop_token(
        0.5, unselectable_token_ids=(CLS, SEP), mode="attention", seed=1
    ),
    "asa": lambda model: model.enable_asa(tau=0.5, seed=1),
    "fl_tuning": lambda model: model.enable_fl_tuning(units=4),
    "prefix_tuning": lambda model: model.enable_prefix_tuning(length=2, dropout=0.0),
    "lora": lambda model: model.enable_lora(2),
}
# Methods whose inference is the plain model's (LoRA's B starts at zero).
INFERENCE_IDENTITY = ("drop_token", "asa", "lora")
# Methods that freeze the pretrained weights.
FROZEN_BASE = ("fl_tuning", "prefix_tuning", "lora")


def _backbone(kind):
    keras.utils.set_random_seed(0)
    if kind == "keras_hub":
        return TransformerBackbone.from_keras_hub(
            keras_hub.models.BertBackbone(**dict(HUB_SIZES, dropout=0.0))
        )
    return TransformerBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=48,
        dropout=0.0, max_sequence_length=12,
    )  # fmt: skip


def _model(kind):
    """``(model the method is enabled on, model to train, model to predict with)``."""
    backbone = _backbone(kind)
    if kind == "classifier":
        preprocessor = TransformerTextClassifierPreprocessor(
            bert_tokenizer(VOCABULARY), sequence_length=8
        )
        classifier = TransformerTextClassifier(
            backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0
        )
        return classifier, classifier
    logits = keras.layers.Dense(2, name="head")(backbone(backbone.input)["pooled_output"])
    return backbone, keras.Model(backbone.input, logits)


def _features(kind):
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, 18, size=(4, 8)).astype("int32")
    token_ids[:, 0], token_ids[:, -1] = CLS, SEP
    padding_mask = np.ones((4, 8), "int32")
    padding_mask[1, 6:] = 0
    return {
        "token_ids": token_ids * padding_mask,
        "segment_ids": np.zeros((4, 8), "int32"),
        "padding_mask": padding_mask,
    }


def _predict(model, kind):
    """Inference outputs, eagerly (a compiled predict would be one more compile)."""
    features = model.preprocessor(TEXTS) if kind == "classifier" else _features(kind)
    return np.asarray(model(features, training=False))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_method_on_a_keras_hub_backbone_trains_predicts_clean_and_round_trips(method, tmp_path):
    """A backbone converted from keras-hub, the method enabled before the
    first fit (the other kinds enable it after one: the test below)."""
    kind = "keras_hub"
    backbone, model = _model(kind)
    plain = _predict(model, kind)
    METHODS[method](backbone)
    enabled = _predict(model, kind)
    if method in INFERENCE_IDENTITY:
        np.testing.assert_allclose(enabled, plain, atol=1e-5)
    else:
        assert np.abs(enabled - plain).max() > 1e-6

    trainer = model
    if method == "asa":
        trainer = ASATrainer(model)  # a user's own head: the backbone holds the setting
    trainer.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # On TensorFlow a tf.function without XLA (an XLA compile costs more
        # than these steps; each method's XLA step is tested with the method:
        # tests/methods/test_drop_token.py, test_asa.py, test_fl_tuning.py).
        # On JAX, without XLA the step runs op by op, slower than its XLA compile.
        jit_compile=keras.config.backend() == "jax",
    )
    build_optimizer(trainer)  # your own model: its first step traced once on TensorFlow
    variables = {id(v): (v, np.array(v.numpy())) for v in model.weights}
    history = trainer.fit(_features(kind), LABELS, batch_size=4, epochs=1, verbose=0)
    moved = {id(v) for v, before in variables.values() if not np.array_equal(v.numpy(), before)}

    head = model.get_layer("head")
    assert {id(v) for v in head.weights} <= moved
    embedding = backbone.token_embedding.embeddings
    assert (id(embedding) in moved) == (method not in FROZEN_BASE)
    if method == "asa":
        assert {"divergence", "mask_term", "masked_fraction_0"} <= set(history.history)
        assert {id(v) for a in backbone.attention_adversaries for v in a.weights} <= moved
    if method in FROZEN_BASE:
        trainable = {id(v) for v in model.trainable_weights}
        assert moved <= trainable
        assert {id(v) for v in backbone.embeddings.weights}.isdisjoint(trainable)

    expected = _predict(model, kind)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(_predict(loaded, kind), expected, atol=1e-5)
    loaded_backbone = loaded.layers[-2]
    for key in ("drop_token", "asa", "add_ffn", "key_value_prefix"):
        assert (loaded_backbone.get_config()[key] is None) == (
            backbone.get_config()[key] is None
        ), key


def test_drop_token_drops_in_training_only_with_positions_kept():
    backbone = _backbone("backbone")
    features = _features("backbone")
    plain = backbone(features)
    backbone.enable_drop_token(0.5, unselectable_token_ids=(CLS, SEP), seed=3)
    np.testing.assert_allclose(
        backbone(features)["sequence_output"], plain["sequence_output"], atol=1e-6
    )
    trained = backbone(features, training=True)
    assert tuple(trained["sequence_output"].shape) == tuple(plain["sequence_output"].shape)
    zero_rows = np.all(np.asarray(trained["sequence_output"]) == 0.0, axis=-1)
    real = features["padding_mask"].astype(bool)
    assert zero_rows[real].any() and not zero_rows[:, 0].any()  # [CLS] kept


def test_asa_on_a_classifier_predicts_the_clean_pass_and_its_mask_term_is_the_formula():
    model, _ = _model("classifier")
    model.enable_asa(tau=0.5, seed=1)
    features = model.preprocessor(TEXTS)
    features = {name: np.asarray(value) for name, value in features.items()}
    outputs = model(features, training=True)
    np.testing.assert_allclose(
        outputs["clean"], model(features, training=False), atol=1e-5
    )  # no dropout: the clean training pass is the inference pass
    kept = sum(float(np.sum(mask)) / 4 for mask in outputs["masks"])
    np.testing.assert_allclose(float(model.mask_term(outputs)), 0.25 * kept, rtol=1e-6)


def test_fl_tuning_merges_into_a_plain_classifier_with_the_same_predictions():
    model, _ = _model("classifier")
    model.enable_fl_tuning(units=4, layers=[1])
    merged = model.merge_fl()
    assert merged.backbone.intermediate_dim == 52 and merged.backbone.add_ffn is None
    np.testing.assert_allclose(
        _predict(merged, "classifier"), _predict(model, "classifier"), atol=1e-5
    )
    split = merged.unmerge_fl()
    assert split.backbone.add_ffn == {"units": 4, "layers": [1]}
    np.testing.assert_allclose(
        _predict(split, "classifier"), _predict(model, "classifier"), atol=1e-5
    )


def _compiled(model, learning_rate=0.5, jit_compile="auto"):
    """Compiled as a user would: Keras' "auto" is XLA on JAX, none on TensorFlow's CPU."""
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    build_optimizer(model)  # your own model: its first step traced once on TensorFlow
    return model


def _moved(model, fit):
    """The paths of ``model``'s weights that ``fit()`` changed."""
    before = {v.path: np.array(v.numpy()) for v in model.weights}
    history = fit()
    moved = {v.path for v in model.weights if not np.array_equal(v.numpy(), before[v.path])}
    return moved, history


def _count_calls(layer):
    """Counts the calls (traces, in a compiled step) of ``layer``."""
    calls = []
    original = layer.call

    def call(*args, **kwargs):
        calls.append(kwargs.get("training"))
        return original(*args, **kwargs)

    layer.call = call
    return calls


@pytest.mark.parametrize("kind", ("backbone", "classifier"))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_method_enabled_after_a_fit_trains_in_the_next_fit(kind, method, tmp_path):
    """Enabled after a first fit: inference stays the fitted model's where the
    method is training-only, the next fit trains the method's weights (and
    no frozen ones), and the model round trips through ``model.save``."""
    target, model = _model(kind)
    backbone = model.backbone if kind == "classifier" else target
    data = TEXTS if kind == "classifier" else _features(kind)
    trainer = model
    if method == "asa" and kind == "backbone":
        # A user's own head trains ASA through the trainer: turn it on
        # after the trainer's first fit, with the trainer's own adversaries.
        trainer = ASATrainer(model, tau=0.5, seed=1)
    # Keras' "auto" (each method's XLA step on TensorFlow is tested with the
    # method: tests/methods/test_drop_token.py, test_asa.py, test_fl_tuning.py),
    # but XLA for LoRA, whose XLA step is tested here.
    jit_compile = True if method == "lora" else "auto"
    _compiled(trainer, jit_compile=jit_compile).fit(data, LABELS, batch_size=4, epochs=1, verbose=0)
    iterations = int(trainer.optimizer.iterations.numpy())

    fitted = _predict(model, kind)
    if method == "asa" and kind == "backbone":
        METHODS["drop_token"](backbone)  # the trainer's adversarial pass follows
    else:
        METHODS[method](target)
    enabled = _predict(model, kind)
    if method in INFERENCE_IDENTITY:
        np.testing.assert_allclose(enabled, fitted, atol=1e-5)
    else:
        assert np.abs(enabled - fitted).max() > 1e-6
    drop_token_calls = _count_calls(backbone.drop_token) if backbone.drop_token else None
    moved, history = _moved(
        model, lambda: trainer.fit(data, LABELS, batch_size=4, epochs=1, verbose=0)
    )

    trainable = {v.path for v in model.trainable_weights}
    assert moved and moved <= trainable | {v.path for v in model.non_trainable_weights}
    assert int(trainer.optimizer.iterations.numpy()) == iterations + 1  # the state went on
    head = model.output_dense if kind == "classifier" else model.get_layer("head")
    assert {v.path for v in head.weights} <= moved
    embedding = backbone.token_embedding.embeddings.path
    assert (embedding in moved) == (method not in FROZEN_BASE)
    if method in FROZEN_BASE:
        assert moved <= trainable
        assert {v.path for v in backbone.embeddings.weights}.isdisjoint(trainable)
    if method == "fl_tuning":
        branches = [layer.feed_forward_branch for layer in backbone.transformer_layers]
        assert {v.path for b in branches for v in b.weights} <= moved
    if method == "prefix_tuning":
        prefixes = [layer.key_value_prefix for layer in backbone.transformer_layers]
        assert {v.path for p in prefixes for v in p.weights} <= moved
    if method == "lora":
        lora = {v.path for v in model.weights if "lora_kernel_b" in v.path}
        assert len(lora) == 2 * backbone.num_layers and lora <= moved
        assert not any(v.path.endswith("query/kernel") for v in model.trainable_weights)
    if method == "asa":
        assert {"divergence", "mask_term"} <= set(history.history)
        if kind == "classifier":  # the trainer's own adversaries are not the model's weights
            assert {v.path for a in backbone.attention_adversaries for v in a.weights} <= moved
    if method in ("drop_token", "asa") and kind == "backbone":
        assert True in drop_token_calls  # the next fit traced the dropping layer
    if method == "drop_token" and kind == "classifier":
        assert True in drop_token_calls

    expected = _predict(model, kind)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(_predict(loaded, kind), expected, atol=1e-5)
    loaded_backbone = loaded.backbone if kind == "classifier" else loaded.layers[-2]
    for key in ("drop_token", "asa", "add_ffn", "key_value_prefix"):
        assert (loaded_backbone.get_config()[key] is None) == (
            backbone.get_config()[key] is None
        ), key


@pytest.mark.parametrize("kind", ["pretrainer", "encoder"])
def test_a_method_enabled_after_a_fit_trains_an_exlm_model_in_the_next_fit(kind):
    """ExLM's models run the backbone's stages, not its call, and were never
    refreshed: after `enable_lora`, TensorFlow's next fit trained the frozen
    weights and not LoRA, and JAX's failed on the optimizer's variable count.
    A method they would leave out is refused at the next fit."""
    backbone = exlm_testing.rotary2d_backbone()
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 60, size=(8, exlm_testing.LENGTH))
    ids[:, 0], ids[:, -1] = exlm_testing.CLS, exlm_testing.SEP
    data = exlm_testing.exlm_inputs(ids)
    if kind == "pretrainer":
        model, labels = exlm_testing.make_pretrainer(backbone), None
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
    else:
        length = exlm_testing.LENGTH
        inputs = {name: keras.Input((length,), dtype="int32", name=name) for name in data}
        encoded = exlm_testing.make_encoder(backbone)(inputs)["pooled_output"]
        model, labels = keras.Model(inputs, keras.layers.Dense(2)(encoded)), LABELS.repeat(2)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(data, labels, batch_size=4, epochs=1, verbose=0)
    backbone.enable_lora(2)
    moved, _ = _moved(model, lambda: model.fit(data, labels, batch_size=4, epochs=1, verbose=0))
    lora = {v.path for v in model.weights if "lora_kernel" in v.path}
    assert len(lora) == 4 * backbone.num_layers and lora <= moved
    assert backbone.token_embedding.embeddings.path not in moved

    backbone.enable_drop_token(0.5, unselectable_token_ids=(exlm_testing.CLS, exlm_testing.SEP))
    with pytest.raises(ValueError, match="leaves out DropToken"):
        model.fit(data, labels, batch_size=4, epochs=1, verbose=0)


def test_lora_composes_with_fl_tuning_and_prefixes_and_survives_saving(tmp_path):
    model, _ = _model("classifier")
    model.enable_fl_tuning(units=4)
    model.enable_prefix_tuning(length=2, dropout=0.0)
    before = {v.path for v in model.trainable_weights}
    model.enable_lora(2)
    after = {v.path for v in model.trainable_weights}
    assert before < after  # the units and prefixes still train; LoRA's kernels join
    lora = {v.path for v in model.weights if "lora_kernel" in v.path}
    lora |= {path.replace("lora_kernel_a", "bias") for path in lora}  # keras-hub's LoRA
    assert after - before == lora
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert len(loaded.trainable_weights) == len(model.trainable_weights)
    assert loaded.backbone.lora == {"rank": 2, "target_layer_names": ["query", "value"]}
    np.testing.assert_allclose(
        _predict(loaded, "classifier"), _predict(model, "classifier"), atol=1e-5
    )
    other, _ = _model("classifier")
    other.enable_lora(2)
    other.backbone.detach_attachments()
    other.enable_fl_tuning(units=4)
    assert {v.path for v in other.weights if "lora_kernel" in v.path} <= {
        v.path for v in other.trainable_weights
    }


@pytest.mark.parametrize("method", ["fl_tuning", "prefix_tuning"])
def test_lora_trains_the_same_weights_before_or_after_a_method_that_freezes_the_base(
    method, tmp_path
):
    """LoRA's kernels and biases train whichever came first, on both backends
    and after loading (enable_lora then FL-tuning froze the biases on JAX
    only, and a loaded model trained them again)."""
    first, _ = _model("classifier")
    METHODS[method](first)
    first.enable_lora(2)
    second, _ = _model("classifier")
    second.enable_lora(2)
    METHODS[method](second)
    trainable = {v.path for v in first.trainable_weights}
    assert {v.path for v in second.trainable_weights} == trainable
    lora = {v.path for v in first.weights if "lora_kernel" in v.path}
    assert {path.replace("lora_kernel_a", "bias") for path in lora} <= trainable
    second.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert {v.path for v in loaded.trainable_weights} == trainable


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"rank": 0}, "Expected an integer >= 1 for rank"),
        ({"rank": -2}, "Expected an integer >= 1 for rank"),
        ({"rank": 2.5}, "Expected an integer for rank"),
        ({"rank": 2, "target_layer_names": ["nope"]}, r"\['nope'\] match no such layer"),
        # Keras' Embedding takes LoRA, which LoRA's merge and files do not hold.
        (
            {"rank": 2, "target_layer_names": ["token_embedding"]},
            r"\['token_embedding'\] match no such layer",
        ),
        ({"rank": 2, "target_layer_names": "query"}, "Expected a list of strings"),
        ({"rank": 2, "target_layer_names": []}, "empty"),
    ],
)
def test_lora_refuses_bad_arguments_before_changing_anything(arguments, message):
    backbone = _backbone("backbone")
    trainable = len(backbone.trainable_weights)
    with pytest.raises(ValueError, match=message):
        backbone.enable_lora(**arguments)
    assert backbone.lora is None and len(backbone.trainable_weights) == trainable


def test_fl_tuning_on_a_loaded_trained_classifier_trains_its_units(tmp_path):
    # The loaded model's optimizer was built by `compile_from_config` over the
    # old trainable set; `fit` then failed with Keras' "Unknown variable".
    model, _ = _model("classifier")
    _compiled(model).fit(TEXTS, LABELS, batch_size=4, epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    loaded.enable_fl_tuning(units=4)
    moved, _ = _moved(loaded, lambda: loaded.fit(TEXTS, LABELS, batch_size=4, verbose=0))
    branches = [layer.feed_forward_branch for layer in loaded.backbone.transformer_layers]
    assert {v.path for b in branches for v in b.weights} <= moved
    assert loaded.backbone.token_embedding.embeddings.path not in moved


# === Methods composed: each variable its own path, its own state ===
def test_the_methods_weights_have_their_own_paths_in_one_order_whatever_the_order_of_enabling():
    # The paths name the optimizer's slots, LoRA's merge and the adapter files'
    # entries: addFFN branches and prefixes built outside their blocks' scope
    # shared one path across layers, and a refreshed optimizer gave every
    # layer's branch the last layer's Adam moments.
    orders = []
    for order in (("prefix_tuning", "fl_tuning"), ("fl_tuning", "prefix_tuning")):
        backbone = _backbone("backbone")
        for method in order:
            METHODS[method](backbone)
        METHODS["asa"](backbone)
        paths = [v.path for v in backbone.weights]
        assert len(set(paths)) == len(paths)
        assert "transformer_layer_1/add_ffn/intermediate_dense/kernel" in paths
        assert "transformer_layer_1/key_value_prefix/keys" in paths
        orders.append([v.path for v in backbone.trainable_variables])
        # The order a loaded backbone has, by which Keras restores an optimizer.
        loaded = TransformerBackbone.from_config(backbone.get_config())
        assert [v.path for v in loaded.trainable_variables] == orders[-1]
    assert orders[0] == orders[1]


def test_a_method_enabled_late_keeps_each_variables_own_optimizer_state():
    target, model = _model("backbone")
    target.enable_fl_tuning(units=4)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.config.backend() == "jax",  # JAX's compiled step donates its buffers
    )
    model.fit(_features("backbone"), LABELS, batch_size=4, epochs=2, verbose=0)
    replaced = model.optimizer
    before = {v.path: np.array(v.numpy()) for v in replaced.variables}
    target.enable_drop_token(0.25, unselectable_token_ids=(CLS, SEP), mode="attention", seed=1)
    after = {v.path: np.array(v.numpy()) for v in model.optimizer.variables}
    moments = [path for path in before if "add_ffn" in path and "momentum" in path]
    assert len(moments) == 8  # two layers' branches, four weights each
    for path in moments:
        np.testing.assert_array_equal(after[path], before[path])

    # The new optimizer holds copies (on JAX the next step would delete
    # shared buffers), and `model.save` writes it, not the replaced one.
    model.fit(_features("backbone"), LABELS, batch_size=4, epochs=1, verbose=0)
    assert replaced.get_config()["learning_rate"] == pytest.approx(0.01)
    model.optimizer.learning_rate = 0.005
    assert model.get_compile_config()["optimizer"]["config"]["learning_rate"] == pytest.approx(
        0.005
    )


def test_lora_adapts_the_pretrained_layers_only_and_merges_with_fl_tuning():
    model, _ = _model("classifier")
    model.enable_fl_tuning(units=4)
    METHODS["asa"](model)
    model.enable_lora(2, target_layer_names=["query", "intermediate_dense"])
    adapted = [layer.path for layer in model.backbone.lora_layers()]
    # Not the addFFN branches' or the adversaries' layers of the same names.
    assert adapted == [
        f"transformer_layer_{i}/{name}"
        for i in range(2)
        for name in ("self_attention/query", "feed_forward/intermediate_dense")
    ]
    adversaries = {v.path for a in model.backbone.attention_adversaries for v in a.weights}
    assert adversaries <= {v.path for v in model.trainable_weights}
    _compiled(model).fit(TEXTS, LABELS, batch_size=4, epochs=1, verbose=0)
    # The serving copy merges LoRA first, then the branches into wider FFNs.
    np.testing.assert_allclose(
        _predict(model.serving_copy(), "classifier"), _predict(model, "classifier"), atol=1e-5
    )
    with pytest.raises(ValueError, match=r"merge LoRA first \(backbone.merge_lora\(\).merge_fl"):
        model.backbone.merge_fl()
    merged = model.backbone.merge_lora().merge_fl()
    assert merged.lora is None and merged.add_ffn is None


@pytest.mark.parametrize("saved_as", ["preset", "keras"])
def test_lora_loaded_from_a_preset_trains_again(saved_as, tmp_path):
    # Keras saves a LoRA layer's kernel merged and loads its LoRA kernels as
    # zeros, which have no gradient: LoRA stopped training after from_preset, and
    # after load_model of a fitted model (its optimizer comes back built).
    model, _ = _model("classifier")
    model.enable_lora(2)
    _compiled(model).fit(TEXTS, LABELS, batch_size=4, epochs=1, verbose=0)
    if saved_as == "preset":
        model.save_to_preset(str(tmp_path / "preset"))
        loaded = _compiled(TransformerTextClassifier.from_preset(str(tmp_path / "preset")))
    else:
        model.save(tmp_path / "model.keras")
        loaded = keras.saving.load_model(tmp_path / "model.keras")
        assert loaded.optimizer.built
    np.testing.assert_allclose(
        _predict(loaded, "classifier"), _predict(model, "classifier"), atol=1e-5
    )
    lora = {v.path for v in loaded.weights if "lora_kernel" in v.path}
    assert len(lora) == 8
    moved, _ = _moved(loaded, lambda: loaded.fit(TEXTS, LABELS, batch_size=4, verbose=0))
    # B trains (A has no gradient while B is zero, as after enable_lora), and
    # A was restarted (He-uniform), not nudged from zero by the optimizer's momentum.
    assert {path for path in lora if path.endswith("_b")} <= moved
    for variable in loaded.weights:
        if "lora_kernel_a" in variable.path:
            assert np.abs(keras.ops.convert_to_numpy(variable)).mean() > 0.05, variable.path


@pytest.mark.parametrize("fitted", [False, True])
def test_an_asa_trainer_refuses_what_it_would_not_train_before_anything_changes(fitted):
    target, model = _model("backbone")
    trainer = _compiled(ASATrainer(model, tau=0.5, seed=1))
    if fitted:
        trainer.fit(_features("backbone"), LABELS, batch_size=4, verbose=0)
    assert target.attacking_trainers() == [trainer]
    with pytest.raises(ValueError, match="ASA cannot attack a backbone that drops tokens"):
        target.enable_drop_token(0.25, unselectable_token_ids=(CLS, SEP), mode="gather")
    assert target.drop_token is None
    # The trainer keeps its own adversaries and settings: the backbone's would not train.
    with pytest.raises(ValueError, match="An ASATrainer already attacks this backbone"):
        target.enable_asa(tau=2.0)
    assert target.asa is None and target.attention_adversaries is None


@pytest.mark.parametrize("fitted", [False, True])
def test_a_model_of_your_own_refuses_to_fit_an_asa_backbone_without_the_trainer(fitted):
    """Your own model's `fit` would step without ASA's adversarial pass (its
    adversaries untrained, ASA ignored): the training call refuses, before
    any weight moves (on JAX, Keras' `fit` has released the weights from the
    variables before it traces the step: `weights_kept_on_error` gives them
    back), and ASATrainer(model) trains it."""
    from keras_masking.utils import weights_kept_on_error

    target, model = _model("backbone")
    features = _features("backbone")
    if fitted:
        _compiled(model).fit(features, LABELS, batch_size=4, verbose=0)
    METHODS["asa"](target)
    if not fitted:
        _compiled(model)
    with pytest.raises(ValueError, match="outside ASA's training pass"):
        model(features, training=True)
    with asa_training_pass():  # a measurement in training mode
        model(features, training=True)
    before = [np.array(v.numpy()) for v in model.weights]
    with pytest.raises(ValueError, match=r"outside ASA's training pass.*ASATrainer\(model\)"):
        with weights_kept_on_error(model):
            model.fit(features, LABELS, batch_size=4, verbose=0)
    for variable, value in zip(model.weights, before):
        np.testing.assert_array_equal(variable.numpy(), value)
    model(features, training=False)  # inference is the clean pass
    trainer = _compiled(ASATrainer(model))
    moved, history = _moved(
        model, lambda: trainer.fit(features, LABELS, batch_size=4, epochs=1, verbose=0)
    )
    adversaries = {v.path for a in target.attention_adversaries for v in a.weights}
    assert adversaries <= moved and "divergence" in history.history
