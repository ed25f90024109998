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


def test_the_fine_tuning_optimizer_is_this_adamw():
    optimizer = keras_masking.clue.optimization.fine_tuning_optimizer(1e-3, total_steps=10)
    assert isinstance(optimizer, AdamW)
