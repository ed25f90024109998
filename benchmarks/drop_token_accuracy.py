"""DropToken's effect on accuracy: FewCLUE TNEWS, rates 0 to 0.5, several seeds.

Starts from the small Chinese BERT of `small_chinese_bert.py` (pretrained
here on People's Daily, cached), fine-tunes a [CLS] classifier on FewCLUE
TNEWS (train_few_all, 15 classes) with `enable_drop_token` at each rate
([CLS]/[SEP] protected, gather mode), and reports dev accuracy per rate:
mean and standard deviation over seeds. Seeds are shared across rates
(same classifier initialisation and data order).

Usage:
    pip install ".[bench]"
    KERAS_BACKEND=tensorflow python benchmarks/drop_token_accuracy.py
"""

import argparse
import json
import statistics

import keras
import numpy as np
from small_chinese_bert import DEFAULT_VOCAB
from small_chinese_bert import FEWCLUE
from small_chinese_bert import chinese_tokenizer
from small_chinese_bert import load_fewclue
from small_chinese_bert import pretrained_small_chinese_bert

import keras_masking
from keras_masking.clue import TASKS
from keras_masking.data import encode_texts


def fine_tune(pretrained, rate, seed, train, dev, args, num_classes):
    keras.utils.set_random_seed(seed)
    backbone = keras_masking.models.TransformerBackbone.from_config(pretrained.get_config())
    backbone.set_weights(pretrained.get_weights())
    if rate:
        backbone.enable_drop_token(rate, unselectable_token_ids=(101, 102), seed=seed)
    inputs = backbone.input
    pooled = keras.layers.Dropout(0.1)(backbone(inputs)["pooled_output"])
    model = keras.Model(inputs, keras.layers.Dense(num_classes)(pooled))
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    model.fit(train[0], train[1], batch_size=32, epochs=args.epochs, verbose=0)
    return model.evaluate(dev[0], dev[1], verbose=0, return_dict=True)["accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="tnews")
    parser.add_argument("--rates", default="0,0.1,0.15,0.25,0.5")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    tokenizer = chinese_tokenizer(DEFAULT_VOCAB)
    pretrained, info = pretrained_small_chinese_bert(tokenizer, steps=args.pretrain_steps)
    print(
        f"backend={keras.config.backend()}; small Chinese BERT: MLM accuracy "
        f"{info['mlm_accuracy']:.3f} after {info['steps']} steps"
    )

    def encode(split):
        first, second, labels = load_fewclue(FEWCLUE, args.task, split)
        features = encode_texts(tokenizer, first, args.sequence_length, second)
        return features, np.array(labels, "int32")

    train, dev = encode("train"), encode("dev")
    num_classes = len(TASKS[args.task].labels)
    print(f"FewCLUE {args.task}: {len(train[1])} train / {len(dev[1])} dev, {args.epochs} epochs")
    rates = [float(r) for r in args.rates.split(",")]
    results = {}
    for rate in rates:
        results[rate] = [
            fine_tune(pretrained, rate, seed, train, dev, args, num_classes)
            for seed in range(args.seeds)
        ]
        values = results[rate]
        print(
            f"  rate {rate:4.2f}: dev accuracy {statistics.mean(values):.4f} +- "
            f"{statistics.stdev(values) if len(values) > 1 else 0:.4f}  "
            f"{[round(v, 4) for v in values]}"
        )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump(
                {"args": vars(args), "pretraining": info, "accuracy": results}, file, indent=2
            )


if __name__ == "__main__":
    main()
