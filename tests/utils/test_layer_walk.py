"""walk_layers: every layer a model holds, composite layers of your own included."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_masking.methods.mlm_embedding_correction import correct_mlm_embeddings
from keras_masking.methods.token_embedding_lookup import find_token_embedding
from keras_masking.models import TransformerBackbone
from keras_masking.utils.layer_walk import walk_layers
from tests.testing import tiny_backbone_kwargs


class Holder(keras.layers.Layer):
    """A composite layer of your own keeping a layer under a name of its choice."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner

    def call(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def _inputs():
    return {name: keras.Input((8,), dtype="int32", name=name)
            for name in ("token_ids", "segment_ids", "padding_mask")}  # fmt: skip


def test_a_backbone_inside_a_layer_of_your_own_is_reached():
    """Only five attribute names were followed: a backbone kept as
    `self.inner` was never reached, and neither was anything from a layer."""
    backbone = TransformerBackbone(**tiny_backbone_kwargs())
    inputs = _inputs()
    holder = Holder(backbone)
    model = keras.Model(inputs, keras.layers.Dense(2)(holder(inputs)["pooled_output"]))
    assert any(layer is backbone.embeddings.token_embedding for layer in walk_layers(model))
    assert find_token_embedding(model) is backbone.embeddings.token_embedding
    assert find_token_embedding(holder) is backbone.embeddings.token_embedding
    assert holder not in list(walk_layers(holder))  # the model itself is not yielded
    assert len({id(layer) for layer in walk_layers(model)}) == len(list(walk_layers(model)))


def test_a_tied_keras_hub_head_inside_a_layer_of_your_own_is_refused_by_keep():
    """keras-hub's tied head cannot keep the original rows: in the graph it is
    refused; inside a layer of yours, the table was corrected without a word
    and the head predicted with the corrected rows."""
    hub = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=48,
        max_sequence_length=16,
    )  # fmt: skip
    head = keras_hub.layers.MaskedLMHead(vocabulary_size=64, token_embedding=hub.token_embedding)
    inputs = _inputs()
    positions = keras.Input((2,), dtype="int32", name="mask_positions")
    outputs = Holder(head)(hub(inputs)["sequence_output"], mask_positions=positions)
    model = keras.Model({**inputs, "mask_positions": positions}, outputs)
    before = np.array(hub.token_embedding.embeddings.numpy())
    with pytest.raises(ValueError, match="tied"):
        correct_mlm_embeddings(model, mask_token_id=3, tied_output="keep")
    np.testing.assert_array_equal(hub.token_embedding.embeddings.numpy(), before)
