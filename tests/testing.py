"""What the tests share: tiny model sizes, random features, reference fixtures,
gradients. Imported normally (``from tests.testing import ...``)."""

import json
import pathlib

import numpy as np

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


def randomize_weights(model, seed=0, scale=0.2):
    """Large random trainable weights, so that any mis-wiring shows."""
    rng = np.random.default_rng(seed)
    for variable in model.trainable_weights:
        variable.assign(rng.normal(0, scale, variable.shape).astype("float32"))
    return model


def value_and_gradients(fn, arrays):
    """``fn(*arrays)`` and its gradients with respect to each array (TF or JAX)."""
    import keras

    arrays = [np.asarray(a, "float32") for a in arrays]
    if keras.config.backend() == "jax":
        import jax

        value, grads = jax.value_and_grad(lambda args: fn(*args))(arrays)
        return float(value), [np.asarray(g) for g in grads]
    import tensorflow as tf

    variables = [tf.Variable(a) for a in arrays]
    with tf.GradientTape() as tape:
        value = fn(*variables)
    grads = tape.gradient(value, variables)
    return float(value), [
        np.zeros(a.shape, "float32") if g is None else np.asarray(tf.convert_to_tensor(g))
        for a, g in zip(arrays, grads)
    ]


def model_gradients(model, x, y):
    """The loss of one training forward of a compiled model, and the gradient
    of every trainable variable (by path), computed eagerly as `fit` does."""
    import keras

    if keras.config.backend() == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        metrics = [v.value for v in model.metrics_variables]
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        optimizer = [v.value for v in model.optimizer.variables]

        def loss_fn(values):
            loss, _ = model.compute_loss_and_updates(
                values,
                non_trainable,
                metrics,
                x,
                y,
                None,
                training=True,
                optimizer_variables=optimizer,
            )
            return loss

        loss, grads = jax.jit(jax.value_and_grad(loss_fn))(trainable)
    else:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
    return float(loss), {
        v.path: np.zeros(v.shape, "float32") if g is None else np.asarray(g)
        for v, g in zip(model.trainable_variables, grads)
    }
