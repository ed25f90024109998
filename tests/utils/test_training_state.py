"""The call-context reading behind the backbone's caller record."""

import keras
import numpy as np
import pytest

import keras_masking
from tests.testing import count_train_step_traces
from tests.testing import random_features
from tests.testing import tiny_backbone_kwargs


def test_a_backbone_predict_leaves_no_training_flag_for_later_calls():
    # JAX runs `call` through `stateless_call` with no call context open; the
    # backbone's caller record once opened one there and never closed it, so
    # after any later `fit` every eager call in the process ran dropout.
    backbone = keras_masking.models.TransformerBackbone(**tiny_backbone_kwargs())
    backbone.predict(random_features(), verbose=0)
    assert keras_masking.utils.outermost_caller() is None
    assert list(backbone.callers) == [backbone]
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dropout(0.5)(keras.layers.Dense(2)(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 2)), verbose=0)
    ones = keras.ops.ones((3, 8))
    dropped = keras.layers.Dropout(0.5, seed=1)(ones)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dropped), np.ones((3, 8)))


def _classifier():
    keras.utils.set_random_seed(0)
    backbone = keras_masking.models.TransformerBackbone(**tiny_backbone_kwargs(dropout=0.0))
    model = keras_masking.models.TransformerTextClassifier(backbone, num_classes=2, dropout=0.0)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],  # built in the first trace too, by Keras' own `fit`
    )
    return model, count_train_step_traces(model)


def test_a_first_fit_builds_the_optimizer_before_it_traces_and_trains_the_same():
    import keras_hub

    features, labels = random_features(batch=4), np.array([0, 1, 1, 0])
    # Keras' own `fit` (past the package's): on TensorFlow the optimizer is
    # built inside the first trace, which is then traced again.
    keras_default, default_traces = _classifier()
    keras_hub.models.TextClassifier.fit(keras_default, features, labels, batch_size=2, verbose=0)
    model, traces = _classifier()
    model.fit(features, labels, batch_size=2, shuffle=False, verbose=0)  # keras-hub's order
    tensorflow = keras.config.backend() == "tensorflow"
    assert len(default_traces) == (2 if tensorflow else 1)
    assert len(traces) == 1
    assert int(model.optimizer.iterations) == 2
    for ours, theirs in zip(model.weights, keras_default.weights):
        assert ours.path == theirs.path
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-6, err_msg=ours.path)
    moments = {v.path for v in model.optimizer.variables}
    assert len(moments) == len(keras_default.optimizer.variables)


def test_build_optimizer_builds_an_unbuilt_model_from_a_dict_of_arrays_first():
    """ExLMPretrainer builds its head and transition from the inputs' length:
    built inside the first trace, they made TensorFlow trace its large step
    twice (the one trace: tests/models/test_exlm_pretrainer.py)."""
    from tests.models.exlm_testing import make_pretrainer
    from tests.models.exlm_testing import rotary2d_backbone

    model = make_pretrainer(rotary2d_backbone())
    model.compile(optimizer="sgd")
    ones = np.ones((3, 8), "int32")
    keras_masking.utils.build_optimizer(model, {"token_ids": ones, "padding_mask": ones})
    tensorflow = keras.config.backend() == "tensorflow"
    assert model.built == tensorflow == model.optimizer.built
    if tensorflow:  # the batch left open, as in the traced step
        shapes = model.get_build_config()["input_shape"]
        assert shapes == {"token_ids": (None, 8), "padding_mask": (None, 8)}
        assert len(model.optimizer.variables) > 1


def test_your_own_model_with_named_outputs_is_built_from_its_labels_and_traced_once():
    inputs = keras.Input((3,), name="x")
    outputs = {
        "a": keras.layers.Dense(2, name="a")(inputs),
        "b": keras.layers.Dense(1, name="b")(inputs),
    }
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer="sgd",
        loss={"a": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "b": "mse"},
        metrics={"a": ["accuracy"]},
    )
    x, y = {"x": np.ones((4, 3), "float32")}, {"a": np.array([0, 1, 1, 0]), "b": np.ones((4, 1))}
    keras_masking.utils.build_optimizer(model, x, y)
    assert model.optimizer.built == (keras.config.backend() == "tensorflow")
    traces = count_train_step_traces(model)
    model.fit(x, y, batch_size=4, verbose=0)
    assert len(traces) == 1


def test_build_optimizer_leaves_an_unbuilt_model_and_a_built_optimizer_alone():
    model, _ = _classifier()
    model.optimizer.build(model.trainable_variables)
    built = [v.path for v in model.optimizer.variables]
    keras_masking.utils.build_optimizer(model)
    assert [v.path for v in model.optimizer.variables] == built
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    unbuilt.compile(optimizer="adam", loss="mse")
    keras_masking.utils.build_optimizer(unbuilt)

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, inputs):
            return self.dense(inputs["x"])

    subclassed = Subclassed()
    subclassed.compile(optimizer="adam", loss="mse")
    # Keras' default `build` would mark it built without weights: left alone.
    keras_masking.utils.build_optimizer(subclassed, {"x": np.ones((2, 3))})
    # Data that does not describe the step (strings for a preprocessor; a
    # subclassed model has no `input` to read instead): left alone, no error.
    subclassed.preprocessor = lambda texts: texts
    keras_masking.utils.build_optimizer(subclassed, {"x": np.array(["a", "b"])}, np.ones(2))
    keras_masking.utils.build_optimizer(subclassed, ["a", "b"], np.ones(2))
    assert not subclassed.built and not subclassed.optimizer.built
    keras_masking.utils.build_optimizer(keras.Sequential())  # no optimizer: nothing to do


class TwinDense(keras.Model):
    """Two Dense layers of one name: both kernels get the path ``.../dense/kernel``."""

    def __init__(self):
        super().__init__()
        self.first = keras.layers.Dense(3, name="dense")
        self.second = keras.layers.Dense(2, name="dense")

    def call(self, inputs):
        return self.second(self.first(inputs))


def _twin_dense_model():
    model = TwinDense()
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")  # XLA on JAX, as a user has
    model.fit(np.ones((4, 4)), np.zeros((4, 2)), verbose=0)
    return model, model.first, model.second


def test_refresh_training_starts_afresh_the_slots_it_cannot_tell_apart(caplog):
    model, first, second = _twin_dense_model()
    assert first.kernel.path == second.kernel.path
    with caplog.at_level("WARNING", logger="keras_masking"):
        keras_masking.utils.refresh_training(model)
    assert "start again from zero" in caplog.text and first.kernel.path in caplog.text
    # Each kernel's slots are zero: none took the other kernel's moments.
    slots = [v for v in model.optimizer.variables if "dense_kernel" in v.path]
    assert len(slots) == 4 and not any(np.any(v.numpy()) for v in slots)


def test_restart_loaded_lora_gives_a_trainable_start_with_the_same_outputs():
    inputs = keras.Input((4,))
    dense = keras.layers.Dense(3)
    model = keras.Model(inputs, dense(inputs))
    dense.enable_lora(2)
    assert keras_masking.utils.restart_loaded_lora(model) == 0  # A is random, B zero: alive
    before = np.array(dense.lora_kernel_a.numpy())
    x = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    expected = np.asarray(model(x))
    dense.lora_kernel_a.assign(np.zeros_like(before))  # as Keras loads a LoRA layer
    assert keras_masking.utils.restart_loaded_lora(model) == 1
    assert np.any(dense.lora_kernel_a.numpy()) and not np.any(dense.lora_kernel_b.numpy())
    np.testing.assert_allclose(np.asarray(model(x)), expected, atol=1e-6)


def test_refresh_training_carries_the_moments_of_a_loss_scale_optimizer():
    # Keras builds a LossScaleOptimizer's inner optimizer in its own scope
    # ("loss_scale_optimizer/adam_w/..."); the rebuilt one names its slots
    # "adam_w/...": the same slots, found by their place under the optimizer.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW(1e-2))
    model.compile(optimizer=optimizer, loss="mse")
    x, y = np.random.default_rng(0).normal(size=(8, 4)), np.zeros((8, 2))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)

    def head_slots(optimizer):
        return {
            v.path.rsplit("/", 1)[-1]: keras.ops.convert_to_numpy(v)
            for v in optimizer.variables
            if "head_kernel" in v.path
        }

    before = head_slots(model.optimizer)
    assert len(before) == 2 and all(np.abs(value).sum() > 0 for value in before.values())
    model.get_layer("hidden").trainable = False
    keras_masking.utils.refresh_training(model)
    after = head_slots(model.optimizer)
    assert after.keys() == before.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)
    assert int(model.optimizer.iterations) == 2


@pytest.mark.parametrize("loss_scale", [False, True])
def test_refresh_training_starts_a_new_variables_moving_average_at_its_value(loss_scale):
    """With ``use_ema``, a variable that trains only after the refresh had its
    average start at zero under the carried step count, and the fit's end
    wrote that average into it: 1 - 0.99**2, 2% of its value, after two steps."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, name="hidden")
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden(inputs)))
    hidden.trainable = False
    optimizer = keras.optimizers.Adam(1e-6, use_ema=True, ema_momentum=0.99)
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = np.random.default_rng(0).normal(size=(8, 4)), np.zeros((8, 2))
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    hidden.trainable = True
    keras_masking.utils.refresh_training(model)
    before = keras.ops.convert_to_numpy(hidden.kernel)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(hidden.kernel), before, atol=1e-4)


def _fresh_classifier():
    keras.utils.set_random_seed(0)
    backbone = keras_masking.models.TransformerBackbone(**tiny_backbone_kwargs(num_layers=1))
    return keras_masking.models.TransformerTextClassifier(backbone, num_classes=2, dropout=0.0)


def test_freezing_after_predict_trains_what_stays_trainable():
    """`predict` built the optimizer on JAX (to keep its values on an error):
    a backbone frozen after it made the next `fit` fail on the optimizer's
    variable count."""
    model = _fresh_classifier()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    features, labels = random_features(), np.array([0, 1])
    model.predict(features, verbose=0)
    assert not model.optimizer.built
    model.backbone.trainable = False
    frozen = [np.array(weight) for weight in model.backbone.get_weights()]
    model.fit(features, labels, verbose=0)
    for before, after in zip(frozen, model.backbone.get_weights()):
        np.testing.assert_array_equal(before, after)
    assert len(model.trainable_weights) == 2  # the head's kernel and bias


@pytest.mark.parametrize("entry", ("predict", "evaluate"))
def test_an_error_in_a_later_batch_leaves_the_model_its_weights(entry):
    """An error in the second batch: on JAX the first step had consumed the
    values kept before the call ("Buffer has been deleted or donated"), and
    `evaluate`'s metrics, created inside the call, stayed empty."""
    import tensorflow as tf

    model = _fresh_classifier()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    good, labels = random_features(batch=4, length=8), np.array([0, 1, 1, 0])
    bad = random_features(batch=4, length=12)
    bad["padding_mask"] = bad["padding_mask"][:, :10]
    expected = model.predict(good, verbose=0)

    def batches():
        for features in (good, bad):
            yield (features, labels) if entry == "evaluate" else (features,)

    spec = {name: tf.TensorSpec((None, None), tf.int32) for name in good}
    signature = (spec, tf.TensorSpec((None,), tf.int64)) if entry == "evaluate" else (spec,)
    data = tf.data.Dataset.from_generator(batches, output_signature=signature)
    jax = keras.config.backend() == "jax"  # TensorFlow fails as the retraced step runs
    with pytest.raises(ValueError if jax else Exception, match="padding_mask" if jax else None):
        getattr(model, entry)(data, verbose=0)
    np.testing.assert_array_equal(model.predict(good, verbose=0), expected)
    loss = model.evaluate(good, labels, verbose=0, return_dict=True)
    model.fit(good, labels, verbose=0)  # and it trains on
    assert np.isfinite(loss["loss"]) and 0.0 <= loss["sparse_categorical_accuracy"] <= 1.0


def test_an_error_after_train_on_batch_keeps_the_weights_set_since():
    """Keras' JAX `train_on_batch` leaves its last state on the model: after a
    failed call the restore synced it back, over the weights set since."""
    import tensorflow as tf

    model = _fresh_classifier()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    good, labels = random_features(batch=4, length=8), np.array([0, 1, 1, 0])
    initial = model.get_weights()
    model.train_on_batch(good, labels)
    model.set_weights(initial)
    bad = random_features(batch=4, length=12)
    bad["padding_mask"] = bad["padding_mask"][:, :10]
    spec = {name: tf.TensorSpec((None, None), tf.int32) for name in good}
    for entry in ("predict", "evaluate", "fit"):
        labelled = entry != "predict"
        signature = (spec, tf.TensorSpec((None,), tf.int64)) if labelled else (spec,)
        data = tf.data.Dataset.from_generator(
            lambda: iter([(bad, labels) if labelled else (bad,)]), output_signature=signature
        )
        with pytest.raises(Exception):
            getattr(model, entry)(data, verbose=0)
        for before, after in zip(initial, model.get_weights()):
            np.testing.assert_array_equal(before, after, err_msg=entry)
