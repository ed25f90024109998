"""FL-tuning against full fine-tuning, P-tuning v2 and LoRA on FewCLUE, with an LR sweep.

Starts from the small Chinese BERT of `small_chinese_bert.py` (pretrained
here on People's Daily, cached) and fine-tunes a [CLS] classifier on a
FewCLUE task with each method at each learning rate, over several seeds
(shared across methods: same head initialisation and data order). Prints a
method x learning-rate table of dev accuracy (mean +- std over seeds) and
each method's best cell, so the learning-rate sensitivity can be read off.

Methods: ``full`` (all weights), ``fl`` (``enable_fl_tuning``, 160 units),
``pv2`` (``enable_prefix_tuning``, 160 prefixes), ``lora`` (keras-hub
``enable_lora(8)``).

Usage:
    pip install ".[bench]"
    KERAS_BACKEND=tensorflow python benchmarks/fl_tuning_accuracy.py
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


def fine_tune(pretrained, method, learning_rate, seed, train, dev, args, num_classes):
    keras.utils.set_random_seed(seed)
    backbone = keras_masking.models.TransformerBackbone.from_config(pretrained.get_config())
    backbone.set_weights(pretrained.get_weights())
    inputs = backbone.input
    pooled = keras.layers.Dropout(0.1)(backbone(inputs)["pooled_output"])
    model = keras.Model(inputs, keras.layers.Dense(num_classes)(pooled))
    if method == "fl":
        backbone.enable_fl_tuning(units=args.units)
    elif method == "pv2":
        backbone.enable_prefix_tuning(length=args.units)
    elif method == "lora":
        backbone.enable_lora(8)
    steps = args.epochs * -(-len(train[1]) // 32)
    schedule = keras.optimizers.schedules.PolynomialDecay(learning_rate, steps, 0.0)
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    model.fit(train[0], train[1], batch_size=32, epochs=args.epochs, verbose=0)
    return model.evaluate(dev[0], dev[1], verbose=0, return_dict=True)["accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="tnews")
    parser.add_argument("--methods", default="full,fl,pv2,lora")
    parser.add_argument("--learning-rates", default="1e-4,3e-4,1e-3,3e-3")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--units", type=int, default=160)
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
    print(
        f"FewCLUE {args.task}: {len(train[1])} train / {len(dev[1])} dev, {args.epochs} epochs, "
        f"AdamW (wd 0.01) with linear decay, {args.seeds} seeds"
    )
    methods = args.methods.split(",")
    rates = [float(r) for r in args.learning_rates.split(",")]
    results = {}
    for method in methods:
        for rate in rates:
            values = [
                fine_tune(pretrained, method, rate, seed, train, dev, args, num_classes)
                for seed in range(args.seeds)
            ]
            results[f"{method}@{rate:g}"] = values
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            print(
                f"  {method:5} lr {rate:7.0e}: {statistics.mean(values):.4f} +- {spread:.4f}",
                flush=True,
            )
    print("best learning rate per method (mean over seeds):")
    for method in methods:
        cells = {r: statistics.mean(results[f"{method}@{r:g}"]) for r in rates}
        best = max(cells, key=cells.get)
        worst = min(cells.values())
        print(
            f"  {method:5}: {cells[best]:.4f} at lr {best:g}; "
            f"range over the sweep {worst:.4f}..{cells[best]:.4f}"
        )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump(
                {"args": vars(args), "pretraining": info, "accuracy": results}, file, indent=2
            )


if __name__ == "__main__":
    main()
