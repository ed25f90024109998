"""ExLM, hardened: overflow, padding layouts, float32 transitions, NaN, bad input, configs.

Every expansion is compared with `reference_expansion`, an independent numpy
construction written from methods.md's description, row by row. The value
tests share one batch shape (2 rows of 12 tokens, k = 2, mask rate 0.5), so
that JAX compiles each eager operation once for the whole file.
"""

import functools
import itertools

import keras
import numpy as np
import pytest
from tests.testing import tiny_backbone_kwargs

from keras_masking.data import repeated_mlm
from keras_masking.layers import DAGTransition
from keras_masking.layers import StateExpansion
from keras_masking.losses import dag_loss
from keras_masking.models import ExLMEncoder
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone

CLS, SEP, MASK = 1, 2, 3
LENGTH = 12
# With mask_rate 0.5 a row of 12 has room for ceil(0.5 * 12) + 3 = 9 expanded tokens
# (targets), 2 * 9 = 18 vertices and 12 + 9 = 21 slots; 12, 24 and 24 without a limit.
TARGETS, VERTICES, SLOTS = 9, 18, 21


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _backbone(**overrides):
    keras.utils.set_random_seed(0)
    return TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True, **overrides)
    )


def _pad(rows, length=LENGTH):
    return np.array([row + [0] * (length - len(row)) for row in rows], "int32")


def _inputs(ids, segment_ids=None):
    """Backbone inputs; id 0 is padding."""
    ids = np.asarray(ids, "int32")
    segments = np.zeros_like(ids) if segment_ids is None else np.asarray(segment_ids, "int32")
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": (ids > 0).astype("int32")}


def _pretrainer(backbone, **kwargs):
    options = dict(
        k=2,
        mask_rate=0.5,
        mask_token_id=MASK,
        special_token_ids=(CLS, SEP),
        transition_heads=2,
        seed=1,
    )
    options.update(kwargs)
    return ExLMPretrainer(backbone, **options)


def _encoder(backbone, **kwargs):
    return ExLMEncoder(backbone, mask_token_id=MASK, special_token_ids=(CLS, SEP), **kwargs)


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


def _backbone_on(backbone, references):
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
    return {key: _numpy(value) for key, value in outputs.items()}


def _seed_state(model):
    return _numpy(model.seed_generator.state.value).copy()


def _restore_seed(model, state):
    model.seed_generator.state.assign(state)


def _log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


# === Item 7: the pretrainer's targets, vertices and emissions, by hand ===
HAND = [[CLS, 5, 6, 7, 8, SEP] + [0] * 6, [0] * 8 + [CLS, 9, 10, SEP]]  # right / left padded


def test_pretrainer_targets_vertices_and_emissions_match_a_numpy_construction():
    backbone = _backbone()
    model = _pretrainer(backbone, seed=5)
    segments = [[0, 0, 0, 1, 1, 1] + [0] * 6, [0] * 10 + [1, 1]]
    x = _inputs(HAND, segment_ids=segments)
    outputs = model(x)
    y = {key: _numpy(value) for key, value in outputs.items()}
    picked = y["picked"]
    # Four candidates at rate 0.5: exactly two masks; two candidates: one or two.
    assert picked[0].sum() == 2 and set(np.flatnonzero(picked[0])) <= {1, 2, 3, 4}
    assert 1 <= picked[1].sum() <= 2 and set(np.flatnonzero(picked[1])) <= {9, 10}
    assert y["match"].shape == (2, TARGETS, VERTICES)
    assert y["log_transitions"].shape == (2, VERTICES, VERTICES)
    references = [
        reference_expansion(
            x["token_ids"][b], x["padding_mask"][b], picked[b], 2, SLOTS, segments[b]
        )
        for b in range(2)
    ]
    # Emissions: the backbone on the hand-expanded rows, the LM head at the vertices.
    hidden = _backbone_on(backbone, references)["sequence_output"]
    vertex_slots = _pad([r["vertex_slots"].tolist() for r in references], VERTICES)
    log_p = _log_softmax(_numpy(model.lm_head(hidden, vertex_slots)))
    # Transitions: the head on those states, each slotted at its expanded position.
    counts = [len(r["vertex_slots"]) for r in references]
    vertex_mask = (np.arange(VERTICES)[None] < np.array(counts)[:, None]).astype("int32")
    vertex_hidden = np.take_along_axis(_numpy(hidden), vertex_slots[..., None], axis=1)
    edges = _numpy(model.transition(vertex_hidden, vertex_mask, slot_index=vertex_slots))
    expected_loss = []
    for b, reference in enumerate(references):
        n, t = len(reference["vertex_slots"]), len(reference["targets"])
        assert (y["output_length"][b], y["target_length"][b]) == (n, t)
        np.testing.assert_array_equal(y["vertex_slots"][b], vertex_slots[b])
        np.testing.assert_array_equal(y["targets"][b, :t], reference["targets"])
        np.testing.assert_array_equal(y["target_is_mask"][b, :t], reference["target_is_mask"])
        assert not y["target_is_mask"][b, t:].any()
        want = log_p[b, :n][:, reference["targets"]].T  # match[i, u] = log P_u(y_i)
        np.testing.assert_allclose(y["match"][b, :t, :n], want, atol=1e-4)
        np.testing.assert_allclose(y["log_transitions"][b, :n, :n], edges[b, :n, :n], atol=1e-4)
        assert np.isneginf(y["log_transitions"][b, n:]).all()
        log_likelihood = brute_force_log_likelihood(
            y["match"][b, :t, :n].astype("float64"), y["log_transitions"][b, :n, :n]
        )
        expected_loss.append(-log_likelihood / t)
    loss = float(_numpy(model.compute_loss(x, None, outputs)))
    np.testing.assert_allclose(loss, np.mean(expected_loss), rtol=1e-5)


# === Item 2: packed rows with many [SEP]s ===
PACKED = [CLS, 4, 5, SEP, 6, SEP, 7, SEP, 8, SEP, 9, SEP]  # five [SEP]s: six special tokens
SHORT = [CLS, 12, 13, 14, SEP] + [0] * 7


def test_encoder_rows_that_do_not_fit_raise_eagerly_and_are_nan_when_compiled():
    backbone = _backbone()
    x = _inputs([PACKED, SHORT])
    encoder = _encoder(backbone, k=2)  # max_expanded_tokens=3
    with pytest.raises(ValueError, match=r"Rows \[0\] hold more than max_expanded_tokens=3"):
        encoder(x)
    y = traced_call(encoder, x)
    assert np.isnan(y["pooled_output"][0]).all() and np.isnan(y["sequence_output"][0]).all()
    assert np.isfinite(y["pooled_output"][1]).all()
    # Sized for any input: each row is the backbone on its hand-expanded row.
    out = _encoder(backbone, k=2, max_expanded_tokens=None)(x)
    np.testing.assert_allclose(_numpy(out["pooled_output"])[1], y["pooled_output"][1], atol=1e-5)
    references = [
        reference_expansion(x["token_ids"][b], x["padding_mask"][b], [0] * LENGTH, 2, 2 * LENGTH)
        for b in range(2)
    ]
    hand = _backbone_on(backbone, references)
    for b, reference in enumerate(references):
        real, slots = zip(*sorted(reference["first_slot"].items()))
        np.testing.assert_allclose(
            _numpy(out["sequence_output"])[b, list(real)],
            _numpy(hand["sequence_output"])[b, list(slots)],
            atol=1e-5,
        )
    np.testing.assert_allclose(
        _numpy(out["pooled_output"]), _numpy(hand["pooled_output"]), atol=1e-5
    )


@pytest.mark.parametrize("max_special_tokens, targets", [(None, LENGTH), (6, TARGETS)])
def test_a_packed_row_with_five_separators_keeps_every_target(max_special_tokens, targets):
    backbone = _backbone()
    # Room for min(ceil(0.25 * 12) + 6, 12) = 9 expanded tokens, or for all 12 when None.
    model = _pretrainer(backbone, mask_rate=0.25, max_special_tokens=max_special_tokens)
    x = _inputs([PACKED, SHORT])
    y = {key: _numpy(value) for key, value in model(x).items()}
    assert y["match"].shape == (2, targets, 2 * targets)
    assert not y["overflow"].any()
    for b in range(2):
        reference = reference_expansion(
            x["token_ids"][b], x["padding_mask"][b], y["picked"][b], 2, LENGTH + targets
        )
        n, t = len(reference["vertex_slots"]), len(reference["targets"])
        assert (y["output_length"][b], y["target_length"][b]) == (n, t)
        np.testing.assert_array_equal(y["targets"][b, :t], reference["targets"])
        np.testing.assert_array_equal(y["vertex_slots"][b, :n], reference["vertex_slots"])
    # Every [SEP] of the packed row is a target, the last one emitted by the last vertex.
    assert (y["targets"][0] == SEP).sum() == 5
    assert y["target_length"][0] == 6 + y["picked"][0].sum()
    assert y["targets"][0, y["target_length"][0] - 1] == SEP
    # The expanded row has 12 + (6 + picked) slots; the last vertex is its last slot.
    assert y["vertex_slots"][0, y["output_length"][0] - 1] == 12 + 6 + y["picked"][0].sum() - 1


def test_a_row_with_more_special_tokens_than_room_is_refused_in_eager_calls():
    model = _pretrainer(_shared())  # max_special_tokens=3
    x = _inputs([PACKED, SHORT])
    model.build({key: value.shape for key, value in x.items()})
    state = _seed_state(model)
    with pytest.raises(
        ValueError, match=r"Rows \[0\] hold \[6\] special tokens.*max_special_tokens=3"
    ):
        model(x)
    np.testing.assert_array_equal(_seed_state(model), state)  # no draw was made


def test_compiled_calls_leave_overflowing_rows_out_of_the_loss_and_count_them():
    model = _pretrainer(_backbone())  # max_special_tokens=3
    x = _inputs([PACKED, SHORT])
    model.build({key: value.shape for key, value in x.items()})
    y = traced_call(model, x)
    assert y["overflow"].tolist() == [True, False]
    # The loss is the short row's alone, over a batch of two.
    short = dag_loss(
        y["match"][1:], y["log_transitions"][1:], y["output_length"][1:], y["target_length"][1:]
    )
    expected = -float(_numpy(short)[0]) / y["target_length"][1] / 2
    assert np.isfinite(expected) and expected > 0
    np.testing.assert_allclose(float(_numpy(model.compute_loss(x, None, y))), expected, rtol=1e-6)
    model.compute_metrics(x, None, y)
    assert float(_numpy(model.overflow_tracker.result())) == 0.5
    assert float(_numpy(model.impossible_tracker.result())) == 0.0


# === Item 3: any padding layout ===
def _layouts(rows, length=LENGTH):
    """The rows padded right, left and inside (after their first token)."""
    right = [row + [0] * (length - len(row)) for row in rows]
    left = [[0] * (length - len(row)) + row for row in rows]
    inside = [row[:1] + [0] * (length - len(row)) + row[1:] for row in rows]
    return {"right": np.array(right), "left": np.array(left), "inside": np.array(inside)}


def test_state_expansion_is_the_same_for_every_padding_layout():
    expand = StateExpansion(k=4, mask_token_id=MASK, expand_token_ids=(CLS, SEP))
    # The example, left-padded: [PAD, PAD, CLS, 7, MASK, SEP].
    out = expand(np.array([[0, 0, CLS, 7, MASK, SEP]]), np.array([[0, 0, 1, 1, 1, 1]]))
    positions = _numpy(out["position_ids"])[0, :13]
    assert "".join(str(v) for v in positions[:, 0]) == "0000122223333"
    assert "".join(str(v) for v in positions[:, 1]) == "1234012341234"
    assert _numpy(out["token_ids"])[0, :13].tolist() == [CLS] * 4 + [7] + [MASK] * 4 + [SEP] * 4
    assert _numpy(out["source_index"])[0, :13].tolist() == [2] * 4 + [3] + [4] * 4 + [5] * 4
    layouts = _layouts([[CLS, 7, MASK, 8, SEP], [CLS, 9, SEP, 10, 11, SEP]], 8)
    outputs = {}
    for name, ids in layouts.items():
        mask = (ids > 0).astype("int32")
        outputs[name] = {key: _numpy(v) for key, v in expand(ids, mask).items()}
        for b in range(2):
            reference = reference_expansion(ids[b], mask[b], np.zeros(8, bool), 4, 32)
            for key in ("token_ids", "position_ids", "padding_mask"):
                np.testing.assert_array_equal(outputs[name][key][b], reference[key])
            used = reference["padding_mask"].sum()
            source = outputs[name]["source_index"][b, :used]
            np.testing.assert_array_equal(ids[b][source], reference["token_ids"][:used])
            for j, slot in reference["first_slot"].items():
                assert outputs[name]["first_slot"][b, j] == slot
    for key in ("token_ids", "position_ids", "padding_mask", "expanded_mask", "overflow"):
        np.testing.assert_array_equal(outputs["left"][key], outputs["right"][key])
        np.testing.assert_array_equal(outputs["inside"][key], outputs["right"][key])


@pytest.mark.parametrize("k", [1, 2])
def test_encoder_gives_the_same_outputs_for_every_padding_layout(k):
    encoder = _encoder(_backbone(), k=k)
    layouts = _layouts([[CLS, 5, 6, 7, SEP], [CLS, 10, SEP, 11, 12, 13, SEP]])
    results = {}
    for name, ids in layouts.items():
        x = _inputs(ids)
        out = encoder(x)
        real = x["padding_mask"].astype(bool)
        results[name] = (
            [_numpy(out["sequence_output"])[b][real[b]] for b in range(2)],
            _numpy(out["pooled_output"]),
        )
    for name in ("left", "inside"):
        for b in range(2):
            np.testing.assert_allclose(results[name][0][b], results["right"][0][b], atol=1e-5)
        np.testing.assert_allclose(results[name][1], results["right"][1], atol=1e-5)


@pytest.mark.parametrize("objective", ["exlm", "mlm"])
def test_pretrainer_gives_the_same_outputs_and_loss_for_every_padding_layout(objective):
    model = _pretrainer(_backbone(), objective=objective)
    layouts = _layouts([[CLS, 5, 6, 7, 8, 9, SEP], [CLS, 10, 11, SEP, 12, SEP]])
    state = _seed_state(model)
    results = {}
    for name, ids in layouts.items():
        _restore_seed(model, state)  # the same draws for each layout
        x = _inputs(ids)
        outputs = model(x)
        results[name] = (
            {key: _numpy(value) for key, value in outputs.items()},
            float(_numpy(model.compute_loss(x, None, outputs))),
            x["padding_mask"].astype(bool),
        )
    right, right_loss, right_real = results["right"]
    assert right["picked"].sum() > 0 and np.isfinite(right_loss)
    for name in ("left", "inside"):
        other, loss, real = results[name]
        for b in range(2):  # the same tokens are picked
            np.testing.assert_array_equal(
                other["picked"][b][real[b]], right["picked"][b][right_real[b]]
            )
        for key, value in right.items():
            if key in ("picked", "labels", "label_mask", "logits"):
                continue
            np.testing.assert_allclose(other[key], value, atol=1e-5, err_msg=f"{name} {key}")
        if objective == "mlm":  # labels and logits of the masked tokens, in order
            for b in range(2):
                count = right["label_mask"][b].sum()
                np.testing.assert_array_equal(
                    other["labels"][b, :count], right["labels"][b, :count]
                )
                np.testing.assert_allclose(
                    other["logits"][b, :count], right["logits"][b, :count], atol=1e-4
                )
        np.testing.assert_allclose(loss, right_loss, rtol=1e-5, err_msg=name)


# === Item 5: DAGTransition in float32 under mixed precision ===
@pytest.fixture
def restore_policy():
    previous = keras.config.dtype_policy()
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


@pytest.mark.parametrize(
    "policy, low", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")]
)
def test_transition_computes_in_float32_under_mixed_precision(policy, low, restore_policy):
    rng = np.random.default_rng(2)
    hidden = rng.normal(size=(2, 6, 8)).astype("float32")  # test_exlm.py's shapes
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2], "int32")
    slots = np.array([[0, 1, 3, 4, 6, 9], [0, 2, 3, 7, 0, 0]], "int32")
    keras.config.set_dtype_policy("float32")
    full = DAGTransition(num_heads=2, max_vertices=10, slot_dim=4)
    expected = _numpy(full(hidden, mask, slot_index=slots))
    keras.config.set_dtype_policy(policy)
    mixed = DAGTransition(num_heads=2, max_vertices=10, slot_dim=4)
    mixed.build(hidden.shape)
    mixed.set_weights(full.get_weights())
    assert mixed.compute_dtype == low  # the layer follows the policy...
    seen = {}
    for name in ("slot_embedding", "query", "key", "gate"):
        layer = getattr(mixed, name)
        assert layer.compute_dtype == "float32" and layer.variable_dtype == "float32"

        def spy(inputs, _call=layer.call, _name=name, **kwargs):
            outputs = _call(inputs, **kwargs)
            seen[_name] = (keras.backend.standardize_dtype(inputs.dtype), outputs.dtype)
            return outputs

        layer.call = spy
    actual = _numpy(mixed(hidden, mask, slot_index=slots))
    # ...but each sensitive computation runs in float32: the slot lookup, the query,
    # key and gate projections (inputs and outputs), and the log-probabilities.
    assert set(seen) == {"slot_embedding", "query", "key", "gate"}
    for name, (inputs, outputs) in seen.items():
        if name != "slot_embedding":
            assert inputs == "float32", name
        assert keras.backend.standardize_dtype(outputs) == "float32", name
    assert actual.dtype == np.float32
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(actual), finite)
    # The same float32 arithmetic: equal to float32 within 1e-6.
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=0, atol=1e-6)
    # A 16-bit input (a mixed backbone's output) is widened, not the computation narrowed.
    narrow = keras.ops.cast(hidden, low)
    widened = _numpy(keras.ops.cast(narrow, "float32"))
    keras.config.set_dtype_policy("float32")
    np.testing.assert_allclose(
        _numpy(mixed(narrow, mask, slot_index=slots))[finite],
        _numpy(full(widened, mask, slot_index=slots))[finite],
        rtol=0,
        atol=1e-6,
    )


# === Item 4: NaN shows as NaN ===
@pytest.mark.parametrize("part", ["transition", "lm_head"])
def test_nan_weights_give_a_nan_loss_not_zero(part):
    model = _pretrainer(_backbone())
    x = _inputs(HAND)
    model(x)
    layer = getattr(model, part)
    variable = layer.trainable_weights[0]
    variable.assign(np.full(variable.shape, np.nan, "float32"))
    outputs = model(x)
    assert np.isnan(float(_numpy(model.compute_loss(x, None, outputs))))
    model.compute_metrics(x, None, outputs)
    assert float(_numpy(model.impossible_tracker.result())) == 0.0  # NaN is not "impossible"


# === Item 6: configs and saved files ===
def test_encoder_config_and_saved_file_round_trip(tmp_path):
    encoder = _encoder(_backbone(), k=2, max_expanded_tokens=None, name="exlm_encoder")
    x = _inputs([PACKED, [0] * 7 + SHORT[:5]])
    expected = {key: _numpy(value) for key, value in encoder(x).items()}
    config = encoder.get_config()
    assert config["trainable"] is True and config["dtype"]["config"]["name"] == "float32"
    assert config["max_expanded_tokens"] is None and config["name"] == "exlm_encoder"
    clone = ExLMEncoder.from_config(config)
    assert clone.get_config() == config
    encoder.trainable = False
    assert ExLMEncoder.from_config(encoder.get_config()).trainable is False
    encoder.trainable = True
    path = str(tmp_path / "encoder.keras")
    encoder.save(path)
    restored = keras.saving.load_model(path)  # no custom_objects
    assert type(restored) is ExLMEncoder and restored.max_expanded_tokens is None
    for key, value in restored(x).items():
        np.testing.assert_allclose(_numpy(value), expected[key], atol=1e-6)
    mixed = ExLMEncoder(
        _shared(), k=2, mask_token_id=MASK, special_token_ids=(CLS, SEP), dtype="mixed_bfloat16"
    )
    assert ExLMEncoder.from_config(mixed.get_config()).dtype_policy.name == "mixed_bfloat16"


def test_pretrainer_config_round_trip_keeps_every_argument():
    model = _pretrainer(_shared(), mask_rate=np.float32(0.25), k=np.int64(3), max_special_tokens=7)
    config = model.get_config()
    assert (config["k"], config["mask_rate"], config["max_special_tokens"]) == (3, 0.25, 7)
    assert config["trainable"] is True and "dtype" in config
    model.trainable = False
    clone = ExLMPretrainer.from_config(model.get_config())
    assert clone.trainable is False and clone.get_config() == model.get_config()


# === Item 5: bad input, each with a clear error; counted per entry point ===
@functools.cache
def _shared():
    """One backbone for the constructors that must refuse their arguments."""
    return _backbone()


def _expansion(**kwargs):
    options = dict(k=2, mask_token_id=MASK, expand_token_ids=(CLS, SEP))
    options.update(kwargs)
    return StateExpansion(**options)


IDS = np.array([[CLS, 5, MASK, SEP]], "int32")
ONES = np.ones((1, 4), "int32")

BAD_CONSTRUCTION = {
    "StateExpansion": [
        (lambda: _expansion(k=2.5), r"integer for k\. Received: k=2\.5"),
        (lambda: _expansion(k=0), r"integer >= 1 for k\. Received: k=0"),
        (lambda: _expansion(k=True), r"integer for k\. Received: k=True"),
        (lambda: _expansion(mask_token_id=-1), r"mask_token_id\. Received: mask_token_id=-1"),
        (lambda: _expansion(mask_token_id="103"), r"integer for mask_token_id"),
        (lambda: _expansion(expand_token_ids=101), r"list of integer token ids for expand_"),
        (lambda: _expansion(expand_token_ids=(1, 2.5)), r"expand_token_ids=\(1, 2\.5\)"),
        (lambda: _expansion(expand_token_ids=(1, -2)), r"token ids 0 or more for expand_"),
        (lambda: _expansion(max_expanded_tokens=-1), r"max_expanded_tokens=-1"),
        (lambda: _expansion(max_expanded_tokens=1.5), r"integer for max_expanded_tokens"),
        (lambda: _expansion(mask_rate=1.5), r"mask_rate in \(0\.0, 1\.0\]\. Received"),
        (lambda: _expansion(mask_rate=0), r"mask_rate in \(0\.0, 1\.0\]"),
        (lambda: _expansion(mask_rate=0.15, max_expanded_tokens=3), r"at most one of"),
    ],
    "DAGTransition": [
        (lambda: DAGTransition(num_heads=0, max_vertices=8), r"num_heads=0"),
        (lambda: DAGTransition(num_heads=2.5, max_vertices=8), r"integer for num_heads"),
        (lambda: DAGTransition(num_heads=2, max_vertices=-3), r"max_vertices=-3"),
        (lambda: DAGTransition(num_heads=2, max_vertices=True), r"integer for max_vertices"),
        (lambda: DAGTransition(2, 8, slot_dim=0), r"slot_dim=0"),
        (lambda: DAGTransition(2, 8, slot_dim=4.5), r"integer for slot_dim"),
    ],
    "ExLMPretrainer": [
        (
            lambda: ExLMPretrainer(TransformerBackbone(**tiny_backbone_kwargs())),
            r"position='rotary2d'.*Received: backbone=",
        ),
        (lambda: _pretrainer(_shared(), k=2.5), r"integer for k\. Received: k=2\.5"),
        (lambda: _pretrainer(_shared(), k=0), r"k\. Received: k=0"),
        (lambda: _pretrainer(_shared(), mask_rate=1.5), r"mask_rate in \(0\.0, 1\.0\)"),
        (lambda: _pretrainer(_shared(), mask_rate=0), r"mask_rate in \(0\.0, 1\.0\)"),
        (lambda: _pretrainer(_shared(), mask_rate="0.15"), r"number for mask_rate"),
        (lambda: _pretrainer(_shared(), mask_rate=True), r"number for mask_rate"),
        (lambda: _pretrainer(_shared(), mask_token_id=64), r"<= 63 for mask_token_id"),
        (lambda: _pretrainer(_shared(), mask_token_id=-1), r">= 0 for mask_token_id"),
        (lambda: _pretrainer(_shared(), special_token_ids=(1, 64)), r"\[0, 64\) for special"),
        (lambda: _pretrainer(_shared(), special_token_ids=1), r"list of integer token ids"),
        (lambda: _pretrainer(_shared(), replacement="random"), r"replacement='random'"),
        (lambda: _pretrainer(_shared(), objective="clm"), r"objective='clm'"),
        (lambda: _pretrainer(_shared(), transition_heads=0), r"transition_heads=0"),
        (lambda: _pretrainer(_shared(), transition_heads=3), r"divide .* 32\. Received: tr"),
        (lambda: _pretrainer(_shared(), seed=1.5), r"integer for seed"),
        (lambda: _pretrainer(_shared(), max_special_tokens=-1), r"max_special_tokens=-1"),
        (lambda: _pretrainer(_shared(), max_special_tokens=2.5), r"for max_special_tokens"),
    ],
    "ExLMEncoder": [
        (
            lambda: ExLMEncoder(TransformerBackbone(**tiny_backbone_kwargs(position="rotary"))),
            r"position='rotary2d'",
        ),
        (lambda: ExLMEncoder(_shared(), k=2.5, mask_token_id=MASK), r"Received: k=2\.5"),
        (lambda: ExLMEncoder(_shared(), k=0, mask_token_id=MASK), r"Received: k=0"),
        (lambda: ExLMEncoder(_shared(), mask_token_id=103), r"<= 63 for mask_token_id"),
        (
            lambda: ExLMEncoder(_shared(), mask_token_id=MASK, special_token_ids="12"),
            r"list of integer token ids for special_token_ids",
        ),
        (
            lambda: ExLMEncoder(_shared(), mask_token_id=MASK, special_token_ids=(1, 99)),
            r"\[0, 64\) for special_token_ids",
        ),
        (
            lambda: ExLMEncoder(
                _shared(), mask_token_id=MASK, special_token_ids=(1, 2), max_expanded_tokens=-1
            ),
            r"max_expanded_tokens=-1",
        ),
        (
            lambda: ExLMEncoder(
                _shared(), mask_token_id=MASK, special_token_ids=(1, 2), max_expanded_tokens=2.5
            ),
            r"integer for max_expanded_tokens",
        ),
    ],
    "ExLMPretrainer.fine_tuning_encoder": [
        (lambda: _pretrainer(_shared()).fine_tuning_encoder(-1), r"max_expanded_tokens=-1"),
        (lambda: _pretrainer(_shared()).fine_tuning_encoder(1.5), r"max_expanded_tokens"),
    ],
    "repeated_mlm": [
        (lambda: repeated_mlm(IDS, ONES, 2.5, 0.5, MASK), r"integer for k\. Received: k=2\.5"),
        (lambda: repeated_mlm(IDS, ONES, 0, 0.5, MASK), r"k\. Received: k=0"),
        (lambda: repeated_mlm(IDS, ONES, 2, 1.5, MASK), r"mask_rate in \(0\.0, 1\.0\)"),
        (lambda: repeated_mlm(IDS, ONES, 2, "0.5", MASK), r"number for mask_rate"),
        (lambda: repeated_mlm(IDS, ONES, 2, 0.5, -1), r">= 0 for mask_token_id"),
        (lambda: repeated_mlm(IDS, ONES, 2, 0.5, MASK, 5), r"list of integer token ids"),
        (lambda: repeated_mlm(IDS * 1.5, ONES, 2, 0.5, MASK), r"integer array for token_ids"),
        (lambda: repeated_mlm(IDS[0], ONES[0], 2, 0.5, MASK), r"shape \(batch, sequence\)"),
        (lambda: repeated_mlm(IDS, ONES[:, :3], 2, 0.5, MASK), r"padding_mask of the shape"),
        (lambda: repeated_mlm(IDS, ONES * 2, 2, 0.5, MASK), r"padding_mask of 0s and 1s"),
        (lambda: repeated_mlm(IDS, ONES, 2, 0.5, MASK, seed=0.5), r"integer for seed"),
    ],
}


@pytest.mark.parametrize(
    "make, match",
    [case for cases in BAD_CONSTRUCTION.values() for case in cases],
    ids=[f"{name}-{i}" for name, cases in BAD_CONSTRUCTION.items() for i in range(len(cases))],
)
def test_bad_arguments_are_refused_with_a_clear_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_numpy_numbers_are_accepted_where_python_numbers_are():
    expansion = StateExpansion(
        k=np.int64(2), mask_token_id=np.int32(MASK), mask_rate=np.float32(0.5)
    )
    assert (expansion.k, expansion.mask_rate) == (2, 0.5)
    assert DAGTransition(np.int64(2), np.int32(8)).max_vertices == 8
    batch = repeated_mlm(IDS, ONES, np.int64(2), np.float32(0.5), np.int64(MASK), seed=0)
    assert batch.token_ids.shape == (1, 8)


def _bad_calls():
    """(entry point, make the object, call it with a bad input, message)."""
    pretrainer_x = _inputs([[CLS, 5, 6, SEP]])
    cases = {
        "StateExpansion.call": [
            (lambda e: e(IDS.astype("float32"), ONES), r"integer tensor for token_ids.*float32"),
            (lambda e: e(IDS.astype(bool), ONES), r"integer tensor for token_ids.*bool"),
            (lambda e: e(IDS[0], ONES[0]), r"token_ids of shape \(batch, sequence\)"),
            (lambda e: e(IDS, ONES[:, :3]), r"padding_mask of the shape of token_ids"),
            (lambda e: e(IDS, ONES * 2), r"padding_mask of 0s and 1s. Received values \[2\]"),
            (lambda e: e(IDS, ONES, expand_mask=ONES[:, :2]), r"expand_mask of the shape"),
        ],
        "DAGTransition.call": [
            (lambda t: t(np.ones((1, 4, 30), "float32")), r"divisible by num_heads.*30"),
            (lambda t: t(np.ones((4, 32), "float32")), r"hidden of shape \(batch, vertices"),
            (lambda t: t(np.ones((1, 4, 32), "int32")), r"float tensor for hidden"),
            (lambda t: t(np.ones((1, 4, 32), "float32"), np.ones((1, 3))), r"vertex_mask of shape"),
            (
                lambda t: t(np.ones((1, 4, 32), "float32"), slot_index=np.zeros((1, 4), "float32")),
                r"integer tensor for slot_index",
            ),
            (
                lambda t: t(np.ones((1, 4, 32), "float32"), slot_index=np.array([[0, 2, 4, 9]])),
                r"Expected slot_index in \[0, 8\)",
            ),
            (
                lambda t: t(np.ones((1, 4, 32), "float32"), np.array([[1, 1, 2, 0]])),
                r"vertex_mask of 0s and 1s",
            ),
        ],
        "ExLMPretrainer.call": [
            (lambda m: m({"token_ids": pretrainer_x["token_ids"]}), r"keys \['token_ids', 'pad"),
            (
                lambda m: m({**pretrainer_x, "token_ids": pretrainer_x["token_ids"] + 0.7}),
                r"integer tensor for token_ids.*float",
            ),
            (
                lambda m: m({**pretrainer_x, "token_ids": np.array([[CLS, 5, 64, SEP]])}),
                r"token_ids in \[0, 64\).*Received values \[64\]",
            ),
            (
                lambda m: m({**pretrainer_x, "token_ids": np.array([[CLS, -5, 6, SEP]])}),
                r"Received values \[-5\]",
            ),
            (
                lambda m: m({**pretrainer_x, "padding_mask": np.ones((1, 3), "int32")}),
                r"padding_mask of the shape of token_ids",
            ),
            (
                lambda m: m({**pretrainer_x, "segment_ids": np.zeros((2, 4), "int32")}),
                r"segment_ids of the shape of token_ids",
            ),
            (
                lambda m: m({**pretrainer_x, "segment_ids": np.zeros((1, 4), "float32")}),
                r"integer tensor for segment_ids",
            ),
            (
                lambda m: m({**pretrainer_x, "padding_mask": np.array([[1, 1, 1, 3]])}),
                r"padding_mask of 0s and 1s",
            ),
            (lambda m: m(_inputs([[CLS, SEP, SEP, SEP]])), r"Rows \[0\] hold \[4\] special"),
            (
                lambda m: m(_inputs([[CLS] + [5] * 10 + [SEP]])),
                r"12 tokens expand to .* slots, more than this pretrainer was built for",
            ),
            (lambda m: m(pretrainer_x["token_ids"]), r"keys \['token_ids', 'padding_mask'\]"),
        ],
        "ExLMEncoder.call": [
            (lambda e: e({"token_ids": pretrainer_x["token_ids"]}), r"keys \['token_ids', 'pad"),
            (
                lambda e: e({**pretrainer_x, "token_ids": pretrainer_x["token_ids"] * 1.0}),
                r"integer tensor for token_ids",
            ),
            (
                lambda e: e({**pretrainer_x, "token_ids": np.array([[CLS, 5, 70, SEP]])}),
                r"token_ids in \[0, 64\).*\[70\]",
            ),
            (
                lambda e: e({**pretrainer_x, "padding_mask": np.ones((1, 5), "int32")}),
                r"padding_mask of the shape of token_ids",
            ),
            (
                lambda e: e({**pretrainer_x, "padding_mask": np.array([[1, 1, 0.5, 1]])}),
                r"padding_mask of 0s and 1s",
            ),
            (
                lambda e: e(_inputs([[CLS, 5, SEP, 6, SEP, 7, SEP]])),
                r"Rows \[0\] hold more than max_expanded_tokens=3",
            ),
        ],
    }
    makers = {
        "StateExpansion.call": lambda: _expansion(max_expanded_tokens=2),
        "DAGTransition.call": lambda: DAGTransition(num_heads=4, max_vertices=8),
        "ExLMPretrainer.call": lambda: _pretrainer(_shared()),
        "ExLMEncoder.call": lambda: ExLMEncoder(
            _shared(), k=2, mask_token_id=MASK, special_token_ids=(CLS, SEP)
        ),
    }
    return [
        (f"{name}-{i}", makers[name], call, match)
        for name, calls in cases.items()
        for i, (call, match) in enumerate(calls)
    ]


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize(
    "make, call, match", [case[1:] for case in BAD_CALLS], ids=[case[0] for case in BAD_CALLS]
)
def test_bad_call_inputs_are_refused_before_anything_changes(make, call, match):
    instance = make()
    if isinstance(instance, ExLMPretrainer):
        instance.build({"token_ids": (2, 6), "padding_mask": (2, 6)})  # built for L = 6
    weights = [_numpy(v).copy() for v in instance.weights]
    state = _seed_state(instance) if hasattr(instance, "seed_generator") else None
    with pytest.raises(ValueError, match=match):
        call(instance)
    for before, after in zip(weights, instance.weights):
        np.testing.assert_array_equal(_numpy(after), before)
    if state is not None:  # no draw was made
        np.testing.assert_array_equal(_seed_state(instance), state)
