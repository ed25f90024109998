"""Shared by the ExLM tests (pretrainer, encoder, state expansion): tiny models,
inputs, and `reference_expansion`, an independent numpy construction written
from methods.md's description, row by row. The value tests share one batch
shape (2 rows of 12 tokens, k = 2, mask rate 0.5), so that JAX compiles each
eager operation once for all of them."""

import functools
import itertools

import keras
import numpy as np
import pytest

from keras_masking.layers import StateExpansion
from keras_masking.models import ExLMEncoder
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone
from tests.testing import tiny_backbone_kwargs

CLS, SEP, MASK = 1, 2, 3


LENGTH = 12


# With mask_rate 0.5 a row of 12 has room for ceil(0.5 * 12) + 3 = 9 expanded tokens
# (targets), 2 * 9 = 18 vertices and 12 + 9 = 21 slots; 12, 24 and 24 without a limit.
TARGETS, VERTICES, SLOTS = 9, 18, 21


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def rotary2d_backbone(**overrides):
    keras.utils.set_random_seed(0)
    return TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True, **overrides)
    )


def pad_rows(rows, length=LENGTH):
    return np.array([row + [0] * (length - len(row)) for row in rows], "int32")


def exlm_inputs(ids, segment_ids=None):
    """Backbone inputs; id 0 is padding."""
    ids = np.asarray(ids, "int32")
    segments = np.zeros_like(ids) if segment_ids is None else np.asarray(segment_ids, "int32")
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": (ids > 0).astype("int32")}


def make_pretrainer(backbone, **kwargs):
    options = dict(
        k=2,
        mask_rate=0.5,
        mask_token_id=MASK,
        unselectable_token_ids=(CLS, SEP),
        transition_heads=2,
        seed=1,
    )
    options.update(kwargs)
    return ExLMPretrainer(backbone, **options)


def make_encoder(backbone, **kwargs):
    return ExLMEncoder(backbone, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP), **kwargs)


def reference_expansion(ids, mask, picked, k, out_length, segment_ids=None):
    """One row expanded by hand: [CLS]/[SEP], picked tokens and [MASK]s become k slots.

    Returns the padded expanded row (ids with picked tokens shown as [MASK],
    2D positions counting real tokens only, segments, mask), the DAG vertices
    (slots of the expanded tokens), the targets (original ids of the picked
    and special tokens, in order) and each real input token's first slot.
    """
    rows = {key: [] for key in ("token_ids", "position_ids", "segment_ids")}
    vertex_slots, targets, target_is_mask, first_slot = [], [], [], {}
    real = [j for j in range(len(ids)) if mask[j]]
    for rank, j in enumerate(real):
        token = int(ids[j])
        is_target = bool(picked[j]) or token in (CLS, SEP)
        expanded = is_target or token == MASK
        if is_target:
            targets.append(token)
            target_is_mask.append(bool(picked[j]))
        first_slot[j] = len(rows["token_ids"])
        for copy in range(k if expanded else 1):
            if expanded:
                vertex_slots.append(len(rows["token_ids"]))
            rows["token_ids"].append(MASK if picked[j] else token)
            rows["position_ids"].append((rank, copy + 1 if expanded else 0))
            rows["segment_ids"].append(0 if segment_ids is None else int(segment_ids[j]))
    used = len(rows["token_ids"])
    assert used <= out_length
    pad = out_length - used
    return {
        "token_ids": np.array(rows["token_ids"] + [0] * pad, "int32"),
        "position_ids": np.array(rows["position_ids"] + [(0, 0)] * pad, "int32"),
        "segment_ids": np.array(rows["segment_ids"] + [0] * pad, "int32"),
        "padding_mask": np.array([1] * used + [0] * pad, "int32"),
        "vertex_slots": np.array(vertex_slots, "int32"),
        "targets": np.array(targets, "int32"),
        "target_is_mask": np.array(target_is_mask, bool),
        "first_slot": first_slot,
    }


def backbone_on(backbone, references):
    """The backbone's outputs on hand-expanded rows (one batch)."""
    keys = ("token_ids", "segment_ids", "padding_mask", "position_ids")
    return backbone({key: np.stack([r[key] for r in references]) for key in keys})


def brute_force_log_likelihood(match, edges):
    """log P(Y): every path 0 = a_0 < ... < a_{T-1} = N - 1, one target per vertex."""
    steps, vertices = match.shape
    total = -np.inf
    for middle in itertools.combinations(range(1, vertices - 1), steps - 2):
        path = (0,) + middle + (vertices - 1,)
        score = sum(match[i, path[i]] for i in range(steps))
        score += sum(edges[path[i - 1], path[i]] for i in range(1, steps))
        total = np.logaddexp(total, score)
    return total


def traced_call(model, x):
    """``model(x)`` inside a compiled function, where values cannot be read."""
    if keras.config.backend() == "jax":
        import jax

        def call(trainable, non_trainable, x):
            outputs, _ = model.stateless_call(trainable, non_trainable, x)
            return outputs

        outputs = jax.jit(call)(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            x,
        )
    else:
        import tensorflow as tf

        outputs = tf.function(lambda x: model(x))(x)
    return {key: to_numpy(value) for key, value in outputs.items()}


def seed_state(model):
    return to_numpy(model.seed_generator.state.value).copy()


def restore_seed(model, state):
    model.seed_generator.state.assign(state)


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


# === Item 2: packed rows with many [SEP]s ===
PACKED = [CLS, 4, 5, SEP, 6, SEP, 7, SEP, 8, SEP, 9, SEP]  # five [SEP]s: six special tokens


SHORT = [CLS, 12, 13, 14, SEP] + [0] * 7


# === Item 3: any padding layout ===
def padding_layouts(rows, length=LENGTH):
    """The rows padded right, left and inside (after their first token)."""
    right = [row + [0] * (length - len(row)) for row in rows]
    left = [[0] * (length - len(row)) + row for row in rows]
    inside = [row[:1] + [0] * (length - len(row)) + row[1:] for row in rows]
    return {"right": np.array(right), "left": np.array(left), "inside": np.array(inside)}


# === Item 5: bad input, each with a clear error; counted per entry point ===
@functools.cache
def shared_backbone():
    """One backbone for the constructors that must refuse their arguments."""
    return rotary2d_backbone()


def make_expansion(**kwargs):
    options = dict(k=2, mask_token_id=MASK, expand_token_ids=(CLS, SEP))
    options.update(kwargs)
    return StateExpansion(**options)


IDS = np.array([[CLS, 5, MASK, SEP]], "int32")


ONES = np.ones((1, 4), "int32")


def refused_without_change(instance, call, match):
    """``call(instance)`` raises a ValueError matching ``match`` and changes no
    weight and no random state."""
    weights = [to_numpy(v).copy() for v in instance.weights]
    state = seed_state(instance) if hasattr(instance, "seed_generator") else None
    with pytest.raises(ValueError, match=match):
        call(instance)
    for before, after in zip(weights, instance.weights):
        np.testing.assert_array_equal(to_numpy(after), before)
    if state is not None:  # no draw was made
        np.testing.assert_array_equal(seed_state(instance), state)
