"""Batches of encoded arrays in a seeded order, for `fit` on any backend."""

import math

import keras
import numpy as np


def epoch_order(size, seed, epoch):
    """The example order of one epoch: a permutation fixed by (seed, epoch), so a
    resumed run draws the same order as an uninterrupted one.

    Args:
        size: the number of rows.
        seed: the run's seed.
        epoch: the epoch index (from 0).

    Returns:
        An int64 permutation of ``range(size)``.

    Example:
    >>> bool((epoch_order(5, seed=0, epoch=1) == epoch_order(5, seed=0, epoch=1)).all())
    True
    """
    return np.random.default_rng([int(seed), int(epoch)]).permutation(size)


class ArrayBatches(keras.utils.PyDataset):
    """Serves ``(features, labels)`` batches of numpy arrays in a given order.

    Every batch has ``batch_size`` rows, so a compiled step traces once: the
    last batch is completed with the first rows of the order.

    Args:
        features: dict of numpy arrays with the same first dimension.
        labels: numpy array (or None) with that first dimension.
        batch_size: int >= 1.
        order: optional permutation of the rows (default: as stored).

    Example:
    >>> order = np.array([4, 3, 2, 1, 0])
    >>> batches = ArrayBatches({"x": np.arange(5)}, np.arange(5), 2, order=order)
    >>> len(batches), batches[0][0]["x"].tolist(), batches[2][1].tolist()
    (3, [4, 3], [0, 4])
    """

    def __init__(self, features, labels, batch_size, order=None):
        super().__init__()
        self.features = features
        self.labels = labels
        self.batch_size = int(batch_size)
        size = len(next(iter(features.values())))
        order = np.arange(size) if order is None else np.asarray(order)
        missing = -len(order) % self.batch_size
        self.order = np.concatenate([order, np.resize(order, missing)]) if missing else order

    def __len__(self):
        return math.ceil(len(self.order) / self.batch_size)

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size : (index + 1) * self.batch_size]
        features = {name: value[rows] for name, value in self.features.items()}
        return (features,) if self.labels is None else (features, self.labels[rows])


def predict_in_batches(model, features, batch_size):
    """Yields ``model``'s outputs batch by batch, every batch full.

    Full batches let the compiled call trace once (the last one is padded
    with copies of the first row, whose outputs are cut off).

    Args:
        model: a compiled Keras model.
        features: dict of numpy arrays with the same first dimension.
        batch_size: int >= 1.

    Yields:
        numpy outputs of consecutive rows.

    Example:
    >>> inputs = keras.Input((3,), name="x")
    >>> model = keras.Model({"x": inputs}, keras.layers.Dense(2)(inputs))
    >>> outputs = predict_in_batches(model, {"x": np.ones((5, 3), "float32")}, batch_size=2)
    >>> [chunk.shape for chunk in outputs]
    [(2, 2), (2, 2), (1, 2)]
    """
    size = len(next(iter(features.values())))
    for start in range(0, size, batch_size):
        batch = {name: value[start : start + batch_size] for name, value in features.items()}
        rows = len(next(iter(batch.values())))
        if rows < batch_size:
            batch = {
                name: np.concatenate([value, np.repeat(value[:1], batch_size - rows, axis=0)])
                for name, value in batch.items()
            }
        outputs = model.predict_on_batch(batch)
        yield np.asarray(outputs)[:rows]
