"""The package's keras-hub task models shuffle in-memory data in `fit`, as Keras does.

keras-hub's task models batched arrays and raw texts in their order and
ignored ``shuffle=True`` (Keras' default) with a warning: every epoch saw the
same batches, one class per batch for data sorted by label.
"""

import keras
import numpy as np
import pytest

from keras_masking.data import bert_tokenizer
from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerMaskedLM
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor
from keras_masking.models.shuffled_array_fit import is_in_memory_data
from keras_masking.models.shuffled_array_fit import shuffled_batches
from tests.testing import tiny_backbone_kwargs

COUNT = 8


class _Recorder:
    """Records each step's labels and weights (eager steps: `run_eagerly=True`)."""

    def __init__(self, model):
        self.train, self.test = [], []
        train_step, test_step = model.train_step, model.test_step

        def record(steps, step):
            def recorded(*args):
                _, y, weight = keras.utils.unpack_x_y_sample_weight(args[-1])
                weight = None if weight is None else np.asarray(weight).tolist()
                steps.append((np.asarray(y).tolist(), weight))
                return step(*args)

            return recorded

        model.train_step = record(self.train, train_step)
        model.test_step = record(self.test, test_step)


def _features(count=COUNT):
    ids = np.full((count, 6), 7, "int32")
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}


def _classifier(preprocessor=None, seed=0):
    keras.utils.set_random_seed(seed)
    backbone = TransformerBackbone(**tiny_backbone_kwargs(num_layers=1))
    model = TransformerTextClassifier(
        backbone, num_classes=COUNT, preprocessor=preprocessor, dropout=0.0
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), run_eagerly=True)
    return model, _Recorder(model)


def _epochs(steps, per_epoch):
    labels = [label for batch, _ in steps for label in batch]
    return [labels[i : i + per_epoch] for i in range(0, len(labels), per_epoch)]


def test_each_epoch_sees_every_example_once_in_a_new_order():
    model, recorder = _classifier()
    labels = np.arange(COUNT)  # sorted, as a file sorted by label
    model.fit(_features(), labels, sample_weight=labels + 10.0, batch_size=2, epochs=3, verbose=0)
    epochs = _epochs(recorder.train, COUNT)
    assert len(epochs) == 3 and all(sorted(epoch) == list(range(COUNT)) for epoch in epochs)
    assert all(len(batch) == 2 for batch, _ in recorder.train)
    assert len({tuple(epoch) for epoch in epochs} | {tuple(range(COUNT))}) == 4  # none in order
    # Each weight stays with its example.
    assert all(weight == [label + 10.0 for label in batch] for batch, weight in recorder.train)


def test_a_seeded_fit_repeats_its_order_and_shuffle_false_keeps_it():
    orders = []
    for _ in range(2):
        model, recorder = _classifier(seed=3)
        model.fit(_features(), np.arange(COUNT), batch_size=4, epochs=2, verbose=0)
        orders.append(_epochs(recorder.train, COUNT))
    assert orders[0] == orders[1]
    model, recorder = _classifier()
    model.fit(_features(), np.arange(COUNT), batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert _epochs(recorder.train, COUNT) == [list(range(COUNT))] * 2


def test_validation_split_holds_out_the_last_examples_before_shuffling():
    model, recorder = _classifier()
    history = model.fit(
        _features(10), np.arange(10) % COUNT, batch_size=3, validation_split=0.2, verbose=0
    )
    assert sorted(_epochs(recorder.train, 8)[0]) == list(range(8))
    assert [batch for batch, _ in recorder.test] == [[0, 1]]  # examples 8 and 9
    held_out = {name: value[8:] for name, value in _features(10).items()}
    expected = model.evaluate(held_out, np.array([0, 1]), verbose=0, return_dict=True)["loss"]
    assert history.history["val_loss"][0] == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="validation_split=0.95 of 10 examples"):
        model.fit(_features(10), np.arange(10) % COUNT, validation_split=0.95, verbose=0)


def test_validation_data_in_memory_is_batched_by_the_batch_size():
    model, recorder = _classifier()
    model.fit(
        _features(),
        np.arange(COUNT),
        batch_size=3,
        validation_data=(_features(5), np.arange(5)),
        validation_split=0.5,  # ignored beside validation_data, as in Keras
        verbose=0,
    )
    assert sorted(_epochs(recorder.train, COUNT)[0]) == list(range(COUNT))
    assert [batch for batch, _ in recorder.test] == [[0, 1, 2], [3, 4]]


def test_raw_text_pairs_are_shuffled_with_their_labels(tmp_path):
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"零一二三四五六七甲乙"]
    vocabulary += [f"[unused{i}]" for i in range(len(vocabulary), 64)]  # the backbone's size
    (tmp_path / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(tmp_path / "vocab.txt"), sequence_length=6
    )
    model, recorder = _classifier(preprocessor)
    texts = list("零一二三四五六七")
    seen = []
    original = model.train_step

    def train_step(*args):  # the ids say which text each label came with
        x, y, _ = keras.utils.unpack_x_y_sample_weight(args[-1])
        seen.extend(zip(np.asarray(x["token_ids"])[:, 1].tolist(), np.asarray(y).tolist()))
        return original(*args)

    model.train_step = train_step
    model.fit((texts, ["甲"] * COUNT), np.arange(COUNT), batch_size=2, epochs=2, verbose=0)
    assert all(token == vocabulary.index(texts[label]) for token, label in seen)
    epochs = _epochs(recorder.train, COUNT)
    assert sorted(epochs[0]) == list(range(COUNT)) and epochs[0] != list(range(COUNT))


def test_a_masked_lm_shuffles_too():
    keras.utils.set_random_seed(0)
    masked_lm = TransformerMaskedLM(TransformerBackbone(**tiny_backbone_kwargs(num_layers=1)))
    masked_lm.compile(optimizer=keras.optimizers.SGD(0.0), run_eagerly=True)
    recorder = _Recorder(masked_lm)
    inputs = {**_features(), "mask_positions": np.ones((COUNT, 1), "int32")}
    masked_lm.fit(inputs, np.arange(COUNT)[:, None], batch_size=2, epochs=2, verbose=0)
    labels = [[row[0] for row in batch] for batch, _ in recorder.train]
    epochs = [sum(labels[i : i + 4], []) for i in (0, 4)]
    assert all(sorted(epoch) == list(range(COUNT)) for epoch in epochs)
    assert list(range(COUNT)) not in epochs


def test_what_counts_as_in_memory_data():
    import tensorflow as tf

    assert is_in_memory_data(np.zeros(3)) and is_in_memory_data(["a", "b"])
    assert is_in_memory_data((["a"], ["b"])) and is_in_memory_data({"x": np.zeros(2), "y": None})
    assert is_in_memory_data(keras.ops.zeros((2, 3)))
    for data in (None, {}, tf.data.Dataset.range(3), iter([1]), (np.zeros(2), iter([1]))):
        assert not is_in_memory_data(data)
    train, validation = shuffled_batches(np.arange(5), validation_split=0.4, batch_size=2)
    assert [batch.numpy().tolist() for batch in validation] == [[3, 4]]
    assert sorted(int(value) for batch in train for value in batch.numpy()) == [0, 1, 2]


def test_validation_batches_follow_validation_batch_size_and_a_list_is_in_memory_data():
    """`validation_batch_size` was ignored and a list `[x, y]` was batched by
    32: with `validation_steps`, `val_loss` read other examples than Keras'."""
    model, recorder = _classifier()
    model.fit(
        _features(),
        np.arange(COUNT),
        batch_size=3,
        validation_data=[_features(5), np.arange(5)],
        validation_batch_size=2,
        verbose=0,
    )
    assert [batch for batch, _ in recorder.test] == [[0, 1], [2, 3], [4]]
    model, recorder = _classifier()
    model.fit(_features(10), np.arange(10) % COUNT, batch_size=4, validation_split=0.3,
              validation_batch_size=2, verbose=0)  # fmt: skip
    assert [batch for batch, _ in recorder.test] == [[7 % COUNT, 0], [1]]  # examples 7, 8, 9


def test_shuffle_batch_reorders_within_each_batch_only():
    model, recorder = _classifier()
    model.fit(_features(), np.arange(COUNT), batch_size=4, epochs=4, shuffle="batch", verbose=0)
    batches = [batch for batch, _ in recorder.train]
    assert [sorted(batch) for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 4
    assert any(batch != sorted(batch) for batch in batches)


def test_data_without_a_batch_dimension_is_refused_by_name():
    model, _ = _classifier()
    with pytest.raises(ValueError, match="batch dimension.*fit\\(x, y, batch_size, sample_weight"):
        model.fit(_features(), np.arange(COUNT), 4, 2.0, verbose=0)  # 2.0 read as sample_weight


@pytest.mark.parametrize("y", (None, np.arange(4)), ids=("no_labels", "labels"))
@pytest.mark.parametrize(
    "x",
    (
        (np.array(list("abcd")), np.array(list("efgh"))),  # a text pair
        np.array(list("abcd")),
        {"token_ids": np.arange(4)},
    ),
    ids=("pair", "texts", "dict"),
)
def test_shuffle_batch_keeps_the_structure_of_each_element(x, y):
    """``shuffle="batch"`` unpacked a text pair given without labels, ``((a, b),)``,
    into ``(a, b)``: the model's preprocessor read the second texts as labels
    (a masked LM trained on the first segment only)."""
    shuffled, _ = shuffled_batches(x, y, batch_size=4, shuffle=True)
    within, _ = shuffled_batches(x, y, batch_size=4, shuffle="batch")
    assert within.element_spec == shuffled.element_spec
    (batch,) = list(within.as_numpy_iterator())
    if isinstance(x, tuple):  # each pair stays together
        first, second = batch[0]
        assert [list("abcd").index(a.decode()) for a in first] == [
            list("efgh").index(b.decode()) for b in second
        ]


@pytest.mark.parametrize("shuffle", (True, False))
def test_a_class_weight_that_leaves_out_a_class_weighs_it_one_as_keras_does(shuffle):
    """A class above ``class_weight``'s keys failed in `tf.data`'s class-weight
    map ("indices[1] = 2 is not in [0, 2)"); Keras weighs arrays' left-out
    classes 1.0. The held-out examples get no class weight, as in Keras."""
    model, recorder = _classifier()
    labels = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 2])
    class_weight = {0: 3.0, 1: 2.0}
    history = model.fit(
        _features(10),
        labels,
        batch_size=8,
        class_weight=class_weight,
        validation_split=0.2,
        shuffle=shuffle,
        verbose=0,
    )
    ((batch, weights),) = recorder.train
    assert sorted(batch) == sorted(labels[:8].tolist())
    assert weights == [class_weight.get(label, 1.0) for label in batch]
    assert [weight for _, weight in recorder.test] == [None]
    logits = model.predict(_features(10), verbose=0).astype("float64")
    shifted = logits - logits.max(-1, keepdims=True)
    cross_entropy = np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(10), labels]
    expected = np.array([class_weight.get(label, 1.0) for label in labels[:8]])
    assert history.history["loss"][0] == pytest.approx(
        np.mean(expected * cross_entropy[:8]), rel=1e-5
    )
    assert history.history["val_loss"][0] == pytest.approx(np.mean(cross_entropy[8:]), rel=1e-5)
    with pytest.raises(ValueError, match="class_weight and sample_weight"):
        model.fit(
            _features(), np.arange(COUNT), sample_weight=np.ones(COUNT), class_weight=class_weight
        )
