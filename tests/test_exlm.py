"""ExLM: state expansion, 2D RoPE, the transition head, the pretrainer, Repeated MLM."""

import keras
import numpy as np
import pytest
from tests.testing import tiny_backbone_kwargs
from keras import ops

from keras_masking.data import repeated_mlm
from keras_masking.layers import DAGTransition
from keras_masking.layers import StateExpansion
from keras_masking.losses import dag_alignment_posterior
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone
from keras_masking.models import plain_position_ids
from keras_masking.models.exlm_pretrainer import prediction_entropy
from keras_masking.ops.rotary import apply_rotary_2d
from keras_masking.ops.rotary import apply_split_rotary

CLS, SEP, MASK = 101, 102, 103


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def test_expansion_reproduces_the_worked_example():
    expand = StateExpansion(
        k=4, mask_token_id=MASK, expand_token_ids=(CLS, SEP), max_expanded_tokens=4
    )
    ids = np.array([[CLS, 7, MASK, MASK, 8, SEP, 0, 0]], "int32")
    out = expand(ids, (ids > 0).astype("int32"))
    assert _numpy(out["token_ids"]).shape == (1, 8 + 3 * 4)
    pos1 = "".join(str(v) for v in _numpy(out["position_ids"])[0, :18, 0])
    pos2 = "".join(str(v) for v in _numpy(out["position_ids"])[0, :18, 1])
    assert pos1 == "000012222333345555"  # 0000 1 2222 3333 4 5555
    assert pos2 == "123401234123401234"  # 1234 0 1234 1234 0 1234
    assert (
        _numpy(out["token_ids"])[0, :18].tolist() == [CLS] * 4 + [7] + [MASK] * 8 + [8] + [SEP] * 4
    )
    assert _numpy(out["padding_mask"])[0].tolist() == [1] * 18 + [0] * 2
    assert not _numpy(out["overflow"])[0]
    # Too many expanded tokens for the static length: cut and flagged.
    tight = StateExpansion(
        k=4, mask_token_id=MASK, expand_token_ids=(CLS, SEP), max_expanded_tokens=2
    )
    assert _numpy(tight(ids, (ids > 0).astype("int32"))["overflow"])[0]
    # Neither size given: room for every token, so nothing can overflow.
    assert StateExpansion(k=4, mask_token_id=MASK).output_length(8) == 32


def test_2d_rope_reduces_to_1d_rope_when_the_copy_index_is_zero():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 3, 8)).astype("float32")
    pos1 = rng.integers(0, 50, (2, 6)).astype("int32")
    zero = np.stack([pos1, np.zeros_like(pos1)], -1)
    got = _numpy(apply_rotary_2d(x, zero))
    want = np.concatenate([_numpy(apply_split_rotary(x[..., :4], pos1)), x[..., 4:]], -1)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(_numpy(apply_rotary_2d(x, pos1)), want, atol=1e-6)
    # Relative: q.k depends on position differences only, in both dimensions.
    both = np.stack([pos1, rng.integers(0, 5, (2, 6))], -1).astype("int32")
    shifted = both + np.array([7, 3], "int32")
    q, k = x, rng.normal(size=x.shape).astype("float32")

    def logits(positions):
        return np.einsum(
            "bqhd,bkhd->bhqk",
            _numpy(apply_rotary_2d(q, positions)),
            _numpy(apply_rotary_2d(k, positions)),
        )

    np.testing.assert_allclose(logits(both), logits(shifted), atol=1e-4)
    assert np.abs(logits(both) - logits(zero)).max() > 1e-3


def test_rotary2d_backbone_runs_and_saves(tmp_path):
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )
    ids = np.array([[1, 5, 6, 2]], "int32")
    features = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": np.ones_like(ids),
        "position_ids": _numpy(plain_position_ids(ids)),
    }
    expected = _numpy(backbone(features)["sequence_output"])
    path = str(tmp_path / "rotary2d.keras")
    backbone.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(_numpy(loaded(features)["sequence_output"]), expected, atol=1e-6)


@pytest.mark.parametrize("expanded_positions", [False, True])
def test_transition_matrix_matches_the_formula_and_is_float32(expanded_positions):
    rng = np.random.default_rng(1)
    head = DAGTransition(num_heads=2, max_vertices=10, slot_dim=4)
    hidden = rng.normal(size=(2, 6, 8)).astype("float32")
    vertex_mask = np.array([[1] * 6, [1] * 4 + [0] * 2], "int32")
    # Each vertex's position in the expanded sequence (official), or its index.
    slot_index = np.array([[0, 1, 3, 4, 5, 9], [0, 2, 3, 7, 0, 0]], "int32")
    if expanded_positions:
        got = _numpy(head(hidden, vertex_mask, slot_index=slot_index))
    else:
        got = _numpy(head(hidden, vertex_mask))
        slot_index = np.tile(np.arange(6), (2, 1))
    assert got.dtype == np.float32
    weights = {w.path.split("/")[-2] + "/" + w.name: _numpy(w) for w in head.weights}
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
        assert _numpy(mixed(hidden, vertex_mask)).dtype == np.float32
    finally:
        keras.config.set_dtype_policy("float32")


def _peoples_daily_batch(length=32, batch=16):
    import pathlib

    from keras_masking.data import bert_tokenizer
    from keras_masking.data import encode_texts
    from keras_masking.data.corpora import peoples_daily_sentences

    vocab = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "vocab"
    if not (vocab / "bert-base-chinese-vocab.txt").exists():
        pytest.skip("../shared/data (the Chinese BERT vocabulary) is not present")
    tokenizer = bert_tokenizer(vocab / "bert-base-chinese-vocab.txt")
    return encode_texts(tokenizer, peoples_daily_sentences()[:batch], length)


# About a minute per objective on two CPU cores (the compiled step's tracing dominates);
# the wiring is checked value by value in tests/test_exlm_hardening.py.
@pytest.mark.slow
@pytest.mark.parametrize("objective", ["exlm", "mlm"])
def test_a_tiny_model_learns_on_peoples_daily(objective):
    features = _peoples_daily_batch()
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(
            position="rotary2d",
            custom_position_ids=True,
            vocabulary_size=21128,
            max_sequence_length=64,
        )
    )
    model = ExLMPretrainer(
        backbone, k=4, mask_token_id=MASK, special_token_ids=(CLS, SEP), objective=objective, seed=3
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=True)
    history = model.fit(features, epochs=12, batch_size=16, verbose=0).history
    first, last = np.mean(history["loss"][:2]), np.mean(history["loss"][-2:])
    assert last < first - 0.3, history["loss"]
    assert history["impossible"][-1] == 0.0
    assert 0.0 < history["entropy"][-1] < np.log(21128)
    assert 0.0 < history["aligned_entropy"][-1] < np.log(21128)
    if objective == "mlm":
        np.testing.assert_allclose(history["aligned_entropy"], history["entropy"], rtol=1e-6)


def test_aligned_entropy_weights_state_entropies_by_the_alignment_posterior():
    rng = np.random.default_rng(4)
    batch, steps, vertices = 3, 4, 7
    match = rng.normal(size=(batch, steps, vertices)).astype("float32")
    edges = np.where(
        np.triu(np.ones((vertices, vertices)), 1) > 0,
        rng.normal(size=(batch, vertices, vertices)),
        -np.inf,
    ).astype("float32")
    y_pred = {
        "match": match,
        "log_transitions": edges,
        "output_length": np.array([7, 6, 2], "int32"),  # the last one is impossible
        "target_length": np.array([4, 3, 4], "int32"),
        "state_entropy": rng.uniform(1, 5, (batch, vertices)).astype("float32"),
        "target_is_mask": np.array([[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 0]], bool),
    }
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )
    got = float(
        _numpy(
            ExLMPretrainer(backbone, mask_token_id=3, special_token_ids=(1, 2)).aligned_entropy(
                y_pred
            )
        )
    )
    posterior = _numpy(
        dag_alignment_posterior(match, edges, y_pred["output_length"], y_pred["target_length"])
    )
    expected = [posterior[b, i] @ y_pred["state_entropy"][b] for b, i in ((0, 1), (0, 2), (1, 1))]
    np.testing.assert_allclose(got, np.mean(expected), rtol=1e-5)


def test_pretrainer_checks_and_serializes():
    plain = TransformerBackbone(**tiny_backbone_kwargs())
    with pytest.raises(ValueError, match="rotary2d"):
        ExLMPretrainer(plain)
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )
    with pytest.raises(ValueError, match="replacement"):
        ExLMPretrainer(backbone, mask_token_id=3, special_token_ids=(1, 2), replacement="random")
    model = ExLMPretrainer(
        backbone, k=2, replacement="bert", mask_token_id=3, special_token_ids=(1, 2)
    )
    config = keras.saving.serialize_keras_object(model)
    restored = keras.saving.deserialize_keras_object(config)
    assert isinstance(restored, ExLMPretrainer) and restored.k == 2
    assert restored.replacement == "bert"
    # Built on 8 tokens, the slot embedding cannot index the slots of 16.
    ids = np.tile(np.array([[1, 5, 6, 7, 8, 9, 10, 2]], "int32"), (2, 1))
    features = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    model.build({key: value.shape for key, value in features.items()})
    assert model.transition.max_vertices == 8 + (2 - 1) * 5  # L + (k - 1) * (2 picked + 3)
    longer = {k: np.concatenate([v, v], axis=1) for k, v in features.items()}
    with pytest.raises(ValueError, match="expand to .* slots"):
        model(longer)
    head = DAGTransition(num_heads=2, max_vertices=4)
    with pytest.raises(ValueError, match="slot_index"):
        head(np.ones((1, 3, 8), "float32"), slot_index=np.array([[0, 2, 4]]))


def test_repeated_mlm_ratios():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (200, 40)).astype("int32")
    ids[:, 0], ids[:, -1] = CLS, SEP
    batch = repeated_mlm(
        ids,
        np.ones_like(ids),
        k=3,
        mask_rate=0.4,
        mask_token_id=MASK,
        special_token_ids=(CLS, SEP),
        seed=1,
    )
    assert batch.token_ids.shape == (200, 120)
    assert abs(batch.unreal_token_ratio - 0.4) < 0.01
    assert abs(batch.corrupted_semantics_ratio - 0.4**3) < 0.01
    assert (batch.token_ids[:, :3] == CLS).all()  # specials repeated, never masked
    restored = np.where(batch.labels >= 0, batch.labels, batch.token_ids)
    np.testing.assert_array_equal(restored, np.repeat(ids, 3, axis=1))
    with pytest.raises(ValueError, match="mask_rate"):
        repeated_mlm(ids, np.ones_like(ids), 2, 1.5, MASK)


def test_prediction_entropy_of_uniform_and_peaked_logits():
    uniform = ops.zeros((2, 3, 50))
    np.testing.assert_allclose(
        _numpy(prediction_entropy(uniform, ops.ones((2, 3)))), np.log(50), rtol=1e-5
    )
    peaked = np.zeros((1, 2, 50), "float32")
    peaked[0, 1, 7] = 100.0
    value = _numpy(prediction_entropy(peaked, np.array([[0, 1]])))
    assert value < 1e-6


def _tiny_pretrainer():
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )
    return ExLMPretrainer(backbone, k=2, mask_token_id=3, special_token_ids=(1, 2), seed=0)


def _tiny_batches(count=3):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 64, size=(2 * count, 8)).astype("int32")
    ids[:, 0], ids[:, -1] = 1, 2
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


def test_fit_refuses_nan_weights_before_the_first_step():
    model = _tiny_pretrainer()
    model.compile(optimizer=keras.optimizers.SGD(1e-3))
    model.build({key: value.shape for key, value in _tiny_batches().items()})
    table = keras.ops.convert_to_numpy(model.backbone.token_embedding.embeddings).copy()
    table[7, 1] = np.nan
    model.backbone.token_embedding.embeddings.assign(table)
    with pytest.raises(
        ValueError,
        match=r"Expected finite weights to train ExLMPretrainer\. Received: "
        r"'.*token_embedding/embeddings' holds 1 NaN or infinite value",
    ):
        model.fit(_tiny_batches(), batch_size=2, verbose=0)


def test_fit_stops_at_the_first_nan_loss():
    model = _tiny_pretrainer()
    # A step this large overflows the weights to inf: every later loss is NaN.
    model.compile(optimizer=keras.optimizers.SGD(1e38))
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    with pytest.raises(
        FloatingPointError,
        match=r"ExLMPretrainer\.fit stopped: the loss is nan at epoch 1, batch 2, so the "
        r"weights now hold NaN",
    ):
        model.fit(_tiny_batches(), batch_size=2, epochs=2, verbose=0, callbacks=[record])
    assert seen == [0, 1]  # no step ran after the NaN loss


def test_fit_and_predict_check_numpy_inputs_before_compiling():
    model = _tiny_pretrainer()
    model.compile(optimizer=keras.optimizers.SGD(1e-3))
    batches = _tiny_batches()
    bad = {**batches, "token_ids": batches["token_ids"] + 64}
    with pytest.raises(
        ValueError, match=r"Expected token_ids in \[0, 64\).*Received values \[65, 66, "
    ):
        model.fit(bad, batch_size=2, verbose=0)
    half = {**batches, "padding_mask": batches["padding_mask"] * 0.5}
    with pytest.raises(ValueError, match=r"padding_mask of 0s and 1s\. Received values \[0\.5\]"):
        model.predict(half, verbose=0)
