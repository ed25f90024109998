"""Shared helpers for the test suite (tiny configs only)."""

import json
import pathlib

import numpy as np
import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
FAMILIES = ("bert", "roformer", "nezha")


# The same tiny sizes for keras-hub's BertBackbone / RobertaBackbone.
HUB_SIZES = dict(
    vocabulary_size=64,
    num_layers=2,
    num_heads=4,
    hidden_dim=32,
    intermediate_dim=48,
    dropout=0.0,
    max_sequence_length=24,
)


def tiny_backbone_kwargs(position="absolute", **overrides):
    """Arguments of a 2-layer, hidden-32 TransformerBackbone."""
    kwargs = dict(
        vocabulary_size=64,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=48,
        dropout=0.0,
        max_sequence_length=24,
        position=position,
        max_relative_position=4,
    )
    kwargs.update(overrides)
    return kwargs


def random_features(batch=2, length=10, vocabulary_size=64, seed=0, padded=True):
    """Token ids, segment ids and a padding mask with a padded second row."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(1, vocabulary_size, size=(batch, length)).astype("int32")
    segment_ids = np.zeros((batch, length), "int32")
    segment_ids[:, length // 2 :] = 1
    padding_mask = np.ones((batch, length), "int32")
    if padded and batch > 1:
        padding_mask[1, length - 3 :] = 0
        token_ids[1, length - 3 :] = 0
    return {
        "token_ids": token_ids,
        "segment_ids": segment_ids,
        "padding_mask": padding_mask,
    }


def load_reference(family):
    """The Hugging Face reference fixture of one family (see fixtures/)."""
    with np.load(FIXTURES / f"{family}_reference.npz") as data:
        arrays = {key: data[key] for key in data.files}
    config = json.loads(str(arrays.pop("config_json")))
    weights = {
        key[len("weights/") :]: value for key, value in arrays.items() if key.startswith("weights/")
    }
    outputs = {k: v for k, v in arrays.items() if not k.startswith("weights/")}
    return config, weights, outputs


def write_reference_checkpoint(family, folder, drop=(), extra=None, config_changes=None):
    """Writes a fixture as a Google-layout TF checkpoint + bert_config.json.

    Returns:
        (config_path, checkpoint_prefix, outputs)
    """
    from keras_masking.models.tf_checkpoint import write_tf_checkpoint

    config, weights, outputs = load_reference(family)
    config.update(config_changes or {})
    for name in drop:
        weights.pop(name)
    weights.update(extra or {})
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "bert_config.json"
    config_path.write_text(json.dumps(config))
    prefix = str(folder / "bert_model.ckpt")
    write_tf_checkpoint(weights, prefix)
    return str(config_path), prefix, outputs


@pytest.fixture
def features():
    return random_features()


def randomize_weights(model, seed=0, scale=0.2):
    """Large random trainable weights, so that any mis-wiring shows."""
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        variable.assign(rng.normal(0, scale, variable.shape).astype("float32"))
    return model
