"""DAGTransition: ExLM's log transition matrix over the expanded states."""

import keras
import numpy as np
import pytest

from keras_masking.layers import DAGTransition
from tests.models.exlm_testing import refused_without_change
from tests.models.exlm_testing import to_numpy


@pytest.mark.parametrize("expanded_positions", [False, True])
def test_transition_matrix_matches_the_formula_and_is_float32(expanded_positions):
    rng = np.random.default_rng(1)
    head = DAGTransition(num_heads=2, max_vertices=10, slot_dim=4)
    hidden = rng.normal(size=(2, 6, 8)).astype("float32")
    vertex_mask = np.array([[1] * 6, [1] * 4 + [0] * 2], "int32")
    # Each vertex's position in the expanded sequence (official), or its index.
    slot_index = np.array([[0, 1, 3, 4, 5, 9], [0, 2, 3, 7, 0, 0]], "int32")
    if expanded_positions:
        got = to_numpy(head(hidden, vertex_mask, slot_index=slot_index))
    else:
        got = to_numpy(head(hidden, vertex_mask))
        slot_index = np.tile(np.arange(6), (2, 1))
    assert got.dtype == np.float32
    weights = {w.path.split("/")[-2] + "/" + w.name: to_numpy(w) for w in head.weights}
    for b in range(2):
        n = vertex_mask[b].sum()
        f = np.concatenate([hidden[b], weights["slot/embeddings"][slot_index[b]]], -1)
        q = (f @ weights["query/kernel"] + weights["query/bias"]).reshape(6, 2, 4)
        k = (f @ weights["key/kernel"] + weights["key/bias"]).reshape(6, 2, 4)
        g = f @ weights["gate/kernel"] + weights["gate/bias"]
        log_g = g - np.logaddexp.reduce(g, axis=-1, keepdims=True)
        for i in range(6):
            for j in range(6):
                if not (i < j < n and i < n):
                    assert got[b, i, j] == -np.inf
        for i in range(n - 1):
            total = []
            for c in range(2):
                s = np.array([q[i, c] @ k[j, c] / 2.0 for j in range(i + 1, n)])
                total.append(log_g[i, c] + s - np.logaddexp.reduce(s))
            want = np.logaddexp.reduce(np.stack(total), axis=0)
            np.testing.assert_allclose(got[b, i, i + 1 : n], want, atol=1e-5)
            np.testing.assert_allclose(np.exp(got[b, i]).sum(), 1.0, atol=1e-5)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        mixed = DAGTransition(num_heads=2, max_vertices=6)
        assert to_numpy(mixed(hidden, vertex_mask)).dtype == np.float32
    finally:
        keras.config.set_dtype_policy("float32")


# === DAGTransition in float32 under mixed precision ===
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
    expected = to_numpy(full(hidden, mask, slot_index=slots))
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
    actual = to_numpy(mixed(hidden, mask, slot_index=slots))
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
    widened = to_numpy(keras.ops.cast(narrow, "float32"))
    keras.config.set_dtype_policy("float32")
    np.testing.assert_allclose(
        to_numpy(mixed(narrow, mask, slot_index=slots))[finite],
        to_numpy(full(widened, mask, slot_index=slots))[finite],
        rtol=0,
        atol=1e-6,
    )


def test_numpy_numbers_are_accepted_where_python_numbers_are():
    assert DAGTransition(np.int64(2), np.int32(8)).max_vertices == 8


BAD_ARGUMENTS = [
    (lambda: DAGTransition(num_heads=0, max_vertices=8), r"num_heads=0"),
    (lambda: DAGTransition(num_heads=2.5, max_vertices=8), r"integer for num_heads"),
    (lambda: DAGTransition(num_heads=2, max_vertices=-3), r"max_vertices=-3"),
    (lambda: DAGTransition(num_heads=2, max_vertices=True), r"integer for max_vertices"),
    (lambda: DAGTransition(2, 8, slot_dim=0), r"slot_dim=0"),
    (lambda: DAGTransition(2, 8, slot_dim=4.5), r"integer for slot_dim"),
]


@pytest.mark.parametrize("make, match", BAD_ARGUMENTS)
def test_bad_arguments_are_refused_with_a_clear_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


BAD_CALLS = [
    (lambda t: t(np.ones((1, 4, 30), "float32")), r"divisible by num_heads.*30"),
    (lambda t: t(np.ones((4, 32), "float32")), r"hidden of shape \(batch, vertices"),
    (lambda t: t(np.ones((1, 4, 32), "int32")), r"float tensor for hidden"),
    (lambda t: t(np.ones((1, 4, 32), "float32"), np.ones((1, 3))), r"vertex_mask of shape"),
    (
        lambda t: t(np.ones((1, 4, 32), "float32"), slot_index=np.zeros((1, 4), "float32")),
        r"Expected integer slot_index",
    ),
    (
        lambda t: t(np.ones((1, 4, 32), "float32"), slot_index=np.array([[0, 2, 4, 9]])),
        r"Expected slot_index in \[0, 8\)",
    ),
    (
        lambda t: t(np.ones((1, 4, 32), "float32"), np.array([[1, 1, 2, 0]])),
        r"vertex_mask of 0s and 1s",
    ),
]


@pytest.mark.parametrize("call, match", BAD_CALLS)
def test_bad_call_inputs_are_refused_before_anything_changes(call, match):
    instance = DAGTransition(num_heads=4, max_vertices=8)
    refused_without_change(instance, call, match)
