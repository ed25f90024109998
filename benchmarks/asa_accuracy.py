"""ASA against plain fine-tuning: accuracy, robustness to noisy input, masked share per layer.

Starts from the small Chinese BERT of `small_chinese_bert.py` (pretrained
here on People's Daily, cached) and fine-tunes a [CLS] classifier on FewCLUE
tasks, plain and with ASA (``backbone.enable_asa(0.5)``, every layer), with
the same seeds, optimizer and data order. FewCLUE's ``dev_few_all`` is split
in two fixed halves: the epoch is chosen on the first ("select"), and
accuracy is reported on the second ("held-out"), clean and with random
character noise (each character deleted with probability p/2 or replaced by
a random character of the training text with probability p/2), which is what
ASA claims to make models robust to. For ASA, the share of real query/key
pairs each layer's adversary masked is reported per epoch.

Usage:
    pip install ".[bench]"
    KERAS_BACKEND=jax python benchmarks/asa_accuracy.py [--tasks tnews,eprstmt] [--seeds 3]
"""

import argparse
import json
import pathlib
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


def perturb(texts, rate, alphabet, seed):
    """Deletes (p/2) or substitutes (p/2) each character at random."""
    rng = np.random.default_rng(seed)
    noisy = []
    for text in texts:
        characters = []
        for character in text:
            draw = rng.uniform()
            if draw < rate / 2:
                continue
            characters.append(alphabet[rng.integers(len(alphabet))] if draw < rate else character)
        noisy.append("".join(characters))
    return noisy


def accuracy(model, features, labels):
    logits = model.predict(features, batch_size=128, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def fine_tune(pretrained, method, seed, splits, args, num_classes):
    keras.utils.set_random_seed(seed)
    backbone = keras_masking.models.TransformerBackbone.from_config(pretrained.get_config())
    backbone.set_weights(pretrained.get_weights())
    pooled = keras.layers.Dropout(0.1)(backbone(backbone.input)["pooled_output"])
    model = keras.Model(backbone.input, keras.layers.Dense(num_classes)(pooled))
    trained = model
    if method == "asa":
        backbone.enable_asa(tau=args.tau)
        trained = keras_masking.methods.ASATrainer(model)
    trained.compile(
        optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    epochs = []
    for _ in range(args.epochs):
        history = trained.fit(*splits["train"], batch_size=32, epochs=1, verbose=0)
        record = {name: accuracy(model, *split) for name, split in splits.items()}
        record["fractions"] = {
            name: float(values[-1])
            for name, values in history.history.items()
            if name.startswith("masked_fraction_")
        }
        epochs.append(record)
    best = max(range(len(epochs)), key=lambda index: epochs[index]["select"])
    return {"chosen_epoch": best + 1, "chosen": epochs[best], "epochs": epochs}


def _mean_std(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="tnews,eprstmt")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--tau", type=float, default=0.5)
    parser.add_argument("--noise", default="0.1,0.2")
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--output", default=None, help="JSON file for every figure")
    parser.add_argument("--plot", default=None, help="PNG of ASA's masked share per layer")
    args = parser.parse_args()
    tokenizer = chinese_tokenizer(DEFAULT_VOCAB)
    pretrained, info = pretrained_small_chinese_bert(tokenizer, steps=args.pretrain_steps)
    print(
        f"backend={keras.config.backend()}; small Chinese BERT: MLM accuracy "
        f"{info['mlm_accuracy']:.3f} after {info['steps']} steps"
    )
    noise_rates = [float(rate) for rate in args.noise.split(",") if rate]
    results = {}
    for task in args.tasks.split(","):
        first, second, labels = load_fewclue(FEWCLUE, task, "train")
        alphabet = sorted({c for text in first + (second or []) for c in text})

        def encode(first, second, labels, noise=0.0, seed=0):
            if noise:
                first = perturb(first, noise, alphabet, seed)
                if second is not None:
                    second = perturb(second, noise, alphabet, seed + 1)
            features = encode_texts(tokenizer, first, args.sequence_length, second)
            return features, np.array(labels, "int32")

        dev_first, dev_second, dev_labels = load_fewclue(FEWCLUE, task, "dev")
        order = np.random.default_rng(0).permutation(len(dev_labels))
        halves = {"select": order[::2], "held-out": order[1::2]}

        def subset(indices):
            return (
                [dev_first[i] for i in indices],
                None if dev_second is None else [dev_second[i] for i in indices],
                [dev_labels[i] for i in indices],
            )

        splits = {"train": encode(first, second, labels)}
        splits["select"] = encode(*subset(halves["select"]))
        splits["held-out"] = encode(*subset(halves["held-out"]))
        for rate in noise_rates:
            splits[f"noise {rate}"] = encode(*subset(halves["held-out"]), noise=rate, seed=7)
        num_classes = len(TASKS[task].labels)
        print(
            f"FewCLUE {task}: {len(labels)} train, dev halves {len(halves['select'])} select / "
            f"{len(halves['held-out'])} held-out, {args.epochs} epochs, lr {args.learning_rate}"
        )
        results[task] = {}
        for method in ("plain", "asa"):
            runs = [
                fine_tune(pretrained, method, seed, splits, args, num_classes)
                for seed in range(args.seeds)
            ]
            results[task][method] = runs
            line = [f"  {method:5s}"]
            for name in ["select", "held-out"] + [f"noise {rate}" for rate in noise_rates]:
                mean, std = _mean_std([run["chosen"][name] for run in runs])
                line.append(f"{name} {mean:.4f} +- {std:.4f}")
            epochs = [run["chosen_epoch"] for run in runs]
            print("; ".join(line) + f"; chosen epochs {epochs}")
        drops = {}
        for method in ("plain", "asa"):
            for rate in noise_rates:
                drops[(method, rate)] = _mean_std(
                    [
                        run["chosen"]["held-out"] - run["chosen"][f"noise {rate}"]
                        for run in results[task][method]
                    ]
                )
        for rate in noise_rates:
            plain_drop, asa_drop = drops[("plain", rate)], drops[("asa", rate)]
            print(
                f"  accuracy lost at noise {rate}: plain {plain_drop[0]:.4f} +- "
                f"{plain_drop[1]:.4f}, ASA {asa_drop[0]:.4f} +- {asa_drop[1]:.4f}"
            )
        fractions = np.array(
            [
                [list(epoch["fractions"].values()) for epoch in run["epochs"]]
                for run in results[task]["asa"]
            ]
        )  # (seeds, epochs, layers)
        mean = fractions.mean(axis=0)
        print("  ASA masked share of real pairs per layer (mean over seeds):")
        for epoch in (0, mean.shape[0] - 1):
            values = ", ".join(f"{value:.3f}" for value in mean[epoch])
            print(f"    epoch {epoch + 1}: layers 0..{mean.shape[1] - 1}: {values}")
        if args.plot:
            history = {f"masked_fraction_{layer}": mean[:, layer] for layer in range(mean.shape[1])}
            path = pathlib.Path(args.plot)
            path = path.with_name(f"{path.stem}_{task}{path.suffix}")
            keras_masking.methods.plot_masked_fractions(
                history, path, title=f"ASA on FewCLUE {task}: masked share of real pairs"
            )
            print(f"  plot: {path}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            json.dump({"args": vars(args), "pretraining": info, "results": results}, file, indent=2)


if __name__ == "__main__":
    main()
