"""`text_shard_dataset` and examples/pretrain_text_shards.py on a tiny corpus.

The dataset is read back in numpy: every line once, each host's files
apart, BERT's masking against the unmasked batches. The example pretrains
a tiny model in-process; an interrupted run, resumed, ends with the weights
of an uninterrupted one.
"""

import importlib.util
import os
import pathlib

import keras
import numpy as np
import pytest

from keras_masking.data import bert_tokenizer
from keras_masking.data import text_shard_dataset
from keras_masking.data import text_shard_files
from keras_masking.models import TransformerBackbone

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)
CHARACTERS = (
    "今天天气很好北京是中国的首都大学上海交通他做事一心三意说了什么在年月日人们喜欢这个地方"
)
VOCABULARY = SPECIAL + list(dict.fromkeys(CHARACTERS))
# Steps compile with XLA on JAX (cached across runs by conftest); tiny TF
# steps start faster without it.
FAST = ["--no-jit-compile"] if keras.config.backend() == "tensorflow" else []
# The dataset is tf.data (TensorFlow ops) under either Keras backend, read
# back in numpy here: the same run on JAX proves nothing more.
TF_DATA_ONLY = pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="tf.data under either Keras backend: checked once, on TensorFlow",
)


def _line(index, length):
    """A line of ``length`` distinct-looking characters, different for each index."""
    characters = VOCABULARY[len(SPECIAL) :]
    return "".join(characters[(index * 7 + step) % len(characters)] for step in range(length))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """5 files of 4 lines (one of them long), a blank line each, and a vocab.txt."""
    folder = tmp_path_factory.mktemp("corpus")
    lines = {}
    for shard in range(5):
        texts = [_line(shard * 4 + row, 3 + (shard + row) % 4) for row in range(4)]
        if shard == 2:
            texts[1] = _line(99, 27)  # five windows at sequence_length 8
        path = folder / f"part-{shard}.txt"
        path.write_text("\n".join(texts[:2] + [""] + texts[2:]) + "\n", encoding="utf-8")
        lines[str(path)] = texts
    (folder / "vocab.txt").write_text("\n".join(VOCABULARY) + "\n", encoding="utf-8")
    return folder, lines


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return bert_tokenizer(corpus[0] / "vocab.txt")


def _ids(text):
    return [VOCABULARY.index(character) for character in text]


def _windows(texts, width):
    return [tuple(_ids(t)[i : i + width]) for t in texts for i in range(0, len(t), width)]


def _rows(batches):
    """The text tokens of every row ([CLS] ... [SEP] and padding removed)."""
    rows = []
    for batch in batches:
        for ids, mask in zip(batch["token_ids"], batch["padding_mask"]):
            real = ids[mask.astype(bool)]
            assert real[0] == CLS and real[-1] == SEP
            rows.append(tuple(int(i) for i in real[1:-1]))
    return rows


@TF_DATA_ONLY
def test_batches_have_static_shapes(corpus, tokenizer):
    folder, _ = corpus
    exlm = text_shard_dataset(str(folder / "part-*.txt"), tokenizer, 8, 3, seed=0)
    spec = exlm.element_spec
    assert sorted(spec) == ["padding_mask", "segment_ids", "token_ids"]
    assert all(s.shape == (3, 8) and s.dtype.name == "int32" for s in spec.values())
    mlm = text_shard_dataset(str(folder / "part-*.txt"), tokenizer, 8, 3, objective="mlm", seed=0)
    x, labels, weights = mlm.element_spec
    assert x["token_ids"].shape == (3, 8) and x["mask_positions"].shape == (3, 1)
    assert (labels.shape, labels.dtype.name) == ((3, 1), "int32")
    assert (weights.shape, weights.dtype.name) == ((3, 1), "float32")
    for batch in exlm.take(12).as_numpy_iterator():  # repeats past the 24 windows
        assert batch["token_ids"].shape == (3, 8) and batch["token_ids"].dtype == np.int32


@TF_DATA_ONLY
def test_one_pass_reads_every_line_once(corpus, tokenizer):
    folder, lines = corpus
    expected = _windows([t for texts in lines.values() for t in texts], 6)
    assert len(expected) == 24  # 20 lines, one of them cut into 5 windows
    for shuffle_buffer in (0, 7):
        dataset = text_shard_dataset(
            str(folder / "part-*.txt"),
            tokenizer,
            8,
            4,
            shuffle_buffer=shuffle_buffer,
            seed=3,
            repeat=False,
        )
        assert sorted(_rows(dataset.as_numpy_iterator())) == sorted(expected)


@TF_DATA_ONLY
def test_files_split_across_shards(corpus, tokenizer):
    folder, lines = corpus
    every = sorted(lines)
    for num_shards in (1, 2, 5):
        shards = [
            text_shard_files(str(folder / "part-*.txt"), num_shards, i) for i in range(num_shards)
        ]
        assert sorted(path for shard in shards for path in shard) == every
        assert len({path for shard in shards for path in shard}) == len(every)
    read = []
    for index in range(2):
        dataset = text_shard_dataset(
            [str(folder / "part-*.txt")],
            tokenizer,
            8,
            1,
            seed=0,
            num_shards=2,
            shard_index=index,
            repeat=False,
        )
        files = text_shard_files(str(folder / "part-*.txt"), 2, index)
        rows = _rows(dataset.as_numpy_iterator())
        assert sorted(rows) == sorted(_windows([t for f in files for t in lines[f]], 6))
        read.append(set(rows))
    assert not read[0] & read[1]


def test_a_file_is_read_by_its_name_and_once_however_it_is_spelled(tmp_path, monkeypatch):
    """A file named ``part[0].txt`` was read as the pattern ``part0.txt`` (another
    file, silently, or "matches no file"), and one file given as ``a.txt``,
    ``./a.txt`` and by its full path was read three times."""
    literal = tmp_path / "part[0].txt"
    literal.write_text("一\n", encoding="utf-8")
    assert text_shard_files(str(literal)) == [str(literal)]
    (tmp_path / "part0.txt").write_text("二\n" * 5, encoding="utf-8")
    assert text_shard_files(str(literal)) == [str(literal)]
    assert text_shard_files(str(tmp_path / "part[0-9].txt")) == [str(tmp_path / "part0.txt")]
    monkeypatch.chdir(tmp_path)
    spellings = [str(tmp_path / "part0.txt"), os.path.join(str(tmp_path), ".", "part0.txt")]
    assert len(text_shard_files(spellings + ["part0.txt", "part*.txt"])) == 2
    # The order is the full names', whichever spelling a host was given and
    # wherever its links lead: links into a store ("z", "a") sort as the names.
    store = tmp_path / "store"
    store.mkdir()
    for name, target in (("x.txt", "z"), ("y.txt", "a")):
        (store / target).write_text("三\n", encoding="utf-8")
        os.symlink(store / target, tmp_path / name)
    assert [os.path.basename(p) for p in text_shard_files(["y.txt", "x.txt"])] == ["x.txt", "y.txt"]
    assert [os.path.basename(p) for p in text_shard_files(["part0.txt", str(literal)])] == [
        "part0.txt",
        "part[0].txt",
    ]


@TF_DATA_ONLY
@pytest.mark.parametrize("split", [0, 1, 2])
def test_invalid_utf8_names_its_line_when_a_character_spans_two_reads(tokenizer, tmp_path, split):
    """A character cut by the 64 KiB read (``split`` of its bytes before it), then
    an invalid byte: the line was one too far."""
    head = b"\r\n" * ((65536 - split) // 2) + b"\n" * ((65536 - split) % 2)
    data = head + "今".encode("utf-8") + b"\xff\r\nx\r\n"
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    line = head.count(b"\n") + 1
    with pytest.raises(ValueError, match=rf"line {line}, near byte {len(head) + 3}:"):
        text_shard_dataset(str(path), tokenizer, 8, 2)


def _assert_same_batches(expected, got):
    assert len(expected) == len(got)
    for index, (a, b) in enumerate(zip(expected, got)):
        for name in a[0]:
            np.testing.assert_array_equal(a[0][name], b[0][name], err_msg=f"{index}: {name}")
        np.testing.assert_array_equal(a[1], b[1], err_msg=f"batch {index}: labels")
        np.testing.assert_array_equal(a[2], b[2], err_msg=f"batch {index}: weights")


def _mlm(folder, tokenizer, **kwargs):
    arguments = dict(objective="mlm", shuffle_buffer=5, seed=11)
    arguments.update(kwargs)
    return text_shard_dataset(str(folder / "part-*.txt"), tokenizer, 8, 4, **arguments)


@TF_DATA_ONLY
def test_skip_in_the_same_process_continues_an_uninterrupted_run(corpus, tokenizer):
    """One dataset object, iterated again: ``skip(n)`` gives the batches from
    the n-th on, in order, across passes over the files (24 windows, 6
    batches a pass), and so does a new pipeline."""
    folder, _ = corpus
    dataset = _mlm(folder, tokenizer)
    uninterrupted = list(dataset.take(16).as_numpy_iterator())
    _assert_same_batches(uninterrupted, list(dataset.take(16).as_numpy_iterator()))
    for n in (2, 7):
        _assert_same_batches(
            uninterrupted[n:], list(dataset.skip(n).take(16 - n).as_numpy_iterator())
        )
    again = _mlm(folder, tokenizer).skip(5).take(11).as_numpy_iterator()
    _assert_same_batches(uninterrupted[5:], list(again))
    # Shuffled: not in file order, and the passes over the files differ.
    rows = _rows(x for x, _, _ in uninterrupted)
    assert rows[:24] != rows[24:48]
    assert rows[:24] != _windows([t for f in sorted(corpus[1]) for t in corpus[1][f]], 6)


@TF_DATA_ONLY
def test_global_seeds_do_not_change_the_batches(corpus, tokenizer):
    import tensorflow as tf

    folder, _ = corpus
    tf.random.set_seed(1)
    expected = list(_mlm(folder, tokenizer).take(8).as_numpy_iterator())
    keras.utils.set_random_seed(12345)  # sets TensorFlow's global seed too
    _assert_same_batches(expected, list(_mlm(folder, tokenizer).take(8).as_numpy_iterator()))
    # Another seed argument does change them.
    other = list(_mlm(folder, tokenizer, seed=12).take(8).as_numpy_iterator())
    assert any(
        not np.array_equal(a[0]["token_ids"], b[0]["token_ids"]) for a, b in zip(expected, other)
    )


@TF_DATA_ONLY
@pytest.mark.parametrize("repeat", [False, True])
def test_shuffle_buffer_0_reads_the_files_in_order(corpus, tokenizer, repeat):
    folder, lines = corpus
    in_order = _windows([t for path in sorted(lines) for t in lines[path]], 6)
    dataset = text_shard_dataset(
        str(folder / "part-*.txt"), tokenizer, 8, 4, shuffle_buffer=0, seed=3, repeat=repeat
    )
    rows = _rows(dataset.take(12).as_numpy_iterator())
    assert rows == (in_order * 2 if repeat else in_order)


@TF_DATA_ONLY
def test_mlm_labels_are_the_original_tokens(corpus, tokenizer):
    folder, _ = corpus
    common = dict(shuffle_buffer=9, seed=5)
    plain = text_shard_dataset(str(folder / "part-*.txt"), tokenizer, 16, 8, **common)
    masked = text_shard_dataset(
        str(folder / "part-*.txt"), tokenizer, 16, 8, objective="mlm", max_predictions=4, **common
    )
    picked = replaced_by_mask = 0
    for original, (x, labels, weights) in zip(
        plain.take(10).as_numpy_iterator(), masked.take(10).as_numpy_iterator()
    ):
        ids, positions = original["token_ids"], x["mask_positions"]
        np.testing.assert_array_equal(x["padding_mask"], original["padding_mask"])
        live = weights > 0
        rows = np.nonzero(live)[0]
        np.testing.assert_array_equal(labels[live], ids[rows, positions[live]])
        assert (labels[~live] == 0).all() and (positions[~live] == 0).all()
        # Only picked tokens change; special tokens are never picked.
        changed = np.zeros(ids.shape, bool)
        changed[rows, positions[live]] = True
        assert (x["token_ids"][~changed] == ids[~changed]).all()
        assert not np.isin(ids[rows, positions[live]], [PAD, CLS, SEP, MASK]).any()
        real = ((ids != CLS) & (ids != SEP) & original["padding_mask"].astype(bool)).sum(1)
        expected = np.clip(np.round(0.15 * real), np.minimum(real, 1), 4)
        np.testing.assert_array_equal(live.sum(1), expected)
        picked += live.sum()
        replaced_by_mask += (x["token_ids"][rows, positions[live]] == MASK).sum()
    assert 0.6 < replaced_by_mask / picked < 0.95  # 80% [MASK]


@TF_DATA_ONLY
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(files="missing.txt"), "no file at"),
        (dict(files="nothing-*.txt"), "matches no file"),
        (dict(files=[]), "non-empty list"),
        (dict(files="."), "is a folder"),
        (dict(num_shards=6), "at least as many files as shards"),
        (dict(num_shards=2, shard_index=2), "shard_index"),
        (dict(sequence_length=2), "sequence_length"),
        (dict(batch_size=0), "batch_size"),
        (dict(objective="bert"), "objective"),
        (dict(shuffle_buffer=-1), "shuffle_buffer"),
        (dict(repeat=1), "repeat"),
        (dict(mask_rate=0.2), "objective='mlm' only"),
        (dict(objective="mlm", mask_rate=1.5), "mask_rate"),
        (
            dict(objective="mlm", mask_token_rate=0.8, random_token_rate=0.3),
            "random_token_rate <= 1",
        ),
        (dict(objective="mlm", max_predictions=9), "max_predictions"),
        (dict(tokenizer=object()), "WordPiece tokenizer"),
        (dict(files="empty.txt"), "'empty.txt', which holds no text"),
        (dict(files="blank.txt"), "'blank.txt', which holds no text"),
        (dict(files=["part-*.txt", "blank.txt"]), "'blank.txt', which holds no text"),
        (dict(files="latin1.txt"), r"'latin1.txt', which is not UTF-8 text \(line 3,"),
        (dict(files=["part-*.txt", "gbk.txt"]), "'gbk.txt', which is not UTF-8 text"),
    ],
)
def test_bad_arguments_are_named(corpus, tokenizer, monkeypatch, change, message):
    folder, _ = corpus
    (folder / "empty.txt").write_text("")
    (folder / "blank.txt").write_text("\n\n  \n\t\n" * 50)
    (folder / "latin1.txt").write_text("ok\nfine\ncafé au lait\n", encoding="latin-1")
    (folder / "gbk.txt").write_text("今天天气很好\n", encoding="gbk")
    monkeypatch.chdir(folder)
    arguments = dict(files="part-*.txt", tokenizer=tokenizer, sequence_length=8, batch_size=2)
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        text_shard_dataset(
            arguments.pop("files"),
            arguments.pop("tokenizer"),
            arguments.pop("sequence_length"),
            arguments.pop("batch_size"),
            **arguments,
        )


@TF_DATA_ONLY
def test_invalid_utf8_past_the_checked_head_stops_naming_the_file(corpus, tokenizer, tmp_path):
    import tensorflow as tf

    path = tmp_path / "late-gbk.txt"
    head = (_line(1, 30) + "\n").encode("utf-8") * 800  # 72 KB of valid lines
    path.write_bytes(head + "北京是中国的首都\n".encode("gbk"))
    dataset = text_shard_dataset(str(path), tokenizer, 8, 4, seed=0, repeat=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="late-gbk.txt"):
        for _ in dataset:
            pass


@TF_DATA_ONLY
def test_random_token_replacement_share(corpus, tokenizer):
    """Of the picked positions about 80% become [MASK], about 10% a random
    non-special token (a draw may give the token itself: 1 in 40 here), the
    rest stay."""
    folder, _ = corpus
    common = dict(shuffle_buffer=9, seed=5)
    plain = text_shard_dataset(str(folder / "part-*.txt"), tokenizer, 16, 8, **common)
    masked = text_shard_dataset(
        str(folder / "part-*.txt"),
        tokenizer,
        16,
        8,
        objective="mlm",
        mask_rate=0.5,
        max_predictions=8,
        **common,
    )
    before, after = [], []
    for original, (x, _, weights) in zip(
        plain.take(40).as_numpy_iterator(), masked.take(40).as_numpy_iterator()
    ):
        live = weights > 0
        rows, positions = np.nonzero(live)[0], x["mask_positions"][live]
        before.append(original["token_ids"][rows, positions])
        after.append(x["token_ids"][rows, positions])
    before, after = np.concatenate(before), np.concatenate(after)
    assert len(before) > 800
    to_mask = after == MASK
    to_random = (after != MASK) & (after != before)
    assert 0.74 < to_mask.mean() < 0.86
    assert 0.06 < to_random.mean() < 0.14  # 10% x 39/40
    # Random tokens are non-special, spread over the vocabulary.
    assert not np.isin(after[to_random], [PAD, UNK, CLS, SEP, MASK]).any()
    assert len(set(after[to_random].tolist())) > len(VOCABULARY) // 2


# === The example ===
@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location(
        "pretrain_text_shards", ROOT / "examples" / "pretrain_text_shards.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Interrupted(Exception):
    pass


class Interrupt(keras.callbacks.Callback):
    """Raises after ``step`` training steps, as a killed job stops."""

    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise Interrupted(f"interrupted at step {self.step}")


def _state(folder):
    with np.load(folder / "checkpoint.npz") as checkpoint:
        return {name: checkpoint[name] for name in checkpoint.files}


# The example's two runs compile several models (about a minute each on two
# cores); the dataset's own resume (`skip`) and determinism are tested above.
@pytest.mark.slow
def test_example_resumes_to_the_weights_of_an_uninterrupted_run(example, corpus, tmp_path, capsys):
    folder, _ = corpus
    run = ["--files", str(folder / "part-*.txt"), "--vocab", str(folder / "vocab.txt")]
    run += ["--objective", "mlm", "--steps", "6", "--steps-per-checkpoint", "2"]
    run += ["--sequence-length", "8", "--batch-size", "4", "--shuffle-buffer", "5", *FAST]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert example.main([*run, "--checkpoint-dir", str(whole)]) == 0
    assert (whole / "backbone" / "tokenizer.json").is_file()

    with pytest.raises(Interrupted):
        example.main([*run, "--checkpoint-dir", str(resumed)], callbacks=[Interrupt(5)])
    assert int(_state(resumed)["steps_done"]) == 4  # step 5 was lost
    assert not (resumed / "backbone").exists()
    assert not list(resumed.glob(".*partial*"))
    assert example.main([*run, "--checkpoint-dir", str(resumed)]) == 0
    assert "resuming after step 4 of 6" in capsys.readouterr().out

    # Weights, optimizer state and random states (dropout) all equal.
    expected, got = _state(whole), _state(resumed)
    assert sorted(expected) == sorted(got) and int(got["steps_done"]) == 6
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert TransformerBackbone.from_preset(str(resumed / "backbone")).position == "absolute"

    # A finished run does nothing; another run's settings are refused.
    before = (resumed / "checkpoint.npz").stat().st_mtime_ns
    assert example.main([*run, "--checkpoint-dir", str(resumed)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (resumed / "checkpoint.npz").stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="seed"):
        example.main([*run, "--seed", "4", "--checkpoint-dir", str(resumed)])


@pytest.mark.slow
def test_example_pretrains_exlm_on_its_built_in_corpus(example, tmp_path):
    out = tmp_path / "exlm"
    argv = ["--steps", "3", "--steps-per-checkpoint", "2", "--sequence-length", "16"]
    argv += ["--batch-size", "4", "--k", "2", "--checkpoint-dir", str(out), *FAST]
    assert example.main([*argv, "--stop-after", "2"]) == 0
    state = _state(out)
    assert int(state["steps_done"]) == 2 and not (out / "backbone").exists()
    assert all(np.isfinite(value).all() for value in state.values())
    assert len(list((out / "corpus").glob("shard-*.txt"))) == 4
    assert (out / "corpus" / "vocab.txt").is_file()


@TF_DATA_ONLY
def test_a_carriage_return_that_ends_no_line_is_refused_naming_the_file_and_line(
    tokenizer, tmp_path
):
    # TensorFlow's line reader deletes every \r: "一二\r三" would read as "一二三".
    windows = tmp_path / "windows.txt"
    windows.write_bytes(f"{_line(1, 4)}\r\n{_line(2, 4)}\r\n".encode("utf-8"))
    text_shard_dataset(str(windows), tokenizer, 8, 4, seed=0, repeat=False)  # \r\n: lines
    for name, text, line in (
        ("inside.txt", f"{_line(1, 4)}\n{_line(2, 4)}\n{_line(3, 2)}\r{_line(4, 2)}\n", 3),
        ("old-mac.txt", f"{_line(1, 4)}\r{_line(2, 4)}\r", 1),
    ):
        (tmp_path / name).write_bytes(text.encode("utf-8"))
        with pytest.raises(ValueError, match=rf"{name}', line {line}, holds a carriage return"):
            text_shard_dataset(str(tmp_path / name), tokenizer, 8, 4, seed=0, repeat=False)


@TF_DATA_ONLY
def test_random_replacements_never_draw_a_unigram_tokenizers_unknown_piece(tmp_path):
    from keras_masking.models import UnigramTokenizer
    from tests.models.unigram_testing import toy_model

    tokenizer = UnigramTokenizer(toy_model())
    path = tmp_path / "a.txt"
    path.write_text("ab fix yz c ab ab fix\n" * 50, encoding="utf-8")
    dataset = text_shard_dataset(
        str(path), tokenizer, 12, 8, objective="mlm", mask_rate=0.5, mask_token_rate=0.0,
        random_token_rate=1.0, shuffle_buffer=0, seed=0, repeat=False,
    )  # fmt: skip
    drawn = []
    for features, _, weights in dataset:
        ids = np.take_along_axis(
            np.asarray(features["token_ids"]), np.asarray(features["mask_positions"]), axis=1
        )
        drawn += ids[np.asarray(weights) > 0].tolist()
    assert len(drawn) > 100
    assert tokenizer.unk_token_id not in drawn
    assert not set(drawn) & {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
