"""keras_masking.optimizers.AdamW: the exact Adam update of repeated embedding rows."""

import keras
import numpy as np
import pytest

import keras_masking
from keras_masking.optimizers import AdamW
from keras_masking.optimizers import densify_gradients

# A batch where id 2 appears three times and id 5 twice.
IDS = np.array([[2, 2, 5], [2, 5, 1]], "int32")
TARGETS = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,), dtype="int32")
    outputs = keras.layers.Embedding(8, 4, name="table")(inputs)
    return keras.Model(inputs, outputs)


def _numpy_adamw(table, steps, lr, weight_decay, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Adam(W) on the mean squared error, with the dense gradient of the lookup."""
    table = table.astype("float64")
    m, v = np.zeros_like(table), np.zeros_like(table)
    for t in range(1, steps + 1):
        out = table[IDS]
        grad_out = 2.0 * (out - TARGETS) / out.size
        grad = np.zeros_like(table)
        np.add.at(grad, IDS, grad_out)  # duplicates summed
        table = table - lr * weight_decay * table
        m = beta_1 * m + (1 - beta_1) * grad
        v = beta_2 * v + (1 - beta_2) * grad**2
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        table = table - alpha * m / (np.sqrt(v) + epsilon)
    return table


@pytest.mark.parametrize("steps", [1, 3])
def test_adamw_matches_a_numpy_adamw_with_repeated_ids(steps):
    model = _model()
    start = np.array(model.get_layer("table").embeddings.numpy())
    model.compile(optimizer=AdamW(learning_rate=0.05, weight_decay=0.01), loss="mse")
    model.fit(IDS, TARGETS, batch_size=2, epochs=steps, shuffle=False, verbose=0)
    expected = _numpy_adamw(start, steps, 0.05, 0.01)
    actual = model.get_layer("table").embeddings.numpy()
    # Rows 2 and 5 are the repeated ones; 1 once; the others never looked up
    # (weight decay only).
    np.testing.assert_allclose(actual, expected, atol=2e-6)
    assert np.abs(actual[[2, 5]] - start[[2, 5]]).max() > 0.01


def test_densify_gradients_sums_duplicate_rows_on_tensorflow():
    if keras.config.backend() != "tensorflow":
        grads = [np.ones((2, 2), "float32"), None]
        assert densify_gradients(grads)[0] is grads[0] and densify_gradients(grads)[1] is None
        return
    import tensorflow as tf

    sparse = tf.IndexedSlices(
        tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
        tf.constant([1, 1, 0]),
        dense_shape=tf.constant([3, 2]),
    )
    dense = densify_gradients([sparse, None])
    np.testing.assert_array_equal(dense[0].numpy(), [[5.0, 6.0], [4.0, 6.0], [0.0, 0.0]])
    assert dense[1] is None


def test_adamw_round_trips_through_its_config_and_a_saved_model(tmp_path):
    optimizer = AdamW(learning_rate=0.02, weight_decay=0.03, beta_1=0.8)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(clone) is AdamW
    assert clone.get_config() == optimizer.get_config()
    model = _model()
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(IDS, TARGETS, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.optimizer) is AdamW
    np.testing.assert_array_equal(
        loaded.get_layer("table").embeddings.numpy(), model.get_layer("table").embeddings.numpy()
    )


@pytest.mark.parametrize("model_kind", ["functional", "classifier"])
def test_weight_decay_exclusions_survive_saving_and_loading(model_kind, tmp_path):
    """Keras keeps `exclude_from_weight_decay` outside the optimizer's config: a
    loaded model went on training with decay on every bias and LayerNorm."""
    from keras_masking.models import TransformerBackbone
    from keras_masking.models import TransformerTextClassifier
    from tests.testing import random_features
    from tests.testing import tiny_backbone_kwargs

    keras.utils.set_random_seed(0)
    if model_kind == "classifier":
        backbone = TransformerBackbone(**tiny_backbone_kwargs(dropout=0.0))
        model = TransformerTextClassifier(backbone, num_classes=2, dropout=0.0)
        x, y = random_features(batch=4), np.array([0, 1, 0, 1])
    else:
        inputs = keras.Input((4,))
        model = keras.Model(inputs, keras.layers.Dense(2, bias_initializer="ones")(inputs))
        x, y = np.ones((4, 4), "float32"), np.zeros((4, 2), "float32")
    optimizer = keras_masking.clue.optimization.fine_tuning_optimizer(
        0.01, total_steps=10, warmup_proportion=0.0, weight_decay=0.5
    )
    loss = "mse" if model_kind == "functional" else None
    model.compile(optimizer=optimizer, **({"loss": loss} if loss else {}))
    model.fit(x, y, batch_size=4, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.optimizer.get_config()["exclude_from_weight_decay_names"] == [
        "beta", "bias", "gamma"
    ]  # fmt: skip
    for each in (model, loaded):
        each.fit(x, y, batch_size=4, verbose=0)
    for got, want in zip(loaded.weights, model.weights):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), atol=1e-6
        )


def test_the_fine_tuning_optimizer_is_this_adamw():
    optimizer = keras_masking.clue.optimization.fine_tuning_optimizer(1e-3, total_steps=10)
    assert isinstance(optimizer, AdamW)


# === Keras' own AdamW against ours, under every option ===
def _one_hot_model(table):
    """The lookup as a matmul of one-hot rows: its gradient is dense on every
    backend, so Keras' AdamW updates it exactly (the reference)."""
    inputs = keras.Input((3,), dtype="int32")
    dense = keras.layers.Dense(table.shape[1], use_bias=False, name="table")
    outputs = dense(keras.ops.one_hot(inputs, table.shape[0]))
    model = keras.Model(inputs, outputs)
    dense.kernel.assign(table)
    return model


def _table_after(model, optimizer, steps=3, batch_size=2):
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(IDS, TARGETS, batch_size=batch_size, epochs=steps, shuffle=False, verbose=0)
    layer = model.get_layer("table")
    return (layer.embeddings if hasattr(layer, "embeddings") else layer.kernel).numpy()


OPTIONS = {
    "plain": {},
    "amsgrad": {"amsgrad": True},
    "ema": {"use_ema": True, "ema_momentum": 0.5},
    "accumulation": {"gradient_accumulation_steps": 2},
    "loss_scale_factor": {"loss_scale_factor": 8.0},
    "loss_scale_optimizer": {},
}
#: What Keras' own AdamW does with the embedding's IndexedSlices on
#: TensorFlow: a wrong update of repeated rows, the exact one (gradient
#: accumulation sums them into a dense buffer first), or a TypeError
#: (``loss_scale_factor`` divides the IndexedSlices).
KERAS_ON_TENSORFLOW = {
    "plain": "wrong",
    "amsgrad": "wrong",
    "ema": "wrong",
    "accumulation": "exact",
    "loss_scale_factor": TypeError,
    "loss_scale_optimizer": "wrong",
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_adamw_is_exact_under_every_option_where_keras_adamw_is_not(option):
    """The reference is Keras' AdamW on dense gradients (a one-hot matmul).
    Ours on the embedding's gradients equals it; Keras' own AdamW on the same
    embedding does not on TensorFlow (repeated rows move too far, or it
    fails), and is ours on JAX."""
    start = _model().get_layer("table").embeddings.numpy()

    def make(cls):
        optimizer = cls(learning_rate=0.05, weight_decay=0.01, **OPTIONS[option])
        if option == "loss_scale_optimizer":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=64.0)
        return optimizer

    reference = _table_after(_one_hot_model(start), make(keras.optimizers.AdamW), batch_size=1)
    ours = _table_after(_model(), make(AdamW), batch_size=1)
    np.testing.assert_allclose(ours, reference, atol=2e-6)
    assert np.abs(ours - start).max() > 0.05  # the steps moved the rows
    keras_does = KERAS_ON_TENSORFLOW[option] if keras.config.backend() == "tensorflow" else "exact"
    if keras_does is TypeError:
        with pytest.raises(TypeError, match="IndexedSlices"):
            _table_after(_model(), make(keras.optimizers.AdamW), batch_size=1)
        return
    theirs = _table_after(_model(), make(keras.optimizers.AdamW), batch_size=1)
    gap = np.abs(theirs - reference).max()
    if keras_does == "wrong":
        assert gap > 0.01, gap  # the defect this class fixes shows here
    else:
        assert gap < 2e-6, gap


def test_accumulation_under_loss_scaling_is_refused(restore_policy):
    """Keras' LossScaleOptimizer skips an overflowing micro-batch without counting
    it: every later accumulation group shifts by one batch."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2 cannot run under the"):
        AdamW(1e-3, gradient_accumulation_steps=2)
    AdamW(1e-3)  # no accumulation
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    AdamW(1e-3, gradient_accumulation_steps=2)  # no loss scaling
    # Made before the policy changed: refused when the first fit builds it.
    keras.mixed_precision.set_global_policy("float32")
    optimizer = AdamW(1e-3, gradient_accumulation_steps=2)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    with pytest.raises(ValueError, match="mixed_bfloat16"):
        model.fit(np.ones((4, 3)), np.ones((4, 1)), batch_size=2, verbose=0)


def test_keras_adamw_on_tensorflow_moves_a_row_looked_up_k_times_sqrt_k_too_far():
    """Row 2 looked up k = 4 times with the same gradient: the exact first
    Adam step moves it by the learning rate; Keras' AdamW on TensorFlow
    moves it sqrt(4) = 2 times as far."""
    ids = np.array([[2, 2, 2, 2]], "int32")

    def step(optimizer):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,), dtype="int32")
        model = keras.Model(inputs, keras.layers.Embedding(8, 4, name="table")(inputs))
        start = model.get_layer("table").embeddings.numpy()
        model.compile(optimizer=optimizer, loss=lambda y, p: keras.ops.sum(p))
        model.fit(ids, np.zeros((1, 4, 4), "float32"), verbose=0)
        return np.abs(model.get_layer("table").embeddings.numpy() - start)[2]

    ours = step(AdamW(learning_rate=0.01, weight_decay=0.0))
    theirs = step(keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.0))
    np.testing.assert_allclose(ours, 0.01, rtol=1e-4)
    expected = 0.02 if keras.config.backend() == "tensorflow" else 0.01
    np.testing.assert_allclose(theirs, expected, rtol=1e-4)


# === Arguments ===
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": 0.0}, r"Expected learning_rate in \(0.0, inf\). Received: "),
        ({"learning_rate": -1e-3}, "learning_rate"),
        ({"learning_rate": float("nan")}, "Expected a number for learning_rate"),
        ({"learning_rate": "fast"}, "Expected a number > 0, a LearningRateSchedule"),
        ({"weight_decay": -0.01}, r"Expected weight_decay in \[0.0, inf\)"),
        ({"weight_decay": float("inf")}, "Expected a finite number for weight_decay"),
        ({"beta_1": 1.0}, r"Expected beta_1 in \[0.0, 1.0\). Received: beta_1=1.0"),
        ({"beta_2": 1.5}, r"Expected beta_2 in \[0.0, 1.0\)"),
        ({"epsilon": 0.0}, r"Expected epsilon in \(0.0, inf\). Received: epsilon=0.0"),
        ({"epsilon": -1e-7}, "epsilon"),
        ({"amsgrad": 1}, "Expected True or False for amsgrad"),
        ({"use_ema": "yes"}, "Expected True or False for use_ema"),
        ({"clipnorm": 0.0}, "clipnorm"),
        ({"global_clipnorm": float("inf")}, "Expected a finite number for global_clipnorm"),
        ({"clipvalue": -1.0}, "clipvalue"),
        ({"loss_scale_factor": 0.0}, "loss_scale_factor"),
        ({"ema_momentum": 1.5}, r"Expected ema_momentum in \[0.0, 1.0\]"),
        ({"ema_overwrite_frequency": 0}, "ema_overwrite_frequency"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"gradient_accumulation_steps": 2.5}, "Expected an integer for gradient_accumulation"),
    ],
)
def test_adamw_refuses_arguments_that_cannot_train(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdamW(**kwargs)


def test_adamw_accepts_schedules_numpy_numbers_and_one_accumulation_step():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert AdamW(learning_rate=schedule).learning_rate is not None
    optimizer = AdamW(learning_rate=np.float32(0.5), gradient_accumulation_steps=1)
    assert optimizer.gradient_accumulation_steps is None
    np.testing.assert_allclose(float(optimizer.learning_rate), 0.5)


def test_epsilon_zero_would_make_rows_never_looked_up_nan():
    """Why epsilon > 0: a row no example looked up has a zero (dense)
    gradient, and 0 / (sqrt(0) + 0) is NaN."""
    model = _model()
    optimizer = keras.optimizers.AdamW(learning_rate=0.01, epsilon=0.0)
    table = _table_after(model, optimizer, steps=1)
    looked_up = np.unique(IDS)
    never = np.setdiff1d(np.arange(8), looked_up)
    assert np.isfinite(table[looked_up]).all()
    if keras.config.backend() == "jax":  # dense gradients: NaN where never looked up
        assert np.isnan(table[never]).all()
    with pytest.raises(ValueError, match="epsilon"):
        AdamW(epsilon=0.0)


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="IndexedSlices are TensorFlow's")
def test_an_indexed_slices_row_outside_the_variable_is_refused_clearly():
    import tensorflow as tf

    table = keras.Variable(np.zeros((8, 4), "float32"), name="table")
    optimizer = AdamW(learning_rate=0.1)
    optimizer.build([table])
    shape = tf.constant([8, 4])
    sparse = tf.IndexedSlices(tf.ones((2, 4)), tf.constant([1, 9]), dense_shape=shape)
    expected = (
        r"Expected the rows of the IndexedSlices gradient of table in \[0, 8\)\. "
        r"Received: indices=\[9\]\."
    )
    with pytest.raises(ValueError, match=expected):
        optimizer.apply([sparse], [table])
    negative = tf.IndexedSlices(tf.ones((1, 4)), tf.constant([-1]), dense_shape=shape)
    with pytest.raises(ValueError, match=r"Received: indices=\[-1\]"):
        optimizer.apply([negative], [table])
    np.testing.assert_array_equal(table.numpy(), 0.0)  # nothing changed
    assert int(optimizer.iterations.numpy()) == 0

    @tf.function(autograph=False)  # as Keras' own steps
    def graph_step(grad):
        optimizer.apply([grad], [table])

    with pytest.raises(tf.errors.InvalidArgumentError, match="IndexedSlices gradient of table"):
        graph_step(sparse)
    np.testing.assert_array_equal(table.numpy(), 0.0)


@pytest.mark.parametrize("accumulation", [None, 2, 3])
def test_a_schedule_is_evaluated_at_the_update_count_under_accumulation(accumulation):
    # A constant gradient makes each Adam step equal to the rate (m_hat = g,
    # v_hat = g**2), so the k-th update moves the weight by schedule(k).
    schedule = keras.optimizers.schedules.PolynomialDecay(1.0, decay_steps=4, end_learning_rate=0.0)
    optimizer = AdamW(
        learning_rate=schedule,
        weight_decay=0.0,
        epsilon=1e-12,
        gradient_accumulation_steps=accumulation,
    )
    variable = keras.Variable(np.zeros((1,), "float32"))
    moves, batches = [], accumulation or 1
    for _ in range(4):
        before = float(variable.numpy()[0])
        for _ in range(batches):
            optimizer.apply([keras.ops.ones((1,))], [variable])
        moves.append(before - float(variable.numpy()[0]))
    np.testing.assert_allclose(moves, [1.0, 0.75, 0.5, 0.25], atol=1e-5)


def _alive_train_graphs():
    import gc

    gc.collect()
    return sum(
        1
        for value in gc.get_objects()
        if type(value).__name__ == "FuncGraph" and "one_step_on_data" in value.name
    )


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TensorFlow's graph registry")
def test_a_finished_fit_leaves_no_train_graph_in_memory():
    """Many runs in one process (`compare`) keep memory flat: no fit's traced
    step, with the variables it holds, outlives its model."""
    before = _alive_train_graphs()
    for _ in range(2):
        model = _model()
        model.compile(optimizer=AdamW(1e-2), loss="mse", jit_compile=False)
        model.fit(IDS, TARGETS, verbose=0)
        del model
        keras.backend.clear_session(free_memory=True)
    assert _alive_train_graphs() == before


def test_weight_decay_exclusions_take_a_list_of_names_not_a_string():
    # "bias" as a string was matched character by character: a kernel whose
    # name holds a b, i, a or s lost its weight decay.
    optimizer = AdamW(learning_rate=0.1, weight_decay=0.5)
    with pytest.raises(ValueError, match=r"Expected a list of strings for var_names"):
        optimizer.exclude_from_weight_decay(var_names="bias")
    with pytest.raises(ValueError, match="Expected a list of variables for var_list"):
        optimizer.exclude_from_weight_decay(var_list=keras.Variable(1.0))
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    kernel = keras.Variable(np.ones((2,)), name="kernel_basis")
    bias = keras.Variable(np.ones((2,)), name="bias")
    optimizer.apply([np.zeros(2), np.zeros(2)], [kernel, bias])
    assert np.all(np.asarray(kernel) < 1.0)  # decayed
    np.testing.assert_allclose(np.asarray(bias), 1.0)  # excluded


@pytest.mark.parametrize("second", [{"var_names": ["gamma"]}, {"var_names": []}, {"var_list": []}])
def test_a_second_exclusion_call_replaces_the_first_in_the_config_too(second):
    """Keras replaces the exclusions at each call; the config kept the first
    names, so a loaded optimizer skipped decay the trained one applied."""
    optimizer = AdamW(learning_rate=0.1, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.exclude_from_weight_decay(**second)
    loaded = AdamW.from_config(optimizer.get_config())
    for each in (optimizer, loaded):
        bias = keras.Variable(np.ones((2,)), name="bias")
        gamma = keras.Variable(np.ones((2,)), name="gamma")
        each.apply([np.zeros(2), np.zeros(2)], [bias, gamma])
        decayed = [bool(np.all(np.asarray(v) < 1.0)) for v in (bias, gamma)]
        assert decayed == [True, second.get("var_names") != ["gamma"]]
    assert loaded.get_config()["exclude_from_weight_decay_names"] == (
        second.get("var_names") or None
    )


class _NaNAtStart(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return keras.ops.cast(step, "float32") / keras.ops.cast(step, "float32")  # 0 / 0

    def get_config(self):
        return {}


def test_a_schedule_with_a_nan_rate_is_refused_before_it_turns_the_weights_nan():
    with pytest.raises(ValueError, match="rate at step 0 is nan"):
        AdamW(learning_rate=_NaNAtStart())


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.distribute is TensorFlow's")
def test_what_cannot_run_under_a_tf_distribute_strategy_is_refused_clearly():
    # Keras' accumulation fails there with "merge_call called while defining a new graph".
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        optimizer = AdamW(1e-3, gradient_accumulation_steps=2)
        variable = keras.Variable(np.ones(2, "float32"))
        with pytest.raises(ValueError, match="cannot run under a tf.distribute strategy"):
            optimizer.apply([np.ones(2, "float32")], [variable])
    outside = AdamW(1e-3)  # TensorFlow's "Mixing different tf.distribute.Strategy objects"
    with strategy.scope():
        variable = keras.Variable(np.ones(2, "float32"))
        with pytest.raises(ValueError, match="made outside the tf.distribute strategy"):
            outside.apply([np.ones(2, "float32")], [variable])


def test_the_moving_average_steps_once_per_update_under_accumulation():
    """Keras averages after every micro-batch, though the weights move once per
    update: with 3 micro-batches the momentum was 0.9**3 per update."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = AdamW(1e-1, use_ema=True, ema_momentum=0.9, gradient_accumulation_steps=3)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = np.random.default_rng(0).normal(size=(9, 4)), np.ones((9, 2))
    updates = []
    for batch in range(9):
        model.train_on_batch(x[batch : batch + 1], y[batch : batch + 1])
        if batch % 3 == 2:  # the weights after each of the three updates
            updates.append([keras.ops.convert_to_numpy(v).copy() for v in model.weights])
    assert not np.allclose(updates[1][0], updates[2][0])
    optimizer.finalize_variable_values(model.trainable_variables)  # fit's end: the averages
    for index, variable in enumerate(model.trainable_variables):
        expected = updates[0][index]
        for weights in updates[1:]:
            expected = 0.9 * expected + 0.1 * weights[index]
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), expected, atol=1e-6)


def test_a_moving_average_fit_writes_its_averages_and_fits_again():
    """Keras assigns each average itself to its variable at the end of a fit
    with ``use_ema``; on JAX the next compiled step then donated one buffer
    twice and the second ``fit`` failed."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=AdamW(1e-2, use_ema=True, ema_momentum=0.9), loss="mse")
    x, y = np.random.default_rng(0).normal(size=(8, 4)), np.ones((8, 2))
    for _ in range(2):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        averages = model.optimizer._model_variables_moving_average
        for variable, average in zip(model.trainable_variables, averages):
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(variable), keras.ops.convert_to_numpy(average)
            )
