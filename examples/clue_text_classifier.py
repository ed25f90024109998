"""A keras-hub TextClassifier on a CLUE task: fit, predict and save on raw strings.

`keras_masking.models.TransformerTextClassifier` is a keras-hub
`TextClassifier` on the package's backbone. Its preprocessor
(`TransformerTextClassifierPreprocessor`) tokenizes raw strings, or pairs
``(texts_a, texts_b)``, in the input pipeline, so `fit` and `predict` take
the sentences themselves and the compiled step sees fixed-length arrays.
``save_to_preset`` writes the classifier with its tokenizer, and
``keras_hub.models.TextClassifier.from_preset(folder)`` loads it back. Each of
the package's methods is one call on it, before ``compile``
(``classifier.enable_fl_tuning(units)``, ``classifier.enable_asa(tau)``...),
and the embedding-correction callback works in ``fit``; here it is plain
fine-tuning.

Usage:
    python examples/clue_text_classifier.py \\
        --checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt --task bustm
    python examples/clue_text_classifier.py --preset ./my_preset --task eprstmt

Writes to --output-dir: preset/ (the classifier as a keras-hub preset),
model.keras, results.json and, when the data has a test split, CLUE's
submission file.
"""

import sys

import clue_common
import numpy as np
import tensorflow as tf

from keras_masking.clue import fine_tuning_optimizer
from keras_masking.clue import task_loss
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor


def parse_args(argv=None):
    parser = clue_common.argument_parser(__doc__, task="bustm", learning_rate=2e-5)
    return clue_common.parse_args(parser, argv, method="text_classifier")


def texts(examples):
    """Raw strings: a list, or a tuple of two lists for sentence pairs."""
    first = [example.text_a for example in examples]
    if examples[0].text_b is None:
        return first
    return (first, [example.text_b for example in examples])


def predicted_labels(classifier, splits, labels, batch_size):
    """split name -> {id: label string}, from ONE `predict` over all the splits
    (keras-hub traces its string pipeline anew for every call)."""
    examples = [example for split in splits.values() for example in split.examples]
    classes = classifier.predict(texts(examples), batch_size=batch_size, verbose=0).argmax(-1)
    predictions, start = {}, 0
    for name, split in splits.items():
        chosen = classes[start : start + len(split.examples)]
        predictions[name] = {example.id: labels[i] for example, i in zip(split.examples, chosen)}
        start += len(split.examples)
    return predictions


def main(argv=None):
    args = parse_args(argv)
    run = clue_common.load(args, encode=False)  # the preprocessor tokenizes
    train = run.splits["train"]

    preprocessor = TransformerTextClassifierPreprocessor(
        run.tokenizer, sequence_length=args.max_length
    )
    classifier = TransformerTextClassifier(
        backbone=run.backbone, num_classes=len(run.labels), preprocessor=preprocessor
    )
    classifier.compile(
        optimizer=fine_tuning_optimizer(args.learning_rate, run.total_steps),
        loss=task_loss(run.task),
        jit_compile=True,
    )
    # keras-hub batches in-memory strings without shuffling: shuffle them in tf.data.
    classes = np.array([run.labels.index(example.label) for example in train.examples])
    train_data = (
        tf.data.Dataset.from_tensor_slices((texts(train.examples), classes))
        .shuffle(len(classes), seed=args.seed)
        .batch(args.batch_size)
    )
    history = classifier.fit(train_data, epochs=args.epochs, verbose=2)
    scored = {name: split for name, split in run.splits.items() if name != "train"}
    predictions = predicted_labels(classifier, scored, run.labels, args.batch_size)
    classifier.save_to_preset(str(run.output_dir / "preset"))
    clue_common.save_results(run, classifier, history.history, predictions, preset="preset")
    return 0


if __name__ == "__main__":
    sys.exit(main())
