"""The demo's small Chinese encoders: MLM and ExLM pretraining on one budget.

Three encoders are pretrained on the same People's Daily sequences, for the
same number of steps, batch and learning rate:

* ``mlm``: BERT's recipe, the encoder the other methods fine-tune: absolute
  positions, `TransformerMaskedLM`, keras-hub's `MaskedLMMaskGenerator`
  (15% of tokens, 80% [MASK], 10% random, 10% kept; special tokens never),
  the masking the embedding correction undoes;
* ``mlm_2d`` and ``exlm``: ExLM's setup (``rotary2d`` positions, 15% of
  tokens, every one [MASK]) trained with `ExLMPretrainer`'s ``"mlm"`` and
  ``"exlm"`` objectives: the like-for-like comparison of the two.

Each is evaluated on held-out paragraphs (loss and the entropy of its
predictions at masked positions) and saved as a preset in the cache folder,
so a second demo with the same settings skips pretraining.
"""

import hashlib
import json
import math
import os
import pathlib
import platform
import shutil
import time
import uuid

import keras
import numpy as np

from keras_masking.optimizers.adamw import AdamW
from keras_masking.version import __version__

CACHE_VARIABLE = "KERAS_MASKING_CACHE"


def cache_folder():
    """Where the demo keeps its pretrained encoders.

    ``$KERAS_MASKING_CACHE``, else ``$XDG_CACHE_HOME/keras_masking``, else
    ``~/.cache/keras_masking``.

    Example:
    >>> isinstance(cache_folder(), pathlib.Path)
    True
    """
    if os.environ.get(CACHE_VARIABLE):
        return pathlib.Path(os.environ[CACHE_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "keras_masking"


def small_encoder_label(settings):
    """The table's name of the small encoders pretrained here.

    Example:
    >>> from keras_masking.demo.settings import DemoSettings
    >>> small_encoder_label(DemoSettings())
    'small encoder pretrained here (2 layers, hidden 64)'
    """
    layers, hidden, _, _ = settings.architecture
    plural = "" if layers == 1 else "s"
    return f"small encoder pretrained here ({layers} layer{plural}, hidden {hidden})"


def pretraining_sequences(texts, tokenizer, length, count, seed):
    """``count`` windows of ``length`` tokens cut from ``texts`` (fixed order).

    Windows in a shuffled order, and again in another when ``count`` asks for
    more than ``texts`` hold (so that ``--steps`` steps run whatever the corpus).
    """
    from keras_masking.data import encode_texts

    width = length - 2  # [CLS] and [SEP]
    windows = [
        text[start : start + width] for text in texts for start in range(0, len(text), width)
    ]
    windows = [window for window in windows if len(window) >= 8]
    if not windows:
        raise ValueError(f"No text of 8 characters or more to pretrain on at length {length}.")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(windows))
    while len(order) < count:
        order = np.concatenate([order, rng.permutation(len(windows))])
    chosen = [windows[index] for index in order[:count]]
    return encode_texts(tokenizer, chosen, length)


def _backbone(settings, vocabulary_size, position):
    from keras_masking.models import TransformerBackbone

    layers, hidden, heads, ffn = settings.architecture
    return TransformerBackbone(
        vocabulary_size=vocabulary_size,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=ffn,
        dropout=0.1,
        max_sequence_length=max(settings.sequence_length, settings.entity_length),
        position=position,
        custom_position_ids=position == "rotary2d",
    )


def _bert_masker(tokenizer, length):
    import keras_hub

    return keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=tokenizer.vocabulary_size(),
        mask_selection_rate=0.15,
        mask_token_id=tokenizer.mask_token_id,
        # Each token is picked with probability 0.15, then rows are cut to this
        # many: at 0.15 * length a fifth of the rows were cut (14.0% picked where the
        # embedding correction assumes 15%); 0.3 * length cuts none in practice.
        mask_selection_length=math.ceil(0.3 * length),
        unselectable_token_ids=tokenizer.special_token_ids,
    )


def _masked(masker, features):
    """BERT-masked copies of ``features`` with targets, as numpy."""
    out = masker(features["token_ids"])
    inputs = {
        "token_ids": np.asarray(keras.ops.convert_to_numpy(out["token_ids"]), "int32"),
        "segment_ids": features["segment_ids"],
        "padding_mask": features["padding_mask"],
        "mask_positions": np.asarray(keras.ops.convert_to_numpy(out["mask_positions"]), "int32"),
    }
    labels = np.asarray(keras.ops.convert_to_numpy(out["mask_ids"]), "int32")
    weights = np.asarray(keras.ops.convert_to_numpy(out["mask_weights"]), "float32")
    return inputs, labels, weights


def _mlm_held_out(masked_lm, inputs, labels, weights):
    """Masked-token cross-entropy, accuracy and prediction entropy (nats)."""
    logits = masked_lm.predict(inputs, batch_size=64, verbose=0).astype("float64")
    logits -= logits.max(-1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, labels[..., None], -1)[..., 0]
    entropy = -(np.exp(log_p) * log_p).sum(-1)
    total = weights.sum()
    return {
        "loss": float(-(picked * weights).sum() / total),
        "accuracy": float(((log_p.argmax(-1) == labels) * weights).sum() / total),
        "entropy": float((entropy * weights).sum() / total),
    }


def _pretrain_mlm(settings, tokenizer, train, held_out, progress):
    from keras_masking.models import TransformerMaskedLM

    keras.utils.set_random_seed(settings.seed)
    backbone = _backbone(settings, tokenizer.vocabulary_size(), "absolute")
    masked_lm = TransformerMaskedLM(backbone)
    masker = _bert_masker(tokenizer, settings.sequence_length)
    inputs, labels, weights = _masked(masker, train)
    masked_lm.compile(
        optimizer=AdamW(1e-3, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True,
            reduction="mean_with_sample_weight",  # per masked token, as BERT
        ),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=settings.jit_compile,
    )
    history = masked_lm.fit(
        inputs,
        labels,
        sample_weight=weights,
        batch_size=settings.batch_size,
        epochs=1,
        shuffle=False,
        verbose=progress,
    )
    result = _mlm_held_out(masked_lm, *_masked(masker, held_out))
    result["train_loss"] = float(history.history["loss"][-1])
    return backbone, result


def _pretrain_2d(settings, tokenizer, train, held_out, objective, progress):
    from keras_masking.models import ExLMPretrainer

    keras.utils.set_random_seed(settings.seed)
    backbone = _backbone(settings, tokenizer.vocabulary_size(), "rotary2d")
    pretrainer = ExLMPretrainer(
        backbone,
        k=settings.exlm_k,
        mask_token_id=tokenizer.mask_token_id,
        unselectable_token_ids=(tokenizer.cls_token_id, tokenizer.sep_token_id),
        objective=objective,
        transition_heads=settings.architecture[2],
        seed=settings.seed,
    )
    pretrainer.compile(
        optimizer=AdamW(1e-3, weight_decay=0.01),
        jit_compile=settings.jit_compile,
    )
    history = pretrainer.fit(
        train, batch_size=settings.batch_size, epochs=1, shuffle=False, verbose=progress
    )
    scores = pretrainer.evaluate(held_out, batch_size=64, verbose=0, return_dict=True)
    result = {name: float(scores[name]) for name in ("loss", "entropy", "aligned_entropy")}
    result["train_loss"] = float(history.history["loss"][-1])
    return backbone, result


def library_versions():
    """The versions of what computes a pretraining: Keras, its backend, numpy, keras-hub.

    Example:
    >>> {"keras", "keras_hub", "numpy"} <= set(library_versions())
    True
    """
    import importlib

    names = ["keras", "keras_hub", "numpy", keras.config.backend()]
    if keras.config.backend() == "jax":
        names.append("jaxlib")
    return {name: getattr(importlib.import_module(name), "__version__", None) for name in names}


def source_digest():
    """A hash of this package's Python sources.

    A cached encoder is the product of the code that trained it; the
    version number alone does not change with every edit, so an edited
    model, loss or optimizer would otherwise be served encoders its code
    never trained.

    Example:
    >>> len(source_digest())
    64
    """
    root = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _texts_digest(texts):
    return hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest()


def pretraining_key(settings, vocabulary, texts=(), held_out=()):
    """The cache key of a pretraining: everything its encoders and figures depend on.

    Its settings, vocabulary, pretraining and held-out text (the figures are
    measured on the held-out text), the package's sources (`source_digest`),
    the versions of Keras, its backend, numpy and keras-hub, and what else
    changes the floating-point results: ``XLA_FLAGS``, TensorFlow's oneDNN
    switch, the processor and its core count.
    """
    fields = {
        "environment": {
            name: os.environ.get(name) for name in ("XLA_FLAGS", "TF_ENABLE_ONEDNN_OPTS")
        },
        "machine": [platform.machine(), os.cpu_count()],
        "texts": _texts_digest(texts),
        "held_out": _texts_digest(held_out),
        "version": __version__,
        "source": source_digest(),
        "libraries": library_versions(),
        "model_size": settings.model_size,
        "steps": settings.pretraining_steps,
        "sequence_length": settings.sequence_length,
        "entity_length": settings.entity_length,
        "batch_size": settings.batch_size,
        "exlm_k": settings.exlm_k,
        "seed": settings.seed,
        "backend": keras.config.backend(),
        "jit_compile": settings.jit_compile,
        "vocabulary": _texts_digest(vocabulary),
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()
    return f"{settings.model_size}-{settings.pretraining_steps}steps-{digest[:12]}"


def pretrained_encoders(settings, corpora, tokenizer, say, progress=1, cache=None):
    """Pretrains the three encoders, or loads them from the cache.

    Args:
        settings: a `DemoSettings`.
        corpora: from `demo_corpora`.
        tokenizer: the demo's tokenizer.
        say: a function that logs one progress line.
        progress: Keras ``verbose`` for the pretraining ``fit``.
        cache: the cache folder (default: `cache_folder()`).

    Returns:
        ``(presets, results)``: the preset folder of each encoder (``mlm``,
        ``mlm_2d``, ``exlm``) and each one's held-out figures, steps and
        seconds (``cached`` True when it was loaded).
    """
    key = pretraining_key(
        settings, corpora["vocabulary"], corpora["pretraining"], corpora["held_out"]
    )
    folder = pathlib.Path(cache or cache_folder()) / "demo" / key
    record = folder / "pretraining.json"
    presets = {name: folder / name for name in ("mlm", "mlm_2d", "exlm")}
    if record.is_file() and all((path / "config.json").is_file() for path in presets.values()):
        results = json.loads(record.read_text(encoding="utf-8"))
        for result in results.values():
            result["cached"] = True
        say(f"pretrained encoders loaded from {folder}")
        return presets, results
    count = settings.pretraining_steps * settings.batch_size
    train = pretraining_sequences(
        corpora["pretraining"], tokenizer, settings.sequence_length, count, settings.seed
    )
    held_out = pretraining_sequences(
        corpora["held_out"], tokenizer, settings.sequence_length, 256, settings.seed
    )
    staging = folder.parent / f".{folder.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    results = {}
    staging.mkdir(parents=True)
    try:
        for name in presets:
            say(f"pretraining {name}: {settings.pretraining_steps} steps of {settings.batch_size}")
            started = time.perf_counter()
            if name == "mlm":
                backbone, result = _pretrain_mlm(settings, tokenizer, train, held_out, progress)
            else:
                objective = "mlm" if name == "mlm_2d" else "exlm"
                backbone, result = _pretrain_2d(
                    settings, tokenizer, train, held_out, objective, progress
                )
            result.update(steps=settings.pretraining_steps, seconds=time.perf_counter() - started)
            backbone.save_to_preset(str(staging / name))
            (staging / name / "vocab.txt").write_text(
                "\n".join(corpora["vocabulary"]) + "\n", encoding="utf-8"
            )
            results[name] = result
        (staging / "pretraining.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for result in results.values():
        result["cached"] = False
    return presets, results
