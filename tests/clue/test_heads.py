"""The CLUE task models on every encoder: heads, GlobalPointer and the losses.

Values are checked against numpy computations on the same weights (the
GlobalPointer formula with RoPE written with complex numbers, the
multilabel and span cross-entropies, the masked choices' zero
probability), and every kind trains under ``jit_compile=True``.
"""

import keras
import numpy as np
import pytest

from keras_masking.clue.encoding import encode_examples
from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import EntityExample
from keras_masking.clue.examples import IdiomPassage
from keras_masking.clue.examples import SpanExample
from keras_masking.clue.examples import TextExample
from keras_masking.clue.heads import build_task_model
from keras_masking.clue.heads import task_loss
from keras_masking.layers.global_pointer import MASKED_SCORE
from keras_masking.layers.global_pointer import GlobalPointer
from keras_masking.layers.multiple_choice import MASKED_LOGIT
from keras_masking.layers.multiple_choice import ChoiceLogits
from keras_masking.layers.multiple_choice import FlattenChoices
from keras_masking.layers.span_logits import MaskedSpanLogits
from keras_masking.losses.multilabel_crossentropy import MultilabelCategoricalCrossentropy
from keras_masking.losses.multilabel_crossentropy import entity_targets
from keras_masking.losses.span_crossentropy import SpanCrossentropy
from keras_masking.models import ExLMEncoder
from keras_masking.models import TransformerBackbone
from keras_masking.utils import build_optimizer
from tests.clue.helpers import CLS
from tests.clue.helpers import MASK
from tests.clue.helpers import SEP
from tests.clue.helpers import VOCABULARY
from tests.clue.helpers import tokenizer
from tests.drop_token_cases import copied
from tests.drop_token_cases import with_drop_token
from tests.testing import randomize_weights

LENGTH = 12
MASKED32 = float(np.float32(MASKED_SCORE))


def tiny_backbone(**overrides):
    kwargs = dict(
        vocabulary_size=len(VOCABULARY),
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=48,
        dropout=0.0,
        max_sequence_length=LENGTH,
    )
    kwargs.update(overrides)
    return TransformerBackbone(**kwargs)


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def run(function, *args):
    """``function(*args)`` as numpy; one compiled call on JAX, whose eager ops are slow."""
    if keras.config.backend() == "jax":
        import jax

        # A new function each time: jax.jit bakes the weights in as constants.
        return keras.tree.map_structure(to_numpy, jax.jit(lambda *a: function(*a))(*args))
    return keras.tree.map_structure(to_numpy, function(*args))


# === numpy references ===
def numpy_rotary(x):
    """Interleaved RoPE with complex numbers: pair (2i, 2i+1) turned by p * 10000^(-2i/d)."""
    depth = x.shape[-1]
    pairs = x[..., 0::2] + 1j * x[..., 1::2]  # (batch, length, types, depth/2)
    angles = np.arange(x.shape[1])[:, None] * 10000.0 ** (-np.arange(0, depth, 2) / depth)
    turned = pairs * np.exp(1j * angles)[None, :, None, :]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = turned.real, turned.imag
    return out


def numpy_global_pointer(hidden, mask, kernel, bias, num_types, head_size):
    projected = hidden.astype("float64") @ kernel + bias
    batch, length = hidden.shape[:2]
    projected = projected.reshape(batch, length, num_types, 2 * head_size)
    queries = numpy_rotary(projected[..., :head_size])
    keys = numpy_rotary(projected[..., head_size:])
    scores = np.einsum("bitd,bjtd->btij", queries, keys) / np.sqrt(head_size)
    valid = np.triu(np.ones((length, length), bool))[None, None]
    valid = valid & mask[:, None, :, None].astype(bool) & mask[:, None, None, :].astype(bool)
    valid = np.broadcast_to(valid, scores.shape)
    return np.where(valid, scores, MASKED32), valid


def numpy_multilabel_loss(targets, scores):
    """mean over (batch, type) of log(1 + sum_neg e^s) + log(1 + sum_pos e^-s)."""
    scores = scores.reshape(scores.shape[0], scores.shape[1], -1).astype("float64")
    targets = targets.reshape(scores.shape).astype(bool)
    negative = np.log1p(np.where(targets, 0.0, np.exp(np.minimum(scores, 50))).sum(-1))
    positive = np.log1p(np.where(targets, np.exp(np.minimum(-scores, 50)), 0.0).sum(-1))
    return float((negative + positive).mean())


def dense_targets(rows, num_types, length):
    dense = np.zeros((len(rows), num_types, length, length))
    for b, entities in enumerate(rows):
        for kind, start, end in entities:
            if kind >= 0:
                dense[b, kind, start, end] = 1
    return dense


# === Layers and losses on their own ===
def test_global_pointer_equals_the_numpy_formula():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 6, 16)).astype("float32")
    mask = np.array([[1] * 6, [1, 1, 1, 1, 0, 0]], "int32")
    layer = GlobalPointer(num_types=3, head_size=8)
    layer.build(hidden.shape)
    randomize_weights(layer, seed=1, scale=0.5)
    scores = run(layer, hidden, mask)
    kernel, bias = (to_numpy(w) for w in layer.projection.weights)
    expected, valid = numpy_global_pointer(hidden, mask, kernel, bias, 3, 8)
    assert scores.dtype == np.float32 and scores.shape == (2, 3, 6, 6)
    np.testing.assert_allclose(scores[valid], expected[valid], rtol=1e-4, atol=1e-4)
    assert (scores[~valid] == MASKED32).all()
    assert valid[1, 0, 3, 3] and not valid[1, 0, 3, 4] and not valid[0, 0, 2, 1]
    # RoPE makes the scores depend on position: without it they do not match.
    plain = GlobalPointer(num_types=3, head_size=8, use_rotary=False)
    plain.build(hidden.shape)
    plain.set_weights(layer.get_weights())
    assert not np.allclose(run(plain, hidden, mask)[valid], expected[valid], atol=1e-3)


def test_multilabel_crossentropy_equals_numpy_on_sparse_and_dense_targets():
    rng = np.random.default_rng(2)
    scores = rng.normal(scale=3.0, size=(2, 3, 5, 5)).astype("float32")
    scores[:, :, 3, 1] = MASKED32  # masked pairs add nothing
    rows = np.array(
        [[[0, 1, 2], [2, 0, 4], [-1, -1, -1]], [[1, 3, 3], [1, 0, 0], [0, 4, 4]]], "int32"
    )
    dense = dense_targets(rows, 3, 5)
    np.testing.assert_array_equal(run(lambda r: entity_targets(r, 3, 5), rows), dense)
    expected = numpy_multilabel_loss(dense, scores)
    loss = MultilabelCategoricalCrossentropy()
    assert float(run(loss, rows, scores)) == pytest.approx(expected, rel=1e-5)
    assert float(run(loss, dense, scores)) == pytest.approx(expected, rel=1e-5)


def test_span_crossentropy_equals_numpy():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(3, 7, 2)).astype("float32")
    targets = np.array([[0, 0], [2, 5], [6, 6]], "int32")
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    expected = -np.mean([(log_p[b, s, 0] + log_p[b, e, 1]) / 2 for b, (s, e) in enumerate(targets)])
    assert float(run(SpanCrossentropy(), targets, logits)) == pytest.approx(expected, rel=1e-5)


def test_choice_and_span_masks():
    scores = np.arange(6, dtype="float32").reshape(6, 1)
    logits = run(ChoiceLogits(), scores, np.array([[1, 1, 0], [1, 0, 0]]))
    assert logits.tolist() == [[0.0, 1.0, MASKED_LOGIT], [3.0, MASKED_LOGIT, MASKED_LOGIT]]
    probabilities = run(keras.ops.softmax, logits)
    assert probabilities[0, 2] == 0.0 and probabilities[1, 1:].tolist() == [0.0, 0.0]
    assert run(FlattenChoices(), np.zeros((2, 3, 5), "int32")).shape == (6, 5)
    span = run(
        MaskedSpanLogits(),
        np.ones((1, 5, 2), "float32"),
        np.array([[0, 0, 1, 1, 1]]),
        np.array([[1, 1, 1, 1, 0]]),
    )
    assert span[0, :, 1].tolist() == [1.0, MASKED_LOGIT, 1.0, 1.0, MASKED_LOGIT]


def test_layers_and_losses_round_trip_their_configs():
    cases = [
        GlobalPointer(num_types=4, head_size=6, use_rotary=False, name="gp"),
        ChoiceLogits(name="choices"),
        FlattenChoices(),
        MaskedSpanLogits(context_segment=2),
        MultilabelCategoricalCrossentropy(reduction="sum"),
        SpanCrossentropy(name="span"),
    ]
    for instance in cases:
        config = instance.get_config()
        again = type(instance).from_config(config)
        assert again.get_config() == config
        serialized = keras.saving.serialize_keras_object(instance)
        assert keras.saving.deserialize_keras_object(serialized).get_config() == config
    assert cases[0].get_config()["num_types"] == 4 and cases[3].context_segment == 2


def test_heads_are_float32_under_mixed_precision():
    hidden = np.ones((1, 4, 8), "float32")
    layer = GlobalPointer(num_types=2, head_size=4, dtype="mixed_bfloat16")
    layer.build(hidden.shape)
    scores = run(layer, hidden, np.array([[1, 1, 1, 0]]))
    assert scores.dtype == np.float32
    assert (
        layer.projection.compute_dtype == "bfloat16" and layer.projection.kernel.dtype == "float32"
    )
    assert float(to_numpy(scores)[0, 0, 0, 3]) == MASKED32
    scores = keras.ops.ones((2, 1), "bfloat16")
    choices = run(ChoiceLogits(dtype="mixed_bfloat16"), scores, np.array([[1, 0]]))
    assert choices.dtype == np.float32 and choices[0, 1] == MASKED_LOGIT  # not bfloat16


def test_build_task_model_bad_input(backbone):
    with pytest.raises(ValueError, match=r"Unknown options \['head_size'\] for the classification"):
        build_task_model("tnews", backbone, max_length=LENGTH, head_size=8)
    # csldcp's classes are its 67 disciplines, whatever a training file holds.
    assert build_task_model("csldcp", backbone, max_length=LENGTH).output.shape == (None, 67)
    with pytest.raises(ValueError, match=r"Expected an integer for max_length"):
        build_task_model("tnews", backbone, max_length="12")
    with pytest.raises(ValueError, match=r"Expected an integer >= 2 for max_length"):
        build_task_model("tnews", backbone, max_length=1)
    with pytest.raises(ValueError, match=r"Expected an integer >= 1 for num_labels"):
        build_task_model("cluener", backbone, num_labels=0, max_length=LENGTH)
    with pytest.raises(ValueError, match=r"Unknown task 'nope'"):
        build_task_model("nope", backbone)
    names = ("token_ids", "segment_ids", "padding_mask", "position_ids")
    inputs = {key: keras.Input((LENGTH,), dtype="int32", name=key) for key in names}
    needs_positions = keras.Model(inputs, inputs["token_ids"])
    with pytest.raises(ValueError, match=r"needs the inputs \['position_ids'\]"):
        build_task_model("tnews", needs_positions, max_length=LENGTH)


# === Task models ===
KINDS = ("classification", "multiple_choice", "idiom", "span", "entity")


def _examples(kind):
    if kind == "classification":
        return "afqmc", [
            TextExample(0, "今天天气很好", "北京", "1"),
            TextExample(1, "他做事", "一心一意", "0"),
        ]
    if kind == "multiple_choice":
        return "c3", [
            ChoiceExample("q1", "男你好女再见", "说了什么", ("你好", "再见", "什么"), 1),
            ChoiceExample("q2", "今天天气很好", "天气", ("好", "坏"), 0),
        ]
    if kind == "idiom":
        return "chid", [
            IdiomPassage(
                "p0", ("一心一意", "三心二意", "一意"), ("他", "小明", "。"), ("#1#", "#2#"), (0, 1)
            )
        ]
    if kind == "span":
        context = "北京是中国的首都"
        return "cmrc2018", [
            SpanExample("s1", context, "首都", (("北京", 0),)),
            SpanExample("s2", context, "中国", (("首都", 6),)),
        ]
    return "cluener", [
        EntityExample("e1", "浙商银行北京", (("company", 0, 3), ("address", 4, 5))),
        EntityExample("e2", "小明去公园", (("name", 0, 1), ("scene", 3, 4))),
    ]


def _encoded(kind):
    """A task's name, two examples' encoding and the options (every row batch: 2 or 2 x 4)."""
    name, examples = _examples(kind)
    options = {"num_choices": 4} if kind == "idiom" else {}
    return name, encode_examples(name, examples, tokenizer(), LENGTH, **options), options


@pytest.fixture(scope="module")
def backbone():
    return randomize_weights(tiny_backbone(), seed=4, scale=0.1)


@pytest.mark.parametrize("kind", KINDS)
def test_task_models_equal_numpy_on_the_same_weights(kind, backbone):
    name, encoded, options = _encoded(kind)
    model = build_task_model(name, backbone, max_length=LENGTH, **options)
    x = encoded.features
    assert set(model.input) == set(x)  # the encoded features feed the model as they are
    logits, backbone_outputs = run(lambda x: (model(x), _backbone_outputs(backbone, x, kind)), x)
    assert logits.dtype == np.float32
    if kind == "classification":
        kernel, bias = (to_numpy(w) for w in model.get_layer("logits").weights)
        expected = backbone_outputs["pooled_output"] @ kernel + bias
        np.testing.assert_allclose(logits, expected, atol=1e-5)
    elif kind in ("multiple_choice", "idiom"):
        kernel, bias = (to_numpy(w) for w in model.get_layer("choice_score").weights)
        scores = (backbone_outputs["pooled_output"] @ kernel + bias).reshape(logits.shape)
        valid = x["choice_mask"].astype(bool)
        np.testing.assert_allclose(logits[valid], scores[valid], atol=1e-5)
        probabilities = run(keras.ops.softmax, logits)
        assert (probabilities[~valid] == 0.0).all() and (~valid).any()
        np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-6)
    elif kind == "span":
        valid = ((x["segment_ids"] == 1) & (x["padding_mask"] == 1)) | (np.arange(LENGTH) == 0)
        assert (logits[~valid] == MASKED_LOGIT).all() and (logits[valid] != MASKED_LOGIT).all()
        kernel, bias = (to_numpy(w) for w in model.get_layer("span_logits").weights)
        expected = backbone_outputs["sequence_output"] @ kernel + bias
        np.testing.assert_allclose(logits[valid], expected[valid], atol=1e-5)
        shifted = logits - logits.max(1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        y = encoded.labels
        expected_loss = -np.mean(
            [(log_p[b, s, 0] + log_p[b, e, 1]) / 2 for b, (s, e) in enumerate(y)]
        )
        assert float(run(task_loss(name), y, logits)) == pytest.approx(expected_loss, rel=1e-5)
    else:
        pointer = model.get_layer("global_pointer")
        kernel, bias = (to_numpy(w) for w in pointer.projection.weights)
        expected, valid = numpy_global_pointer(
            backbone_outputs["sequence_output"], x["padding_mask"], kernel, bias, 10, 64
        )
        np.testing.assert_allclose(logits[valid], expected[valid], rtol=1e-4, atol=1e-4)
        assert (logits[~valid] == MASKED32).all()
        dense = dense_targets(encoded.labels, 10, LENGTH)
        assert dense.sum() == 4
        loss = float(run(task_loss(name), encoded.labels, logits))
        assert loss == pytest.approx(numpy_multilabel_loss(dense, logits), rel=1e-5)


@pytest.mark.parametrize("kind", ["classification", "multiple_choice", "span"])
def test_the_logit_layer_computes_in_float32_under_mixed_precision(kind, restore_policy):
    """The span and choice heads' Dense ran in bfloat16, and their masking layers
    cast float32 logits to bfloat16 (0.4% off, 0.017 on logits near 4: enough to
    flip a close start/end or C3 choice); float32 like the classification head's."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    mixed = randomize_weights(tiny_backbone(), seed=4, scale=0.1)
    name, encoded, options = _encoded(kind)
    model = build_task_model(name, mixed, max_length=LENGTH, **options)
    head = model.get_layer(
        {"classification": "logits", "multiple_choice": "choice_score", "span": "span_logits"}[kind]
    )
    kernel, bias = (to_numpy(w).astype("float64") for w in head.weights)
    probe = keras.Model(model.inputs, [head.input, model.output])
    # Op by op (a compiled JAX step may keep the backbone's float32 excess precision).
    features, logits = (to_numpy(y) for y in probe(encoded.features))
    expected = (features.astype("float64") @ kernel + bias).reshape(logits.shape)
    valid = logits != MASKED_LOGIT
    assert features.dtype == keras.ops.dtype(keras.ops.ones(1, "bfloat16")) and valid.any()
    np.testing.assert_allclose(logits[valid], expected[valid], rtol=1e-5, atol=1e-6)


def _backbone_outputs(backbone, x, kind):
    if kind in ("multiple_choice", "idiom"):
        length = x["token_ids"].shape[-1]
        x = {k: x[k].reshape(-1, length) for k in ("token_ids", "segment_ids", "padding_mask")}
    return backbone({k: x[k] for k in ("token_ids", "segment_ids", "padding_mask")})


def _train_compiled(model, loss, x, y, steps=6):
    """``steps`` jit-compiled train_on_batch calls; the inference loss must go down."""
    before = float(run(lambda x: loss(y, model(x)), x))
    model.compile(optimizer=keras.optimizers.Adam(2e-3), loss=loss, jit_compile=True)
    steps = [float(model.train_on_batch(x, y)) for _ in range(steps)]
    after = float(run(lambda x: loss(y, model(x)), x))
    assert np.isfinite(steps).all() and np.isfinite(after), steps
    assert after < before, (before, after, steps)


def test_every_head_and_loss_trains_compiled_on_a_backbone():
    """Every head layer and loss on one 2-layer backbone, trained in one jit compilation.

    The task models of `build_task_model` are these layers wired per kind; each of them
    is compiled and trained in `test_task_models_train_compiled` (slow).
    """
    _, c3, _ = _encoded("multiple_choice")
    choices = {k: keras.Input((4, LENGTH), dtype="int32", name=k) for k in c3.features}
    choices["choice_mask"] = keras.Input((4,), dtype="int32", name="choice_mask")
    flatten = FlattenChoices()
    flat = {k: flatten(choices[k]) for k in ("token_ids", "segment_ids", "padding_mask")}
    sequence = tiny_backbone(use_pooler=False)(flat)["sequence_output"]
    # Mean states differ between choices from the first step ([CLS] states at
    # initialisation hardly do), so the choice loss moves clearly in 5 steps.
    scores = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(sequence))
    heads = {
        "choices": ChoiceLogits()(scores, choices["choice_mask"]),
        "span": MaskedSpanLogits()(
            keras.layers.Dense(2)(sequence), flat["segment_ids"], flat["padding_mask"]
        ),
        "entity": GlobalPointer(10, head_size=8)(sequence, flat["padding_mask"]),
    }
    model = keras.Model(choices, heads)
    losses = {
        "choices": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        "span": SpanCrossentropy(),
        "entity": MultilabelCategoricalCrossentropy(),
    }
    # Span and entity targets for each of the 2 x 4 flattened rows: in the second
    # segment / on real tokens ([CLS] and [SEP] for the padded choices).
    mask = c3.features["padding_mask"].reshape(8, LENGTH)
    context = (c3.features["segment_ids"].reshape(8, LENGTH) == 1) & (mask == 1)
    starts = np.where(context.any(1), context.argmax(1), 0)
    ends = np.where(context.any(1), starts + 2, 0)
    entities = np.full((8, 2, 3), -1, "int32")
    entities[:, 0] = np.where(mask[:, 3:4] == 1, [[2, 1, 3]], [[0, 0, 1]])
    y = {"choices": c3.labels, "span": np.stack([starts, ends], 1), "entity": entities}
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses, jit_compile=True)
    build_optimizer(model, c3.features, y)  # TensorFlow: one trace
    # No dropout here: the training losses of a repeated batch are comparable.
    steps = [model.train_on_batch(c3.features, y, return_dict=True) for _ in range(5)]
    for key in ("loss", "choices_loss", "span_loss", "entity_loss"):
        values = [float(step[key]) for step in steps]
        assert np.isfinite(values).all() and values[-1] < values[0], (key, values)


def test_drop_token_task_model_is_the_backbones_at_inference(backbone):
    name, encoded, options = _encoded("entity")
    reference = build_task_model(name, backbone, max_length=LENGTH)
    encoder = with_drop_token(
        copied(backbone), 0.3, unselectable_token_ids=(CLS, SEP), mode="attention", seed=2
    )
    model = build_task_model(name, encoder, max_length=LENGTH)
    model.set_weights(reference.get_weights())
    expected, outputs = run(lambda x: (reference(x), model(x)), encoded.features)
    # One graph: the backbone's DropToken is the identity at inference, on
    # or off, so the outputs are the same numbers.
    np.testing.assert_array_equal(outputs, expected)


# Training-mode calls run eagerly (the dropping draws random numbers): slow on JAX.
@pytest.mark.slow
def test_drop_token_task_model_scores_dropped_tokens_in_training(backbone):
    name, encoded, options = _encoded("entity")
    encoder = with_drop_token(
        copied(backbone), 0.3, unselectable_token_ids=(CLS, SEP), mode="attention", seed=2
    )
    model = build_task_model(name, encoder, max_length=LENGTH)
    expected = run(model, encoded.features)
    dropped = to_numpy(model(encoded.features, training=True))
    scored = expected != MASKED32
    assert not np.allclose(dropped[scored], expected[scored], rtol=1e-3, atol=0)  # dropped
    # Dropped tokens still get scores: the masks are the padding's, as at inference.
    assert np.isfinite(dropped).all() and (dropped[~scored] == MASKED32).all()


def _exlm_encoder():
    backbone = tiny_backbone(position="rotary2d", custom_position_ids=True)
    # C3 rows hold [CLS] and three [SEP]: four expanded tokens.
    return ExLMEncoder(
        backbone, k=2, mask_token_id=MASK, unselectable_token_ids=(CLS, SEP), max_expanded_tokens=4
    )


def test_exlm_task_model_masks_padded_choices():
    name, encoded, _ = _encoded("multiple_choice")
    model = build_task_model(name, _exlm_encoder(), max_length=LENGTH)
    probabilities = run(lambda x: keras.ops.softmax(model(x)), encoded.features)
    valid = encoded.features["choice_mask"].astype(bool)
    assert (probabilities[~valid] == 0.0).all() and (probabilities[valid] > 0).all()


def _encoder(kind):
    if kind == "drop_token":
        return with_drop_token(
            tiny_backbone(), 0.3, unselectable_token_ids=(CLS, SEP), mode="attention", seed=1
        )
    return _exlm_encoder() if kind == "exlm" else tiny_backbone()


# 5-10 s a model on two CPU cores (XLA compiles the whole training step).
@pytest.mark.slow
@pytest.mark.parametrize(
    "encoder, kind",
    [("backbone", kind) for kind in KINDS]
    + [("drop_token", "classification"), ("drop_token", "span"), ("exlm", "multiple_choice")]
    + [("exlm", "entity"), ("exlm", "idiom")],
)
def test_task_models_train_compiled(encoder, kind):
    name, encoded, options = _encoded(kind)
    model = build_task_model(name, _encoder(encoder), max_length=LENGTH, **options)
    _train_compiled(model, task_loss(name), encoded.features, encoded.labels)


def test_entity_model_saves_and_loads(tmp_path, backbone):
    name, encoded, options = _encoded("entity")
    model = build_task_model(name, backbone, max_length=LENGTH, head_size=8)
    path = tmp_path / "cluener.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("global_pointer").head_size == 8
    restored, expected = run(lambda x: (loaded(x), model(x)), encoded.features)
    np.testing.assert_allclose(restored, expected, atol=1e-6)
