"""MethodPlan: refusals before anything loads, and applying the methods to a backbone."""

import keras
import numpy as np
import pytest

from keras_masking.callbacks import MLMEmbeddingCorrection
from keras_masking.clue import MethodPlan
from keras_masking.clue import build_task_model
from keras_masking.methods import parameter_report
from keras_masking.models import TransformerBackbone
from tests.clue.helpers import VOCABULARY
from tests.clue.helpers import tokenizer

LENGTH = 16


def test_asa_is_refused_for_entities_and_drop_token_keeps_positions_for_token_tasks():
    with pytest.raises(ValueError, match="--asa does not apply to cluener"):
        MethodPlan(asa=0.5).check("cluener")
    assert MethodPlan(drop_token=0.1).drop_token_mode("cmrc2018") == "attention"
    assert MethodPlan(drop_token=0.1).drop_token_mode("tnews") == "gather"
    assert MethodPlan(drop_token=0.1, asa=0.5).drop_token_mode("tnews") == "attention"


@pytest.mark.parametrize(
    "methods, message",
    [
        (dict(drop_token=1.0), r"drop_token in \[0.0, 1.0\)"),
        (dict(fl_tuning=2.5), "Expected an integer for fl_tuning"),
        (dict(asa=-1.0), r"Expected asa in \[0.0, inf\)"),
        (dict(correct_embeddings=1), "Expected True or False for correct_embeddings"),
    ],
)
def test_bad_switches_are_refused(methods, message):
    with pytest.raises(ValueError, match=message):
        MethodPlan(**methods)


def _backbone():
    keras.utils.set_random_seed(0)
    return TransformerBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=LENGTH,
    )  # fmt: skip


def _head(encoder):
    return build_task_model("eprstmt", encoder, max_length=LENGTH)


def test_a_plain_plan_trains_the_task_model_on_the_backbone():
    backbone = _backbone()
    applied = MethodPlan().apply(backbone, "eprstmt", tokenizer(), _head)
    assert applied.encoder is backbone and applied.trainer is applied.task_model
    assert applied.callbacks == [] and applied.correction is None
    assert parameter_report(applied.task_model).trainable == backbone.count_params() + 16 * 2 + 2


def test_apply_puts_every_method_in_its_place():
    backbone = _backbone()
    table = np.array(backbone.token_embedding.embeddings.numpy())
    plan = MethodPlan(correct_embeddings=True, drop_token=0.2, asa=0.5, fl_tuning=4)
    applied = plan.apply(backbone, "eprstmt", tokenizer(), _head, seed=3, correct_now=True)
    # Corrected while building: the record says so and the table changed.
    assert applied.correction["corrected_rows"] > 0
    assert not np.allclose(backbone.token_embedding.embeddings.numpy(), table)
    # FL-tuning froze the backbone: addFFN (W1', b1', W2', b2') and the head train.
    # ASA's adversaries live in the backbone (enable_asa) and train too.
    add_ffn = 2 * 16 * 4 + 4 + 16
    adversaries = sum(
        int(np.prod(w.shape)) for layer in backbone.attention_adversaries for w in layer.weights
    )
    assert adversaries > 0
    assert parameter_report(applied.task_model).trainable == add_ffn + 16 * 2 + 2 + adversaries
    assert applied.encoder is backbone  # the one-call gestures, on the backbone itself
    assert backbone.drop_token.mode == "attention"  # ASA needs every position
    assert backbone.asa["tau"] == 0.5 and backbone.drop_token.seed == 3
    assert applied.trainer is not applied.task_model  # ASA's trainer, for the task's own head
    features = {
        "token_ids": np.full((2, LENGTH), 7, "int32"),
        "segment_ids": np.zeros((2, LENGTH), "int32"),
        "padding_mask": np.ones((2, LENGTH), "int32"),
    }
    assert applied.task_model(features).shape == (2, 2)
    # A new run corrects when its fit begins: a callback, nothing changed yet.
    later = MethodPlan(correct_embeddings=True).apply(_backbone(), "eprstmt", tokenizer(), _head)
    (callback,) = later.callbacks
    assert isinstance(callback, MLMEmbeddingCorrection) and later.correction is None


@pytest.mark.parametrize("k", [1, 2])
def test_the_exlm_encoder_reads_the_positions_exlm_pretraining_gave(k):
    """[CLS] and [SEP] at (index, 1..k), as ExLMPretrainer's fine_tuning_encoder gives
    them; with k=1 the encoder defaulted to MLM's (index, 0)."""
    from keras_masking.models import ExLMPretrainer

    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=LENGTH, position="rotary2d",
        custom_position_ids=True,
    )  # fmt: skip
    words = tokenizer()
    special = (words.cls_token_id, words.sep_token_id)
    pretrained = ExLMPretrainer(backbone, k=k, mask_token_id=words.mask_token_id,
                                unselectable_token_ids=special)  # fmt: skip
    applied = MethodPlan(exlm_k=k).apply(backbone, "eprstmt", words, _head)
    assert applied.encoder.objective == pretrained.fine_tuning_encoder().objective == "exlm"


def test_exlm_fits_an_exlm_preset_and_no_other(tmp_path):
    from keras_masking.clue.model_source import ModelSource
    from tests.clue import fixtures as clue_fixtures

    exlm = clue_fixtures.tiny_preset(
        tmp_path / "exlm", position="rotary2d", custom_position_ids=True, num_heads=2
    )
    plain = clue_fixtures.tiny_preset(tmp_path / "plain")
    assert ModelSource(preset=str(exlm)).position_scheme() == ("rotary2d", True)
    MethodPlan(exlm_k=2).check_source(ModelSource(preset=str(exlm)))
    with pytest.raises(ValueError, match="position='absolute'"):
        MethodPlan(exlm_k=2).check_source(ModelSource(preset=str(plain)))
    MethodPlan(fl_tuning=4).check_source(ModelSource(preset=str(plain)))  # any backbone
