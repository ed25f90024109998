"""ExLM against plain MLM pretraining on People's Daily: loss and prediction entropy.

The same small rotary2d backbone (4 x 128, Chinese BERT vocabulary), the
same masking (15%, all [MASK]) and the same data order, pretrained with
`ExLMPretrainer(objective="exlm")` and ``objective="mlm"`` for the same
number of steps. Prints, every ``--log-every`` steps, each objective's loss
and the mean entropy of its predicted distributions at masked positions on a
held-out set (the paper reports that ExLM lowers it). The two losses are
different quantities (DAG log-likelihood per target vs cross-entropy per
mask) and are not compared with each other.

Usage:
    pip install ".[bench]"
    KERAS_BACKEND=jax python benchmarks/exlm_pretraining.py
"""

import argparse

import keras
import numpy as np
from small_chinese_bert import DEFAULT_VOCAB
from small_chinese_bert import chinese_tokenizer

from keras_masking.data import encode_texts
from keras_masking.data.corpora import peoples_daily_sentences
from keras_masking.models import ExLMPretrainer
from keras_masking.models import TransformerBackbone


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--log-every", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
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
            special_token_ids=special,
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
    for step in range(1, args.steps + 1):
        index = rng.integers(0, count, args.batch_size)
        batch = {k: v[index] for k, v in train.items()}
        losses = {
            name: model.train_on_batch(batch, return_dict=True)["loss"]
            for name, model in models.items()
        }
        if step % args.log_every == 0:
            line = [f"step {step:5d}"]
            for name, model in models.items():
                result = model.evaluate(held_out, batch_size=64, verbose=0, return_dict=True)
                line.append(
                    f"{name}: train loss {losses[name]:.3f}, held-out loss {result['loss']:.3f}, "
                    f"entropy {result['entropy']:.3f}"
                )
            print("  " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
