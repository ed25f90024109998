"""ExLM against plain MLM pretraining on People's Daily: loss and prediction entropy.

The same small rotary2d backbone (4 x 128, Chinese BERT vocabulary), the
same masking (15%, all [MASK]) and the same data order, pretrained with
`ExLMPretrainer(objective="exlm")` and ``objective="mlm"`` for the same
number of steps. Prints, every ``--log-every`` steps, each objective's loss
and the mean entropy of its predicted distributions at masked positions on a
held-out set (the paper reports that ExLM lowers it): ``entropy`` over every
[MASK] state, and ``aligned`` over the states that emit the masked targets,
weighted by the alignment posterior (for MLM both are the per-mask
entropy). The two losses are different quantities (DAG log-likelihood per
target vs cross-entropy per mask) and are not compared with each other.

Then each pretrained backbone is fine-tuned on a FewCLUE task
(``--fine-tune-task``, TNEWS by default; ``none`` skips it) through
`ExLMPretrainer.fine_tuning_encoder()`: the ExLM backbone with [CLS]/[SEP]
expanded into k copies and the first [CLS] copy pooled, as the official code
fine-tunes; the MLM backbone on plain positions. Dev accuracy, mean +- std
over seeds (same head initialisation and data order for both).

Usage:
    pip install ".[bench]"
    KERAS_BACKEND=jax python benchmarks/exlm_pretraining.py
"""

import argparse
import statistics
import time

import keras
import numpy as np
from small_chinese_bert import DEFAULT_VOCAB
from small_chinese_bert import FEWCLUE
from small_chinese_bert import chinese_tokenizer
from small_chinese_bert import load_fewclue

from keras_masking.clue import TASKS
from keras_masking.data import encode_texts
from keras_masking.data.corpora import peoples_daily_sentences
from keras_masking.models import ExLMEncoder
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone


def fine_tune(pretrainer, seed, train, dev, args, num_classes):
    """Dev accuracy of a [CLS] classifier on a copy of the pretrained backbone."""
    keras.utils.set_random_seed(seed)
    encoder = ExLMEncoder.from_config(pretrainer.fine_tuning_encoder().get_config())
    encoder.backbone.set_weights(pretrainer.backbone.get_weights())
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    pooled = keras.layers.Dropout(0.1)(encoder(inputs)["pooled_output"])
    model = keras.Model(inputs, keras.layers.Dense(num_classes)(pooled))
    steps = args.fine_tune_epochs * -(-len(train[1]) // 32)
    schedule = keras.optimizers.schedules.PolynomialDecay(args.fine_tune_learning_rate, steps, 0.0)
    model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    model.fit(train[0], train[1], batch_size=32, epochs=args.fine_tune_epochs, verbose=0)
    return model.evaluate(dev[0], dev[1], verbose=0, return_dict=True)["accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--log-every", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--fine-tune-task", default="tnews")
    parser.add_argument("--fine-tune-epochs", type=int, default=6)
    parser.add_argument("--fine-tune-learning-rate", type=float, default=1e-3)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    tokenizer = chinese_tokenizer(DEFAULT_VOCAB)
    sentences = peoples_daily_sentences()
    features = encode_texts(tokenizer, sentences, args.sequence_length)
    held_out = {k: v[-512:] for k, v in features.items()}
    train = {k: v[:-512] for k, v in features.items()}
    count = len(train["token_ids"])
    ids = tokenizer.token_to_id
    special = (ids("[CLS]"), ids("[SEP]"))
    models = {}
    for objective in ("mlm", "exlm"):
        keras.utils.set_random_seed(0)
        backbone = TransformerBackbone(
            vocabulary_size=tokenizer.vocabulary_size(),
            num_layers=4,
            num_heads=4,
            hidden_dim=128,
            intermediate_dim=512,
            max_sequence_length=512,
            position="rotary2d",
            custom_position_ids=True,
        )
        model = ExLMPretrainer(
            backbone,
            k=4,
            mask_token_id=ids("[MASK]"),
            unselectable_token_ids=special,
            objective=objective,
            seed=0,
        )
        model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate), jit_compile=True)
        models[objective] = model
    print(
        f"backend={keras.config.backend()}; People's Daily: {count} train / 512 held-out "
        f"sequences of {args.sequence_length} tokens; batch {args.batch_size}"
    )
    rng = np.random.default_rng(0)
    seconds = {name: 0.0 for name in models}
    for step in range(1, args.steps + 1):
        index = rng.integers(0, count, args.batch_size)
        batch = {k: v[index] for k, v in train.items()}
        losses = {}
        for name, model in models.items():
            start = time.perf_counter()
            losses[name] = model.train_on_batch(batch, return_dict=True)["loss"]
            seconds[name] += time.perf_counter() - start
        if step % args.log_every == 0:
            line = [f"step {step:5d}"]
            for name, model in models.items():
                result = model.evaluate(held_out, batch_size=64, verbose=0, return_dict=True)
                line.append(
                    f"{name}: train loss {losses[name]:.3f}, held-out loss {result['loss']:.3f}, "
                    f"entropy {result['entropy']:.3f}, aligned {result['aligned_entropy']:.3f}"
                )
            print("  " + " | ".join(line), flush=True)
    print(
        "pretraining time (first step's compilation included): "
        + ", ".join(f"{name} {value:.0f} s" for name, value in seconds.items())
    )
    if args.fine_tune_task == "none":
        return

    def encode(split):
        first, second, labels = load_fewclue(FEWCLUE, args.fine_tune_task, split)
        return encode_texts(tokenizer, first, args.sequence_length, second), np.array(
            labels, "int32"
        )

    train_set, dev_set = encode("train"), encode("dev")
    num_classes = len(TASKS[args.fine_tune_task].labels)
    print(
        f"FewCLUE {args.fine_tune_task}: {len(train_set[1])} train / {len(dev_set[1])} dev, "
        f"{args.fine_tune_epochs} epochs, lr {args.fine_tune_learning_rate:g}, {args.seeds} seeds"
    )
    for name, model in models.items():
        values = [
            fine_tune(model, seed, train_set, dev_set, args, num_classes)
            for seed in range(args.seeds)
        ]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"  {name}: dev accuracy {statistics.mean(values):.4f} +- {spread:.4f}", flush=True)


if __name__ == "__main__":
    main()
