"""The Keras contract of every registered layer, model and loss.

Each class has a `LayerCase` here, checked by tests.testing's
`run_layer_test` (layers and models), `run_backbone_test` (encoders) or
`run_task_test` (keras-hub Tasks): a config that holds exactly its
constructor arguments and round-trips (``from_config(get_config())`` gives the
same config, the same outputs with the same weights, and keeps
``trainable=False``), saving and loading in a ``.keras`` file without
``custom_objects``, training versus inference where it has randomness
(dropout, noise), masking where it takes a padding mask, the
``mixed_bfloat16`` policy (float32 variables, the documented output dtype,
values close to float32) and one compiled (``jit_compile=True``) training
step with the right loss that changes every trainable weight.

`test_every_registered_class_has_a_contract_case` fails when a class is
registered without a case here.
"""

import importlib
import inspect
import json
import pkgutil

import keras
import numpy as np
import pytest
from keras import ops

import keras_masking
from keras_masking.distribution.dropout import ReplicaDropout
from keras_masking.layers import AddFFN
from keras_masking.layers import AttentionAdversary
from keras_masking.layers import AttentionUnits
from keras_masking.layers import DAGTransition
from keras_masking.layers import DropToken
from keras_masking.layers import FeedForward
from keras_masking.layers import GradientReversal
from keras_masking.layers import KeyValuePrefix
from keras_masking.layers import LoRADense
from keras_masking.layers import MaskedLMHead
from keras_masking.layers import RestoreDroppedTokens
from keras_masking.layers import SelfAttention
from keras_masking.layers import StateExpansion
from keras_masking.layers import TransformerBlock
from keras_masking.layers import TransformerEmbedding
from keras_masking.layers.global_pointer import MASKED_SCORE
from keras_masking.layers.global_pointer import GlobalPointer
from keras_masking.layers.key_value_prefix import PrefixEncoder
from keras_masking.layers.multiple_choice import MASKED_LOGIT
from keras_masking.layers.multiple_choice import ChoiceLogits
from keras_masking.layers.multiple_choice import FlattenChoices
from keras_masking.layers.span_logits import MaskedSpanLogits
from keras_masking.losses import DAGLoss
from keras_masking.losses import dag_loss
from keras_masking.methods import ASATrainer
from keras_masking.models import ExLMEncoder
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from tests.testing import LayerCase
from tests.testing import assert_outputs_equal
from tests.testing import dtype_policy
from tests.testing import outputs_differ
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import run_backbone_test
from tests.testing import run_layer_test
from tests.testing import run_task_test
from tests.testing import tiny_backbone_kwargs
from tests.testing import to_numpy

TINY = tiny_backbone_kwargs()
HIDDEN, HEADS, INTERMEDIATE = TINY["hidden_dim"], TINY["num_heads"], TINY["intermediate_dim"]
HEAD_DIM = HIDDEN // HEADS
# The attention logits of a query row all gain the same ``q . b_k``, which the
# softmax cancels: the key projection's bias has an exactly zero gradient.
KEY_BIAS = "key/bias"

_RNG = np.random.default_rng(0)
_HIDDEN_STATES = _RNG.normal(size=(2, 6, HIDDEN)).astype("float32")
_PADDING = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], "int32")
_KEPT = _RNG.normal(size=(2, 4, 3)).astype("float32")
_KEEP = np.array([[1, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 0]], bool)


def hidden_states():
    return _HIDDEN_STATES.copy()


def padding_mask():
    return _PADDING.copy()


def features(special=False):
    """A padded batch of backbone inputs; ``special`` puts [CLS]=1 / [SEP]=2 in."""
    x = random_features(batch=2, length=8, seed=1)  # row 1 padded from position 5
    token_ids = x["token_ids"]
    token_ids[(token_ids > 0) & (token_ids < 4)] += 4  # no special id by chance
    if special:
        token_ids[:, 0] = 1
        token_ids[0, 7] = 2
        token_ids[1, 4] = 2
    return x


def tiny_backbone(**overrides):
    """The tiny backbone with one layer: a second one repeats the same contract,
    and XLA compiles each layer again (a 2-layer ExLM step took 34 s on a CPU)."""
    return TransformerBackbone(**tiny_backbone_kwargs(**{"num_layers": 1, **overrides}))


def exlm_backbone(**overrides):
    return tiny_backbone(position="rotary2d", custom_position_ids=True, **overrides)


# === Building blocks of the cases ===
def _head():
    embedding = keras.layers.ReversibleEmbedding(20, HIDDEN, name="token_embedding")
    embedding.build((None, None))
    return MaskedLMHead(embedding)


def _masked_lm_args():
    return ({**features(), "mask_positions": np.array([[1, 2], [0, 4]], "int32")},)


def _pretrainer(**backbone_overrides):
    return ExLMPretrainer(
        exlm_backbone(**backbone_overrides),
        k=2,
        mask_rate=0.3,
        mask_token_id=3,
        unselectable_token_ids=(1, 2),
        transition_heads=2,
        seed=3,
    )


def _classifier():
    backbone = tiny_backbone()
    logits = keras.layers.Dense(3, name="logits")(backbone(backbone.input)["pooled_output"])
    return keras.Model(backbone.input, logits)


def _drop_token_backbone(rate=0.0):
    backbone = tiny_backbone()
    backbone.enable_drop_token(rate, unselectable_token_ids=(1, 2), seed=4)
    return backbone


def _prefix_backbone(reparameterize):
    prefix = {"length": 3, "dropout": 0.0}
    if reparameterize:
        prefix.update(reparameterize=True, hidden_units=8)
    return tiny_backbone(key_value_prefix=prefix), (features(),)


def _block_with(prefix):
    """A block attending to ``prefix`` (a `KeyValuePrefix`), in a model."""
    block = TransformerBlock(num_heads=HEADS, intermediate_dim=INTERMEDIATE)
    block.build((None, None, HIDDEN))
    block.attach_key_value_prefix(prefix)
    inputs = keras.Input((6, HIDDEN))
    return inputs, block(inputs), hidden_states()


def _shared_prefix(encoder):
    return KeyValuePrefix(
        3,
        HEADS,
        HEAD_DIM,
        dropout=0.0,
        reparameterize=True,
        hidden_units=8,
        encoder=encoder,
        layer_index=1,
    )


# --- masking checks: content at padded positions changes nothing real ---
def _perturbed_hidden():
    hidden = hidden_states()
    hidden[1, 4:] += 5.0
    return hidden


def _attention_masking(layer):
    before = to_numpy(layer(hidden_states(), padding_mask()))
    after = to_numpy(layer(_perturbed_hidden(), padding_mask()))
    np.testing.assert_allclose(after[0], before[0], atol=1e-6)
    np.testing.assert_allclose(after[1, :4], before[1, :4], atol=1e-5)
    # ... while without the mask the real positions see the change.
    unmasked = to_numpy(layer(_perturbed_hidden())) - to_numpy(layer(hidden_states()))
    assert np.abs(unmasked[1, :4]).max() > 1e-3


def _adversary_masking(layer):
    mask = to_numpy(layer(hidden_states(), padding_mask()))
    np.testing.assert_array_equal(mask[1, :, 4:], 0.0)  # padded keys are masked
    assert 0 < mask[:, :4, :4].mean() < 1
    after = to_numpy(layer(_perturbed_hidden(), padding_mask()))
    np.testing.assert_array_equal(after[:, :4, :4], mask[:, :4, :4])
    np.testing.assert_array_equal(after[0], mask[0])


def _drop_token_masking(layer):
    out = layer(hidden_states(), padding_mask(), training=True)
    kept = to_numpy(out["padding_mask"]).astype(bool)
    positions = to_numpy(out["position_ids"])
    # Real tokens 6 and 4, position 0 protected, rate 0.5 with stochastic
    # rounding: 6 - 3 = 3 slots, all real in row 0; 2 or 3 of row 1's 4 real
    # tokens kept, padding dropped first.
    assert kept[0].sum() == 3 and kept[1].sum() in (2, 3)
    assert (positions[1][kept[1]] < 4).all()
    assert positions[0][0] == 0 and positions[1][0] == 0  # protected position 0
    hidden = to_numpy(out["hidden"])
    for row in range(2):
        np.testing.assert_array_equal(
            hidden[row][kept[row]], hidden_states()[row][positions[row][kept[row]]]
        )


def _restore_masking(layer):
    out = to_numpy(layer(_KEPT, _KEEP))
    np.testing.assert_array_equal(out[~_KEEP], 0.0)
    for row in range(2):
        np.testing.assert_array_equal(out[row][_KEEP[row]], _KEPT[row])


def _transition_masking(layer):
    log_e = to_numpy(layer(hidden_states(), padding_mask()))
    assert np.isneginf(log_e[1, :, 4:]).all() and np.isneginf(log_e[1, 4:, :]).all()
    assert np.isneginf(log_e[0][np.tril_indices(6)]).all()  # forward edges only
    # Each valid vertex with a valid successor has a distribution over them.
    for row, last in ((0, 5), (1, 3)):
        np.testing.assert_allclose(np.log(np.exp(log_e[row, :last]).sum(-1)), 0.0, atol=1e-5)
    again = to_numpy(layer(_perturbed_hidden(), padding_mask()))
    np.testing.assert_allclose(again[1, :4, :4], log_e[1, :4, :4], atol=1e-6)


def _expansion_masking(layer):
    token_ids = np.array([[1, 3, 5, 2, 7, 8], [1, 3, 2, 6, 1, 3]], "int32")
    out = layer(token_ids, padding_mask())
    # Row 1 keeps 4 real tokens: [CLS] [MASK] [SEP] become 2 slots, 6 one.
    np.testing.assert_array_equal(to_numpy(out["padding_mask"]).sum(1), [9, 7])
    ids = to_numpy(out["token_ids"])
    np.testing.assert_array_equal(ids[1, :7], [1, 1, 3, 3, 2, 2, 6])
    np.testing.assert_array_equal(ids[1, 7:], 0)


def _padded_ids_masking(select, mask_positions=None, special=False):
    """Padded token ids change nothing at the real positions of a model."""

    def check(model):
        x = features(special=special)
        if mask_positions is not None:
            x["mask_positions"] = mask_positions
        perturbed = {key: value.copy() for key, value in x.items()}
        perturbed["token_ids"][1, 5:] = 9
        for before, after in zip(select(model(x)), select(model(perturbed))):
            before, after = to_numpy(before), to_numpy(after)
            np.testing.assert_allclose(after[0], before[0], atol=1e-6)
            real = after[1, :5] if after.ndim == 3 and mask_positions is None else after[1]
            expected = before[1, :5] if before.ndim == 3 and mask_positions is None else before[1]
            np.testing.assert_allclose(real, expected, atol=1e-5)

    return check


def _backbone_outputs(outputs):
    return [outputs["sequence_output"], outputs["pooled_output"]]


def _twins(make, x, count=2):
    """``count`` instances of one seed with the same weights, built, not called."""
    first = make()
    first.build({key: value.shape for key, value in x.items()})
    twins = [first]
    for _ in range(count - 1):
        twin = make()
        twin.build({key: value.shape for key, value in x.items()})
        twin.set_weights(first.get_weights())
        twins.append(twin)
    return twins


def _live(outputs):
    """The parts of a pretrainer's outputs its loss reads: live targets and vertices."""
    match = to_numpy(outputs["match"])
    edges = to_numpy(outputs["log_transitions"])
    targets, vertices = to_numpy(outputs["target_length"]), to_numpy(outputs["output_length"])
    live = [targets, vertices]
    for row in range(match.shape[0]):
        live.append(match[row, : targets[row], : vertices[row]])
        live.append(edges[row, : vertices[row], : vertices[row]])
    return live


def _pretrainer_masking(model):
    x = features(special=True)
    first, second = _twins(_pretrainer, x)
    perturbed = {key: value.copy() for key, value in x.items()}
    perturbed["token_ids"][1, 5:] = 9
    # The same masking draws (same seed): padded ids are never picked, and
    # what the loss reads does not see them.
    expected, actual = _live(first(x)), _live(second(perturbed))
    assert len(expected[2]) and expected[0][1] > 0
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, atol=1e-5)


def _pretrainer_training():
    x = features(special=True)
    first, second = _twins(lambda: _pretrainer(dropout=0.5), x)
    inference = first(x, training=False)
    assert outputs_differ(second(x, training=True), inference)  # dropout in training
    third = _twins(_pretrainer, x, count=1)[0]
    third.set_weights(first.get_weights())
    assert_outputs_equal(third(x, training=False), inference, atol=1e-5)


def _pretrainer_saved(model):
    """A pretrainer built but not called: its first draws are those of the file."""
    x = features(special=True)
    fresh = _twins(_pretrainer, x, count=1)[0]
    fresh.set_weights(model.get_weights())
    return fresh, (x,)


def _asa_training():
    trainer = ASATrainer(_classifier(), tau=0.5, seed=0)
    x = features()
    trainer(x)
    randomize_weights(trainer, seed=5)
    inference = trainer(x, training=False)
    assert_outputs_equal(trainer.task_model(x, training=False), inference)
    training = trainer(x, training=True)
    assert sorted(training) == ["adversarial", "clean", "masks", "padding_mask"]
    assert_outputs_equal(training["clean"], inference)  # the tiny model has no dropout
    masks = [to_numpy(mask) for mask in training["masks"]]
    assert all(set(np.unique(mask)) == {0.0, 1.0} for mask in masks)
    # The adversarial pass is the task model with each layer's padding mask
    # replaced by its adversary's mask, (1 - M) * -10000.
    backbone = trainer.backbone
    hidden = backbone.embed(x["token_ids"], x["segment_ids"])
    biases = [((1.0 - mask) * -10000.0)[:, None] for mask in masks]
    encoded = backbone.encode(hidden, x["padding_mask"], attention_mask_fn=lambda i, h: biases[i])
    expected = trainer.task_model.get_layer("logits")(backbone.pool(encoded))
    assert_outputs_equal(training["adversarial"], expected, atol=1e-5)


# --- compiled steps of the models with their own loss ---
def _pretrainer_step(model):
    x = features(special=True)
    model.compile(optimizer=keras.optimizers.SGD(0.5), jit_compile=True)
    return model, x, None


def _asa_step(trainer):
    trainer.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return trainer, features(), np.array([0, 2])


def _model_train(select):
    """A model taking the features dict: its selected output, for one step."""

    def train_model(model):
        x = features(special=True)
        inputs = {
            key: keras.Input(shape=value.shape[1:], dtype=str(value.dtype), name=key)
            for key, value in x.items()
        }
        return inputs, select(model(inputs)), x

    return train_model


# --- the CLUE heads ---
_CHOICE_SCORES = _RNG.normal(size=(8, 1)).astype("float32")
_CHOICE_MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], "int32")
_SEGMENTS = np.array([[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]], "int32")


def _pointer_masking(layer):
    scores = to_numpy(layer(hidden_states(), padding_mask()))
    masked = np.float32(MASKED_SCORE)
    assert (scores[1, :, 4:, :] == masked).all() and (scores[1, :, :, 4:] == masked).all()
    rows, columns = np.tril_indices(6, -1)
    assert (scores[:, :, rows, columns] == masked).all()  # end before start
    after = to_numpy(layer(_perturbed_hidden(), padding_mask()))
    np.testing.assert_allclose(after[1, :, :4, :4], scores[1, :, :4, :4], atol=1e-5)


def _pointer_train(layer):
    inputs = [keras.Input((6, HIDDEN)), keras.Input((6,), dtype="int32")]
    scores = layer(*inputs)
    return inputs, ops.where(scores > -1e11, scores, 0.0), [hidden_states(), padding_mask()]


def _choice_masking(layer):
    logits = to_numpy(layer(_CHOICE_SCORES, _CHOICE_MASK))
    valid = _CHOICE_MASK == 1
    np.testing.assert_array_equal(logits[~valid], MASKED_LOGIT)
    np.testing.assert_array_equal(logits[valid], _CHOICE_SCORES.reshape(2, 4)[valid])


def _span_masking(layer):
    logits = to_numpy(layer(hidden_states()[..., :2], _SEGMENTS, padding_mask()))
    valid = ((_SEGMENTS == 1) & (padding_mask() == 1)) | (np.arange(6) == 0)
    np.testing.assert_array_equal(logits[~valid], MASKED_LOGIT)
    np.testing.assert_array_equal(logits[valid], hidden_states()[..., :2][valid])


CASES = {
    "GlobalPointer": LayerCase(
        lambda: GlobalPointer(num_types=2, head_size=4),
        lambda: (hidden_states(), padding_mask()),
        mixed_dtype="float32",
        masking=_pointer_masking,
        train_model=_pointer_train,
    ),
    "ChoiceLogits": LayerCase(
        lambda: ChoiceLogits(),
        lambda: (_CHOICE_SCORES, _CHOICE_MASK),
        mixed_dtype="float32",
        masking=_choice_masking,
        weightless=True,
    ),
    "FlattenChoices": LayerCase(
        lambda: FlattenChoices(),
        lambda: (np.arange(48, dtype="int32").reshape(2, 4, 6),),
        mixed_dtype=None,
        weightless=True,
    ),
    "MaskedSpanLogits": LayerCase(
        lambda: MaskedSpanLogits(),
        lambda: (hidden_states()[..., :2], _SEGMENTS, padding_mask()),
        mixed_dtype="float32",
        masking=_span_masking,
        weightless=True,
    ),
    "AddFFN": LayerCase(lambda: AddFFN(units=8), lambda: (hidden_states(),)),
    "AttentionAdversary": LayerCase(
        lambda: AttentionAdversary(),
        lambda: (hidden_states(), padding_mask()),
        mixed_dtype="float32",
        mixed_atol=1e-6,
        make_random=lambda: AttentionAdversary(noise=True, seed=2),
        masking=_adversary_masking,
    ),
    "AttentionUnits": LayerCase(
        lambda: AttentionUnits(units_per_head=2, num_heads=HEADS),
        lambda: (hidden_states(),),
        # call() is the value path only; the extra queries and keys act
        # through SelfAttention's logits (tests/test_fl_tuning.py).
        no_gradient=("query", "key"),
    ),
    "DAGTransition": LayerCase(
        lambda: DAGTransition(num_heads=2, max_vertices=8),
        lambda: (hidden_states(), padding_mask()),
        mixed_dtype="float32",
        mixed_atol=1e-5,
        masking=_transition_masking,
    ),
    "DropToken": LayerCase(
        lambda: DropToken(0.5, protected_positions=(0,), slot_multiple=1, seed=1),
        lambda: (hidden_states(), padding_mask()),
        make_random=lambda: DropToken(0.5, protected_positions=(0,), slot_multiple=1, seed=1),
        masking=_drop_token_masking,
        weightless=True,
    ),
    "FeedForward": LayerCase(
        lambda: FeedForward(intermediate_dim=INTERMEDIATE), lambda: (hidden_states(),)
    ),
    "GradientReversal": LayerCase(
        lambda: GradientReversal(alpha=0.5), lambda: (hidden_states(),), weightless=True
    ),
    "LoRADense": LayerCase(lambda: LoRADense(8), lambda: (hidden_states(),)),
    "KeyValuePrefix": LayerCase(
        lambda: KeyValuePrefix(length=3, num_heads=HEADS, head_dim=HEAD_DIM, dropout=0.0),
        lambda: (),
        make_random=lambda: KeyValuePrefix(
            length=3, num_heads=HEADS, head_dim=HEAD_DIM, dropout=0.5
        ),
        saved_model=lambda layer: _prefix_backbone(reparameterize=False),
        train_model=_block_with,
        no_gradient=(KEY_BIAS,),
    ),
    "KeyValuePrefix-reparameterized": LayerCase(
        lambda: _shared_prefix(PrefixEncoder(3, HIDDEN, 2, hidden_units=8)),
        lambda: (),
        saved_model=lambda layer: _prefix_backbone(reparameterize=True),
        train_model=_block_with,
        no_gradient=(KEY_BIAS,),
    ),
    "PrefixEncoder": LayerCase(
        lambda: PrefixEncoder(length=3, hidden_dim=HIDDEN, num_layers=2, hidden_units=8),
        lambda: (),
        saved_model=lambda layer: _prefix_backbone(reparameterize=True),
        train_model=lambda encoder: _block_with(_shared_prefix(encoder)),
        no_gradient=(KEY_BIAS,),
    ),
    "MaskedLMHead": LayerCase(
        _head,
        lambda: (hidden_states(), np.array([[0, 3, 5], [1, 2, 2]], "int32")),
        mixed_dtype="float32",
    ),
    "ReplicaDropout": LayerCase(
        lambda: ReplicaDropout(0.0),
        lambda: (hidden_states(),),
        make_random=lambda: ReplicaDropout(0.5, seed=3),
        weightless=True,
    ),
    "RestoreDroppedTokens": LayerCase(
        lambda: RestoreDroppedTokens(),
        lambda: (_KEPT, _KEEP),
        masking=_restore_masking,
        weightless=True,
    ),
    "SelfAttention": LayerCase(
        lambda: SelfAttention(num_heads=HEADS, head_dim=HEAD_DIM),
        lambda: (hidden_states(), padding_mask()),
        make_random=lambda: SelfAttention(num_heads=HEADS, head_dim=HEAD_DIM, dropout=0.5),
        masking=_attention_masking,
        no_gradient=(KEY_BIAS,),
    ),
    "StateExpansion": LayerCase(
        lambda: StateExpansion(
            k=2, mask_token_id=3, expand_token_ids=(1, 2), max_expanded_tokens=3
        ),
        lambda: (np.array([[1, 3, 5, 2, 7, 8], [1, 3, 2, 6, 0, 0]], "int32"), padding_mask()),
        mixed_dtype=None,
        masking=_expansion_masking,
        weightless=True,
    ),
    "TransformerBlock": LayerCase(
        lambda: TransformerBlock(num_heads=HEADS, intermediate_dim=INTERMEDIATE),
        lambda: (hidden_states(), padding_mask()),
        make_random=lambda: TransformerBlock(
            num_heads=HEADS, intermediate_dim=INTERMEDIATE, dropout=0.5
        ),
        masking=_attention_masking,
        no_gradient=(KEY_BIAS,),
    ),
    "TransformerEmbedding": LayerCase(
        lambda: TransformerEmbedding(64, HIDDEN, max_sequence_length=8),
        lambda: (features()["token_ids"], features()["segment_ids"]),
        make_random=lambda: TransformerEmbedding(64, HIDDEN, max_sequence_length=8, dropout=0.5),
    ),
    "TransformerBackbone": LayerCase(
        tiny_backbone,
        lambda: (features(),),
        make_random=lambda: tiny_backbone(dropout=0.5),
        masking=_padded_ids_masking(_backbone_outputs),
        train_model=_model_train(lambda out: out["pooled_output"]),
        no_gradient=(KEY_BIAS,),
    ),
    "TransformerTextClassifier": LayerCase(
        lambda: keras_masking.models.TransformerTextClassifier(
            tiny_backbone(), num_classes=3, dropout=0.0
        ),
        lambda: (features(),),
        mixed_dtype="float32",  # the logits layer computes in float32
        make_random=lambda: keras_masking.models.TransformerTextClassifier(
            tiny_backbone(), num_classes=3, dropout=0.5
        ),
        masking=_padded_ids_masking(lambda out: [out]),
        train_model=lambda model: (model.input, model.output, features()),
        no_gradient=(KEY_BIAS,),
        task=True,
    ),
    "TransformerMaskedLM": LayerCase(
        lambda: TransformerMaskedLM(tiny_backbone()),
        _masked_lm_args,
        mixed_dtype="float32",
        masking=_padded_ids_masking(lambda out: [out], np.array([[1, 2], [0, 4]], "int32")),
        train_model=lambda model: (model.input, model.output, _masked_lm_args()[0]),
        # The pooler is not on the masked-LM path.
        no_gradient=(KEY_BIAS, "pooled_dense"),
        task=True,
    ),
    "TransformerBackbone-drop_token": LayerCase(
        _drop_token_backbone,
        lambda: (features(special=True),),
        make_random=lambda: _drop_token_backbone(rate=0.5),
        masking=_padded_ids_masking(_backbone_outputs, special=True),
        train_model=_model_train(lambda out: out["pooled_output"]),
        no_gradient=(KEY_BIAS,),
    ),
    "ExLMEncoder": LayerCase(
        lambda: ExLMEncoder(exlm_backbone(), k=2, mask_token_id=3, unselectable_token_ids=(1, 2)),
        lambda: (features(special=True),),
        masking=_padded_ids_masking(_backbone_outputs, special=True),
        train_model=_model_train(lambda out: out["pooled_output"]),
        no_gradient=(KEY_BIAS,),
    ),
    "ExLMPretrainer": LayerCase(
        _pretrainer,
        lambda: (features(special=True),),
        mixed_dtype="float32",
        atol=1e-4,
        make_random=_pretrainer,
        masking=_pretrainer_masking,
        training_check=_pretrainer_training,
        saved_model=_pretrainer_saved,
        step=_pretrainer_step,
        # The pooler is not on its path.
        no_gradient=(KEY_BIAS, "pooled_dense"),
    ),
    "ASATrainer": LayerCase(
        lambda: ASATrainer(_classifier(), tau=0.5, seed=0),
        lambda: (features(),),
        make_random=lambda: ASATrainer(_classifier(), tau=0.5, seed=0),
        training_check=_asa_training,
        step=_asa_step,
        no_gradient=(KEY_BIAS,),
    ),
}


# === Registration ===
def _registered_classes():
    for module in pkgutil.walk_packages(keras_masking.__path__, "keras_masking."):
        importlib.import_module(module.name)
    return {
        value.__name__: value
        for key, value in keras.saving.get_custom_objects().items()
        if key.startswith("keras_masking>") and inspect.isclass(value)
    }


def test_every_registered_class_has_a_contract_case():
    registered = _registered_classes()
    # Losses have their own tests: DAGLoss below, the CLUE losses in tests/test_clue_heads.py;
    # the learning-rate schedule in tests/test_clue_runner.py; the optimizer in
    # tests/optimizers/test_adamw.py.
    losses = {"DAGLoss", "MultilabelCategoricalCrossentropy", "SpanCrossentropy"}
    # String preprocessing has its own tests: tests/test_text_classifier.py and
    # tests/models/test_unigram_tokenizer.py.
    preprocessing = {
        "TransformerTextClassifierPreprocessor",
        "TransformerTokenizer",
        "UnigramTokenizer",
    }
    covered = {name.split("-")[0] for name in CASES} | losses | preprocessing
    covered |= {"WarmupLinearDecay", "AdamW"}
    assert set(registered) == covered, (
        f"without a contract case: {sorted(set(registered) - covered)}; "
        f"cases of no registered class: {sorted(covered - set(registered))}"
    )
    kinds = (
        keras.layers.Layer,
        keras.losses.Loss,
        keras.optimizers.schedules.LearningRateSchedule,
        keras.optimizers.Optimizer,
    )
    for name, cls in registered.items():
        assert issubclass(cls, kinds), name
    # ... and every public layer, model and loss is registered.
    for package in (keras_masking.layers, keras_masking.models, keras_masking.losses):
        for name, value in vars(package).items():
            if inspect.isclass(value) and issubclass(value, kinds):
                assert registered.get(value.__name__) is value, f"{name} is not registered"


def test_registered_activations_round_trip():
    from keras_masking.layers import gelu_approximate
    from keras_masking.layers import gelu_exact

    x = np.linspace(-3, 3, 7).astype("float32")
    for function, approximate in ((gelu_exact, False), (gelu_approximate, True)):
        name = keras.activations.serialize(function)
        assert keras.activations.deserialize(json.loads(json.dumps(name))) is function
        expected = keras.activations.gelu(x, approximate=approximate)
        np.testing.assert_allclose(to_numpy(function(x)), to_numpy(expected), atol=1e-6)
    assert np.abs(to_numpy(gelu_exact(x)) - to_numpy(gelu_approximate(x))).max() > 1e-4


# === The contract ===
BACKBONES = ("TransformerBackbone", "TransformerBackbone-drop_token", "ExLMEncoder")
TASKS = ("TransformerTextClassifier", "TransformerMaskedLM")
LAYERS = tuple(name for name in CASES if name not in BACKBONES + TASKS)

# Raw strings for the classifier's preprocessor: [PAD] [UNK] [CLS] [SEP]
# [MASK] (ids 0-4), then single characters.
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("今天很好坏我喜欢讨厌电影")


def _classifier_on_raw_strings():
    from keras_masking.data import bert_tokenizer
    from keras_masking.models import TransformerTextClassifierPreprocessor

    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(VOCABULARY), sequence_length=8
    )
    task = keras_masking.models.TransformerTextClassifier(
        tiny_backbone(vocabulary_size=len(VOCABULARY)), num_classes=3, preprocessor=preprocessor
    )
    randomize_weights(task, seed=5)
    return task, np.array(["今天很好", "我讨厌电影", "我喜欢", "今天很坏"])


@pytest.mark.parametrize("name", LAYERS)
def test_layer_contract(name, tmp_path):
    run_layer_test(CASES[name], tmp_path)


@pytest.mark.parametrize("name", BACKBONES)
def test_backbone_contract(name, tmp_path):
    run_backbone_test(CASES[name], tmp_path)


@pytest.mark.parametrize("name", TASKS)
def test_task_contract(name, tmp_path):
    raw = _classifier_on_raw_strings if name == "TransformerTextClassifier" else None
    run_task_test(CASES[name], tmp_path, raw=raw)


# === The masked-LM head's logits (issue 12 items 5 and 7) ===
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_masked_lm_head_logits_are_float32_under_mixed_precision(policy):
    hidden = hidden_states()
    positions = np.array([[0, 3, 5], [1, 2, 2]], "int32")
    full, _, _ = CASES["MaskedLMHead"].build()
    # Logits near 1000, 0.01 apart: 16-bit logits there are 4 (bfloat16)
    # or 0.5 (float16) apart.
    full.output_bias.assign(1000.0 + np.arange(20, dtype="float32") * 0.01)
    expected = to_numpy(full(hidden, positions))
    with dtype_policy(policy):
        mixed = _head()
        mixed(hidden, positions)
    assert all(v.dtype == "float32" for v in mixed.weights)
    assert mixed.transform_dense.compute_dtype == policy.split("_")[1]
    mixed.set_weights(full.get_weights())
    logits = mixed(hidden, positions)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    # Only the 16-bit transform differs, by ~0.005 (bfloat16) / ~0.0005.
    np.testing.assert_allclose(to_numpy(logits), expected, rtol=0, atol=0.02)
    log_probs = keras.ops.log_softmax(logits, axis=-1)
    assert keras.backend.standardize_dtype(log_probs.dtype) == "float32"
    shifted = expected - expected.max(-1, keepdims=True)
    reference = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    np.testing.assert_allclose(to_numpy(log_probs), reference, rtol=0, atol=0.02)


def test_masked_lm_head_equals_its_formula_and_rebuilds_from_its_config():
    head, (hidden, positions), logits = CASES["MaskedLMHead"].build()
    x = np.take_along_axis(hidden, positions[..., None], axis=1)
    x = x @ np.asarray(head.transform_dense.kernel) + np.asarray(head.transform_dense.bias)
    x = to_numpy(keras.activations.gelu(x, approximate=False))
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    norm = head.transform_layer_norm
    x = x * np.asarray(norm.gamma) + np.asarray(norm.beta)
    table = np.asarray(head.token_embedding.embeddings)
    expected = x @ table.T + np.asarray(head.output_bias)
    np.testing.assert_allclose(to_numpy(logits), expected, atol=1e-4)
    # From its config alone: a head on a new embedding of the same shape.
    clone = MaskedLMHead.from_config(head.get_config())
    assert clone.token_embedding is not head.token_embedding
    assert clone.token_embedding.get_config() == head.token_embedding.get_config()
    clone(hidden, positions)
    clone.set_weights(head.get_weights())
    np.testing.assert_array_equal(np.asarray(clone.token_embedding.embeddings), table)


# === DAGLoss ===
def _dag_inputs():
    rng = np.random.default_rng(9)
    match = np.log(rng.dirichlet(np.ones(5), size=(2, 3))).astype("float32")  # (B, T, N)
    edges = rng.normal(size=(2, 5, 5)).astype("float32")
    edges = np.where(np.triu(np.ones((5, 5)), 1) > 0, edges, -np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        edges = edges - np.log(np.exp(edges).sum(-1, keepdims=True))
    edges = np.where(np.isfinite(edges), edges, -np.inf).astype("float32")
    y_true = {
        "output_length": np.array([5, 4], "int32"),
        "target_length": np.array([3, 2], "int32"),
    }
    return y_true, {"match": match, "log_transitions": edges}


def test_dag_loss_config_and_serialization_round_trip():
    loss = DAGLoss(name="exlm_loss", reduction="sum")
    y_true, y_pred = _dag_inputs()
    expected = float(loss(y_true, y_pred))
    log_likelihood = to_numpy(
        dag_loss(
            y_pred["match"],
            y_pred["log_transitions"],
            y_true["output_length"],
            y_true["target_length"],
        )
    )
    assert np.isfinite(log_likelihood).all() and (log_likelihood < 0).all()
    np.testing.assert_allclose(expected, float(np.sum(-log_likelihood / [3, 2])), rtol=1e-6)
    config = loss.get_config()
    assert config["name"] == "exlm_loss" and config["reduction"] == "sum"
    clone = DAGLoss.from_config(config)
    assert clone.get_config() == config
    np.testing.assert_allclose(float(clone(y_true, y_pred)), expected, rtol=1e-6)
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(loss)))
    restored = keras.saving.deserialize_keras_object(serialized)  # no custom_objects
    assert isinstance(restored, DAGLoss) and restored.get_config() == config
    np.testing.assert_allclose(float(restored(y_true, y_pred)), expected, rtol=1e-6)


def test_dag_loss_is_float32_under_mixed_precision():
    y_true, y_pred = _dag_inputs()
    expected = float(DAGLoss()(y_true, y_pred))
    with dtype_policy("mixed_bfloat16"):
        mixed = DAGLoss()
    value = mixed(y_true, {key: ops.cast(value, "bfloat16") for key, value in y_pred.items()})
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    # Only the inputs' bfloat16 rounding (~0.4% of each log-prob) differs.
    np.testing.assert_allclose(float(value), expected, rtol=0.01)
