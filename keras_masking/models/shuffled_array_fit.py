"""ShuffledArrayFit: a keras-hub task model's ``fit`` on in-memory data shuffles, as Keras' does."""

import math
from collections.abc import Mapping

import keras
import numpy as np


def is_in_memory_data(x):
    """Whether ``x`` is data `keras.Model.fit` shuffles: arrays, tensors, lists
    (texts, ids) and tuples or dicts of them; not a dataset, generator or
    `keras.utils.PyDataset`.

    Example:
    >>> is_in_memory_data({"token_ids": np.zeros((2, 4))}), is_in_memory_data(iter([]))
    (True, False)
    """
    if isinstance(x, (Mapping, tuple)):
        return bool(x) and all(
            value is None or is_in_memory_data(value)
            for value in (x.values() if isinstance(x, Mapping) else x)
        )
    return isinstance(x, (list, np.ndarray)) or (
        hasattr(x, "__array__") and hasattr(x, "shape")  # tf, JAX tensors
    )


def shuffled_batches(
    x,
    y=None,
    sample_weight=None,
    batch_size=None,
    validation_split=None,
    shuffle=True,
    validation_batch_size=None,
    class_weight=None,
):
    """``(train, validation)`` `tf.data` pipelines of in-memory data: the
    training examples shuffled anew every epoch, then batched.

    As `keras.Model.fit` does: ``validation_split`` takes the last examples,
    before any shuffling (``validation`` is None without it); ``batch_size``
    defaults to 32; ``shuffle="batch"`` shuffles within each batch only,
    ``shuffle=False`` not at all; ``class_weight`` weighs each training
    example by its class (1.0 for a class it leaves out; one-hot labels by
    their largest entry). The shuffle follows TensorFlow's global seed, which
    `keras.utils.set_random_seed` sets, so a seeded run repeats its order.

    Args:
        x: inputs: arrays, lists (raw texts), tuples (text pairs) or dicts.
        y: optional labels, one per example.
        sample_weight: optional weights, one per example.
        batch_size: optional int, examples per batch.
        validation_split: optional float in (0, 1): the share held out.
        shuffle: True (every example), ``"batch"`` (within each batch) or
            False.
        validation_batch_size: optional int for the held-out batches
            (default ``batch_size``).
        class_weight: optional dict from class id to weight (not with
            ``sample_weight``).

    Returns:
        ``(train, validation)``: batched `tf.data.Dataset` of
        ``(x, y, sample_weight)`` as `keras.utils.pack_x_y_sample_weight`
        packs them, and the held-out examples batched alike, or None.

    Raises:
        ValueError: a ``validation_split`` that leaves no training or no
            validation example; data without a batch dimension;
            ``class_weight`` with ``sample_weight`` or without ``y``.

    Example:
    ```python
    train, _ = shuffled_batches(np.arange(6), np.arange(6), batch_size=2)
    [batch[1].numpy().tolist() for batch in train]  # e.g. [[4, 0], [3, 5], [1, 2]]
    ```
    """
    examples = _examples(x, y, sample_weight)
    count = int(examples.cardinality())
    batch_size = batch_size or 32
    validation = None
    if validation_split:
        kept = int(math.floor(count * (1.0 - validation_split)))
        if kept in (0, count):
            raise ValueError(
                f"Expected validation_split to leave training and validation examples. "
                f"Received: validation_split={validation_split} of {count} examples."
            )
        validation = examples.skip(kept).batch(validation_batch_size or batch_size)
    if class_weight is not None:  # the training examples only, as Keras weighs them
        examples = _examples(x, y, _class_weighted(y, sample_weight, class_weight))
    if validation_split:
        examples, count = examples.take(kept), kept
    if not shuffle:
        return examples.batch(batch_size), validation
    if shuffle == "batch":
        batches = examples.batch(batch_size)
        # `map` passes a tuple's items as arguments: the structure is given back as it came.
        unpacked = isinstance(batches.element_spec, tuple)
        return batches.map(
            lambda *batch: _shuffled_within_batch(batch if unpacked else batch[0])
        ), validation
    return examples.shuffle(count, reshuffle_each_iteration=True).batch(batch_size), validation


def _shuffled_within_batch(batch):
    """One batch's examples in a new order (``shuffle="batch"``), in the
    batch's own structure (``(x,)`` stays a 1-tuple: a text pair ``x`` is not
    read as ``(x, y)``)."""
    import tensorflow as tf

    order = tf.random.shuffle(tf.range(tf.shape(tf.nest.flatten(batch)[0])[0]))
    return tf.nest.map_structure(lambda tensor: tf.gather(tensor, order), batch)


def _class_weighted(y, sample_weight, class_weight):
    """Each example's weight from ``class_weight``, as `keras.Model.fit` weighs
    arrays (`tf.data`'s class-weight map fails on a class above its keys)."""
    if sample_weight is not None:
        raise ValueError("You cannot pass class_weight and sample_weight at the same time.")
    if y is None or not isinstance(class_weight, Mapping):
        raise ValueError(
            "Expected class_weight, a dict from class id to weight, with labels y. "
            f"Received: class_weight={class_weight!r}, y={'None' if y is None else 'given'}."
        )
    labels = np.asarray(y if isinstance(y, (list, np.ndarray)) else keras.ops.convert_to_numpy(y))
    if labels.ndim > 1:
        labels = labels.argmax(-1) if labels.shape[-1] != 1 else labels[..., 0]
    labels = np.round(labels).astype("int64")
    return np.array(
        [class_weight.get(int(label), 1.0) for label in labels], dtype=keras.config.floatx()
    )


def _examples(x, y=None, sample_weight=None):
    """In-memory data as a `tf.data.Dataset` of single examples, packed as
    `keras.utils.pack_x_y_sample_weight` packs them."""
    import tensorflow as tf

    packed = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
    try:
        return tf.data.Dataset.from_tensor_slices(_numpy_leaves(packed))
    except ValueError as error:
        if "rank >= 1" not in str(error):
            raise
        raise ValueError(
            "Expected x, y and sample_weight with a batch dimension (one entry per "
            "example). Received: a single value (rank 0); note that keras-hub's task "
            "models take fit(x, y, batch_size, sample_weight, ...) by position."
        ) from None


def _numpy_leaves(data):
    """``data`` with any backend's tensors as numpy; a list stays a list
    (`tf.data` reads it as one tensor: a list of texts is one string tensor)."""
    if isinstance(data, Mapping):
        return {name: _numpy_leaves(value) for name, value in data.items()}
    if isinstance(data, tuple):
        return tuple(_numpy_leaves(value) for value in data)
    if isinstance(data, (list, np.ndarray)):
        return data
    return keras.ops.convert_to_numpy(data)


class ShuffledArrayFit:
    """Mixin for keras-hub task models: ``fit`` shuffles in-memory data every epoch.

    `keras.Model.fit` shuffles arrays every epoch (``shuffle=True``, its
    default). keras-hub's task models batch arrays and raw texts in their
    order and ignore ``shuffle`` (with a warning only), so every epoch saw the
    same batches in the same order: data sorted by label trained on batches
    of one class. With this mixin, ``fit`` on arrays, lists of texts, text
    pairs or dicts of them shuffles as Keras does (`shuffled_batches`;
    ``shuffle="batch"`` within each batch; in-memory validation data batched
    by ``validation_batch_size``, else ``batch_size``; ``class_weight``
    gives a class it leaves out the weight 1.0); ``shuffle=False`` keeps
    the order; a `tf.data.Dataset`, generator or `keras.utils.PyDataset` is
    fed as given (shuffle it yourself; ``class_weight`` then follows Keras'
    rule for datasets, where a class id above its largest key is an error).

    Example:
    ```python
    classifier.fit(features, labels, batch_size=2, epochs=2)  # two orders
    ```
    """

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        sample_weight=None,
        validation_data=None,
        validation_split=None,
        **kwargs,
    ):
        shuffle = kwargs.get("shuffle", True)
        if is_in_memory_data(x):
            if validation_data is not None:
                validation_split = None  # Keras ignores the split then
            in_memory = isinstance(validation_data, (tuple, list)) and is_in_memory_data(
                tuple(validation_data)
            )
            validation_batch_size = batch_size
            if validation_split or in_memory:
                validation_batch_size = kwargs.pop("validation_batch_size", None) or batch_size
            x, held_out = shuffled_batches(
                x,
                y,
                sample_weight,
                batch_size,
                validation_split,
                shuffle,
                validation_batch_size,
                kwargs.pop("class_weight", None),
            )
            if validation_split:
                validation_data = held_out
            elif in_memory:  # batched here: keras-hub would batch it by 32
                validation_data = _examples(
                    *keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
                ).batch(validation_batch_size or 32)
            y = sample_weight = batch_size = validation_split = None
            kwargs["shuffle"] = False  # the pipeline shuffles (or keeps the order)
        return super().fit(
            x,
            y,
            batch_size=batch_size,
            sample_weight=sample_weight,
            validation_data=validation_data,
            validation_split=validation_split,
            **kwargs,
        )
