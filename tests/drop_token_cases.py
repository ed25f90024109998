"""What the DropToken tests share (the layer, the op, the backbone, the schedule):
reference computations, compiled calls and tables of bad arguments."""

import keras
import numpy as np
import pytest

from keras_masking.layers import DropToken
from keras_masking.models import TransformerBackbone
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs


def _kept_reference(backbone, features, token_mask):
    """The backbone on each example's kept tokens, original positions."""
    token_mask = np.asarray(token_mask).astype(bool)
    batch, length = token_mask.shape
    kept = token_mask.sum(1)
    width = int(kept.max())
    sub = {
        k: np.zeros((batch, width), "int32") for k in ("token_ids", "segment_ids", "padding_mask")
    }
    positions = np.zeros((batch, width), "int32")
    for b in range(batch):
        index = np.flatnonzero(token_mask[b])
        for key in ("token_ids", "segment_ids"):
            sub[key][b, : len(index)] = features[key][b, index]
        sub["padding_mask"][b, : len(index)] = 1
        positions[b, : len(index)] = index
    output = backbone({**sub, "position_ids": positions})
    return np.asarray(output["sequence_output"]), np.asarray(output["pooled_output"]), sub


def _with_positions(backbone):
    twin = TransformerBackbone(**{**_arguments(backbone), "custom_position_ids": True})
    twin.set_weights(backbone.get_weights())
    return twin


def _arguments(backbone):
    config = backbone.get_config()
    for key in ("name", "trainable", "dtype"):
        config.pop(key)
    return config


def _cross_entropy(logits, labels):
    logits = logits - logits.max(-1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-log_probabilities[np.arange(len(labels)), labels].mean())


def _kept_count_model(length, steps_per_execution=1):
    """A one-layer model whose output is the kept-token count of a DropToken:
    with a zero target, each compiled step's loss shows the rate it used."""
    hidden = keras.Input((length, 1))
    mask = keras.Input((length,), dtype="int32")
    drop = DropToken(0.5, slot_multiple=1, seed=0)
    kept = keras.ops.sum(keras.ops.cast(drop(hidden, mask)["padding_mask"], "float32"), axis=1)
    dense = keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")
    model = keras.Model([hidden, mask], dense(kept[:, None]))
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss="mse",
        jit_compile=True,
        steps_per_execution=steps_per_execution,
    )
    return model, drop


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def compiled_call(layer, *args, **kwargs):
    """``layer(*args, training=True, **kwargs)`` as one XLA-compiled function.

    On JAX the layer runs statelessly under ``jax.jit`` and its seed state is
    written back, as Keras' trainers do.
    """
    if keras.config.backend() == "jax":
        import jax

        variables = list(layer.non_trainable_variables)

        @jax.jit
        def run(values, args, kwargs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
                outputs = layer(*args, training=True, **kwargs)
            updated = [scope.get_current_value(v) for v in variables]
            return outputs, [old if new is None else new for old, new in zip(values, updated)]

        outputs, values = run([v.value for v in variables], args, kwargs)
        for variable, value in zip(variables, values):
            variable.assign(value)
        return outputs
    import tensorflow as tf

    run = tf.function(lambda a, k: layer(*a, training=True, **k), jit_compile=True)
    return run(args, kwargs)


def call(layer, compiled, *args, **kwargs):
    if compiled:
        return compiled_call(layer, *args, **kwargs)
    return layer(*args, training=True, **kwargs)


# === protected tokens that fill the slots ===
# L = 8, rate 0.5, slot_multiple 1: four slots. [CLS] = 1, [SEP] = 2.
OVERFLOW_IDS = np.array(
    [
        [1, 2, 2, 2, 7, 0, 0, 0],  # 4 protected fill the slots: the 7 goes
        [1, 5, 2, 6, 2, 2, 0, 0],  # 4 protected, 2 droppable: both go
        [1, 3, 2, 4, 2, 5, 2, 6],  # full row, 4 protected: every other goes
        [0, 0, 0, 0, 0, 0, 0, 0],  # all padding
        [1, 5, 6, 2, 0, 0, 0, 0],  # 2 protected, 2 droppable: drop exactly 1
    ],
    "int32",
)

OVERFLOW_MASK = np.array(
    [[1] * 5 + [0] * 3, [1] * 6 + [0] * 2, [1] * 8, [0] * 8, [1] * 4 + [0] * 4], "int32"
)

FORCED_KEEP = np.array(
    [
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 1, 1, 0, 0],
        [1, 0, 1, 0, 1, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ],
    bool,
)


def _hidden(batch, length, dim=3):
    return (np.arange(batch * length * dim, dtype="float32").reshape(batch, length, dim) + 1) / 7


def _expected_gather(hidden, keep, slots):
    """The numpy construction of gather mode from a keep mask."""
    batch = keep.shape[0]
    indices = np.stack(
        [
            np.concatenate([np.flatnonzero(keep[b]), np.flatnonzero(~keep[b])])[:slots]
            for b in range(batch)
        ]
    )
    return {
        "hidden": np.stack([hidden[b, indices[b]] for b in range(batch)]),
        "padding_mask": np.stack([keep[b, indices[b]] for b in range(batch)]).astype("int32"),
        "position_ids": indices,
        "kept_indices": indices,
    }


def _compiled_model_call(model, features):
    if keras.config.backend() == "jax":
        return compiled_call(model, features)
    import tensorflow as tf

    return tf.function(lambda x: model(x, training=True), jit_compile=True)(features)


# === mixed precision ===
def _compute_dtype(policy):
    return keras.DTypePolicy(policy).compute_dtype


def _random_batch(seed=0, batch=6, length=16, dim=8):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 60, (batch, length)).astype("int32")
    lengths = rng.integers(5, length + 1, batch)
    mask = (np.arange(length)[None] < lengths[:, None]).astype("int32")
    ids[:, 0] = 1
    ids[np.arange(batch), lengths - 1] = 2
    ids = ids * mask
    return rng.normal(size=(batch, length, dim)).astype("float32"), mask, ids


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


# === A backbone with DropToken on ===
def with_drop_token(backbone, rate, **options):
    """``backbone`` (a keras-hub one converted) with ``enable_drop_token(rate, **options)``."""
    if not isinstance(backbone, TransformerBackbone):
        backbone = TransformerBackbone.from_keras_hub(backbone)
    backbone.enable_drop_token(rate, **options)
    return backbone


def copied(backbone):
    """A second backbone with ``backbone``'s config and weights."""
    twin = TransformerBackbone.from_config(backbone.get_config())
    twin.set_weights(backbone.get_weights())
    return twin


def _tiny_encoder(**options):
    backbone = randomize_weights(TransformerBackbone(**tiny_backbone_kwargs(position="rotary")))
    arguments = dict(rate=0.25, unselectable_token_ids=(1, 2), seed=4, slot_multiple=4)
    arguments.update(options)
    return with_drop_token(backbone, **arguments)


# === Bad input: a clear error for each, naming the argument ===
def _raises(pattern, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)


RATE_CASES = [
    (1.0, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.0"),
    (-0.1, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=-0\.1"),
    (1.5, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.5"),
    (True, r"Expected a number for rate\. Received: rate=True"),
    ("0.1", r"Expected a number for rate\. Received: rate='0\.1'"),
    (float("nan"), r"Expected a number for rate\. Received: rate=nan"),
    (None, r"Expected a number for rate\. Received: rate=None"),
]

DROP_TOKEN_CASES = [({"rate": rate}, pattern) for rate, pattern in RATE_CASES] + [
    ({"slot_multiple": 0}, r"integer >= 1 for slot_multiple\. Received: slot_multiple=0"),
    ({"slot_multiple": -8}, r"integer >= 1 for slot_multiple\. Received: slot_multiple=-8"),
    (
        {"slot_multiple": 2.0},
        r"Expected an integer for slot_multiple\. Received: slot_multiple=2\.0",
    ),
    (
        {"slot_multiple": True},
        r"Expected an integer for slot_multiple\. Received: slot_multiple=Tr",
    ),
    (
        {"slot_multiple": "8"},
        r"Expected an integer for slot_multiple\. Received: slot_multiple='8'",
    ),
    ({"mode": "mask"}, r"Expected one of 'gather', 'attention' for mode\. Received: mode='mask'"),
    ({"mode": None}, r"for mode\. Received: mode=None"),
    ({"unselectable_token_ids": 101}, r"list of integers for unselectable_token_ids\. "),
    (
        {"unselectable_token_ids": "101"},
        r"for unselectable_token_ids\. Received: unselectable_token_ids='1",
    ),
    ({"unselectable_token_ids": (1.5,)}, r"for unselectable_token_ids\. .*\(1\.5,\)"),
    ({"unselectable_token_ids": (True,)}, r"for unselectable_token_ids\. .*\(True,\)"),
    (
        {"unselectable_token_ids": (1, -1)},
        r"entry of unselectable_token_ids in \[0, inf\)\. .*-1\)",
    ),
    ({"protected_positions": (0.0,)}, r"for protected_positions\. .*\(0\.0,\)"),
    ({"protected_positions": (-1,)}, r"entry of protected_positions in \[0, inf\)\. .*\(-1,\)"),
    ({"protected_positions": 0}, r"for protected_positions\. Received: protected_positions=0"),
    ({"seed": 1.5}, r"Expected an integer for seed\. Received: seed=1\.5"),
    ({"seed": -1}, r"Expected an integer >= 0 for seed\. Received: seed=-1"),
    ({"seed": True}, r"Expected an integer for seed\. Received: seed=True"),
    ({"seed": "7"}, r"Expected an integer for seed\. Received: seed='7'"),
]

HIDDEN = np.ones((2, 8, 3), "float32")

MASK = np.ones((2, 8), "int32")

IDS = np.full((2, 8), 3, "int32")

CALL_CASES = [
    ((np.ones((2, 8), "float32"), MASK), {}, r"Expected hidden of shape \(batch, sequence, dim\)"),
    ((HIDDEN, np.ones((2, 7))), {}, r"Expected padding_mask of shape .*\(2, 7\)"),
    ((HIDDEN, np.ones((2, 8, 1))), {}, r"Expected padding_mask of shape .*\(2, 8, 1\)"),
    ((HIDDEN, MASK), {"token_ids": np.ones((2, 7), "int32")}, r"Expected token_ids of shape"),
    ((HIDDEN, MASK), {"token_ids": np.ones((2, 8), "float32")}, r"Expected integer token_ids"),
    (
        (HIDDEN, MASK),
        {"token_ids": None},
        r"needs token_ids to protect unselectable_token_ids=\(1,\)",
    ),
    ((HIDDEN, MASK), {"position_ids": np.ones((1, 7), "int32")}, r"Expected position_ids of"),
    ((HIDDEN, MASK), {"position_ids": np.ones((1, 8, 2, 1), "int32")}, r"Expected position_ids"),
    (
        (HIDDEN, MASK),
        {"position_ids": np.ones((2, 8), "float32")},
        r"Expected integer position_ids",
    ),
    ((HIDDEN, MASK * 2), {}, r"Expected padding_mask of 0s and 1s\. Received: .*\[2\]"),
    ((HIDDEN, MASK), {"token_ids": np.full((2, 8), 1, "int32")}, r"Row 0 has 8 protected tokens"),
    ("symbolic", {}, r"needs a static sequence length in training"),
]

REAL = np.ones((2, 4), bool)

NOISE = np.zeros((2, 4), "float32")

ROUNDING = np.zeros((2,), "float32")


def _backbone():
    return TransformerBackbone(**tiny_backbone_kwargs())


ENCODER_CASES = [
    ({"rate": 1.0}, r"Expected rate in \[0\.0, 1\.0\)\. Received: rate=1\.0"),
    ({"rate": True}, r"Expected a number for rate\. Received: rate=True"),
    ({"rate": "0.1"}, r"Expected a number for rate\. Received: rate='0\.1'"),
    ({"mode": "mask"}, r"for mode\. Received: mode='mask'"),
    ({"unselectable_token_ids": "101"}, r"for unselectable_token_ids\. Received"),
    ({"unselectable_token_ids": (101.0,)}, r"for unselectable_token_ids\."),
    ({"unselectable_token_ids": (1000,)}, r"unselectable_token_ids in \[0, \d+\]\. Received"),
    ({"slot_multiple": 0}, r"integer >= 1 for slot_multiple\. Received: slot_multiple=0"),
    ({"seed": 2.5}, r"Expected an integer for seed\. Received: seed=2\.5"),
]

SCHEDULE_CASES = [
    ({"final_rate": 1.0}, r"Expected final_rate in \[0\.0, 1\.0\)\. Received: final_rate=1\.0"),
    ({"initial_rate": -0.1}, r"Expected initial_rate in \[0\.0, 1\.0\)\. .*=-0\.1"),
    ({"final_rate": True}, r"Expected a number for final_rate\. Received: final_rate=True"),
    ({"initial_rate": "0"}, r"Expected a number for initial_rate\. Received: initial_rate='0'"),
    ({"ramp_steps": 0}, r"integer >= 1 for ramp_steps\. Received: ramp_steps=0"),
    ({"ramp_steps": 2.5}, r"Expected an integer for ramp_steps\. Received: ramp_steps=2\.5"),
    ({"ramp_steps": True}, r"Expected an integer for ramp_steps\. Received: ramp_steps=True"),
    ({"levels": 1}, r"integer >= 2 for levels\. Received: levels=1"),
    ({"levels": 3.0}, r"Expected an integer for levels\. Received: levels=3\.0"),
]
