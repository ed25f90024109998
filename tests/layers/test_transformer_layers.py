"""The transformer layers' constructors: a bad number is refused by name, never truncated."""

import keras
import pytest

from keras_masking.layers import AttentionUnits
from keras_masking.layers import FeedForward
from keras_masking.layers import MaskedLMHead
from keras_masking.layers import SelfAttention
from keras_masking.layers import TransformerBlock
from keras_masking.layers import TransformerEmbedding

EMBEDDING = dict(vocabulary_size=100, hidden_dim=32)
BLOCK = dict(num_heads=2, intermediate_dim=64)

# Each of these was accepted: a float read as its integer part, "no" as True,
# a negative or NaN epsilon kept (a LayerNorm with epsilon -1 gave NaN everywhere).
BAD_ARGUMENTS = [
    (lambda: TransformerEmbedding(100.9, 32), r"integer for vocabulary_size.*100.9"),
    (lambda: TransformerEmbedding(100, 32.7), r"integer for hidden_dim.*32.7"),
    (lambda: TransformerEmbedding(**EMBEDDING, num_segments=-1), r"num_segments.*-1"),
    (lambda: TransformerEmbedding(**EMBEDDING, max_sequence_length=0), r"max_sequence_length"),
    (lambda: TransformerEmbedding(**EMBEDDING, use_position_embedding="no"), r"use_position_emb"),
    (lambda: TransformerEmbedding(**EMBEDDING, dropout=1.0), r"dropout in \[0.0, 1.0\)"),
    (lambda: TransformerEmbedding(**EMBEDDING, layer_norm_epsilon=-1), r"layer_norm_epsilon"),
    (lambda: TransformerBlock(num_heads=2.9, intermediate_dim=64), r"integer for num_heads.*2.9"),
    (lambda: TransformerBlock(num_heads=2, intermediate_dim=64.5), r"intermediate_dim.*64.5"),
    (lambda: TransformerBlock(**BLOCK, layer_norm_epsilon=float("nan")), r"layer_norm_epsilon"),
    (lambda: TransformerBlock(**BLOCK, max_relative_position=0), r"max_relative_position"),
    (lambda: SelfAttention(num_heads=2.5, head_dim=16), r"integer for num_heads.*2.5"),
    (lambda: SelfAttention(num_heads=2, head_dim=16.9), r"integer for head_dim.*16.9"),
    (lambda: SelfAttention(num_heads=2, head_dim=16, rotary_base=0.0), r"rotary_base"),
    (lambda: FeedForward(64.9), r"integer for intermediate_dim.*64.9"),
    (lambda: AttentionUnits(4, num_heads=2.7), r"integer for num_heads.*2.7"),
    (
        lambda: MaskedLMHead(keras.layers.ReversibleEmbedding(10, 4), layer_norm_epsilon=0.0),
        r"layer_norm_epsilon in \(0.0",
    ),
]


@pytest.mark.parametrize("make, message", BAD_ARGUMENTS)
def test_bad_constructor_arguments_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_numpy_and_json_numbers_are_accepted():
    import numpy as np

    embedding = TransformerEmbedding(np.int64(100), 32, dropout=np.float32(0.0))
    assert (embedding.vocabulary_size, embedding.dropout) == (100, 0.0)
    block = TransformerBlock(num_heads=np.int32(2), intermediate_dim=64, layer_norm_epsilon=1e-12)
    assert (block.num_heads, block.layer_norm_epsilon) == (2, 1e-12)
