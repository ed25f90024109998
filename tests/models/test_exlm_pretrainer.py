"""ExLMPretrainer: masking, [MASK] state expansion, encoder, LM head, DAG loss.

The tests that build inputs from `tests.models.exlm_testing` use its ids
([CLS] 1, [SEP] 2, [MASK] 3); the others use BERT's (101, 102, 103).
"""

import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_masking.layers import DAGTransition
from keras_masking.losses import dag_alignment_posterior
from keras_masking.losses import dag_loss
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone
from keras_masking.models import plain_position_ids
from keras_masking.models.exlm_pretrainer import prediction_entropy
from tests.models import exlm_testing as ex
from tests.models.exlm_testing import LENGTH
from tests.models.exlm_testing import PACKED
from tests.models.exlm_testing import SHORT
from tests.models.exlm_testing import SLOTS
from tests.models.exlm_testing import TARGETS
from tests.models.exlm_testing import VERTICES
from tests.models.exlm_testing import backbone_on
from tests.models.exlm_testing import brute_force_log_likelihood
from tests.models.exlm_testing import exlm_inputs
from tests.models.exlm_testing import log_softmax
from tests.models.exlm_testing import make_pretrainer
from tests.models.exlm_testing import pad_rows
from tests.models.exlm_testing import padding_layouts
from tests.models.exlm_testing import reference_expansion
from tests.models.exlm_testing import refused_without_change
from tests.models.exlm_testing import restore_seed
from tests.models.exlm_testing import rotary2d_backbone
from tests.models.exlm_testing import seed_state
from tests.models.exlm_testing import shared_backbone
from tests.models.exlm_testing import to_numpy
from tests.models.exlm_testing import traced_call
from tests.testing import count_train_step_traces
from tests.testing import tiny_backbone_kwargs

CLS, SEP, MASK = 101, 102, 103


def test_rotary2d_backbone_runs_and_saves(tmp_path):
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )
    ids = np.array([[1, 5, 6, 2]], "int32")
    features = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": np.ones_like(ids),
        "position_ids": to_numpy(plain_position_ids(ids)),
    }
    expected = to_numpy(backbone(features)["sequence_output"])
    path = str(tmp_path / "rotary2d.keras")
    backbone.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(features)["sequence_output"]), expected, atol=1e-6)


def _peoples_daily_batch(length=32, batch=16):
    import pathlib

    from keras_masking.data import bert_tokenizer
    from keras_masking.data import encode_texts
    from keras_masking.data.corpora import peoples_daily_sentences

    vocab = pathlib.Path(os.environ.get("KERAS_MASKING_DATA") or "data") / "vocab"
    if not (vocab / "bert-base-chinese-vocab.txt").exists():
        pytest.skip("needs $KERAS_MASKING_DATA/vocab/bert-base-chinese-vocab.txt")
    tokenizer = bert_tokenizer(vocab / "bert-base-chinese-vocab.txt")
    return encode_texts(tokenizer, peoples_daily_sentences()[:batch], length)


# About a minute per objective on two CPU cores (the compiled step's tracing dominates);
# the wiring is checked value by value in the fast tests above.
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
        backbone,
        k=4,
        mask_token_id=MASK,
        unselectable_token_ids=(CLS, SEP),
        objective=objective,
        seed=3,
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


def test_the_mlm_objectives_loss_averages_every_masked_token_of_the_batches():
    """Keras averages batches by their rows: batches of 10, 3 and 1 masked
    tokens reported 4.19 where the mean over the tokens was 4.53."""
    pretrainer = make_pretrainer(rotary2d_backbone(), objective="mlm")
    pretrainer.compile(optimizer="sgd")
    rng = np.random.default_rng(0)
    losses, counts = [], []
    for masked in (10, 3, 1):
        mask = np.zeros((2, 8), bool)
        mask.reshape(-1)[:masked] = True
        logits = rng.normal(size=(2, 8, 11)).astype("float32") * 3
        labels = rng.integers(0, 11, size=(2, 8)).astype("int32")
        y_pred = {"logits": logits, "labels": labels, "label_mask": mask}
        y_pred["overflow"] = np.zeros(2, bool)
        logs = pretrainer.compute_metrics(None, None, y_pred)
        cross_entropy = -np.take_along_axis(log_softmax(logits), labels[..., None], -1)[..., 0]
        losses.append(cross_entropy[mask].sum())
        counts.append(masked)
    expected = sum(losses) / sum(counts)
    np.testing.assert_allclose(float(logs["loss"]), expected, rtol=1e-5)
    assert "token_loss" not in logs


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
        to_numpy(
            ExLMPretrainer(
                backbone, mask_token_id=3, unselectable_token_ids=(1, 2)
            ).aligned_entropy(y_pred)
        )
    )
    posterior = to_numpy(
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
        ExLMPretrainer(
            backbone, mask_token_id=3, unselectable_token_ids=(1, 2), replacement="random"
        )
    model = ExLMPretrainer(
        backbone, k=2, replacement="bert", mask_token_id=3, unselectable_token_ids=(1, 2)
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


def test_prediction_entropy_of_uniform_and_peaked_logits():
    uniform = ops.zeros((2, 3, 50))
    np.testing.assert_allclose(
        to_numpy(prediction_entropy(uniform, ops.ones((2, 3)))), np.log(50), rtol=1e-5
    )
    peaked = np.zeros((1, 2, 50), "float32")
    peaked[0, 1, 7] = 100.0
    value = to_numpy(prediction_entropy(peaked, np.array([[0, 1]])))
    assert value < 1e-6


def _tiny_pretrainer():
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position="rotary2d", custom_position_ids=True)
    )
    return ExLMPretrainer(backbone, k=2, mask_token_id=3, unselectable_token_ids=(1, 2), seed=0)


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
    seen, traces = [], count_train_step_traces(model)
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    assert not model.built  # built from the data before the step is traced: one trace
    with pytest.raises(
        FloatingPointError,
        match=r"ExLMPretrainer\.fit stopped: the loss is nan at epoch 1, batch 2, so the "
        r"weights now hold NaN",
    ):
        model.fit(_tiny_batches(), batch_size=2, epochs=2, verbose=0, callbacks=[record])
    assert seen == [0, 1]  # no step ran after the NaN loss
    assert len(traces) == 1


def test_fit_and_predict_check_numpy_inputs_before_compiling():
    model = _tiny_pretrainer()
    model.compile(optimizer=keras.optimizers.SGD(1e-3))
    batches = _tiny_batches()
    bad = {**batches, "token_ids": batches["token_ids"] + 64}
    with pytest.raises(ValueError, match=r"Expected token_ids in \[0, 64\).*the values \[65, 66, "):
        model.fit(bad, batch_size=2, verbose=0)
    half = {**batches, "padding_mask": batches["padding_mask"] * 0.5}
    with pytest.raises(
        ValueError,
        match=r"padding_mask of 0s and 1s\. Received: padding_mask with the values \[0\.5\]",
    ):
        model.predict(half, verbose=0)


# === Built from tests.models.exlm_testing's ids ===
# === Item 7: the pretrainer's targets, vertices and emissions, by hand ===
HAND = [
    [ex.CLS, 5, 6, 7, 8, ex.SEP] + [0] * 6,
    [0] * 8 + [ex.CLS, 9, 10, ex.SEP],
]  # right / left padded


def test_pretrainer_targets_vertices_and_emissions_match_a_numpy_construction():
    backbone = rotary2d_backbone()
    model = make_pretrainer(backbone, seed=5)
    segments = [[0, 0, 0, 1, 1, 1] + [0] * 6, [0] * 10 + [1, 1]]
    x = exlm_inputs(HAND, segment_ids=segments)
    outputs = model(x)
    y = {key: to_numpy(value) for key, value in outputs.items()}
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
    hidden = backbone_on(backbone, references)["sequence_output"]
    vertex_slots = pad_rows([r["vertex_slots"].tolist() for r in references], VERTICES)
    log_p = log_softmax(to_numpy(model.lm_head(hidden, vertex_slots)))
    # Transitions: the head on those states, each slotted at its expanded position.
    counts = [len(r["vertex_slots"]) for r in references]
    vertex_mask = (np.arange(VERTICES)[None] < np.array(counts)[:, None]).astype("int32")
    vertex_hidden = np.take_along_axis(to_numpy(hidden), vertex_slots[..., None], axis=1)
    edges = to_numpy(model.transition(vertex_hidden, vertex_mask, slot_index=vertex_slots))
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
    loss = float(to_numpy(model.compute_loss(x, None, outputs)))
    np.testing.assert_allclose(loss, np.mean(expected_loss), rtol=1e-5)


@pytest.mark.parametrize("max_special_tokens, targets", [(None, LENGTH), (6, TARGETS)])
def test_a_packed_row_with_five_separators_keeps_every_target(max_special_tokens, targets):
    backbone = rotary2d_backbone()
    # Room for min(ceil(0.25 * 12) + 6, 12) = 9 expanded tokens, or for all 12 when None.
    model = make_pretrainer(backbone, mask_rate=0.25, max_special_tokens=max_special_tokens)
    x = exlm_inputs([PACKED, SHORT])
    y = {key: to_numpy(value) for key, value in model(x).items()}
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
    # Every [ex.SEP] of the packed row is a target, the last one emitted by the last vertex.
    assert (y["targets"][0] == ex.SEP).sum() == 5
    assert y["target_length"][0] == 6 + y["picked"][0].sum()
    assert y["targets"][0, y["target_length"][0] - 1] == ex.SEP
    # The expanded row has 12 + (6 + picked) slots; the last vertex is its last slot.
    assert y["vertex_slots"][0, y["output_length"][0] - 1] == 12 + 6 + y["picked"][0].sum() - 1


def test_a_row_with_more_special_tokens_than_room_is_refused_in_eager_calls():
    model = make_pretrainer(shared_backbone())  # max_special_tokens=3
    x = exlm_inputs([PACKED, SHORT])
    model.build({key: value.shape for key, value in x.items()})
    state = seed_state(model)
    with pytest.raises(
        ValueError, match=r"Rows \[0\] hold \[6\] special tokens.*max_special_tokens=3"
    ):
        model(x)
    np.testing.assert_array_equal(seed_state(model), state)  # no draw was made


def test_compiled_calls_leave_overflowing_rows_out_of_the_loss_and_count_them():
    model = make_pretrainer(rotary2d_backbone())  # max_special_tokens=3
    x = exlm_inputs([PACKED, SHORT])
    model.build({key: value.shape for key, value in x.items()})
    y = traced_call(model, x)
    assert y["overflow"].tolist() == [True, False]
    # The loss is the short row's alone, over a batch of two.
    short = dag_loss(
        y["match"][1:], y["log_transitions"][1:], y["output_length"][1:], y["target_length"][1:]
    )
    expected = -float(to_numpy(short)[0]) / y["target_length"][1] / 2
    assert np.isfinite(expected) and expected > 0
    np.testing.assert_allclose(float(to_numpy(model.compute_loss(x, None, y))), expected, rtol=1e-6)
    model.compute_metrics(x, None, y)
    assert float(to_numpy(model.overflow_tracker.result())) == 0.5
    assert float(to_numpy(model.impossible_tracker.result())) == 0.0


@pytest.mark.parametrize("objective", ["exlm", "mlm"])
def test_pretrainer_gives_the_same_outputs_and_loss_for_every_padding_layout(objective):
    model = make_pretrainer(rotary2d_backbone(), objective=objective)
    layouts = padding_layouts(
        [[ex.CLS, 5, 6, 7, 8, 9, ex.SEP], [ex.CLS, 10, 11, ex.SEP, 12, ex.SEP]]
    )
    state = seed_state(model)
    results = {}
    for name, ids in layouts.items():
        restore_seed(model, state)  # the same draws for each layout
        x = exlm_inputs(ids)
        outputs = model(x)
        results[name] = (
            {key: to_numpy(value) for key, value in outputs.items()},
            float(to_numpy(model.compute_loss(x, None, outputs))),
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


# === Item 4: NaN shows as NaN ===
@pytest.mark.parametrize("part", ["transition", "lm_head"])
def test_nan_weights_give_a_nan_loss_not_zero(part):
    model = make_pretrainer(rotary2d_backbone())
    x = exlm_inputs(HAND)
    model(x)
    layer = getattr(model, part)
    variable = layer.trainable_weights[0]
    variable.assign(np.full(variable.shape, np.nan, "float32"))
    outputs = model(x)
    assert np.isnan(float(to_numpy(model.compute_loss(x, None, outputs))))
    model.compute_metrics(x, None, outputs)
    assert float(to_numpy(model.impossible_tracker.result())) == 0.0  # NaN is not "impossible"


def test_pretrainer_config_round_trip_keeps_every_argument():
    model = make_pretrainer(
        shared_backbone(), mask_rate=np.float32(0.25), k=np.int64(3), max_special_tokens=7
    )
    config = model.get_config()
    assert (config["k"], config["mask_rate"], config["max_special_tokens"]) == (3, 0.25, 7)
    assert config["trainable"] is True and "dtype" in config
    model.trainable = False
    clone = ExLMPretrainer.from_config(model.get_config())
    assert clone.trainable is False and clone.get_config() == model.get_config()


PRETRAINER_X = exlm_inputs([[ex.CLS, 5, 6, ex.SEP]])


BAD_ARGUMENTS = [
    (
        lambda: ExLMPretrainer(TransformerBackbone(**tiny_backbone_kwargs())),
        r"position='rotary2d'.*Received: backbone=",
    ),
    (lambda: make_pretrainer(shared_backbone(), k=2.5), r"integer for k\. Received: k=2\.5"),
    (lambda: make_pretrainer(shared_backbone(), k=0), r"k\. Received: k=0"),
    (lambda: make_pretrainer(shared_backbone(), mask_rate=1.5), r"mask_rate in \(0\.0, 1\.0\)"),
    (lambda: make_pretrainer(shared_backbone(), mask_rate=0), r"mask_rate in \(0\.0, 1\.0\)"),
    (lambda: make_pretrainer(shared_backbone(), mask_rate="0.15"), r"number for mask_rate"),
    (lambda: make_pretrainer(shared_backbone(), mask_rate=True), r"number for mask_rate"),
    (lambda: make_pretrainer(shared_backbone(), mask_token_id=64), r"<= 63 for mask_token_id"),
    (lambda: make_pretrainer(shared_backbone(), mask_token_id=-1), r">= 0 for mask_token_id"),
    (
        lambda: make_pretrainer(shared_backbone(), unselectable_token_ids=(1, 64)),
        r"unselectable_token_ids in \[0, 63\]",
    ),
    (
        lambda: make_pretrainer(shared_backbone(), unselectable_token_ids=1),
        r"list of integers for unselectable_token_ids",
    ),
    (lambda: make_pretrainer(shared_backbone(), replacement="random"), r"replacement='random'"),
    (lambda: make_pretrainer(shared_backbone(), objective="clm"), r"objective='clm'"),
    (lambda: make_pretrainer(shared_backbone(), transition_heads=0), r"transition_heads=0"),
    (
        lambda: make_pretrainer(shared_backbone(), transition_heads=3),
        r"divide .* 32\. Received: tr",
    ),
    (lambda: make_pretrainer(shared_backbone(), seed=1.5), r"integer for seed"),
    (lambda: make_pretrainer(shared_backbone(), max_special_tokens=-1), r"max_special_tokens=-1"),
    (lambda: make_pretrainer(shared_backbone(), max_special_tokens=2.5), r"for max_special_tokens"),
    (lambda: make_pretrainer(shared_backbone()).fine_tuning_encoder(-1), r"max_expanded_tokens=-1"),
    (lambda: make_pretrainer(shared_backbone()).fine_tuning_encoder(1.5), r"max_expanded_tokens"),
]


@pytest.mark.parametrize("make, match", BAD_ARGUMENTS)
def test_bad_arguments_are_refused_with_a_clear_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


BAD_CALLS = [
    (lambda m: m({"token_ids": PRETRAINER_X["token_ids"]}), r"keys \['token_ids', 'pad"),
    (
        lambda m: m({**PRETRAINER_X, "token_ids": PRETRAINER_X["token_ids"] + 0.7}),
        r"Expected integer token_ids\. Received: token_ids of dtype float",
    ),
    (
        lambda m: m({**PRETRAINER_X, "token_ids": np.array([[ex.CLS, 5, 64, ex.SEP]])}),
        r"token_ids in \[0, 64\).*the values \[64\]",
    ),
    (
        lambda m: m({**PRETRAINER_X, "token_ids": np.array([[ex.CLS, -5, 6, ex.SEP]])}),
        r"Received: token_ids with the values \[-5\]",
    ),
    (
        lambda m: m({**PRETRAINER_X, "padding_mask": np.ones((1, 3), "int32")}),
        r"padding_mask of the shape of token_ids",
    ),
    (
        lambda m: m({**PRETRAINER_X, "segment_ids": np.zeros((2, 4), "int32")}),
        r"segment_ids of the shape of token_ids",
    ),
    (
        lambda m: m({**PRETRAINER_X, "segment_ids": np.zeros((1, 4), "float32")}),
        r"Expected integer segment_ids",
    ),
    (
        lambda m: m({**PRETRAINER_X, "padding_mask": np.array([[1, 1, 1, 3]])}),
        r"padding_mask of 0s and 1s",
    ),
    (
        lambda m: m(exlm_inputs([[ex.CLS, ex.SEP, ex.SEP, ex.SEP]])),
        r"Rows \[0\] hold \[4\] special",
    ),
    (
        lambda m: m(exlm_inputs([[ex.CLS] + [5] * 10 + [ex.SEP]])),
        r"12 tokens expand to .* slots, more than this pretrainer was built for",
    ),
    (lambda m: m(PRETRAINER_X["token_ids"]), r"keys \['token_ids', 'padding_mask'\]"),
]


@pytest.mark.parametrize("call, match", BAD_CALLS)
def test_bad_call_inputs_are_refused_before_anything_changes(call, match):
    instance = make_pretrainer(shared_backbone())
    instance.build({"token_ids": (2, 6), "padding_mask": (2, 6)})  # built for L = 6
    refused_without_change(instance, call, match)


@pytest.mark.parametrize("objective", ["exlm", "mlm"])
def test_an_out_of_range_id_from_a_dataset_gives_a_nan_loss(objective):
    """A picked id is [MASK] in the input but still a target: read from `tf.data` (no
    check can raise), its loss was a finite number from a clamped gather on JAX."""
    import tensorflow as tf

    vocabulary = rotary2d_backbone().vocabulary_size
    ids = pad_rows([[ex.CLS, 5, 6, vocabulary, 8, 9, ex.SEP], [ex.CLS, 10, 11, 12, ex.SEP]])
    pretrainer = make_pretrainer(rotary2d_backbone(), objective=objective)
    pretrainer.compile(optimizer=keras.optimizers.SGD(0.0))

    def loss(ids):
        data = tf.data.Dataset.from_tensor_slices(exlm_inputs(ids)).batch(2)
        return pretrainer.evaluate(data, verbose=0, return_dict=True)["loss"]

    assert np.isnan(loss(ids))
    assert np.isfinite(loss(np.where(ids == vocabulary, 7, ids)))


def test_example_weights_are_refused_before_anything_runs():
    backbone = rotary2d_backbone()
    pretrainer = ExLMPretrainer(backbone, k=2, mask_token_id=3, unselectable_token_ids=(1, 2))
    pretrainer.compile(optimizer="sgd")
    features = {"token_ids": np.array([[1, 5, 6, 7, 2]] * 2), "padding_mask": np.ones((2, 5))}
    before = [to_numpy(variable) for variable in pretrainer.weights]
    for call in (pretrainer.fit, pretrainer.evaluate):
        with pytest.raises(ValueError, match="does not weight examples"):
            call(features, sample_weight=np.array([1.0, 0.0]), batch_size=2, verbose=0)
    with pytest.raises(ValueError, match="does not weight examples"):
        pretrainer.fit(features, class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match="does not weight examples"):
        # A dataset's weights reach compute_loss: refused before the outputs are read.
        pretrainer.compute_loss(features, None, None, np.array([1.0, 0.0]))
    for variable, value in zip(pretrainer.weights, before):
        np.testing.assert_array_equal(to_numpy(variable), value)
