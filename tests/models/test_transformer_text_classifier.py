"""TransformerTextClassifier and its preprocessor: keras-hub's TextClassifier workflow."""

import functools

import keras
import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.data import bert_tokenizer
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor
from tests.testing import count_train_step_traces
from tests.testing import randomize_weights

# 100 tokens: BERT's specials first, Chinese characters, English pieces, punctuation.
VOCABULARY = (
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    + list("今天气很好坏我们你他是的不了在有这个人来去说吗呢吧和也都就要会能看想")
    + list("电影书音乐真太非常喜欢讨厌开心难过美丽糟糕")
    + ["the", "a", "is", "fox", "dog", "run", "good", "bad", "movie", "very", "not"]
    + ["##es", "##s", "##ning", "##ed", "##ly", "##ing"]
    + list("，。！？,.!?")
)
while len(VOCABULARY) < 100:
    VOCABULARY.append(f"[unused{len(VOCABULARY)}]")
LENGTH = 12
SIZES = dict(num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=48, dropout=0.0)

# A separable set: the label is whether the (second) text says 好 / 喜欢 or 坏 / 讨厌.
POSITIVE = ["今天很好", "我喜欢这个电影", "他是好人", "音乐真好"]
NEGATIVE = ["今天很坏", "我讨厌这个电影", "他是坏人", "音乐真坏"]
TEXTS = POSITIVE + NEGATIVE
LABELS = np.array([1] * 4 + [0] * 4)


def _ids(tokens):
    return [VOCABULARY.index(token) for token in tokens]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCABULARY) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def preprocessor(vocab_file):
    return TransformerTextClassifierPreprocessor(bert_tokenizer(vocab_file), sequence_length=LENGTH)


def _backbone(seed=0, **overrides):
    kwargs = dict(SIZES, vocabulary_size=len(VOCABULARY), max_sequence_length=LENGTH)
    kwargs.update(overrides)
    keras.utils.set_random_seed(seed)
    return TransformerBackbone(**kwargs)


def _classifier(preprocessor, seed=0, randomize=True, **overrides):
    backbone = _backbone(seed)
    classifier = TransformerTextClassifier(
        backbone=backbone, num_classes=3, preprocessor=preprocessor, **overrides
    )
    if randomize:
        randomize_weights(classifier, seed=seed)
    return classifier


def _numpy(features):
    return {name: np.asarray(value) for name, value in features.items()}


def _logits(model, texts):
    """A classifier's outputs on raw texts, eagerly (no compiled predict)."""
    return np.asarray(model(model.preprocessor(texts)))


# === Preprocessor ===
def test_preprocessor_packs_a_pair_into_hand_computed_ids(preprocessor):
    import tensorflow as tf

    first, second = "今天天气很好。", "Foxes running"
    expected_tokens = (
        ["[CLS]", "今", "天", "天", "气", "很", "好", "。", "[SEP]"]
        + ["fox", "##es", "run", "##ning", "[SEP]"]
        + ["[PAD]"] * 2
    )
    long = TransformerTextClassifierPreprocessor(preprocessor.tokenizer, sequence_length=16)
    eager = _numpy(long(x=([first], [second])))
    assert eager["token_ids"].tolist() == [_ids(expected_tokens)]
    assert eager["segment_ids"].tolist() == [[0] * 9 + [1] * 5 + [0] * 2]
    assert eager["padding_mask"].astype(int).tolist() == [[1] * 14 + [0] * 2]
    # The same ids from the tf.data path `fit` takes (tf-text, not the Python tokenizer).
    dataset = tf.data.Dataset.from_tensor_slices((([first], [second]), [2])).batch(1).map(long)
    mapped, labels = next(iter(dataset))
    assert np.asarray(mapped["token_ids"]).tolist() == [_ids(expected_tokens)]
    assert np.asarray(mapped["segment_ids"]).tolist() == eager["segment_ids"].tolist()
    assert np.asarray(labels).tolist() == [2]
    # One text, labels passed through.
    single, labels = long(["我喜欢"], [1])
    assert _numpy(single)["token_ids"].tolist() == [
        _ids(["[CLS]", "我", "喜", "欢", "[SEP]"]) + [0] * 11
    ]
    assert labels == [1]


@pytest.mark.parametrize(
    "truncate, kept",
    # 7 + 4 tokens in 8 - 3 = 5 places: round robin takes one from each in turn.
    [("round_robin", (3, 2)), ("waterfall", (5, 0))],
)
def test_truncation_of_a_long_pair(preprocessor, truncate, kept):
    short = TransformerTextClassifierPreprocessor(
        preprocessor.tokenizer, sequence_length=8, truncate=truncate
    )
    first = ["今", "天", "天", "气", "很", "好", "。"]
    second = ["fox", "##es", "run", "##ning"]
    packed = _numpy(short(x=(["今天天气很好。"], ["Foxes running"])))
    a, b = first[: kept[0]], second[: kept[1]]
    assert packed["token_ids"].tolist() == [_ids(["[CLS]", *a, "[SEP]", *b, "[SEP]"])]
    assert packed["segment_ids"].tolist() == [[0] * (len(a) + 2) + [1] * (len(b) + 1)]


# === The model ===
def test_predictions_equal_a_hand_built_functional_model(preprocessor):
    classifier = _classifier(preprocessor)
    backbone = classifier.backbone
    # backbone -> pooled_output -> Dense, with the classifier's weights.
    dense = keras.layers.Dense(3)
    hand = keras.Model(backbone.input, dense(backbone(backbone.input)["pooled_output"]))
    dense.set_weights(classifier.output_dense.get_weights())
    features = _numpy(preprocessor(TEXTS))
    expected = np.asarray(hand(features))
    # The pooler is in the path: the pooled vector is not the [CLS] state.
    pooled = np.asarray(backbone(features)["pooled_output"])
    kernel, bias = classifier.output_dense.get_weights()
    np.testing.assert_allclose(expected, pooled @ kernel + bias, atol=1e-5)
    # Raw texts through the classifier (its preprocessor, then its graph).
    np.testing.assert_allclose(_logits(classifier, TEXTS), expected, atol=1e-5)
    # `activation` like keras-hub's: softmax outputs, and the default loss follows it.
    probabilities = TransformerTextClassifier(
        backbone, num_classes=3, preprocessor=preprocessor, activation="softmax"
    )
    probabilities.output_dense.set_weights([kernel, bias])
    shifted = np.exp(expected - expected.max(-1, keepdims=True))
    np.testing.assert_allclose(
        _logits(probabilities, TEXTS), shifted / shifted.sum(-1, keepdims=True), atol=1e-5
    )
    assert probabilities.loss.from_logits is False and classifier.loss.from_logits is True
    assert classifier.get_config()["dropout"] == 0.1
    assert classifier.get_config()["activation"] == "linear"


def test_fit_reaches_full_accuracy_on_texts_and_pairs_with_the_mlm_correction(
    preprocessor, tmp_path
):
    backbone = _backbone(seed=3)
    classifier = TransformerTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    classifier.compile(
        optimizer=keras.optimizers.Adam(5e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    traces = count_train_step_traces(classifier)
    table = np.asarray(backbone.token_embedding.embeddings).copy()
    seen = {}
    correction = keras_masking.callbacks.MLMEmbeddingCorrection(
        mask_token_id=preprocessor.tokenizer.mask_token_id
    )
    snapshot = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: seen.setdefault(
            "table", np.asarray(backbone.token_embedding.embeddings).copy()
        )
    )
    repeats = 32  # 32 steps of 8 examples in one epoch
    classifier.fit(
        TEXTS * repeats,
        np.tile(LABELS, repeats),
        batch_size=8,
        shuffle=False,  # each batch holds the 8 texts once: 32 steps suffice for every seed
        verbose=0,
        callbacks=[correction, snapshot],
    )
    # Raw texts: the model, its metrics and optimizer are built from the
    # preprocessor's features before the step is traced, once.
    assert len(traces) == 1
    # The callback corrected the table before the first step (mask id 4, BERT's rates).
    expected = 0.85 * table + 0.15 * (0.8 * table[4] + 0.1 * table + 0.1 * table.mean(0))
    np.testing.assert_allclose(seen["table"], expected, atol=1e-6)
    assert backbone.mlm_embedding_correction["mask_token_id"] == 4
    _, accuracy = classifier.evaluate(TEXTS, LABELS, verbose=0)
    assert accuracy == 1.0
    # Pairs: the label follows the second text; the same compiled step.
    firsts = ["你说", "他说", "我们说", "你们说"] * 2
    classifier.fit(
        (firsts * repeats, TEXTS * repeats),
        np.tile(LABELS, repeats),
        batch_size=8,
        shuffle=False,
        verbose=0,
    )
    predicted = classifier.predict((firsts, TEXTS), batch_size=8, verbose=0)
    np.testing.assert_array_equal(predicted.argmax(-1), LABELS)
    np.testing.assert_allclose(
        predicted, np.asarray(classifier(preprocessor(x=(firsts, TEXTS)))), atol=1e-5
    )
    # A saved run resumes: the compilation and the optimizer's state come back.
    classifier.save(tmp_path / "trained.keras")
    restored = keras.saving.load_model(tmp_path / "trained.keras")
    assert int(restored.optimizer.iterations) == 2 * repeats
    assert float(restored.optimizer.learning_rate) == pytest.approx(5e-3)
    assert restored.jit_compile is True
    saved = {v.path: np.asarray(v) for v in classifier.optimizer.variables}
    for variable in restored.optimizer.variables:
        np.testing.assert_array_equal(np.asarray(variable), saved[variable.path])


# Texts whose tokens change if a tokenizer setting is lost: lowercase (Fox), the
# case folding (full-width Ａ and ！ are ASCII only under NFKC) and the word limit.
SETTINGS = dict(lowercase=True, case_folding="nfkc", max_input_chars_per_word=8)
SETTINGS_TEXTS = ["Fox IS Very GOOD！", "Ａ dog runninglyes", "THE movie，ＮＯＴ bad"]


def _settings_ids(tokenizer):
    return [np.asarray(ids).tolist() for ids in tokenizer(SETTINGS_TEXTS)]


def test_settings_texts_show_each_lost_setting(vocab_file):
    expected = [
        _ids(["fox", "is", "very", "good", "!"]),
        _ids(["a", "dog", "[UNK]"]),  # 11 characters: over the limit of 8
        _ids(["the", "movie", ",", "not", "bad"]),
    ]
    assert _settings_ids(bert_tokenizer(vocab_file, **SETTINGS)) == expected
    lost_settings = (
        dict(lowercase=False),
        dict(case_folding="bert"),
        dict(max_input_chars_per_word=100),
    )
    for lost in lost_settings:
        assert _settings_ids(bert_tokenizer(vocab_file, **{**SETTINGS, **lost})) != expected


def test_save_load_and_preset_round_trips_give_equal_predictions(vocab_file, tmp_path):
    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(vocab_file, **SETTINGS), sequence_length=LENGTH
    )
    settings_ids = _settings_ids(preprocessor.tokenizer)
    classifier = _classifier(preprocessor, seed=1, activation="softmax", dropout=0.2)
    expected = _logits(classifier, TEXTS + SETTINGS_TEXTS)
    pairs = (TEXTS[::-1], TEXTS)
    expected_pairs = np.asarray(classifier(preprocessor(x=pairs)))

    classifier.save(tmp_path / "classifier.keras")
    loaded = keras.saving.load_model(tmp_path / "classifier.keras")
    assert type(loaded) is TransformerTextClassifier
    assert _settings_ids(loaded.preprocessor.tokenizer) == settings_ids
    np.testing.assert_allclose(_logits(loaded, TEXTS + SETTINGS_TEXTS), expected, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(loaded(loaded.preprocessor(x=pairs))), expected_pairs, atol=1e-6
    )
    assert loaded.get_config()["dropout"] == 0.2
    assert loaded.get_config()["activation"] == "softmax"

    preset = str(tmp_path / "preset")
    classifier.save_to_preset(preset)
    for loader in (TransformerTextClassifier, keras_hub.models.TextClassifier):
        restored = loader.from_preset(preset)
        assert type(restored) is TransformerTextClassifier
        np.testing.assert_allclose(_logits(restored, TEXTS + SETTINGS_TEXTS), expected, atol=1e-6)
    ids = np.asarray(preprocessor(TEXTS + SETTINGS_TEXTS)["token_ids"])
    for loader in (
        TransformerTextClassifierPreprocessor,
        keras_hub.models.TextClassifierPreprocessor,
    ):
        restored = loader.from_preset(preset)
        assert type(restored) is TransformerTextClassifierPreprocessor
        assert restored.sequence_length == LENGTH
        texts = TEXTS + SETTINGS_TEXTS
        np.testing.assert_array_equal(np.asarray(restored(texts)["token_ids"]), ids)
    for loader in (keras_hub.tokenizers.Tokenizer, keras_hub.tokenizers.BertTokenizer):
        tokenizer = loader.from_preset(preset)
        assert tokenizer.get_vocabulary() == VOCABULARY
        assert np.asarray(tokenizer("今天很好")).tolist() == _ids(list("今天很好"))
        assert _settings_ids(tokenizer) == settings_ids
    # num_classes= builds a new head on the preset's backbone (with a warning); the
    # preset's own num_classes keeps its trained head (keras-hub built a fresh one).
    fresh = TransformerTextClassifier.from_preset(preset, num_classes=5)
    assert fresh.output_dense.kernel.shape == (32, 5)
    np.testing.assert_array_equal(
        np.asarray(fresh.backbone.token_embedding.embeddings),
        np.asarray(classifier.backbone.token_embedding.embeddings),
    )
    same = TransformerTextClassifier.from_preset(preset, num_classes=3)
    np.testing.assert_allclose(_logits(same, TEXTS + SETTINGS_TEXTS), expected, atol=1e-6)
    # A backbone preset with its tokenizer: the preprocessor fits the backbone's 16
    # positions (its default 512 was refused), or packs the sequence_length given.
    backbone_preset = tmp_path / "backbone_preset"
    classifier.backbone.save_to_preset(str(backbone_preset))
    preprocessor.tokenizer.save_to_preset(str(backbone_preset))
    for length, expected_length in ((None, LENGTH), (8, 8)):
        new = TransformerTextClassifier.from_preset(
            str(backbone_preset), num_classes=2, sequence_length=length
        )
        assert new.preprocessor.sequence_length == expected_length
    with pytest.raises(ValueError, match="sequence_length sets the preprocessor of a preset"):
        TransformerTextClassifier.from_preset(preset, sequence_length=12)


# === The package's methods ===
def test_enable_fl_tuning_leaves_only_the_add_ffn_units_and_the_head_trainable(
    preprocessor, tmp_path
):
    classifier = _classifier(preprocessor, seed=2)
    classifier.enable_fl_tuning(units=4)
    branches = [block.feed_forward_branch for block in classifier.backbone.transformer_layers]
    expected_ids = {id(v) for branch in branches for v in branch.weights}
    expected_ids |= {id(v) for v in classifier.output_dense.weights}
    assert {id(v) for v in classifier.trainable_weights} == expected_ids
    # 2 layers x (2 d k + k + d) addFFN parameters (d = 32, k = 4), and the head.
    assert sum(int(np.prod(v.shape)) for v in classifier.trainable_weights) == (
        2 * (2 * 32 * 4 + 4 + 32) + 32 * 3 + 3
    )
    # The tuned classifier round-trips with its branches, still frozen.
    expected = _logits(classifier, TEXTS)
    classifier.save(tmp_path / "tuned.keras")
    loaded = keras.saving.load_model(tmp_path / "tuned.keras")
    assert loaded.backbone.add_ffn == {"units": 4, "layers": [0, 1]}
    assert len(loaded.trainable_weights) == len(classifier.trainable_weights)
    np.testing.assert_allclose(_logits(loaded, TEXTS), expected, atol=1e-6)


def test_lora_trains_only_lora_and_the_head_and_round_trips(preprocessor, tmp_path):
    classifier = _classifier(preprocessor, seed=4)
    before = _logits(classifier, TEXTS)
    classifier.backbone.enable_lora(2)
    trainable = {v.path for v in classifier.trainable_weights}
    lora = {path for path in trainable if "lora_kernel" in path}
    assert len(lora) == 8  # 2 layers x (query, value) x (a, b)
    rest = trainable - lora - {"logits/kernel", "logits/bias"}
    assert rest and all(path.endswith(("query/bias", "value/bias")) for path in rest)
    np.testing.assert_allclose(_logits(classifier, TEXTS), before, atol=1e-6)
    rng = np.random.default_rng(0)
    for variable in classifier.trainable_weights:
        if "lora_kernel_b" in variable.path:
            variable.assign(rng.normal(0, 0.5, variable.shape).astype("float32"))
    changed = _logits(classifier, TEXTS)
    assert np.abs(changed - before).max() > 1e-3
    # Saved with the LoRA update merged into the kernels.
    classifier.save(tmp_path / "lora.keras")
    np.testing.assert_allclose(
        _logits(keras.saving.load_model(tmp_path / "lora.keras"), TEXTS), changed, atol=1e-5
    )


def test_an_asa_trainer_trains_the_classifier_on_preprocessed_batches(preprocessor):
    import tensorflow as tf

    classifier = _classifier(preprocessor, seed=5, randomize=False)
    trainer = keras_masking.methods.ASATrainer(classifier)
    assert trainer.backbone is classifier.backbone and trainer.task == "classification"
    # ASA under XLA is tests/methods/test_asa.py's; TensorFlow's XLA compile of
    # both passes is slow, so this test of the task integration compiles with
    # XLA on JAX only.
    trainer.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.config.backend() == "jax",
    )
    trainer.optimizer.build(trainer.trainable_variables)  # one trace on TensorFlow
    features = _numpy(preprocessor(TEXTS))
    before = np.asarray(classifier(features))
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    dataset = tf.data.Dataset.from_tensor_slices((TEXTS, labels)).batch(4)
    history = trainer.fit(dataset.map(classifier.preprocessor), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert 0.0 < history.history["masked_fraction_0"][0] < 1.0
    after = np.asarray(classifier(features))
    assert np.abs(after - before).max() > 1e-5  # the classifier's own weights trained
    np.testing.assert_array_equal(np.asarray(trainer(features)), after)


# === Bad input ===
def test_a_vocabulary_that_does_not_fit_the_backbone_is_refused(preprocessor):
    backbone = _backbone(vocabulary_size=len(VOCABULARY) + 28)
    with pytest.raises(ValueError, match=r"tokenizer has 100 tokens.*vocabulary_size=128"):
        TransformerTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)


def test_bad_arguments_are_refused_with_the_argument_named(preprocessor):
    backbone = _backbone()
    with pytest.raises(ValueError, match="num_classes"):
        TransformerTextClassifier(backbone, num_classes=1, preprocessor=preprocessor)
    with pytest.raises(ValueError, match="dropout"):
        TransformerTextClassifier(backbone, num_classes=2, dropout=1.0)
    with pytest.raises(ValueError, match="activation='nope'"):
        TransformerTextClassifier(backbone, num_classes=2, activation="nope")
    with pytest.raises(ValueError, match="preprocessor"):
        TransformerTextClassifier(backbone, num_classes=2, preprocessor=preprocessor.tokenizer)
    with pytest.raises(ValueError, match="Expected a keras_masking.models.TransformerBackbone"):
        TransformerTextClassifier(preprocessor, num_classes=2)
    # Keras' functional models drop unknown keywords without a word.
    with pytest.raises(ValueError, match=r"\['num_class'\] \(did you mean 'num_classes'\?\)"):
        TransformerTextClassifier(backbone, num_classes=2, num_class=3)
    with pytest.raises(ValueError, match=r"TransformerMaskedLM got the unknown argument\(s\)"):
        keras_masking.models.TransformerMaskedLM(backbone, preprocesor=preprocessor)
    long = TransformerTextClassifierPreprocessor(preprocessor.tokenizer, sequence_length=64)
    with pytest.raises(ValueError, match=f"sequence_length=64.*max_sequence_length={LENGTH}"):
        TransformerTextClassifier(backbone, num_classes=2, preprocessor=long)
    with pytest.raises(ValueError, match="position_ids"):
        TransformerTextClassifier(
            _backbone(custom_position_ids=True), num_classes=2, preprocessor=preprocessor
        )
    with pytest.raises(ValueError, match="tokenizer"):
        TransformerTextClassifierPreprocessor(VOCABULARY)
    with pytest.raises(ValueError, match="truncate='middle'"):
        TransformerTextClassifierPreprocessor(preprocessor.tokenizer, truncate="middle")
    with pytest.raises(ValueError, match="sequence_length=2"):
        TransformerTextClassifierPreprocessor(preprocessor.tokenizer, sequence_length=2)
    # A tokenizer that pads each text put its padding inside the packed row.
    padding = keras_hub.tokenizers.BertTokenizer(vocabulary=VOCABULARY, sequence_length=6)
    with pytest.raises(ValueError, match=r"without a sequence_length.*tokenizer.sequence_length=6"):
        TransformerTextClassifierPreprocessor(padding, sequence_length=10)


def test_inputs_the_packer_would_misread_are_refused(preprocessor):
    with pytest.raises(ValueError, match="tuple of 3 segments"):
        preprocessor(x=(["a"], ["b"], ["c"]))
    with pytest.raises(ValueError, match="not as a list of pairs"):
        preprocessor([("今天", "很好")])
    with pytest.raises(ValueError, match="not as a list of pairs"):
        preprocessor(np.array([["今天", "很好"]]))
    with pytest.raises(ValueError, match="2 first texts and 1 second texts"):
        preprocessor(x=(["今天", "我"], ["很好"]))


def test_a_backbone_without_segments_takes_the_preprocessor_outputs(preprocessor):
    # The preprocessor always gives segment_ids; a dict with a key the model lacks
    # would be matched by position. The classifier takes it and leaves it unused.
    backbone = _backbone(num_segments=0, use_pooler=False)
    randomize_weights(backbone)
    classifier = TransformerTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    features = _numpy(preprocessor(x=(TEXTS, TEXTS)))
    cls_state = np.asarray(
        backbone({"token_ids": features["token_ids"], "padding_mask": features["padding_mask"]})[
            "sequence_output"
        ]
    )[:, 0]
    kernel, bias = classifier.output_dense.get_weights()
    np.testing.assert_allclose(
        np.asarray(classifier(features)), cls_state @ kernel + bias, atol=1e-5
    )


def test_labels_outside_the_classes_are_refused_before_a_step(preprocessor):
    # TensorFlow's loss raised a raw InvalidArgumentError (JAX: a NaN loss).
    classifier = _classifier(preprocessor)
    classifier.compile(
        optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    texts = TEXTS[:2]
    for labels in (np.array([5, 7]), np.array([0, -1]), np.array([0.5, 1.0])):
        with pytest.raises(ValueError, match=r"Expected class labels in \[0, 3\)"):
            classifier.fit(texts, labels, verbose=0)
        with pytest.raises(ValueError, match=r"Expected class labels in \[0, 3\)"):
            classifier.evaluate(texts, labels, verbose=0)
    classifier.fit(texts, np.array([0, 2]), verbose=0)  # in range
    with pytest.raises(ValueError, match="one-hot labels"):  # the sparse loss takes ids
        classifier.fit(texts, np.eye(3)[[0, 2]], verbose=0, epochs=0)


def test_labels_outside_the_classes_in_a_compiled_step_give_a_nan_loss():
    """From `tf.data` no check can run before the step: its loss is NaN, not a number
    JAX computed from another class (0.549 for a label 3 of 3 classes)."""
    import tensorflow as tf

    from tests.testing import random_features
    from tests.testing import tiny_backbone_kwargs

    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=3)
    classifier = TransformerTextClassifier(backbone, num_classes=3, dropout=0.0)
    classifier.compile(optimizer="sgd", jit_compile=True)

    def loss(labels):
        data = tf.data.Dataset.from_tensor_slices((random_features(), np.array(labels))).batch(2)
        return classifier.evaluate(data, verbose=0, return_dict=True)["loss"]

    assert np.isfinite(loss([0, 2]))
    assert np.isnan(loss([0, 3])) and np.isnan(loss([-1, 0]))


def test_the_logits_are_computed_in_float32_under_mixed_precision(restore_policy):
    """keras-hub's head runs in the backbone's policy: bfloat16 logits, 0.4% off."""
    from tests.testing import random_features
    from tests.testing import tiny_backbone_kwargs

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs()), seed=3)
    model = TransformerTextClassifier(backbone, num_classes=3, dropout=0.0)
    features = random_features()
    pooled = keras.ops.convert_to_numpy(backbone(features)["pooled_output"])
    logits = keras.ops.convert_to_numpy(model(features))
    kernel, bias = (np.asarray(w, "float64") for w in model.output_dense.weights)
    assert pooled.dtype != np.float32 and logits.dtype == np.float32
    np.testing.assert_allclose(
        logits, pooled.astype("float64") @ kernel + bias, rtol=1e-5, atol=1e-6
    )


def _toy_classifier():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("今天很好坏我喜欢讨厌电影")
    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(vocabulary), sequence_length=10
    )
    keras.utils.set_random_seed(0)
    backbone = randomize_weights(
        TransformerBackbone(
            vocabulary_size=len(vocabulary), num_layers=1, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=10, dropout=0.0,
        )
    )  # fmt: skip
    return TransformerTextClassifier(
        backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0
    )


def test_pairs_the_data_would_misread_are_refused_by_name():
    """A dataset of (texts_a, texts_b) is Keras' (x, y): predict scored texts_a
    alone (3% off on the logits); a list of pairs failed on a shape."""
    import tensorflow as tf

    model = _toy_classifier()
    first, second = ["今天很好", "我讨厌电影"], ["我喜欢", "很坏"]
    pairs = tf.data.Dataset.from_tensor_slices((first, second)).batch(2)
    with pytest.raises(ValueError, match=r"reads as the labels.*\(\(texts_a, texts_b\),\)"):
        model.predict(pairs, verbose=0)
    wrapped = tf.data.Dataset.from_tensor_slices(((first, second),)).batch(2)
    np.testing.assert_allclose(
        model.predict(wrapped, verbose=0), model.predict((first, second), verbose=0), atol=1e-6
    )
    with pytest.raises(ValueError, match="not as a list of pairs"):
        model.predict(list(zip(first, second)), verbose=0)
    with pytest.raises(ValueError, match="not as a list of pairs"):
        model.predict(tf.constant(list(zip(first, second))), verbose=0)


def test_an_activation_the_default_loss_cannot_read_needs_a_loss(preprocessor):
    """keras-hub's default loss read sigmoid outputs as logits (on JAX: a softmax
    cross-entropy of the sigmoids, 0.83 nats off the TensorFlow value)."""
    classifier = _classifier(preprocessor, activation="sigmoid")
    labels = np.array([0, 2, 1])
    with pytest.raises(ValueError, match=r"activation=.*sigmoid.*BinaryCrossentropy"):
        classifier.evaluate(TEXTS[:3], labels, verbose=0)
    classifier.compile(loss=keras.losses.BinaryCrossentropy(), metrics=[])
    multi_hot = np.eye(3, dtype="float32")[labels]
    probabilities = classifier.predict(TEXTS[:3], verbose=0).astype("float64")
    expected = -np.mean(
        multi_hot * np.log(probabilities) + (1 - multi_hot) * np.log(1 - probabilities)
    )
    loss = classifier.evaluate(TEXTS[:3], multi_hot, verbose=0, return_dict=True)["loss"]
    assert loss == pytest.approx(expected, rel=1e-5)
    for activation in (None, "softmax"):  # the default loss reads these
        _classifier(preprocessor, activation=activation).evaluate(TEXTS[:3], labels, verbose=0)


def test_labels_the_loss_cannot_read_are_refused_by_name():
    model = _toy_classifier()
    texts = ["今天很好", "我讨厌电影"]
    with pytest.raises(ValueError, match="labels of strings such as 'pos'"):
        model.evaluate(texts, np.array(["pos", "neg"]), verbose=0)
    one_hot = np.eye(2)[[1, 0]]
    with pytest.raises(ValueError, match=r"one-hot labels of shape \(2, 2\).*argmax"):
        model.evaluate(texts, one_hot, verbose=0)
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    one_hot_loss = model.evaluate(texts, one_hot, verbose=0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert one_hot_loss == pytest.approx(
        model.evaluate(texts, np.array([1, 0]), verbose=0), rel=1e-6
    )


def test_the_default_metric_reads_the_labels_of_the_compiled_loss(preprocessor):
    """keras-hub's "auto" metric stayed a sparse accuracy whatever the loss: one-hot
    labels in batches as large as the classes got a wrong accuracy (0.33 for 0.83),
    other batches a shape error, and the docstring's multi-label example failed."""
    texts, ids = TEXTS[:6], np.array([0, 2, 1, 1, 0, 2])
    one_hot = np.eye(3, dtype="float32")[ids]
    multi_hot = (np.arange(3) <= ids[:, None]).astype("float32")
    classifier = _classifier(preprocessor, dropout=0.0)
    classifier.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    predicted = classifier.predict(texts, verbose=0).argmax(-1)
    result = classifier.evaluate(texts, one_hot, batch_size=3, verbose=0, return_dict=True)
    assert result["categorical_accuracy"] == pytest.approx(np.mean(predicted == ids))
    for activation, loss, threshold in (
        ("sigmoid", keras.losses.BinaryCrossentropy(), 0.5),  # the docstring's example
        (None, keras.losses.BinaryCrossentropy(from_logits=True), 0.0),
    ):
        multi_label = _classifier(preprocessor, activation=activation, dropout=0.0)
        multi_label.compile(loss=loss)
        if activation == "sigmoid":  # the docstring's example fits
            multi_label.fit(texts, multi_hot, batch_size=4, epochs=1, verbose=0)
        outputs = multi_label.predict(texts, verbose=0)
        result = multi_label.evaluate(texts, multi_hot, batch_size=4, verbose=0, return_dict=True)
        assert result["binary_accuracy"] == pytest.approx(
            np.mean((outputs > threshold) == multi_hot)
        )
    classifier.compile(loss="mse")
    assert "loss" in classifier.evaluate(texts, one_hot, verbose=0, return_dict=True)
    assert not [name for name in classifier.metrics_names if "accuracy" in name]


def test_class_ids_outside_the_classes_are_checked_for_a_sparse_loss_only(preprocessor):
    """Integer regression targets at or above num_classes made the loss NaN;
    float class ids from `tf.data` skipped the check (3 of 3 classes scored as
    0, 1.5 read as class 1)."""
    import tensorflow as tf

    regression = _classifier(preprocessor, dropout=0.0)
    regression.compile(loss="mse", metrics=[])
    targets = np.array([[1, 4, 0], [0, 3, 5], [2, 5, 1]])
    outputs = regression.predict(TEXTS[:3], verbose=0).astype("float64")
    loss = regression.evaluate(TEXTS[:3], targets, verbose=0, return_dict=True)["loss"]
    assert loss == pytest.approx(np.mean((outputs - targets) ** 2), rel=1e-5)

    classifier = _classifier(preprocessor, dropout=0.0)
    classifier.compile(jit_compile=True)

    def loss_of(labels):
        data = tf.data.Dataset.from_tensor_slices((TEXTS[:2], np.array(labels, "float32")))
        return classifier.evaluate(data.batch(2), verbose=0, return_dict=True)["loss"]

    assert np.isfinite(loss_of([0.0, 2.0]))
    assert np.isnan(loss_of([0.0, 3.0])) and np.isnan(loss_of([1.5, 0.0]))


def _own_sparse_loss(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def _own_one_hot_loss(y_true, y_pred):
    return keras.losses.categorical_crossentropy(y_true, y_pred, from_logits=True)


def test_every_spelling_of_a_sparse_loss_keeps_the_accuracy_and_the_label_check(preprocessor):
    """Only the lowercase name, the object and the function were read as a
    sparse loss: the others lost the accuracy, and on JAX a label outside
    the classes gave a finite loss instead of NaN. A loss of your own is
    taken to read class ids, as keras-hub's default."""
    import tensorflow as tf

    texts, ids = TEXTS[:6], np.array([0, 2, 1, 1, 0, 2])
    classifier = _classifier(preprocessor, dropout=0.0)
    accuracy = np.mean(classifier.predict(texts, verbose=0).argmax(-1) == ids)
    labels = np.array([0, 1, 2, 0, 1, 3])  # 3 of 3 classes
    data = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(6)
    for loss, metric in (
        ("SparseCategoricalCrossentropy", "sparse_categorical_accuracy"),
        (
            functools.partial(keras.losses.sparse_categorical_crossentropy, from_logits=True),
            "sparse_categorical_accuracy",
        ),
        (_own_sparse_loss, "accuracy"),  # Keras' "accuracy": class ids here, by their shape
    ):
        classifier.compile(loss=loss, jit_compile=True)
        result = classifier.evaluate(texts, ids, verbose=0, return_dict=True)
        assert result[metric] == pytest.approx(accuracy), loss
        assert np.isnan(classifier.evaluate(data, verbose=0, return_dict=True)["loss"]), loss


def test_a_loss_of_your_own_takes_one_hot_labels(preprocessor):
    """Read as taking class ids, a loss of your own over one-hot labels was
    refused ("Expected class ids for the compiled sparse cross-entropy").
    Its accuracy, Keras' "accuracy", reads one-hot rows as a categorical one."""
    texts, ids = TEXTS[:6], np.array([0, 2, 1, 1, 0, 2])
    one_hot = np.eye(3, dtype="float32")[ids]
    classifier = _classifier(preprocessor, dropout=0.0)
    logits = classifier.predict(texts, verbose=0).astype("float64")
    classifier.compile(loss=_own_one_hot_loss)
    result = classifier.evaluate(texts, one_hot, verbose=0, return_dict=True)
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == ids))
    shifted = logits - logits.max(-1, keepdims=True)
    cross_entropy = np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(6), ids]
    assert result["loss"] == pytest.approx(np.mean(cross_entropy), rel=1e-5)


def test_multi_hot_labels_get_a_binary_accuracy_or_a_refusal_never_an_argmax(preprocessor):
    """The package's multi-label loss was read as a loss of your own: its
    "accuracy" compared the argmax of each multi-hot row with the logits'
    (0.0 where the entries at the loss's threshold, 0 on scores, give 0.56).
    It gets a binary accuracy at 0; a loss of your own on concrete multi-hot
    rows is refused until its metrics are given."""
    from keras_masking.losses.multilabel_crossentropy import multilabel_categorical_crossentropy

    texts, multi_hot = TEXTS[:6], np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]] * 2, "float32")
    classifier = _classifier(preprocessor, dropout=0.0)
    logits = classifier.predict(texts, verbose=0)
    classifier.compile(loss=multilabel_categorical_crossentropy)
    result = classifier.evaluate(texts, multi_hot, verbose=0, return_dict=True)
    assert result["binary_accuracy"] == pytest.approx(np.mean((logits > 0) == multi_hot))
    classifier.compile(loss=_own_one_hot_loss)
    with pytest.raises(ValueError, match="rows of shape \\(6, 3\\) that do not sum to 1.*metrics="):
        classifier.evaluate(texts, multi_hot, verbose=0)
    classifier.compile(loss=_own_one_hot_loss, metrics=[])
    assert "loss" in classifier.evaluate(texts, multi_hot, verbose=0, return_dict=True)


def test_a_loss_of_your_own_on_soft_labels_trains(preprocessor, tmp_path):
    """Soft rows (label smoothing) for a loss of your own went through the
    class-id guard: every loss NaN, and fit changed no weight. The package's
    multi-label loss, unregistered, made a saved classifier fail to load."""
    from keras_masking.losses.multilabel_crossentropy import multilabel_categorical_crossentropy

    texts, ids = TEXTS[:6], np.array([0, 2, 1, 1, 0, 2])
    soft = (np.eye(3)[ids] * 0.9 + 0.1 / 3).astype("float32")
    classifier = _classifier(preprocessor, dropout=0.0)
    logits = classifier.predict(texts, verbose=0).astype("float64")
    classifier.compile(loss=_own_one_hot_loss, optimizer=keras.optimizers.SGD(0.1))
    result = classifier.evaluate(texts, soft, verbose=0, return_dict=True)
    log_softmax = logits - logits.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    assert result["loss"] == pytest.approx(np.mean(-(soft * log_softmax).sum(-1)), rel=1e-5)
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(-1) == ids))
    before = classifier.output_dense.kernel.numpy().copy()
    history = classifier.fit(texts, soft, batch_size=6, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not np.array_equal(classifier.output_dense.kernel.numpy(), before)
    classifier.compile(loss=multilabel_categorical_crossentropy)
    classifier.save(tmp_path / "multilabel.keras")
    restored = keras.saving.load_model(tmp_path / "multilabel.keras")
    assert restored.loss is multilabel_categorical_crossentropy


def test_a_loss_given_as_the_one_entry_of_a_list_or_dict_is_read_as_that_loss(preprocessor):
    """Keras takes ``loss=[loss]`` or ``{"logits": loss}`` for one output: read as
    a loss of your own, a one-hot loss got the sparse accuracy and its labels
    were refused, and ``["mse"]`` got the class-id check (a NaN loss)."""
    import tensorflow as tf

    texts, ids = TEXTS[:6], np.array([0, 2, 1, 1, 0, 2])
    one_hot = np.eye(3, dtype="float32")[ids]
    classifier = _classifier(preprocessor, dropout=0.0)
    predicted = classifier.predict(texts, verbose=0)
    for loss in (["categorical_crossentropy"], {"logits": "categorical_crossentropy"}):
        classifier.compile(loss=loss)
        result = classifier.evaluate(texts, one_hot, verbose=0, return_dict=True)
        assert result["categorical_accuracy"] == pytest.approx(np.mean(predicted.argmax(-1) == ids))
    targets = np.array([[0, 3, 5], [5, 2, 1], [1, 1, 4]], "float32")
    classifier.compile(loss=["mse"], metrics=[])
    data = tf.data.Dataset.from_tensor_slices((texts[:3], targets)).batch(3)
    loss = classifier.evaluate(data, verbose=0, return_dict=True)["loss"]
    assert loss == pytest.approx(np.mean((predicted[:3] - targets) ** 2), rel=1e-5)
