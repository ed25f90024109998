"""Serving: a method-trained classifier's plain inference copy, and a SavedModel taking strings."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.data import bert_tokenizer
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor
from tests.testing import eager_predict
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCABULARY = SPECIAL + list("这家店的菜很好吃服务太差了不会再来")
TEXTS = ["这家店的菜很好吃", "服务太差了，不会再来", "菜很好吃"]
SECOND = ["很好吃", "不会再来", "服务太差"]

# What a service runs: TensorFlow and tensorflow-text only. One process serves
# every SavedModel of the module (argv[1]: a JSON list of [path, texts, second]):
# serve_texts, serve_text_pairs, and serving_default with the strings it names.
SERVE = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401 (WordPiece ops)
results = []
for path, texts, second in json.loads(sys.argv[1]):
    served = tf.saved_model.load(path)
    strings = {"texts": texts, "texts_a": texts, "texts_b": second}
    single = served.signatures["serve_texts"](texts=tf.constant(texts))
    pairs = served.signatures["serve_text_pairs"](
        texts_a=tf.constant(texts), texts_b=tf.constant(second)
    )
    default = served.signatures["serving_default"]
    names = sorted(default.structured_input_signature[1])
    default = default(**{name: tf.constant(strings[name]) for name in names})
    results.append({
        "single": {key: value.numpy().tolist() for key, value in single.items()},
        "pairs": {key: value.numpy().tolist() for key, value in pairs.items()},
        "default": {key: value.numpy().tolist() for key, value in default.items()},
        "default_inputs": names,
        "signatures": sorted(served.signatures),
    })
imported = sorted(name for name in sys.modules if name.startswith("keras_masking"))
print(json.dumps({"results": results, "imported": imported}))
"""


def _trained_weights(model, seed=0):
    """Random values everywhere, the methods' own weights included (they start at zero)."""
    randomize_weights(model, seed=seed, scale=0.3)
    return model


def _classifier(methods=(), num_layers=2):
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        vocabulary_size=len(VOCABULARY),
        num_layers=num_layers,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
        position="relative",
    )
    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(VOCABULARY), sequence_length=16
    )
    classifier = TransformerTextClassifier(backbone, num_classes=3, preprocessor=preprocessor)
    for method in methods:
        if method == "drop_token":
            classifier.enable_drop_token(0.3, mode="attention", seed=1)
        elif method == "asa":
            classifier.enable_asa(tau=0.5)
        elif method == "fl_tuning":
            classifier.enable_fl_tuning(units=4)
        elif method == "lora":
            classifier.enable_lora(2)
        elif method == "prefix_tuning":
            classifier.enable_prefix_tuning(3)
    return _trained_weights(classifier)


def _plain_weight_count(serving):
    """The weights of a plain classifier of the serving copy's architecture."""
    config = serving.backbone.get_config()
    plain = TransformerBackbone.from_config(config)
    return len(TransformerTextClassifier(plain, num_classes=3).weights)


@pytest.mark.parametrize(
    "methods",
    [("drop_token", "asa"), ("fl_tuning",), ("lora",), ("fl_tuning", "lora", "drop_token")],
    ids=lambda methods: "+".join(methods),
)
def test_the_serving_copy_predicts_the_same_with_the_plain_models_weights_only(methods):
    classifier = _classifier(methods)
    serving = classifier.serving_copy()
    expected = eager_predict(classifier, TEXTS)
    np.testing.assert_allclose(serving.predict(TEXTS, verbose=0), expected, atol=1e-5)
    config = serving.backbone.get_config()
    assert (config["drop_token"], config["asa"], config["lora"], config["add_ffn"]) == (None,) * 4
    assert not config["frozen_base"] and all(w.trainable for w in serving.weights)
    assert len(serving.weights) == _plain_weight_count(serving)
    if "fl_tuning" in methods:  # a plain backbone of the wider FFN
        assert serving.backbone.intermediate_dim == 32 + 4
    # The methods' weights mattered: without them the predictions differ.
    if methods != ("drop_token", "asa"):
        plain = TransformerBackbone.from_config(
            {**classifier.backbone.get_config(), **dict.fromkeys(("add_ffn", "lora"))}
        )
        base = {v.path: v for v in classifier.backbone.weights}
        for variable in plain.weights:
            variable.assign(base[variable.path])
        without = TransformerTextClassifier(
            plain, num_classes=3, preprocessor=classifier.preprocessor
        )
        without.output_dense.set_weights(classifier.output_dense.get_weights())
        assert np.abs(eager_predict(without, TEXTS) - expected).max() > 1e-3


def test_prefixes_stay_in_the_serving_copy():
    classifier = _classifier(("prefix_tuning",))
    serving = classifier.serving_copy()
    assert serving.backbone.key_value_prefix == classifier.backbone.key_value_prefix
    np.testing.assert_allclose(
        serving.predict(TEXTS, verbose=0), eager_predict(classifier, TEXTS), atol=1e-6
    )


def _unigram_classifier(texts):
    """An e5-like classifier: a pruned `UnigramTokenizer` (its graph is the full one's plus
    the row gather; the full one's ids in the graph: tests/models/test_unigram_graph.py)."""
    from keras_masking.models import UnigramTokenizer
    from tests.models.unigram_testing import toy_model

    tokenizer, _ = UnigramTokenizer(toy_model()).prune(texts[:2])
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=tokenizer.vocabulary_size(),
            pooling="mean",
            use_pooler=False,
            num_layers=1,
        )
    )
    preprocessor = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=12)
    classifier = TransformerTextClassifier(backbone, num_classes=3, preprocessor=preprocessor)
    return _trained_weights(classifier)


# multilingual-e5's hard cases: ties, unknown characters (one ``<unk>`` each), the
# normalisation map, literal special pieces.
UNIGRAM_TEXTS = ["ab \ufb01x", "yz  c\t", "dd ab\U0001f600", "<s>cab", "", " ab"]
UNIGRAM_SECOND = ["c", "ab ab", "", "x", "\x01z", "b"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A WordPiece classifier with methods (exported with ``text_pairs=True``) and an
    e5-like one (exported as is), strings-in, served by one process that imports no keras
    (`SERVE`): ``{name: (classifier, served, predicted)}``, ``predicted`` the classifier's
    ``predict`` of the texts (``"single"``) and of the pairs (``"pairs"``)."""
    folder = tmp_path_factory.mktemp("served")
    models = {
        "wordpiece": (_classifier(("fl_tuning", "drop_token", "asa"), 1), TEXTS, SECOND, True),
        "unigram": (_unigram_classifier(UNIGRAM_TEXTS), UNIGRAM_TEXTS, UNIGRAM_SECOND, False),
    }
    jobs = []
    for name, (classifier, texts, second, text_pairs) in models.items():
        classifier.export(folder / name, text_pairs=text_pairs, verbose=False)
        jobs.append([str(folder / name), texts, second])
    done = subprocess.run(
        [sys.executable, "-c", SERVE, json.dumps(jobs)], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    output = json.loads(done.stdout.strip().splitlines()[-1])
    assert output["imported"] == []
    found = {}
    for name, result in zip(models, output["results"]):
        classifier, texts, second, _ = models[name]
        predicted = {
            "single": classifier.predict(texts, verbose=0),
            "pairs": eager_predict(classifier, (texts, second)),
        }
        found[name] = (classifier, result, predicted)
    return found


def test_a_savedmodel_that_takes_strings_serves_predict_without_the_package(served):
    classifier, served, predicted = served["wordpiece"]
    assert {"serving_default", "serve_texts", "serve_text_pairs", "serve_features"} <= set(
        served["signatures"]
    )
    expected = predicted["single"]
    single = served["single"]
    np.testing.assert_allclose(single["logits"], expected, atol=1e-5)
    np.testing.assert_allclose(single["probabilities"], keras.ops.softmax(expected), atol=1e-6)
    assert single["class_id"] == np.argmax(expected, axis=-1).tolist()
    np.testing.assert_allclose(served["pairs"]["logits"], predicted["pairs"], atol=1e-5)


def test_text_pairs_make_the_default_signature_take_two_strings(served):
    """The WordPiece classifier is exported with ``text_pairs=True`` (the e5-like one
    without it: its ``serving_default`` takes one string, `test_a_unigram_tokenizer_...`)."""
    _, served, predicted = served["wordpiece"]
    assert served["default_inputs"] == ["texts_a", "texts_b"]
    outputs = served["default"]
    np.testing.assert_allclose(outputs["logits"], predicted["pairs"], atol=1e-5)
    assert outputs["class_id"] == np.argmax(predicted["pairs"], axis=-1).tolist()


def test_without_a_preprocessor_export_is_keras_export_of_the_serving_copy(tmp_path):
    import tensorflow as tf

    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(num_layers=1)), seed=2)
    classifier = TransformerTextClassifier(backbone, num_classes=2)
    classifier.enable_asa(tau=0.5)
    classifier.export(tmp_path / "features", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "features"))
    features = random_features()
    outputs = served.serve({name: tf.constant(value) for name, value in features.items()})
    np.testing.assert_allclose(np.asarray(outputs), eager_predict(classifier, features), atol=1e-5)
    # The plain graph: ASA's adversaries are not in the SavedModel.
    paths = [variable.name for variable in served.variables]
    assert not [path for path in paths if "adversary" in path]


def test_bad_export_arguments_are_refused_before_anything_is_written(tmp_path):
    classifier = _classifier(num_layers=1)
    with pytest.raises(ValueError, match=r"Expected True or False for text_pairs"):
        classifier.export(tmp_path / "a", text_pairs="yes", verbose=False)
    with pytest.raises(ValueError, match=r"no further options.*\['bogus'\]"):
        classifier.export(tmp_path / "b", verbose=False, bogus=1)
    plain = TransformerTextClassifier(TransformerBackbone(**tiny_backbone_kwargs()), num_classes=2)
    with pytest.raises(ValueError, match="needs the classifier's preprocessor"):
        keras_masking.models.export_text_classifier(plain, tmp_path / "c")
    assert not list(tmp_path.iterdir())


def test_a_unigram_tokenizer_exports_strings_in(served):
    """multilingual-e5's tokenizer is TensorFlow ops too: the SavedModel takes strings and
    serves, without the package, what ``predict`` gives."""
    classifier, served, predicted = served["unigram"]
    texts = UNIGRAM_TEXTS
    expected = predicted["single"]
    np.testing.assert_allclose(served["single"]["logits"], expected, atol=1e-5)
    assert served["single"]["class_id"] == np.argmax(expected, axis=-1).tolist()
    # Exported without text_pairs: serving_default is serve_texts.
    assert served["default_inputs"] == ["texts"]
    np.testing.assert_allclose(served["default"]["logits"], expected, atol=1e-5)
    np.testing.assert_allclose(served["pairs"]["logits"], predicted["pairs"], atol=1e-5)
    # The ids the SavedModel packs are the Python tokenizer's.
    preprocessor = classifier.preprocessor
    tokenizer = preprocessor.tokenizer
    features = preprocessor(texts)
    rows = [[tokenizer.cls_token_id] + tokenizer.encode(text) + [tokenizer.sep_token_id]
            for text in texts]  # fmt: skip
    for row, ids in zip(rows, keras.ops.convert_to_numpy(features["token_ids"]).tolist()):
        assert ids[: len(row)] == row[:12]


def test_onnx_export_serves_predict_with_onnxruntime(tmp_path):
    """From either backend (on JAX a TensorFlow process writes the file from the same weights).

    The first layer's projections keep the all-zero biases of a fresh model:
    tf2onnx's optimizer drops such a bias, and the file then asked
    onnxruntime for a (tokens, hidden, heads, size) reshape on every input.
    Mean pooling (multilingual-e5's): its count's floor of 1 became a fourth,
    undocumented input that every call had to feed.
    """
    backbone = randomize_weights(
        TransformerBackbone(**tiny_backbone_kwargs("relative", num_layers=2, pooling="mean")),
        seed=4,
    )
    classifier = TransformerTextClassifier(backbone, num_classes=2)
    classifier.enable_fl_tuning(units=4)
    classifier.enable_drop_token(0.2, seed=1)
    randomize_weights(classifier, seed=5, scale=0.3)
    attention = backbone.transformer_layers[0].self_attention
    for projection in (attention.query, attention.key, attention.value):
        projection.bias.assign(np.zeros(projection.bias.shape, "float32"))
    path = tmp_path / "classifier.onnx"
    onnxruntime = pytest.importorskip("onnxruntime", reason="the .[export] extra")
    pytest.importorskip("tf2onnx", reason="the .[export] extra")
    classifier.export(path, format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(str(path))
    names = sorted(entry.name for entry in session.get_inputs())
    assert names == ["args_0_padding_mask", "args_0_segment_ids", "args_0_token_ids"]
    for batch, length in ((2, 10), (3, 7)):  # any batch, any length
        features = random_features(batch=batch, length=length)
        feeds = {
            entry.name: features[entry.name.removeprefix("args_0_")]
            for entry in session.get_inputs()
        }
        np.testing.assert_allclose(
            session.run(None, feeds)[0], eager_predict(classifier, features), atol=1e-5
        )


def test_onnx_export_of_a_mixed_precision_model_is_refused_before_writing(restore_policy, tmp_path):
    """tf2onnx wrote a file that ONNX Runtime refused to load (a Sub of float16
    and bfloat16 inputs), and the export raised nothing."""
    pytest.importorskip("tf2onnx", reason="the .[export] extra")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    classifier = TransformerTextClassifier(TransformerBackbone(**tiny_backbone_kwargs()), 2)
    with pytest.raises(ValueError, match="computes under mixed_bfloat16.*tf_saved_model"):
        classifier.export(tmp_path / "classifier.onnx", format="onnx")
    assert not (tmp_path / "classifier.onnx").exists()


def test_onnx_export_of_a_classifier_with_a_preprocessor_is_not_refused(tmp_path):
    """The 16-bit check read every layer's compute dtype: the preprocessor's
    tokenizer (int32) made an all-float32 classifier "compute under int32"."""
    onnxruntime = pytest.importorskip("onnxruntime", reason="the .[export] extra")
    pytest.importorskip("tf2onnx", reason="the .[export] extra")
    from keras_masking.models.onnx_export import export_onnx

    classifier = _classifier(num_layers=1)
    export_onnx(classifier, tmp_path / "classifier.onnx", verbose=False)
    session = onnxruntime.InferenceSession(str(tmp_path / "classifier.onnx"))
    features = random_features(length=16, vocabulary_size=len(VOCABULARY))
    feeds = {e.name: features[e.name.removeprefix("args_0_")] for e in session.get_inputs()}
    np.testing.assert_allclose(
        session.run(None, feeds)[0], eager_predict(classifier, features), atol=1e-5
    )
