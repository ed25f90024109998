"""The first ``fit`` of a text classifier on TensorFlow: one traced train step, not two.

Keras' TensorFlow trainer builds the optimizer inside the first traced train step, and
``tf.function`` traces a function that created variables a second time, so a model's first
``fit`` traces (and optimizes) its whole train step twice. The package's models build their
optimizer before ``fit`` traces (`keras_masking.utils.build_optimizer`): one trace. This times,
side by side in one process on the same texts and sizes, the first ``fit`` (one epoch of 32
texts, batch 8) of fresh models:

* ``keras-hub``: keras-hub's ``BertTextClassifier`` of the same sizes (Keras' default);
* ``ours, built in the trace``: `TransformerTextClassifier` fitted through keras-hub's
  ``fit`` (Keras' default: the optimizer built inside the first trace);
* ``ours``: `TransformerTextClassifier.fit` as it is.

Each row is the median of ``--repeats`` interleaved runs after one warm-up run of each, with
the number of times the train step was traced. Runs on the TensorFlow backend (JAX's trainer
builds everything before it traces).

``--metrics`` compiles with ``metrics=["accuracy"]`` (as keras-hub's default ``compile``
does): Keras builds the metrics inside the first trace too. ``--model exlm`` times an
`ExLMPretrainer` (k=4, rotary2d) instead, whose head and transition are built from the
inputs' length (no keras-hub row).

Usage:
    python benchmarks/first_fit.py [--repeats 5] [--layers 2] [--hidden 64] [--metrics]
    python benchmarks/first_fit.py --model exlm [--repeats 3]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

from keras_masking.data import bert_tokenizer  # noqa: E402
from keras_masking.data import encode_texts  # noqa: E402
from keras_masking.models import ExLMPretrainer  # noqa: E402
from keras_masking.models import TransformerBackbone  # noqa: E402
from keras_masking.models import TransformerTextClassifier  # noqa: E402
from keras_masking.models import TransformerTextClassifierPreprocessor  # noqa: E402

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(
    "这家店的菜很好吃服务太差了不会再来"
)
TEXTS = ["这家店的菜很好吃", "服务太差了不会再来", "菜很好吃", "服务太差了"] * 8
LABELS = np.array([1, 0, 1, 0] * 8)
SEQUENCE_LENGTH = 16


def _sizes(args):
    return dict(
        vocabulary_size=len(VOCABULARY),
        num_layers=args.layers,
        num_heads=4,
        hidden_dim=args.hidden,
        intermediate_dim=4 * args.hidden,
        max_sequence_length=SEQUENCE_LENGTH,
    )


def keras_hub_classifier(args):
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=VOCABULARY, lowercase=False)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTH
    )
    backbone = keras_hub.models.BertBackbone(**_sizes(args))
    return keras_hub.models.BertTextClassifier(backbone, 2, preprocessor=preprocessor)


def our_classifier(args):
    preprocessor = TransformerTextClassifierPreprocessor(
        bert_tokenizer(VOCABULARY), sequence_length=SEQUENCE_LENGTH
    )
    backbone = TransformerBackbone(**_sizes(args))
    return TransformerTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)


def exlm_pretrainer(args):
    backbone = TransformerBackbone(**_sizes(args), position="rotary2d", custom_position_ids=True)
    return ExLMPretrainer(backbone, k=4, mask_token_id=4, unselectable_token_ids=(2, 3))


def first_fit(kind, args):
    """Seconds (wall, CPU) of a fresh model's first ``fit``, and its train-step traces."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    if args.model == "exlm":
        model = exlm_pretrainer(args)
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        data = (encode_texts(bert_tokenizer(VOCABULARY), TEXTS, sequence_length=SEQUENCE_LENGTH),)
    else:
        model = keras_hub_classifier(args) if kind == "keras-hub" else our_classifier(args)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"] if args.metrics else None,
        )
        data = (TEXTS, LABELS)
    traces = []
    train_step = model.train_step

    def counted(*step_args, **step_kwargs):
        traces.append(1)
        return train_step(*step_args, **step_kwargs)

    model.train_step = counted
    # Keras' default on our model: keras-hub's `fit`, past the package's.
    fit = type(model).fit
    if kind == "ours, built in the trace":
        fit = keras.Model.fit if args.model == "exlm" else keras_hub.models.TextClassifier.fit
    wall, cpu = time.perf_counter(), time.process_time()
    fit(model, *data, batch_size=8, epochs=1, verbose=0)
    return time.perf_counter() - wall, time.process_time() - cpu, len(traces)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--metrics", action="store_true", help='compile with metrics=["accuracy"]')
    parser.add_argument("--model", choices=("classifier", "exlm"), default="classifier")
    args = parser.parse_args(argv)
    if keras.config.backend() != "tensorflow":
        sys.exit("first_fit.py times TensorFlow's trainer: run it with KERAS_BACKEND=tensorflow.")
    kinds = ("keras-hub", "ours, built in the trace", "ours")
    if args.model == "exlm":
        kinds = kinds[1:]
    for kind in kinds:
        first_fit(kind, args)  # warm-up: the process's one-off costs
    times = {kind: [] for kind in kinds}
    for _ in range(args.repeats):
        for kind in kinds:
            times[kind].append(first_fit(kind, args))
    print(
        "command: KERAS_BACKEND=tensorflow python benchmarks/first_fit.py "
        + " ".join(sys.argv[1:] if argv is None else argv)
    )
    print(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "machine": platform.platform(),
                "keras": keras.__version__,
                "keras-hub": keras_hub.__version__,
            }
        )
    )
    print(
        f"| {args.model} ({args.layers} layers, hidden {args.hidden}"
        f"{', metrics' if args.metrics else ''}) | traces | first fit s (wall) "
        "| first fit CPU s | CPU / ours' |"
    )
    print("|---|---|---|---|---|")
    ours_cpu = statistics.median(cpu for _, cpu, _ in times["ours"])
    for kind in kinds:
        wall = statistics.median(w for w, _, _ in times[kind])
        cpu = statistics.median(c for _, c, _ in times[kind])
        traces = sorted({t for _, _, t in times[kind]})
        print(
            f"| {kind} | {'/'.join(map(str, traces))} | {wall:.2f} | {cpu:.2f} "
            f"| {cpu / ours_cpu:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
