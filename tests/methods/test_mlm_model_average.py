"""Model averaging over MLM maskings."""

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.methods import mlm_model_average
from keras_masking.methods import sample_mlm_maskings
from keras_masking.models import TransformerBackbone
from tests.testing import random_features
from tests.testing import tiny_backbone_kwargs


def test_maskings_follow_the_pretraining_distribution():
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, 1000, size=(8, 64))
    token_ids[:, 0] = 1  # [CLS]: unselectable
    padding = np.ones_like(token_ids)
    padding[:, 60:] = 0
    masked = sample_mlm_maskings(
        token_ids,
        400,
        mask_token_id=4,
        vocabulary_size=1000,
        unselectable_token_ids=[1],
        padding_mask=padding,
        seed=3,
    )
    assert masked.shape == (400, 8, 64)
    assert (masked[:, :, 0] == 1).all() and (masked[:, :, 60:] == token_ids[:, 60:]).all()
    region = masked[:, :, 1:60]
    original = np.broadcast_to(token_ids[:, 1:60], region.shape)
    mask_share = (region == 4).mean()
    changed = ((region != original) & (region != 4)).mean()
    # Each token selected with probability 15% (stochastic rounding of the count):
    # 80% -> [MASK] (12%), 10% -> random (1.5%, almost always a change).
    assert abs(mask_share - 0.12) < 0.004
    assert abs(changed - 0.015) < 0.002


def test_model_average_equals_a_loop_over_the_same_maskings():
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    inputs = backbone.input
    logits = keras.layers.Dense(3)(backbone(inputs)["pooled_output"])
    model = keras.Model(inputs, logits)
    features = random_features(batch=3)
    averaged = keras_masking.mlm_model_average(
        model,
        features,
        mask_token_id=3,
        samples=5,
        from_logits=True,
        seed=7,
        unselectable_token_ids=[0],
    )
    masked = sample_mlm_maskings(
        features["token_ids"],
        5,
        3,
        64,
        unselectable_token_ids=[0],
        padding_mask=features["padding_mask"],
        seed=7,
    )
    loop = np.mean(
        [
            keras.ops.convert_to_numpy(keras.ops.softmax(model({**features, "token_ids": m})))
            for m in masked
        ],
        axis=0,
    )
    np.testing.assert_allclose(averaged, loop, atol=1e-5)
    assert averaged.shape == (3, 3) and np.allclose(averaged.sum(-1), 1.0)
    with pytest.raises(ValueError, match="samples"):
        keras_masking.mlm_model_average(model, features, mask_token_id=3, samples=0)
    with pytest.raises(ValueError, match="mask_token_id"):
        keras_masking.mlm_model_average(model, features, mask_token_id=64)


# === Special tokens and models with a preprocessor ===
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)
VOCABULARY = SPECIAL + [f"w{index}" for index in range(59)]  # 64 tokens


def _features(batch=4, length=10):
    """[CLS] words [SEP] [PAD]...: 7 or 8 real tokens a row."""
    rng = np.random.default_rng(1)
    token_ids = rng.integers(5, 64, size=(batch, length)).astype("int32")
    padding = np.ones((batch, length), "int32")
    for row, real in enumerate([length, length - 1] * (batch // 2)):
        token_ids[row, 0], token_ids[row, real - 1] = CLS, SEP
        token_ids[row, real:], padding[row, real:] = PAD, 0
    return {
        "token_ids": token_ids,
        "segment_ids": np.zeros_like(token_ids),
        "padding_mask": padding,
    }


def _copy_model():
    """Outputs the one-hot of each input token: averaged, the share of each
    token at each position over the maskings."""
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    padding_mask = keras.Input((None,), dtype="int32", name="padding_mask")
    one_hot = keras.layers.Embedding(64, 64, embeddings_initializer="identity")(token_ids)
    outputs = one_hot * keras.ops.cast(padding_mask, "float32")[..., None]
    return keras.Model({"token_ids": token_ids, "padding_mask": padding_mask}, outputs)


def test_the_tokenizers_special_tokens_are_never_masked_by_default():
    from keras_masking.data import bert_tokenizer

    features = _features()
    features.pop("segment_ids")
    shares = keras_masking.mlm_model_average(
        _copy_model(), features, MASK, samples=600, seed=2, tokenizer=bert_tokenizer(VOCABULARY)
    )
    token_ids = features["token_ids"]
    rows, columns = np.indices(token_ids.shape)
    kept = shares[rows, columns, token_ids]
    special = np.isin(token_ids, [CLS, SEP])
    np.testing.assert_array_equal(kept[special], 1.0)  # [CLS], [SEP]: never masked
    words = (~special) & (features["padding_mask"] > 0)
    mask_share = shares[..., MASK][words]
    assert abs(mask_share.mean() - 0.12) < 0.01  # 15% x 80%
    # Selected explicitly: every non-padding token, [CLS] and [SEP] too.
    everything = keras_masking.mlm_model_average(
        _copy_model(), features, MASK, samples=600, seed=2, unselectable_token_ids=()
    )
    assert abs(everything[..., MASK][special].mean() - 0.12) < 0.02


def test_no_tokenizer_and_no_unselectable_ids_is_refused():
    features = _features()
    features.pop("segment_ids")
    model = _copy_model()
    with pytest.raises(ValueError, match="Expected unselectable_token_ids.*Received: unselectable"):
        keras_masking.mlm_model_average(model, features, MASK, samples=2)
    with pytest.raises(ValueError, match="Expected a tokenizer with special_token_ids"):
        keras_masking.mlm_model_average(model, features, MASK, samples=2, tokenizer=object())


@pytest.mark.parametrize(
    "family", ["keras_masking", pytest.param("keras_hub", marks=pytest.mark.slow)]
)
def test_a_classifier_with_a_preprocessor_is_averaged_on_token_features(family):
    import keras_hub

    from keras_masking.data import bert_tokenizer
    from keras_masking.models import TransformerTextClassifier
    from keras_masking.models import TransformerTextClassifierPreprocessor

    if family == "keras_masking":
        preprocessor = TransformerTextClassifierPreprocessor(
            bert_tokenizer(VOCABULARY), sequence_length=10
        )
        backbone = TransformerBackbone(**tiny_backbone_kwargs())
        classifier = TransformerTextClassifier(backbone, num_classes=3, preprocessor=preprocessor)
    else:
        tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=VOCABULARY)
        preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
            tokenizer, sequence_length=10
        )
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=64,
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            intermediate_dim=64,
            max_sequence_length=16,
        )
        classifier = keras_hub.models.BertTextClassifier(
            backbone, num_classes=3, preprocessor=preprocessor
        )
    features = _features()
    averaged = keras_masking.mlm_model_average(
        classifier, features, MASK, samples=3, from_logits=True, seed=5
    )
    masked = sample_mlm_maskings(
        features["token_ids"],
        3,
        MASK,
        64,
        unselectable_token_ids=[PAD, CLS, SEP, MASK],
        padding_mask=features["padding_mask"],
        seed=5,
    )
    loop = np.mean(
        [
            keras.ops.convert_to_numpy(
                keras.ops.softmax(classifier({**features, "token_ids": m}, training=False))
            )
            for m in masked
        ],
        axis=0,
    )
    np.testing.assert_allclose(averaged, loop, atol=1e-5)
    assert classifier.preprocessor is preprocessor  # left as it was


def test_each_row_selects_the_stochastically_rounded_count_of_its_selectable_tokens():
    token_ids = np.array([[1, 5, 6, 7, 8, 9, 10, 2, 0, 0], [1] + [5] * 9])
    padding = (token_ids > 0).astype("int32")
    masked = sample_mlm_maskings(
        token_ids,
        300,
        mask_token_id=4,
        vocabulary_size=64,
        mask_rate=0.3,
        mask_token_rate=1.0,
        random_token_rate=0.0,
        unselectable_token_ids=[1, 2],
        padding_mask=padding,
        seed=0,
    )
    counts = (masked == 4).sum(axis=2)  # (samples, rows); 6 and 9 selectable tokens
    assert set(counts[:, 0].tolist()) == {1, 2} and set(counts[:, 1].tolist()) == {2, 3}
    np.testing.assert_allclose(counts.mean(axis=0), [0.3 * 6, 0.3 * 9], atol=0.12)
    assert not (masked[:, :, [0]] == 4).any() and (masked[:, 0, 7:] == token_ids[0, 7:]).all()


# === Bad input: each argument named ===
SAMPLE_BAD = [
    ({"samples": 0}, r"integer >= 1 for samples\. Received: samples=0"),
    ({"samples": 2.5}, r"integer for samples\. Received: samples=2\.5"),
    ({"samples": True}, r"integer for samples\. Received: samples=True"),
    ({"vocabulary_size": 0}, r"integer >= 1 for vocabulary_size"),
    ({"mask_token_id": 64}, r"Expected mask_token_id in \[0, 64\)"),
    ({"mask_token_id": 3.5}, "Expected an integer for mask_token_id"),
    ({"token_ids": np.full((2, 4), 1.7)}, r"Expected integer token_ids\. .*\[1\.7\]"),
    ({"token_ids": np.full((2, 4), 64)}, r"token_ids in \[0, 64\).*\[64\]"),
    ({"token_ids": np.zeros((0,), "int32")}, r"not empty\. Received: token_ids\.shape=\(0,\)"),
    ({"padding_mask": np.ones((2, 5), "int32")}, r"padding_mask of the shape .*\(2, 4\)"),
    ({"padding_mask": np.full((2, 4), 0.5)}, r"padding_mask of 0s and 1s"),
    ({"seed": -1}, r"integer >= 0 for seed"),
    ({"seed": 1.5}, r"integer for seed"),
    ({"mask_rate": 1.1}, r"Expected mask_rate in \[0.0, 1.0\]"),
    ({"unselectable_token_ids": [70]}, r"unselectable_token_ids in \[0, 63\]"),
]


@pytest.mark.parametrize("kwargs, message", SAMPLE_BAD)
def test_sample_mlm_maskings_bad_input(kwargs, message):
    arguments = dict(
        token_ids=np.ones((2, 4), "int32"), samples=3, mask_token_id=3, vocabulary_size=64
    )
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sample_mlm_maskings(**arguments)


@pytest.fixture(scope="module")
def averaged_model():
    backbone = TransformerBackbone(**tiny_backbone_kwargs(num_layers=1))
    return keras.Model(
        backbone.input, keras.layers.Dense(2)(backbone(backbone.input)["pooled_output"])
    )


AVERAGE_BAD = [
    ({"samples": 0}, ValueError, r"integer >= 1 for samples"),
    ({"samples": True}, ValueError, r"integer for samples"),
    ({"batch_size": 0}, ValueError, r"integer >= 1 for batch_size"),
    ({"from_logits": "yes"}, ValueError, r"True or False for from_logits"),
    ({"mask_token_id": 64}, ValueError, r"Expected mask_token_id in \[0, 64\)"),
    ({"mask_token_id": 3.0}, ValueError, "Expected an integer for mask_token_id"),
    ({"inputs": [1, 2]}, ValueError, r"dict of inputs holding 'token_ids'"),
    ({"inputs": {"ids": np.ones((2, 4))}}, ValueError, r"Received: \['ids'\]"),
    ({"token_ids": np.full((2, 8), 99)}, ValueError, r"token_ids in \[0, 64\)"),
    ({"token_ids": np.ones((3, 8), "int32")}, ValueError, "batch size of token_ids"),
    ({"model": "classifier"}, TypeError, "Expected a Keras model for model"),
]


@pytest.mark.parametrize("kwargs, error, message", AVERAGE_BAD)
def test_mlm_model_average_bad_input(averaged_model, kwargs, error, message):
    inputs = random_features(length=8)
    if "token_ids" in kwargs:
        inputs["token_ids"] = kwargs.pop("token_ids")
    arguments = dict(model=averaged_model, inputs=inputs, mask_token_id=3, samples=2)
    arguments.update(kwargs)
    with pytest.raises(error, match=message):
        mlm_model_average(**arguments)


def test_a_16_bit_head_is_averaged_in_float32(restore_policy):
    """A user's Dense head under mixed_bfloat16: the softmax and the mean ran in
    bfloat16 (rows summing to 1 within 2e-3 only)."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    logits = keras.layers.Dense(3)(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, logits)
    averaged = keras_masking.mlm_model_average(
        model,
        random_features(batch=3),
        mask_token_id=3,
        samples=4,
        from_logits=True,
        seed=7,
        unselectable_token_ids=[0],
    )
    assert averaged.dtype == np.float32
    np.testing.assert_allclose(averaged.sum(-1), 1.0, atol=1e-6)
