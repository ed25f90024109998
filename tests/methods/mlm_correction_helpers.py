"""Helpers of the MLM embedding correction tests (methods, callback, files)."""

import pathlib

import keras
import numpy as np

from keras_masking.methods import find_token_embedding
from keras_masking.models import TransformerBackbone
from tests.testing import HUB_SIZES
from tests.testing import tiny_backbone_kwargs

MASK = 3
SPECIAL = [0, 1, 2, 3]
WORDS = "bert/embeddings/word_embeddings"


def numpy_formula(table, mask_id=MASK, r=0.15, p_m=0.8, p_r=0.1, unselectable=None):
    """``(1-r) E + r (p_m E[MASK] + p_k E + p_r mean E)``, written out in numpy."""
    table = np.asarray(table, np.float64)
    expected = (1 - r) * table + r * (
        p_m * table[mask_id] + (1 - p_m - p_r) * table + p_r * table.mean(0)
    )
    if unselectable is not None:
        expected[unselectable] = table[unselectable]
    return expected


def table_of(model):
    """A copy of the token embedding of a model (or of an `Embedding` layer)."""
    return keras.ops.convert_to_numpy(find_token_embedding(model).embeddings).copy()


def weights_of(model):
    return [keras.ops.convert_to_numpy(w).copy() for w in model.weights]


def assert_same_weights(model, before):
    after = weights_of(model)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)


def files_in(folder):
    """``[(relative path, size)]`` of every file below ``folder``, or None."""
    folder = pathlib.Path(folder)
    if not folder.exists():
        return None
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file()
    )


def tiny_ours():
    return TransformerBackbone(**tiny_backbone_kwargs(num_layers=1))


def tiny_hub(cls):
    return cls(**{**HUB_SIZES, "num_layers": 1})
