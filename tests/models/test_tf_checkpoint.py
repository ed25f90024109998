"""Google-layout TF checkpoints: reading, writing, loading all or nothing.

Bad files and arguments get a clear error naming the file, the variable or the
argument, and nothing is half-loaded or half-written.
"""

import json
import os
import pathlib
import re

import keras_hub
import numpy as np
import pytest

import keras_masking
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from keras_masking.models import from_tf_checkpoint
from keras_masking.models import load_tf_checkpoint_weights
from keras_masking.models import read_tf_checkpoint
from keras_masking.models import save_tf_checkpoint
from keras_masking.models.mlm_embedding_correction_record import RECORD_FILE
from keras_masking.models.tf_checkpoint import resolve_checkpoint_prefix
from keras_masking.models.tf_checkpoint import write_tf_checkpoint
from tests.methods.mlm_correction_helpers import MASK
from tests.methods.mlm_correction_helpers import WORDS
from tests.methods.mlm_correction_helpers import assert_same_weights
from tests.methods.mlm_correction_helpers import files_in
from tests.methods.mlm_correction_helpers import tiny_ours
from tests.methods.mlm_correction_helpers import weights_of
from tests.testing import HUB_SIZES
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs
from tests.testing import write_reference_checkpoint

QUERY = "bert/encoder/layer_1/attention/self/query/kernel"


def test_bert_checkpoint_loaded_as_nezha(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path)
    with pytest.raises(ValueError, match="position_embeddings.*model='bert'"):
        from_tf_checkpoint(config_path, prefix, model="nezha")


@pytest.mark.parametrize("family", ["roformer", "nezha"])
def test_relative_checkpoints_loaded_as_bert(family, tmp_path):
    config_path, prefix, _ = write_reference_checkpoint(family, tmp_path)
    config = json.loads(open(config_path).read())
    config.pop("max_relative_position", None)  # only the weights tell now
    open(config_path, "w").write(json.dumps(config))
    with pytest.raises(ValueError, match="no absolute position table"):
        from_tf_checkpoint(config_path, prefix, model="bert")


def test_nezha_config_loaded_as_roformer(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("nezha", tmp_path)
    with pytest.raises(ValueError, match="NEZHA setting"):
        from_tf_checkpoint(config_path, prefix, model="roformer")
    config = json.loads(open(config_path).read())
    config.pop("max_relative_position")
    config["use_relative_position"] = True
    open(config_path, "w").write(json.dumps(config))
    with pytest.raises(ValueError, match="use_relative_position"):
        from_tf_checkpoint(config_path, prefix, model="bert")


def test_loading_into_a_built_model_checks_the_family_the_config_beside_declares(tmp_path):
    """RoFormer and NEZHA checkpoints hold the same variables: a NEZHA one loaded
    into a RoFormer model (or the converse) was 2.9 off, without a word."""
    nezha_config, nezha, _ = write_reference_checkpoint("nezha", tmp_path / "nezha")
    roformer_config, roformer, _ = write_reference_checkpoint("roformer", tmp_path / "roformer")
    as_nezha = from_tf_checkpoint(nezha_config, nezha, model="nezha")
    as_roformer = from_tf_checkpoint(roformer_config, roformer, model="roformer")
    for model, prefix, message in (
        (as_roformer, nezha, r"declares a nezha model.*position='rotary'"),
        (as_nezha, roformer, r"declares no NEZHA setting.*position='relative'"),
    ):
        before = weights_of(model)
        with pytest.raises(ValueError, match=message + r".*nothing was loaded"):
            load_tf_checkpoint_weights(model, prefix)
        assert_same_weights(model, before)
    load_tf_checkpoint_weights(as_nezha, nezha)  # its own family loads
    load_tf_checkpoint_weights(as_roformer, roformer)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"activation": "relu"}, "hidden_act='gelu', but the model has activation='relu'"),
        ({"layer_norm_epsilon": 1e-3}, "layer_norm_eps=1e-12, but the model has layer_norm_eps"),
    ],
)
@pytest.mark.parametrize("beside", [True, False])
def test_an_override_of_a_setting_the_weights_do_not_show_is_refused(
    override, message, beside, tmp_path
):
    """Wherever the config sits: beside the checkpoint, the override loaded
    silently (0.33 off for relu); from another folder, it was refused."""
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "bert")
    if not beside:
        moved = tmp_path / "elsewhere" / "bert_config.json"
        moved.parent.mkdir()
        os.replace(config_path, moved)
        config_path = str(moved)
    with pytest.raises(ValueError, match=re.escape(message)):
        from_tf_checkpoint(config_path, prefix, **override)


def test_a_backbone_with_lora_enabled_is_refused_by_name(tmp_path):
    """Its kernels are base plus adapters: the load stopped at a dtype error."""
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path)
    backbone = from_tf_checkpoint(config_path, prefix)
    backbone.enable_lora(2)
    before = weights_of(backbone)
    with pytest.raises(ValueError, match=r"LoRA enabled.*before enable_lora.*merge_lora"):
        load_tf_checkpoint_weights(backbone, prefix)
    assert_same_weights(backbone, before)
    load_tf_checkpoint_weights(backbone.merge_lora(), prefix)


def test_partial_checkpoint_names_what_is_missing(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path, drop=[QUERY])
    with pytest.raises(ValueError, match=f"missing from the checkpoint: \\['{QUERY}'\\]"):
        from_tf_checkpoint(config_path, prefix)


def test_missing_mlm_head_when_asked_for(tmp_path):
    _, weights_dir = tmp_path / "a", tmp_path / "b"
    config_path, prefix, _ = write_reference_checkpoint(
        "bert", weights_dir, drop=["cls/predictions/output_bias"]
    )
    assert from_tf_checkpoint(config_path, prefix).use_pooler
    with pytest.raises(ValueError, match="cls/predictions/output_bias"):
        from_tf_checkpoint(config_path, prefix, with_mlm=True)


def test_shape_mismatch_is_listed(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint(
        "bert", tmp_path, extra={QUERY: np.zeros((32, 16), "float32")}
    )
    with pytest.raises(ValueError, match=r"shape mismatches.*\(32, 16\) vs model \(32, 32\)"):
        from_tf_checkpoint(config_path, prefix)


def test_unexpected_variables_strict_and_lenient(tmp_path, caplog):
    extra = {
        "bert/encoder/layer_0/adapter/kernel": np.ones((2, 2), "float32"),
        "global_step": np.array(7, "int64"),
        "cls/seq_relationship/output_bias": np.zeros(2, "float32"),
        QUERY + "/adam_m": np.zeros((32, 32), "float32"),
    }
    config_path, prefix, expected = write_reference_checkpoint("bert", tmp_path, extra=extra)
    with pytest.raises(
        ValueError, match=r"not used by a bert model: \['bert/encoder/layer_0/adapter/kernel'\]"
    ):
        from_tf_checkpoint(config_path, prefix)
    with caplog.at_level("WARNING", logger="keras_masking"):
        backbone = from_tf_checkpoint(config_path, prefix, strict=False)
    assert "adapter/kernel" in caplog.text
    features = {k: expected[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    np.testing.assert_allclose(
        backbone(features)["sequence_output"], expected["sequence_output"], atol=2e-5
    )


def test_a_head_the_model_has_takes_only_its_own_variables(tmp_path):
    # An untied output matrix (cls/predictions/output_weights) loaded as a
    # tied head without a word (logits 8 off); a head the model does not
    # have is still skipped whole.
    extra = {"cls/predictions/output_weights": np.ones((5, 32), "float32")}
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path, extra=extra)
    assert from_tf_checkpoint(config_path, prefix).use_pooler  # no MLM head: skipped
    with pytest.raises(ValueError, match=r"not used by a bert model: \['cls/predictions/output_w"):
        from_tf_checkpoint(config_path, prefix, with_mlm=True)


def test_settings_the_weights_do_not_show_must_match_the_config_beside(checkpoint):
    config_path, prefix = checkpoint
    backbone = from_tf_checkpoint(config_path, prefix)
    before = weights_of(backbone)
    config = json.loads(pathlib.Path(config_path).read_text())
    for changes, message in (
        ({"hidden_act": "relu"}, "hidden_act='relu', but the model has activation="),
        ({"layer_norm_eps": 1e-5}, "layer_norm_eps=1e-05, but the model has layer_norm_epsilon"),
    ):
        pathlib.Path(config_path).write_text(json.dumps({**config, **changes}))
        with pytest.raises(ValueError, match=re.escape(message) + ".*nothing was loaded"):
            load_tf_checkpoint_weights(backbone, prefix)
        assert_same_weights(backbone, before)
    pathlib.Path(config_path).write_text(json.dumps({**config, "hidden_act": "gelu_erf"}))
    load_tf_checkpoint_weights(backbone, prefix)  # another name of the same GELU


def test_failed_load_leaves_model_untouched(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path, drop=[QUERY])
    backbone = from_tf_checkpoint(*write_reference_checkpoint("bert", tmp_path / "full")[:2])
    before = [np.array(w) for w in backbone.get_weights()]
    with pytest.raises(ValueError, match="nothing was loaded"):
        load_tf_checkpoint_weights(backbone, prefix)
    for a, b in zip(backbone.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="bert_config.json"):
        from_tf_checkpoint(tmp_path / "bert_config.json", tmp_path / "model.ckpt")
    config_path, _, _ = write_reference_checkpoint("bert", tmp_path)
    with pytest.raises(FileNotFoundError, match="No TF checkpoint"):
        from_tf_checkpoint(config_path, tmp_path / "nothing.ckpt")


@pytest.fixture
def checkpoint(tmp_path):
    config_path, prefix, _ = write_reference_checkpoint("bert", tmp_path / "ckpt")
    return config_path, prefix


def test_truncated_data_file_names_the_file_and_variable(checkpoint):
    config_path, prefix = checkpoint
    data = prefix + ".data-00000-of-00001"
    raw = pathlib.Path(data).read_bytes()
    pathlib.Path(data).write_bytes(raw[: len(raw) // 2])
    pattern = re.escape(data) + r": cannot read variable '.*'; the file is truncated or corrupt"
    with pytest.raises(ValueError, match=pattern):
        read_tf_checkpoint(prefix)
    with pytest.raises(ValueError, match=pattern):
        from_tf_checkpoint(config_path, prefix)
    pathlib.Path(data).write_bytes(raw[:4] + bytes(64) + raw[68:])  # corrupt, same size
    with pytest.raises(ValueError, match=pattern):
        read_tf_checkpoint(prefix)


def test_missing_data_shard_and_bad_index_name_the_file(checkpoint):
    config_path, prefix = checkpoint
    data = prefix + ".data-00000-of-00001"
    os.rename(data, data + ".moved")
    with pytest.raises(FileNotFoundError, match=re.escape(data) + ".*missing"):
        from_tf_checkpoint(config_path, prefix)
    os.rename(data + ".moved", data)
    index = prefix + ".index"
    raw = pathlib.Path(index).read_bytes()
    pathlib.Path(index).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=re.escape(index) + ": not a readable TF checkpoint"):
        read_tf_checkpoint(prefix)
    os.remove(index)
    with pytest.raises(FileNotFoundError, match=r"No TF checkpoint.*\.index"):
        read_tf_checkpoint(prefix)


def test_a_failed_write_leaves_no_checkpoint(tmp_path, monkeypatch):
    import tensorflow as tf

    def full_disk(**kwargs):
        pathlib.Path(kwargs["prefix"] + ".index").write_bytes(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(tf.raw_ops, "SaveV2", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_tf_checkpoint({"a": np.ones(3, "float32")}, str(tmp_path / "out" / "model.ckpt"))
    assert files_in(tmp_path / "out") == []


def test_a_checkpoint_already_there_is_never_overwritten(tmp_path):
    """A checkpoint is written file by file, and its folder's bert_config.json and MLM
    record describe one checkpoint: a second write there is refused, nothing touched."""
    prefix = str(tmp_path / "bert" / "bert_model.ckpt")
    save_tf_checkpoint(tiny_ours(), prefix)
    before = [
        (path, (tmp_path / "bert" / path).read_bytes()) for path, _ in files_in(tmp_path / "bert")
    ]
    with pytest.raises(ValueError, match=r"Received: .* holding \['bert_model.ckpt.index'\]"):
        save_tf_checkpoint(tiny_ours(), str(tmp_path / "bert" / "corrected.ckpt"))
    with pytest.raises(ValueError, match=r"has \['bert_model.ckpt.data-00000-of-00001', 'bert"):
        write_tf_checkpoint({"a": np.ones(3, "float32")}, prefix)
    # Nor a config file of another checkpoint's, elsewhere.
    with pytest.raises(ValueError, match=r"config_path '.*bert_config.json', which exists"):
        save_tf_checkpoint(
            tiny_ours(),
            str(tmp_path / "new" / "m.ckpt"),
            config_path=tmp_path / "bert" / "bert_config.json",
        )
    after = [
        (path, (tmp_path / "bert" / path).read_bytes()) for path, _ in files_in(tmp_path / "bert")
    ]
    assert after == before and not (tmp_path / "new").exists()


def test_from_tf_checkpoint_bad_input(checkpoint, tmp_path):
    config_path, prefix = checkpoint
    cases = [
        ({"with_mlm": "yes"}, ValueError, "Expected True or False for with_mlm"),
        ({"strict": None}, ValueError, "Expected True or False for strict"),
        ({"with_pool": "yes"}, ValueError, "Expected one of 'auto', True, False for with_pool"),
        (
            {"config_path": None},
            TypeError,
            r"Expected a path \(str or os.PathLike\) for config_path",
        ),
        ({"checkpoint_path": 3.5}, TypeError, "Expected a path .* for checkpoint_path"),
        ({"model": "albert"}, ValueError, "Expected one of .bert., .* for model"),
    ]
    for kwargs, error, message in cases:
        arguments = {"config_path": config_path, "checkpoint_path": prefix, **kwargs}
        with pytest.raises(error, match=message):
            from_tf_checkpoint(**arguments)
    # A record that does not fit the checkpoint, or is not JSON: the file is named.
    record_path = pathlib.Path(prefix).parent / RECORD_FILE
    record = keras_masking.correct_mlm_embeddings(tiny_ours(), MASK).to_config()
    record_path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"{RECORD_FILE}: the record is for a 64 x 32 table"):
        from_tf_checkpoint(config_path, prefix)
    record_path.write_text("[")
    with pytest.raises(ValueError, match=f"{RECORD_FILE}: not a readable JSON record"):
        from_tf_checkpoint(config_path, prefix)


def test_load_tf_checkpoint_weights_bad_input(checkpoint):
    config_path, prefix = checkpoint
    backbone = from_tf_checkpoint(config_path, prefix)
    before = weights_of(backbone)
    values = read_tf_checkpoint(prefix)
    query = "bert/encoder/layer_0/attention/self/query/kernel"
    cases = [
        ((keras_hub.models.BertBackbone(**HUB_SIZES), prefix), {}, TypeError, "from_keras_hub"),
        ((backbone, prefix), {"strict": "no"}, ValueError, "Expected True or False for strict"),
        ((backbone, prefix), {"source": 5}, ValueError, "Expected a str or None for source"),
        ((backbone, {1: np.ones(2)}), {}, TypeError, "path or a dict"),
        ((backbone, {**values, query: np.ones((32, 16))}), {}, ValueError, query + r": checkp"),
        ((backbone, {**values, query: np.full((32, 32), "x")}), {}, ValueError, query + ".*float"),
        ((backbone, {k: v for k, v in values.items() if k != WORDS}), {}, ValueError, WORDS),
        ((backbone, None), {}, TypeError, "Expected a path .* for checkpoint_path"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            load_tf_checkpoint_weights(*args, **kwargs)
        assert_same_weights(backbone, before)


def test_save_and_write_tf_checkpoint_bad_input(tmp_path):
    hub = keras_hub.models.BertBackbone(**HUB_SIZES)
    with pytest.raises(TypeError, match="save_tf_checkpoint` expects a keras_masking"):
        save_tf_checkpoint(hub, str(tmp_path / "a" / "m.ckpt"))
    backbone = tiny_ours()
    for prefix in (None, 5):
        with pytest.raises(TypeError, match="Expected a path .* for checkpoint_prefix"):
            save_tf_checkpoint(backbone, prefix)
    with pytest.raises(TypeError, match="Expected a path .* for config_path"):
        save_tf_checkpoint(backbone, str(tmp_path / "a" / "m.ckpt"), config_path=3)
    masked_lm = TransformerMaskedLM(tiny_ours())
    keras_masking.correct_mlm_embeddings(masked_lm, MASK)  # tied_output="keep"
    with pytest.raises(ValueError, match="save `model.backbone`"):
        save_tf_checkpoint(masked_lm, str(tmp_path / "a" / "m.ckpt"))
    for values, message in (
        ({}, r"non-empty dict \{name: array\} for values. Received: an empty dict"),
        ([("a", np.ones(2))], "non-empty dict.*Received: a list"),
        ({1: np.ones(2)}, r"non-empty str names in values. Received: the names \[1\]"),
        ({"a": object()}, r"Expected an array for values\['a'\]"),
    ):
        with pytest.raises(ValueError, match=message):
            write_tf_checkpoint(values, str(tmp_path / "a" / "m.ckpt"))
    with pytest.raises(TypeError, match="Expected a path .* for checkpoint_prefix"):
        write_tf_checkpoint({"a": np.ones(2)}, None)
    assert sorted(os.listdir(tmp_path)) in ([], ["a"]) and not files_in(tmp_path / "a")


def test_resolve_checkpoint_prefix_bad_input(checkpoint, tmp_path):
    _, prefix = checkpoint
    with pytest.raises(TypeError, match="Expected a path .* for checkpoint_path"):
        resolve_checkpoint_prefix(None)
    with pytest.raises(TypeError, match="Expected a path .* for checkpoint_path"):
        resolve_checkpoint_prefix(b"x")
    with pytest.raises(FileNotFoundError, match="No TF checkpoint"):
        resolve_checkpoint_prefix(tmp_path / "missing.ckpt")
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "a.index").write_bytes(b"")
    (folder / "b.index").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"expected one TF checkpoint.*a\.index.*b\.index"):
        resolve_checkpoint_prefix(folder)
    assert resolve_checkpoint_prefix(pathlib.Path(prefix + ".index")) == prefix


def test_a_broken_config_beside_the_checkpoint_is_named_and_nothing_loads(checkpoint):
    config_path, prefix = checkpoint
    backbone = from_tf_checkpoint(config_path, prefix)
    before = weights_of(backbone)
    beside = pathlib.Path(prefix).parent / "config.json"
    beside.write_text('{"num_attention_heads": ')
    with pytest.raises(
        ValueError, match=re.escape(str(beside)) + ": not valid JSON.*fix or remove"
    ):
        load_tf_checkpoint_weights(backbone, prefix)
    assert_same_weights(backbone, before)


@pytest.mark.parametrize(
    "method, named",
    [
        (lambda b: b.enable_fl_tuning(units=4), "FL-tuning's addFFN branches"),
        (lambda b: b.enable_prefix_tuning(length=2), "P-tuning v2's prefixes"),
        (lambda b: b.enable_fl_tuning(units=0, attention_units=2), "MA-tuning's attention units"),
    ],
)
def test_a_checkpoint_refuses_the_weights_its_layout_cannot_hold(method, named, tmp_path):
    """The Google layout has no place for attachments: they were left out
    without a word (FL-tuned outputs 0.2-0.5 off after the round trip)."""
    backbone = tiny_ours()
    method(backbone)
    with pytest.raises(ValueError, match=f"no place for {re.escape(named)}.*serving_copy"):
        save_tf_checkpoint(backbone, str(tmp_path / "a" / "m.ckpt"))
    assert not files_in(tmp_path / "a")


def test_the_serving_copy_of_an_fl_tuned_backbone_round_trips(tmp_path):
    backbone = tiny_ours()
    backbone.enable_fl_tuning(units=4)
    randomize_weights(backbone, seed=2)
    features = random_features(batch=2, length=8)
    save_tf_checkpoint(backbone.serving_copy(), str(tmp_path / "m.ckpt"))
    loaded = from_tf_checkpoint(tmp_path / "bert_config.json", tmp_path / "m.ckpt", model="bert")
    np.testing.assert_allclose(
        np.asarray(loaded(features)["sequence_output"]),
        np.asarray(backbone(features)["sequence_output"]),
        atol=1e-5,
    )


@pytest.mark.parametrize("position", ["absolute", "relative"])
def test_mean_pooling_survives_a_checkpoint(position, tmp_path):
    """bert_config.json records a pooling that is not BERT's [CLS] (e5's
    mean): it read back as "first", a different pooled_output."""
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(position, pooling="mean", use_pooler=False)
    )
    randomize_weights(backbone, seed=1)
    save_tf_checkpoint(backbone, str(tmp_path / "m.ckpt"))
    family = {"absolute": "bert", "relative": "nezha"}[position]
    loaded = from_tf_checkpoint(tmp_path / "bert_config.json", tmp_path / "m.ckpt", model=family)
    assert loaded.pooling == "mean"
    features = random_features(batch=2, length=8)
    np.testing.assert_allclose(
        np.asarray(loaded(features)["pooled_output"]),
        np.asarray(backbone(features)["pooled_output"]),
        atol=1e-6,
    )


def test_a_pruned_tables_record_survives_a_checkpoint(tmp_path):
    """bert_config.json keeps ``pruned_from`` (the full table's size and row mean, which
    the MLM correction averages): the reloaded model was corrected with the kept rows'
    mean instead (0.04 apart on a tiny table). A model without the record refuses it."""
    mean = np.random.default_rng(0).normal(size=32).round(3).tolist()
    pruned_from = {"vocabulary_size": 500, "token_embedding_mean": mean}
    backbone = TransformerBackbone(**tiny_backbone_kwargs(pruned_from=pruned_from))
    randomize_weights(backbone, seed=1)
    save_tf_checkpoint(backbone, str(tmp_path / "m.ckpt"))
    loaded = from_tf_checkpoint(tmp_path / "bert_config.json", tmp_path / "m.ckpt")
    assert loaded.get_config()["pruned_from"] == pruned_from
    for model in (backbone, loaded):
        keras_masking.methods.correct_mlm_embeddings(model, mask_token_id=3)
    np.testing.assert_array_equal(
        loaded.token_embedding.embeddings.numpy(), backbone.token_embedding.embeddings.numpy()
    )
    unpruned = TransformerBackbone(**tiny_backbone_kwargs())
    before = weights_of(unpruned)
    with pytest.raises(ValueError, match=r"pruned from 500 rows .* pruned_from is None"):
        load_tf_checkpoint_weights(unpruned, tmp_path / "m.ckpt")
    assert_same_weights(unpruned, before)


def test_a_failed_config_write_takes_the_checkpoint_back(tmp_path, monkeypatch):
    """The config is written after the checkpoint: when that fails (a full disk), the
    checkpoint goes too (a checkpoint without its config was left, and the same call
    then refused its folder), the folder's own files stay, and the call can be made again."""
    import keras_masking.models.tf_checkpoint as tf_checkpoint

    prefix = str(tmp_path / "bert" / "bert_model.ckpt")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "checkpoint").write_text("mine")

    def full_disk(path, value):
        raise OSError("No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(tf_checkpoint, "write_json_atomically", full_disk)
        with pytest.raises(OSError, match="No space"):
            save_tf_checkpoint(tiny_ours(), prefix)
    assert files_in(tmp_path / "bert") == [("checkpoint", 4)]
    # A config folder that does not exist yet is made before anything is written.
    config_path = tmp_path / "configs" / "base" / "bert_config.json"
    save_tf_checkpoint(tiny_ours(), prefix, config_path=config_path)
    assert config_path.exists() and (tmp_path / "bert" / "bert_model.ckpt.index").exists()
