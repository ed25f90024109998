"""What the tests share: tiny model sizes, random features, reference fixtures,
gradients, and the keras-hub-style test case (`run_layer_test`,
`run_backbone_test`, `run_task_test`). Imported normally
(``from tests.testing import ...``)."""

import dataclasses
import inspect
import json
import pathlib
from typing import Callable

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


def count_train_step_traces(model):
    """A list that grows by one each time ``model``'s train step is traced (or run eagerly)."""
    traces = []
    train_step = model.train_step

    def counted(*args, **kwargs):
        traces.append(1)
        return train_step(*args, **kwargs)

    model.train_step = counted
    return traces


def shares_memory(variable, other):
    """Whether two variables hold one buffer. On JAX an assigned array is
    shared, and a compiled step donates (deletes) the buffers it trains; on
    TensorFlow an assignment copies, so this is False there."""
    return np.shares_memory(np.asarray(variable.value), np.asarray(other.value))


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


# === The keras-hub-style test case ===
# `run_layer_test`, `run_backbone_test` and `run_task_test` check one class
# against the Keras contract, in the spirit of keras-hub's ``TestCase``: a
# config that holds exactly the constructor arguments and round-trips, saving
# and loading a ``.keras`` file without ``custom_objects``, training versus
# inference where the class is random, masking where it takes a padding mask,
# the ``mixed_bfloat16`` policy and one compiled (``jit_compile=True``)
# training step that changes every trainable weight. A `LayerCase` says how to
# build, call and check the class; tests/layers/test_contracts.py holds the
# table of every registered class.

# Config keys of the Keras base classes, besides a class's own arguments.
BASE_KEYS = {"name", "trainable", "dtype", "autocast", "activity_regularizer"}


def _is_float(x):
    import keras

    return "float" in keras.backend.standardize_dtype(x.dtype)


def to_numpy(x):
    """A backend tensor as numpy (16-bit floats as float32)."""
    import keras

    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32") if _is_float(x) else x)


def eager_predict(model, x):
    """``model.predict(x)`` of one small batch as one eager call: no traced step, no
    tf.data pipeline. Texts (or a tuple of two batches: pairs) go through
    ``model.preprocessor`` first (``x=``: a positional tuple is read as ``(x, y)``)."""
    if not isinstance(x, dict):
        x = model.preprocessor(x=x)
    return to_numpy(model(x, training=False))


def flat_outputs(outputs):
    """Every tensor of a (nested) output, as numpy."""
    import keras

    return [to_numpy(x) for x in keras.tree.flatten(outputs)]


def assert_outputs_equal(actual, expected, atol=1e-6):
    actual, expected = flat_outputs(actual), flat_outputs(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=0, atol=atol)


def outputs_differ(a, b):
    return any(
        x.shape != y.shape or not np.allclose(x, y, atol=1e-6)
        for x, y in zip(flat_outputs(a), flat_outputs(b))
    )


@dataclasses.dataclass
class LayerCase:
    """How to build, call and check one layer or model class.

    Only ``make`` and ``args`` are needed; every other field turns a check on
    or adapts it.
    """

    make: Callable  # () -> a new instance
    args: Callable  # () -> the positional call arguments (numpy)
    mixed_dtype: str = "bfloat16"  # documented float output dtype under mixed_bfloat16
    mixed_atol: float = 0.05  # |mixed - float32| allowed, relative to max |float32|
    atol: float = 1e-6  # for outputs of the same weights
    make_random: Callable = None  # () -> an instance whose training call is random
    masking: Callable = None  # instance -> asserts that padding is ignored
    saved_model: Callable = None  # instance -> (model holding it, call args)
    train_model: Callable = None  # instance -> (inputs, float output, x) for one step
    step: Callable = None  # instance -> (model compiled with its own loss, x, y)
    no_gradient: tuple = ()  # variable paths a step leaves unchanged (reason at the case)
    weightless: bool = False
    task: bool = False  # a keras-hub Task: its dtype follows the backbone's
    training_check: Callable = None  # replaces the generic training-versus-inference check

    def call(self, instance, args, training=None):
        if training is None:
            return instance(*args)
        return instance(*args, training=training)

    def build(self, make=None, training=None):
        """A built instance with large random weights, its args and outputs."""
        instance = (make or self.make)()
        args = self.args()
        self.call(instance, args)
        randomize_weights(instance, seed=5)
        return instance, args, self.call(instance, args, training=training)


def _constructor_parameters(cls):
    return {
        name
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if name != "self"
        and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
    }


def _all_layers(model):
    return [model] + list(model._flatten_layers(include_self=False, recursive=True))


def _float_outputs(outputs):
    import keras

    return [x for x in keras.tree.flatten(outputs) if _is_float(x)]


def check_config_round_trip(case):
    """The config holds exactly the constructor arguments (plus Keras' base
    keys), is plain JSON, and rebuilds an instance with the same config, the
    same outputs on the same weights, and ``trainable=False`` kept."""
    import keras

    instance, args, expected = case.build()
    config = instance.get_config()
    json.dumps(keras.saving.serialize_keras_object(instance))  # plain JSON
    parameters = _constructor_parameters(type(instance))
    assert parameters <= set(config), f"missing from the config: {parameters - set(config)}"
    assert set(config) <= parameters | BASE_KEYS, f"not arguments: {set(config) - parameters}"
    required = {"name", "trainable"} if case.task else {"name", "trainable", "dtype"}
    assert required <= set(config), f"missing from the config: {required - set(config)}"

    clone = type(instance).from_config(config)
    assert clone.get_config() == config
    actual = case.call(clone, args)
    if instance.trainable_weights:
        # Other weights give other outputs, so the equality below can fail.
        assert outputs_differ(actual, expected)
    if instance.weights:
        clone.set_weights(instance.get_weights())
    assert_outputs_equal(case.call(clone, args), expected, case.atol)

    instance.trainable = False
    frozen = type(instance).from_config(instance.get_config())
    assert frozen.trainable is False


def check_save_and_load(case, folder):
    """A ``.keras`` file (of the instance, or of a model holding it) loads
    without ``custom_objects``: same class, weights and outputs."""
    import keras

    instance, args, _ = case.build()
    if case.saved_model is not None:
        model, args = case.saved_model(instance)
        randomize_weights(model, seed=6)
    elif isinstance(instance, keras.Model):
        model = instance
    else:
        inputs = [keras.Input(shape=a.shape[1:], dtype=str(a.dtype)) for a in args]
        model = keras.Model(inputs, case.call(instance, inputs))
        args = (list(args),)
    path = pathlib.Path(folder) / "model.keras"
    model.save(path)
    expected = model(*args)  # random models: the draws after the saved state
    restored = keras.saving.load_model(path)  # no custom_objects
    assert type(restored) is type(model)
    assert any(isinstance(layer, type(instance)) for layer in _all_layers(restored))
    assert [v.path for v in restored.weights] == [v.path for v in model.weights]
    for original, loaded in zip(model.weights, restored.weights):
        np.testing.assert_array_equal(np.asarray(loaded), np.asarray(original))
    assert_outputs_equal(restored(*args), expected, case.atol)


def check_training_versus_inference(case):
    """The random instance is random in training only, and at inference equals
    the plain instance on the same weights."""
    if case.training_check is not None:
        return case.training_check()
    instance, args, inference = case.build(make=case.make_random, training=False)
    assert_outputs_equal(case.call(instance, args, training=False), inference)
    assert outputs_differ(case.call(instance, args, training=True), inference)
    plain = case.make()
    case.call(plain, args)
    if plain.weights:
        plain.set_weights(instance.get_weights())
    assert_outputs_equal(case.call(plain, args, training=False), inference)


class dtype_policy:
    """``with dtype_policy("mixed_bfloat16"):`` sets Keras' global policy and
    puts the previous one back."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        import keras

        self.previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(self.name)

    def __exit__(self, *exc_info):
        import keras

        keras.config.set_dtype_policy(self.previous)


def check_mixed_precision(case):
    """Under ``mixed_bfloat16``: float32 variables, the documented output
    dtype, and outputs close to float32's on the same weights."""
    import keras

    with dtype_policy("float32"):
        full, args, expected = case.build()
    with dtype_policy("mixed_bfloat16"):
        mixed = case.make()
        case.call(mixed, args)
    variables = [v for v in mixed.weights if "float" in keras.backend.standardize_dtype(v.dtype)]
    assert all(v.dtype == "float32" for v in variables), {v.path: v.dtype for v in variables}
    if mixed.weights:
        mixed.set_weights(full.get_weights())
    actual = case.call(mixed, args)
    floats = _float_outputs(actual)
    if case.mixed_dtype is None:
        assert not floats
    for x in floats:
        assert keras.backend.standardize_dtype(x.dtype) == case.mixed_dtype
    for a, e in zip(flat_outputs(actual), flat_outputs(expected)):
        finite = np.isfinite(e)
        np.testing.assert_array_equal(np.isfinite(a), finite)
        scale = max(1.0, float(np.abs(e[finite]).max())) if finite.any() else 1.0
        np.testing.assert_allclose(a[finite], e[finite], rtol=0, atol=case.mixed_atol * scale)


def check_compiled_training_step(case):
    """One ``jit_compile=True`` step: the loss of the forward pass (MSE to
    random targets, or the model's own loss) and every trainable weight moved."""
    import keras
    from keras import ops

    instance, args, _ = case.build()
    if case.weightless:
        assert not instance.weights
        return
    expected_loss = None
    if case.step is not None:
        model, x, y = case.step(instance)
    else:
        if case.train_model is not None:
            inputs, outputs, x = case.train_model(instance)
        else:
            inputs = [keras.Input(shape=a.shape[1:], dtype=str(a.dtype)) for a in args]
            outputs, x = _float_outputs(case.call(instance, inputs))[0], list(args)
        finite = ops.cast(outputs, "float32")
        model = keras.Model(inputs, ops.where(ops.isfinite(finite), finite, 0.0))
        randomize_weights(model, seed=7)
        prediction = to_numpy(model(x, training=True))
        y = np.random.default_rng(8).normal(size=prediction.shape).astype("float32")
        expected_loss = float(np.mean((prediction - y) ** 2))
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", jit_compile=True)
    before = {v.path: np.asarray(v) for v in model.trainable_variables}
    assert before
    loss = model.train_on_batch(x, y, return_dict=True)["loss"]
    assert np.isfinite(loss)
    if expected_loss is not None:
        np.testing.assert_allclose(loss, expected_loss, rtol=1e-4)
    after = {v.path: np.asarray(v) for v in model.trainable_variables}
    unchanged = [
        path
        for path, value in before.items()
        if not any(part in path for part in case.no_gradient) and np.array_equal(after[path], value)
    ]
    assert not unchanged, f"not trained: {unchanged}"


def run_layer_test(case, folder):
    """Every check of the Keras contract that applies to ``case``.

    Args:
        case: a `LayerCase`.
        folder: a scratch folder (pytest's ``tmp_path``) for the saved file.
    """
    check_config_round_trip(case)
    check_save_and_load(case, folder)
    if case.make_random is not None or case.training_check is not None:
        check_training_versus_inference(case)
    if case.masking is not None:
        instance, _, _ = case.build()
        case.masking(instance)
    check_mixed_precision(case)
    check_compiled_training_step(case)


def run_backbone_test(case, folder):
    """`run_layer_test`, and what a backbone promises: ``sequence_output``
    [batch, length, hidden] and ``pooled_output`` [batch, hidden]; shorter
    sequences than the first call's; a compiled ``predict`` equal to the
    eager call."""
    run_layer_test(case, folder)
    backbone, (x,), outputs = case.build()
    batch, length = x["token_ids"].shape
    hidden = outputs["sequence_output"].shape[-1]
    assert tuple(outputs["sequence_output"].shape) == (batch, length, hidden)
    assert tuple(outputs["pooled_output"].shape) == (batch, hidden)
    for shorter in (length - 2, length - 1):
        short = {key: value[:, :shorter] for key, value in x.items()}
        sequence = backbone(short)["sequence_output"]
        assert tuple(sequence.shape) == (batch, shorter, hidden)
        assert np.isfinite(to_numpy(sequence)).all()
    assert_outputs_equal(backbone.predict(x, verbose=0), outputs, atol=1e-5)


def run_task_test(case, folder, raw=None):
    """`run_layer_test`, and what a keras-hub Task promises: its dtype follows
    its backbone's, a compiled ``predict`` equals the eager call, and, given
    ``raw``, ``predict`` takes raw examples through the task's preprocessor.

    Args:
        case: a `LayerCase` of the task without a preprocessor.
        folder: a scratch folder (pytest's ``tmp_path``).
        raw: optional ``() -> (task with a preprocessor, raw examples)``.
    """
    run_layer_test(case, folder)
    task, (x,), outputs = case.build()
    assert task.backbone.dtype_policy.name == task.dtype_policy.name
    assert_outputs_equal(task.predict(x, verbose=0), outputs, atol=1e-5)
    if raw is not None:
        task, examples = raw()
        assert task.preprocessor is not None
        expected = to_numpy(task(task.preprocessor(examples)))
        actual = task.predict(examples, batch_size=2, verbose=0)
        np.testing.assert_allclose(actual, expected, atol=1e-5)
