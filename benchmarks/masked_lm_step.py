"""MLM train-step time: TransformerMaskedLM against keras-hub's BertMaskedLM.

Same config and weights, compiled with ``jit_compile=True``, alternating
rounds. Our head carries the tied-output compensation of the MLM embedding
correction (a per-row scale and shift on the logits); this measures what
that costs when unused.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/masked_lm_step.py
"""

import statistics
import time

import keras
import keras_hub
import numpy as np

import keras_masking


def main(rounds=5, steps=4, batch=16, length=128, masks=20):
    config = dict(
        vocabulary_size=21128, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024
    )
    hub_backbone = keras_hub.models.BertBackbone(**config)
    ours_backbone = keras_masking.models.from_keras_hub(hub_backbone)
    models = {
        "keras-hub BertMaskedLM": keras_hub.models.BertMaskedLM(hub_backbone),
        "TransformerMaskedLM": keras_masking.models.TransformerMaskedLM(ours_backbone),
    }
    rng = np.random.default_rng(0)
    features = {
        "token_ids": rng.integers(200, 21128, (batch, length)).astype("int32"),
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": np.ones((batch, length), "int32"),
        "mask_positions": np.sort(rng.integers(1, length, (batch, masks)), axis=1).astype("int32"),
    }
    labels = rng.integers(200, 21128, (batch, masks))
    for model in models.values():
        model.compile(optimizer=keras.optimizers.AdamW(1e-4), jit_compile=True)
        model.train_on_batch(features, labels)
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(steps):
                loss = model.train_on_batch(features, labels)
            float(np.sum(loss))
            times[name].append((time.perf_counter() - start) / steps)
    reference = statistics.median(times["keras-hub BertMaskedLM"])
    print(f"backend={keras.config.backend()} batch={batch} length={length} masks={masks}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:24s} {median * 1000:7.1f} ms/step  ratio {median / reference:.3f}")


if __name__ == "__main__":
    main()
