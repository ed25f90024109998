"""Pretraining batches streamed from sharded text files, as a `tf.data.Dataset`.

For corpora that do not fit in memory (`text_shard_dataset`); on several
hosts, each host reads its own files (`text_shard_files`).
"""

import os
import re
import types

from keras_masking.ops.embedding_correction import validate_masking_rates
from keras_masking.ops.token_selection import select_tokens
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

OBJECTIVES = ("exlm", "mlm")
_GLOB_CHARACTERS = "*?["
_LINES_PER_TOKENIZER_CALL = 256
_CHECK_BYTES = 64 * 1024
_CHECK_LINES = 8
# Purposes of the stateless draws (the masking uses purpose 0).
_FILE_ORDER = 1
_WINDOW_ORDER = 2
_MASKING_DEFAULTS = {
    "mask_rate": 0.15,
    "mask_token_rate": 0.8,
    "random_token_rate": 0.1,
    "max_predictions": None,
}


def text_shard_files(files, num_shards=1, shard_index=0):
    """The files one shard (host) reads: every ``num_shards``-th of the sorted list.

    Args:
        files: a path or glob pattern (``"corpus/*.txt"``, expanded by
            `tf.io.gfile.glob`), or a list of them. A file's name is read as
            it is, glob characters and all; one file named two ways counts
            once.
        num_shards: int >= 1, the number of shards (hosts) the files are
            split across.
        shard_index: int in ``[0, num_shards)``, this shard's index.

    Returns:
        A sorted list of paths; the shards' lists are disjoint and together
        hold every file.

    Raises:
        ValueError: a file or pattern is missing, a shard argument is out of
            range, or there are fewer files than shards.

    Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for name in "abc":
    ...     _ = (folder / f"{name}.txt").write_text("今天天气很好\\n", encoding="utf-8")
    >>> [pathlib.Path(path).name for path in text_shard_files(str(folder / "*.txt"), 2, 0)]
    ['a.txt', 'c.txt']
    """
    num_shards = check_int("num_shards", num_shards, minimum=1)
    shard_index = check_int("shard_index", shard_index, minimum=0)
    if shard_index >= num_shards:
        raise ValueError(
            f"Expected shard_index in [0, {num_shards - 1}] (num_shards={num_shards}). "
            f"Received: shard_index={shard_index}."
        )
    paths = _expand_files(files)
    if len(paths) < num_shards:
        raise ValueError(
            f"Got {len(paths)} file(s) for num_shards={num_shards}: each shard reads whole "
            "files, so there must be at least as many files as shards. Split the corpus into "
            f"at least {num_shards} files, or use fewer shards. Files: {paths[:5]}."
        )
    return paths[shard_index::num_shards]


def text_shard_dataset(
    files,
    tokenizer,
    sequence_length,
    batch_size,
    *,
    objective="exlm",
    shuffle_buffer=10_000,
    seed=None,
    num_shards=1,
    shard_index=0,
    repeat=True,
    cycle_length=4,
    **masking,
):
    """Full, fixed-shape pretraining batches streamed from text files.

    Each non-empty line is tokenized and cut into windows of at most
    ``sequence_length - 2`` tokens (none is cut away); each window becomes
    ``[CLS] window [SEP]`` padded with [PAD]. Every batch has exactly
    ``batch_size`` rows and a static shape, so a compiled step compiles once.

    Every draw (file order, shuffled blocks, masking) is stateless, keyed by
    ``seed`` and the pass, block or batch index, so ``dataset.skip(n)``
    continues exactly where a run that trained ``n`` steps stopped. With
    ``objective="mlm"`` rows are masked as BERT masks them. Files are checked
    when the dataset is made (some text, UTF-8). docs/pretraining.md has the
    order, the masking and the checks in full.

    Args:
        files: a path or glob pattern, or a list of them (see
            `text_shard_files`). UTF-8 text, one passage per line.
        tokenizer: a keras-hub WordPiece tokenizer with [CLS], [SEP], [PAD]
            and [MASK] tokens (a `keras_masking.models.TransformerTokenizer`
            or `keras_hub.tokenizers.BertTokenizer`), or a vocabulary path
            accepted by `keras_masking.data.bert_tokenizer`.
        sequence_length: int >= 3, tokens per row, [CLS] and [SEP] included.
        batch_size: int >= 1, rows per batch (per host).
        objective: ``"exlm"`` (inputs of `ExLMPretrainer`, which masks
            itself) or ``"mlm"`` (BERT-masked inputs, labels and weights for
            `TransformerMaskedLM`).
        shuffle_buffer: int >= 0, windows per shuffled block; 0 reads the
            files in sorted order, unshuffled.
        seed: int >= 0 or None. With None a seed is drawn once, so the
            dataset is not reproducible across processes.
        num_shards: int >= 1, hosts the files are split across.
        shard_index: int in ``[0, num_shards)``, this host's files.
        repeat: bool. True repeats the files forever (training with
            ``steps_per_epoch``); False reads them once.
        cycle_length: int >= 1, files read at once when ``shuffle_buffer >
            0``.
        **masking: ``objective="mlm"`` only: ``mask_rate`` (float in (0, 1),
            default 0.15), ``mask_token_rate`` (default 0.8),
            ``random_token_rate`` (default 0.1; the two sum to at most 1) and
            ``max_predictions`` (int in ``[1, sequence_length]``, masked
            positions per row, default ``max(1, round(mask_rate *
            sequence_length))``).

    Returns:
        A `tf.data.Dataset`. For ``"exlm"`` each element is a dict of int32
        ``(batch_size, sequence_length)`` tensors ``token_ids``,
        ``segment_ids`` (zeros) and ``padding_mask``. For ``"mlm"`` it is
        ``(x, labels, sample_weight)``: ``x`` the same dict with the masked
        ``token_ids`` and int32 ``mask_positions`` ``(batch_size, P)``,
        ``labels`` the int32 original ids at those positions and
        ``sample_weight`` float32 ``(batch_size, P)`` (0 on the padding
        positions of a row with fewer picks), ``P = max_predictions``.

    Raises:
        ValueError: an argument is out of range (it is named), a file or
            pattern is missing, a file holds no text or is not UTF-8 (it is
            named), or there are fewer files than shards.

    Example:
    ```python
    import pathlib
    from keras_masking.data import bert_tokenizer, text_shard_dataset

    pathlib.Path("corpus").mkdir(exist_ok=True)
    for index in range(2):
        pathlib.Path(f"corpus/part-{index}.txt").write_text(
            "今天天气很好\\n北京是中国的首都\\n" * 8, encoding="utf-8"
        )
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = bert_tokenizer(special + list("今天气很好北京是中国的首都"))
    dataset = text_shard_dataset(
        "corpus/*.txt", tokenizer, sequence_length=16, batch_size=4, objective="mlm", seed=0
    )
    masked_lm = keras_masking.models.TransformerMaskedLM(backbone)  # absolute positions
    masked_lm.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"  # per masked token, as BERT
        ),
        weighted_metrics=[],
    )
    masked_lm.fit(dataset, steps_per_epoch=2, epochs=1)
    # Resuming after 2 steps, in this process or another: the batches an
    # uninterrupted run would see next (with the weights, optimizer and
    # random states restored too, as examples/pretrain_text_shards.py does).
    masked_lm.fit(dataset.skip(2), steps_per_epoch=2, epochs=2, initial_epoch=1)
    ```
    """
    sequence_length = check_int("sequence_length", sequence_length, minimum=3)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    objective = check_choice("objective", objective, OBJECTIVES)
    shuffle_buffer = check_int("shuffle_buffer", shuffle_buffer, minimum=0)
    if seed is not None:
        seed = check_int("seed", seed, minimum=0, maximum=2**31 - 1)
    repeat = check_bool("repeat", repeat)
    cycle_length = check_int("cycle_length", cycle_length, minimum=1)
    masking = _check_masking(objective, sequence_length, masking)
    paths = text_shard_files(files, num_shards, shard_index)
    tokenizer, special = _check_tokenizer(tokenizer, objective)
    random_ids = None
    if masking is not None:
        random_ids = _random_token_ids(tokenizer, special, masking["random_token_rate"])
    for path in paths:
        _check_file(path, tokenizer)
    if seed is None:
        import random

        seed = random.SystemRandom().randrange(2**31)

    import tensorflow as tf

    lines = _read_lines(
        paths, shuffle=shuffle_buffer > 0, seed=seed, repeat=repeat, cycle=cycle_length
    )
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}
    windows = lines.batch(_LINES_PER_TOKENIZER_CALL).map(
        lambda text: _windows(tokenizer(text), sequence_length - 2), **parallel
    )
    windows = windows.unbatch()
    if shuffle_buffer > 0:
        windows = _block_shuffle(windows, shuffle_buffer, seed)
    batches = windows.ragged_batch(batch_size, drop_remainder=True).map(
        lambda rows: _pack(rows, special, batch_size, sequence_length), **parallel
    )
    if objective == "mlm":
        masker = _bert_masking(masking, special, random_ids, seed, num_shards, shard_index)
        batches = batches.enumerate().map(masker, **parallel)
    options = tf.data.Options()
    options.deterministic = True
    if num_shards > 1:
        # The files are already split per host: tf.distribute must not shard again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return batches.prefetch(tf.data.AUTOTUNE).with_options(options)


# === Arguments ===
def _expand_files(files):
    import tensorflow as tf

    if isinstance(files, (str, os.PathLike)):
        files = [files]
    if not isinstance(files, (list, tuple)) or not files:
        raise ValueError(
            "Expected files as a path, a glob pattern or a non-empty list of them. "
            f"Received: files={files!r}."
        )
    paths = []
    for entry in files:
        if not isinstance(entry, (str, os.PathLike)):
            raise ValueError(f"Expected each file as a path or pattern. Received: {entry!r}.")
        entry = os.fspath(entry)
        if tf.io.gfile.isdir(entry):
            raise ValueError(
                f"files: {entry!r} is a folder; pass its files, e.g. {entry.rstrip('/')}/*.txt."
            )
        if tf.io.gfile.exists(entry):  # a file's name is read as it is, "[" and all
            paths.append(entry)
        elif any(character in entry for character in _GLOB_CHARACTERS):
            matched = [path for path in tf.io.gfile.glob(entry) if not tf.io.gfile.isdir(path)]
            if not matched:
                raise ValueError(f"files: the pattern {entry!r} matches no file.")
            paths.extend(matched)
        else:
            raise ValueError(f"files: no file at {entry!r}.")
    # One file named two ways (a/x.txt, a/./x.txt, x.txt from a/) is read once,
    # and the files are ordered by their full names, however each host spells
    # them and wherever its links lead (the shards then split them alike).
    unique = {}
    for path in paths:
        key = path if "://" in path else os.path.abspath(path)  # gs:// as it is
        unique[key] = min(unique.get(key, path), path)
    return [unique[key] for key in sorted(unique)]


def _check_file(path, tokenizer):
    """Refuses a file that is not UTF-8 or holds a carriage return that ends no line
    (in the part read until the first text), or that holds no text."""
    import codecs

    import tensorflow as tf

    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset, text, lines_before = 0, "", 0
    with tf.io.gfile.GFile(path, "rb") as file:
        while True:
            chunk = file.read(_CHECK_BYTES)
            pending = decoder.getstate()[0]  # a character's first bytes, from the last chunk
            try:
                text += decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                line = lines_before + (pending + chunk)[: error.start].count(b"\n") + 1
                raise ValueError(
                    "Expected UTF-8 text in every file of files. Received: "
                    f"{path!r}, which is not UTF-8 text (line {line}, near byte "
                    f"{offset - len(pending) + error.start}: "
                    f"{error.reason}). Convert it to UTF-8 first, e.g. `iconv -f GBK -t UTF-8` "
                    "or `iconv -f LATIN1 -t UTF-8`."
                ) from None
            offset += len(chunk)
            # The complete lines so far (all of them at the end of the file).
            complete, ends, text = text.rpartition("\n") if chunk else (text, "", "")
            lone = re.search("\r(?!\n|$)", complete)
            if lone:
                line = lines_before + complete.count("\n", 0, lone.start()) + 1
                raise ValueError(
                    "Expected lines ending in \\n (or \\r\\n) in every file of files. Received: "
                    f"{path!r}, line {line}, holds a carriage return (\\r) that ends no line. "
                    "TensorFlow's line reader deletes it, gluing the words around it. Replace "
                    "it with a space or a newline first, e.g. `tr '\\r' '\\n'` for a file with "
                    "old Mac line endings."
                )
            lines_before += complete.count("\n") + len(ends)
            lines = [line for line in complete.split("\n") if line.strip()]
            for start in range(0, len(lines), _CHECK_LINES):  # almost always the first lines
                if _token_count(tokenizer(lines[start : start + _CHECK_LINES])) > 0:
                    return
            if not chunk:
                break
    raise ValueError(
        "Expected text in every file of files (a dataset repeating a file with none "
        f"would wait forever for a batch). Received: {path!r}, which holds no text (it is "
        "empty, or its lines are blank or give no token). Remove it from the files."
    )


def _check_masking(objective, length, masking):
    """The MLM options, checked and completed with their defaults (None for ExLM)."""
    unknown = sorted(set(masking) - set(_MASKING_DEFAULTS))
    if unknown:
        raise TypeError(f"text_shard_dataset() got unexpected keyword arguments {unknown}.")
    if objective != "mlm":
        if masking:
            raise ValueError(
                f"{', '.join(masking)} apply to objective='mlm' only: with objective='exlm' the "
                "batches are unmasked and ExLMPretrainer masks them (set its mask_rate). "
                f"Received: {', '.join(f'{name}={value!r}' for name, value in masking.items())}."
            )
        return None
    masking = {**_MASKING_DEFAULTS, **masking}
    rates = validate_masking_rates(
        masking["mask_rate"], masking["mask_token_rate"], masking["random_token_rate"]
    )
    mask_rate = check_float("mask_rate", rates[0], 0.0, 1.0, True, True)
    predictions = masking["max_predictions"]
    if predictions is None:
        predictions = max(1, round(mask_rate * length))
    return {
        "mask_rate": mask_rate,
        "mask_token_rate": rates[1],
        "random_token_rate": rates[2],
        "max_predictions": check_int("max_predictions", predictions, minimum=1, maximum=length),
    }


def _check_tokenizer(tokenizer, objective):
    """The tokenizer (from a vocabulary path too) and its special ids."""
    if isinstance(tokenizer, (str, os.PathLike)):
        from keras_masking.data.tokenization import bert_tokenizer

        tokenizer = bert_tokenizer(os.fspath(tokenizer))
    needed = ("cls_token_id", "sep_token_id", "pad_token_id")
    if objective == "mlm":
        needed += ("mask_token_id",)
    missing = [name for name in needed if getattr(tokenizer, name, None) is None]
    if missing or not callable(tokenizer) or not hasattr(tokenizer, "vocabulary_size"):
        raise ValueError(
            "Expected a keras-hub WordPiece tokenizer with [CLS], [SEP], [PAD] and [MASK] "
            "tokens (e.g. keras_masking.data.bert_tokenizer('vocab.txt')), or a vocabulary "
            f"path. Received: tokenizer={tokenizer!r:.80} (missing: {missing})."
        )
    mask = tokenizer.mask_token_id
    return tokenizer, {
        "cls": int(tokenizer.cls_token_id),
        "sep": int(tokenizer.sep_token_id),
        "pad": int(tokenizer.pad_token_id),
        "mask": None if mask is None else int(mask),
    }


def _token_count(token_ids):
    """Tokens in a tokenizer's output: a ragged tensor, or lists on JAX."""
    if hasattr(token_ids, "row_lengths"):
        return int(sum(token_ids.row_lengths().numpy()))
    return sum(len(row) for row in token_ids)


def _random_token_ids(tokenizer, special, random_token_rate):
    """The ids a random replacement draws from: the vocabulary less special tokens."""
    size = int(tokenizer.vocabulary_size())
    excluded = {value for value in special.values() if value is not None}
    excluded.update(int(i) for i in getattr(tokenizer, "special_token_ids", None) or ())
    unknown = getattr(tokenizer, "unk_token_id", None)  # a UnigramTokenizer's <unk>
    if unknown is not None:
        excluded.add(int(unknown))
    oov = getattr(tokenizer, "oov_token", None)
    if oov is not None:
        try:
            excluded.add(int(tokenizer.token_to_id(oov)))
        except (KeyError, ValueError):
            pass
    excluded = sorted(i for i in excluded if 0 <= i < size)
    if random_token_rate > 0 and len(excluded) >= size:
        raise ValueError(
            "Expected a vocabulary with a non-special token for random_token_rate > 0 "
            f"(the special tokens are {excluded}). Received: random_token_rate="
            f"{random_token_rate}, a vocabulary of {size} tokens."
        )
    return {"count": size - len(excluded), "excluded": excluded}


# === Pipeline ===
def _tensorflow_ops():
    """TensorFlow's ops under `keras.ops`' names, for `select_tokens` in `tf.data`."""
    import tensorflow as tf

    names = ("cast", "floor", "round", "minimum", "maximum", "where", "argsort")
    return types.SimpleNamespace(sum=tf.reduce_sum, **{name: getattr(tf, name) for name in names})


def _key(seed, purpose, index):
    """A stateless-RNG key: one stream per ``purpose`` and ``index``."""
    import tensorflow as tf

    return tf.stack([tf.constant(seed + purpose * 2**31, tf.int64), tf.cast(index, tf.int64)])


def _read_lines(paths, shuffle, seed, repeat, cycle):
    """The files' lines, in order or (``shuffle``) interleaved in random file orders."""
    import tensorflow as tf

    names = tf.constant(paths)
    if not shuffle:
        files = tf.data.Dataset.from_tensor_slices(names)
        files = files.repeat() if repeat else files
        return files.flat_map(_file_lines)

    def one_pass(index):
        noise = tf.random.stateless_uniform([len(paths)], _key(seed, _FILE_ORDER, index))
        return tf.data.Dataset.from_tensor_slices(tf.gather(names, tf.argsort(noise)))

    passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    return passes.flat_map(one_pass).interleave(
        _file_lines,
        cycle_length=min(cycle, len(paths)),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def _file_lines(path):
    """One file's lines, stopping with an error that names it at invalid UTF-8."""
    import tensorflow as tf

    def checked(lines):
        valid = tf.strings.unicode_transcode(lines, "UTF-8", "UTF-8", errors="replace")
        check = tf.debugging.Assert(
            tf.reduce_all(tf.equal(valid, lines)),
            ["text_shard_dataset: this file is not UTF-8 text; convert it first:", path],
        )
        with tf.control_dependencies([check]):
            return tf.identity(lines)

    return tf.data.TextLineDataset(path).batch(_LINES_PER_TOKENIZER_CALL).map(checked).unbatch()


def _block_shuffle(windows, size, seed):
    """Consecutive blocks of ``size`` windows, each in its own random order."""
    import tensorflow as tf

    def shuffled(index, block):
        noise = tf.random.stateless_uniform(
            tf.reshape(block.nrows(), [1]), _key(seed, _WINDOW_ORDER, index)
        )
        return tf.gather(block, tf.argsort(noise))

    return (
        windows.ragged_batch(size)
        .enumerate()
        .map(shuffled, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
    )


def _windows(token_ids, width):
    """Ragged ``(lines, None)`` tokens cut into ragged windows of at most ``width``."""
    import tensorflow as tf

    token_ids = tf.cast(token_ids, tf.int32)
    lengths = tf.cast(token_ids.row_lengths(), tf.int32)
    counts = (lengths + width - 1) // width
    line = tf.repeat(tf.range(tf.shape(lengths)[0]), counts)
    start = tf.ragged.range(counts).flat_values * width
    window_lengths = tf.minimum(width, tf.gather(lengths, line) - start)
    return tf.RaggedTensor.from_row_lengths(token_ids.flat_values, window_lengths)


def _pack(rows, special, batch_size, length):
    """``[CLS] row [SEP]``, padded to ``length``: the dict of model inputs."""
    import tensorflow as tf

    column = tf.ones([batch_size, 1], tf.int32)

    def ragged(ids):
        return tf.RaggedTensor.from_tensor(ids, row_splits_dtype=rows.row_splits.dtype)

    framed = tf.concat([ragged(column * special["cls"]), rows, ragged(column * special["sep"])], 1)
    token_ids = framed.to_tensor(default_value=special["pad"], shape=[batch_size, length])
    padding_mask = tf.sequence_mask(framed.row_lengths(), length, dtype=tf.int32)
    return {
        "token_ids": tf.ensure_shape(token_ids, [batch_size, length]),
        "segment_ids": tf.zeros([batch_size, length], tf.int32),
        "padding_mask": tf.ensure_shape(padding_mask, [batch_size, length]),
    }


def _bert_masking(masking, special, random_ids, seed, num_shards, shard_index):
    """BERT's masking of one batch, with stateless draws keyed by its index."""
    special_ids = sorted(set(special.values()))
    mask_token_rate, random_token_rate = masking["mask_token_rate"], masking["random_token_rate"]

    def mask(index, inputs):
        import tensorflow as tf

        token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
        shape = tf.shape(token_ids)
        length = token_ids.shape[1]
        # One stream of draws per batch and host, whatever runs before it.
        stream = tf.cast(index, tf.int64) * num_shards + shard_index
        seeds = tf.random.experimental.stateless_split(
            tf.stack([tf.constant(seed, tf.int64), stream]), num=4
        )
        candidates = tf.cast(padding_mask, tf.bool)
        for special_id in special_ids:
            candidates &= token_ids != special_id
        picked = select_tokens(
            candidates,
            masking["mask_rate"],
            tf.random.stateless_uniform(shape, seeds[0]),
            min_count=1,
            max_count=masking["max_predictions"],
            backend_ops=_tensorflow_ops(),
        )
        # Picked positions first, in order, then the others.
        positions = tf.range(length, dtype=tf.int32)[None, :]
        order = tf.argsort(tf.where(picked, positions, positions + length), axis=1, stable=True)
        mask_positions = order[:, : masking["max_predictions"]]
        weights = tf.gather(picked, mask_positions, batch_dims=1)
        mask_positions = tf.where(weights, mask_positions, 0)
        labels = tf.where(weights, tf.gather(token_ids, mask_positions, batch_dims=1), 0)
        draw = tf.random.stateless_uniform(shape, seeds[1])
        # Uniform over the non-special ids: draw in [0, count), then step
        # over each excluded id, in increasing order.
        random_tokens = tf.random.stateless_uniform(
            shape, seeds[2], minval=0, maxval=max(1, random_ids["count"]), dtype=tf.int32
        )
        for excluded in random_ids["excluded"]:
            random_tokens += tf.cast(random_tokens >= excluded, tf.int32)
        replaced = tf.where(draw < mask_token_rate, special["mask"], token_ids)
        random_band = (draw >= mask_token_rate) & (draw < mask_token_rate + random_token_rate)
        replaced = tf.where(random_band, random_tokens, replaced)
        x = dict(inputs)
        x["token_ids"] = tf.where(picked, replaced, token_ids)
        x["mask_positions"] = mask_positions
        return x, labels, tf.cast(weights, tf.float32)

    return mask
