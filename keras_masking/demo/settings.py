"""The demo's settings: sizes, steps, splits, methods and their learning rates;
``quick`` and the default."""

import dataclasses

import keras

from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_int

MAX_SEED = 2**32 - 1  # numpy's largest seed


E5_NUM_LAYERS = 12  # multilingual-e5-small's layers

# (layers, hidden, heads, FFN units) of each model size.
MODEL_SIZES = {
    "tiny": (1, 32, 2, 64),
    "small": (2, 64, 4, 256),
    "medium": (4, 128, 4, 512),
}

# The review-sentiment runs on the real encoder, multilingual-e5-small:
# name -> (finetune switches, learning rate, epochs factor). Full fine-tuning
# (plain, DropToken, ASA) trains `DemoSettings.e5_epochs`; the
# parameter-efficient methods train a frozen encoder's few new weights and a
# fresh head from their initial values and get twice the epochs (each of
# their steps costs less than a full one: BENCHMARKS.md's demo table). The
# rates were fixed before the demo's recorded runs, none on its test split:
# full fine-tuning of a pretrained encoder at 5e-5, the top of BERT's
# 2e-5..5e-5, since a demo run is tens of steps; the parameter-efficient
# methods in their usual 1e-3..5e-3: prefix tuning 5e-3 (P-tuning v2's
# range), LoRA 2e-3, FL-tuning 1e-3. FL-tuning's
# rate was chosen on dev: at 5e-3, the rate of this package's FL recipe for
# a small, weakly pretrained BERT (docs/fl_tuning.md), its loss stayed at
# 0.70 and dev fell to 45%, while at 1e-3 it trained (dev 84% after one
# epoch). FL-tuning adds 160 FFN units per layer (the package's default),
# prefix tuning 16 key/value positions per layer, LoRA rank 8 on the query
# and value projections.
E5_METHODS = {
    "plain": ({}, 5e-5, 1),
    "DropToken 0.1": ({"drop_token": 0.1}, 5e-5, 1),
    "ASA tau 0.5": ({"asa": 0.5}, 5e-5, 1),
    "FL-tuning 160 units": ({"fl_tuning": 160}, 1e-3, 2),
    "prefix tuning 16": ({"prefix_tuning": 16}, 5e-3, 2),
    "LoRA rank 8": ({"lora": 8}, 2e-3, 2),
}
# The review-sentiment runs on the small encoders pretrained here: the two
# methods about MLM pretraining, against plain fine-tuning of the same small
# encoder, each at 1e-3 (a small, weakly pretrained encoder) for
# `DemoSettings.epochs`: name -> (finetune switches, learning rate).
SMALL_SENTIMENT_METHODS = {
    "plain": ({}, 1e-3),
    "corrected embeddings": ({"correct_embeddings": True}, 1e-3),
    "ExLM-pretrained": ({"exlm_k": "k"}, 1e-3),
}
# The entity runs on the small MLM encoder (``--entities``; DropToken in
# attention mode: every position keeps its output), each for
# `DemoSettings.entity_epochs`: name -> (finetune switches, learning rate).
ENTITY_METHODS = {
    "plain": ({}, 1e-3),
    "DropToken 0.1": ({"drop_token": 0.1}, 1e-3),
    "FL-tuning": ({"fl_tuning": "units"}, 5e-3),
}


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """How big the demo runs.

    The default fits about 15 minutes on a 2-core CPU from a fresh cache
    (BENCHMARKS.md, "Demo"): most of it goes to the real encoder, whose
    training step costs about 50 small-encoder steps.

    Args:
        model_size: the small encoders' size, ``"tiny"``, ``"small"`` or
            ``"medium"`` (`MODEL_SIZES`).
        pretraining_steps: MLM and ExLM steps each (the same budget).
        sequence_length: tokens per pretraining and small-encoder sentiment
            sequence.
        entity_length: tokens per entity sentence.
        batch_size: the small encoders' pretraining and fine-tuning batch.
        epochs: the small encoders' sentiment fine-tuning epochs.
        entity_epochs: entity fine-tuning epochs (GlobalPointer's head needs
            more steps than a [CLS] classifier before it predicts spans).
        sentiment_sizes: (train, dev, test) review counts.
        entity_sizes: (train, dev, test) sentence counts.
        entities: run the entity task too (``--entities``; off by default,
            to fit the budget).
        e5_layers: multilingual-e5-small's layers the demo keeps, the first
            ones: 12 (all) by default; ``quick`` keeps 1, a smoke run.
        e5_train_reviews: the real encoder trains on the first this many
            training reviews (the small encoders on all of them); dev and
            test are the same for every row.
        e5_sequence_length: the real encoder's pieces per review, ``<s>``
            and ``</s>`` included (the median review, with its prefix, is 38).
        e5_batch_size: the real encoder's batch.
        e5_epochs: the real encoder's epochs of full fine-tuning (the
            parameter-efficient methods train twice as many, `E5_METHODS`).
        e5_jit_compile: XLA for the real encoder's runs. Off: on a 2-core
            CPU compiling its step costs about 80 CPU seconds per run and the
            compiled step is no faster than TensorFlow's graph step.
        seeds: fine-tuning seeds per method (the mean and spread are shown).
        vocabulary_size: most frequent characters kept (plus special tokens)
            in the small encoders' vocabulary.
        exlm_k: ExLM's states per [MASK].
        seed: the first seed, at most ``2**32 - seeds`` (every run's seed
            seeds numpy); the same seed gives the same demo.
        jit_compile: compile the small encoders' steps with XLA. The
            default: on JAX, not on TensorFlow, where compiling these small
            models on a CPU takes longer than it saves (the default
            pretraining took 227 s with XLA and 171 s without on a 2-core
            CPU).

    Example:
    >>> DemoSettings.quick().e5_layers, DemoSettings().e5_layers, DemoSettings().e5_epochs
    (1, 12, 1)
    """

    model_size: str = "small"
    pretraining_steps: int = 200
    sequence_length: int = 64
    entity_length: int = 48
    batch_size: int = 32
    epochs: int = 3
    entity_epochs: int = 12
    sentiment_sizes: tuple = (2000, 200, 400)
    entity_sizes: tuple = (1200, 300, 500)
    entities: bool = False
    e5_layers: int = 12
    e5_train_reviews: int = 320
    e5_sequence_length: int = 48
    e5_batch_size: int = 16
    e5_epochs: int = 1
    e5_jit_compile: bool = False
    seeds: int = 1
    vocabulary_size: int = 3000
    exlm_k: int = 2
    seed: int = 0
    jit_compile: bool = dataclasses.field(
        default_factory=lambda: keras.config.backend() != "tensorflow"
    )

    def __post_init__(self):
        check_choice("model_size", self.model_size, sorted(MODEL_SIZES))
        check_int("pretraining_steps", self.pretraining_steps, minimum=1)
        check_int("sequence_length", self.sequence_length, minimum=16, maximum=512)
        check_int("entity_length", self.entity_length, minimum=16, maximum=512)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("epochs", self.epochs, minimum=1)
        check_int("entity_epochs", self.entity_epochs, minimum=1)
        check_bool("entities", self.entities)
        check_int("e5_layers", self.e5_layers, minimum=1, maximum=E5_NUM_LAYERS)
        check_int("e5_sequence_length", self.e5_sequence_length, minimum=16, maximum=512)
        check_int("e5_batch_size", self.e5_batch_size, minimum=1)
        check_int("e5_epochs", self.e5_epochs, minimum=1)
        check_bool("e5_jit_compile", self.e5_jit_compile)
        check_int("seeds", self.seeds, minimum=1)
        check_int("vocabulary_size", self.vocabulary_size, minimum=100)
        check_int("exlm_k", self.exlm_k, minimum=1)
        # Runs take seeds seed ... seed + seeds - 1, and a seed seeds numpy
        # (`keras.utils.set_random_seed`): each must be below 2**32.
        check_int("seed", self.seed, minimum=0, maximum=MAX_SEED + 1 - self.seeds)
        check_bool("jit_compile", self.jit_compile)
        for name in ("sentiment_sizes", "entity_sizes"):
            sizes = tuple(getattr(self, name))
            if len(sizes) != 3:
                raise ValueError(f"Expected (train, dev, test) for {name}. Received: {sizes!r}.")
            for size in sizes:
                check_int(name, size, minimum=8)
            object.__setattr__(self, name, sizes)
        check_int("e5_train_reviews", self.e5_train_reviews, minimum=8,
                  maximum=self.sentiment_sizes[0])  # fmt: skip

    @classmethod
    def quick(cls, **overrides):
        """The ``--quick`` settings: the whole pipeline on a tiny budget, a
        smoke run whose scores mean nothing (e5 cut to its first layer)."""
        values = dict(
            model_size="tiny",
            pretraining_steps=20,
            sequence_length=32,
            entity_length=32,
            epochs=1,
            entity_epochs=1,
            sentiment_sizes=(192, 64, 64),
            entity_sizes=(160, 64, 64),
            e5_layers=1,
            e5_train_reviews=64,
            e5_sequence_length=32,
            vocabulary_size=1500,
        )
        values.update(overrides)
        return cls(**values)

    @property
    def architecture(self):
        """The small encoders' ``(layers, hidden, heads, ffn)``."""
        return MODEL_SIZES[self.model_size]

    def method_switches(self, switches):
        """Small-encoder `finetune` switches with the size-dependent ones filled in."""
        hidden = self.architecture[1]
        sizes = {"units": hidden, "prefix": max(4, hidden // 4), "k": self.exlm_k}
        return {name: sizes.get(value, value) for name, value in switches.items()}

    def to_dict(self):
        """A JSON-ready dict."""
        return dataclasses.asdict(self)
