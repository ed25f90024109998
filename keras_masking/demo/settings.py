"""The demo's settings: sizes, steps, splits, methods; ``quick`` and the default."""

import dataclasses

import keras

from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_int

MAX_SEED = 2**32 - 1  # numpy's largest seed

# (layers, hidden, heads, FFN units) of each model size.
MODEL_SIZES = {
    "tiny": (1, 32, 2, 64),
    "small": (2, 64, 4, 256),
    "medium": (4, 128, 4, 512),
}

# The sentiment runs: name -> (finetune switches, learning rate, epochs factor).
# Full fine-tuning at 1e-3; the parameter-efficient methods train few weights
# from their initial values, and need a higher rate and more epochs (the
# FL-tuning recipe trains 30 epochs on TNEWS): 1e-2 and twice the epochs.
SENTIMENT_METHODS = {
    "plain": ({}, 1e-3, 1),
    "corrected embeddings": ({"correct_embeddings": True}, 1e-3, 1),
    "DropToken 0.1": ({"drop_token": 0.1}, 1e-3, 1),
    "ASA tau 0.5": ({"asa": 0.5}, 1e-3, 1),
    "FL-tuning": ({"fl_tuning": "units"}, 1e-2, 2),
    "prefix tuning": ({"prefix_tuning": "prefix"}, 1e-2, 2),
    "LoRA rank 4": ({"lora": 4}, 1e-2, 2),
    "ExLM-pretrained": ({"exlm_k": "k"}, 1e-3, 1),
}
# The entity runs (DropToken in attention mode: every position keeps its
# output), each for `DemoSettings.entity_epochs`.
ENTITY_METHODS = {
    "plain": ({}, 1e-3, 1),
    "DropToken 0.1": ({"drop_token": 0.1}, 1e-3, 1),
    "FL-tuning": ({"fl_tuning": "units"}, 5e-3, 1),
}


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """How big the demo runs.

    Args:
        model_size: ``"tiny"``, ``"small"`` or ``"medium"`` (`MODEL_SIZES`).
        pretraining_steps: MLM and ExLM steps each (the same budget).
        sequence_length: tokens per pretraining and sentiment sequence.
        entity_length: tokens per entity sentence.
        batch_size: pretraining and fine-tuning batch size.
        epochs: sentiment fine-tuning epochs (the parameter-efficient methods
            train twice as many, see `SENTIMENT_METHODS`).
        entity_epochs: entity fine-tuning epochs (GlobalPointer's head needs
            more steps than a [CLS] classifier before it predicts spans).
        sentiment_sizes: (train, dev, test) review counts.
        entity_sizes: (train, dev, test) sentence counts.
        seeds: fine-tuning seeds per method (the mean and spread are shown).
        vocabulary_size: most frequent characters kept (plus special tokens).
        exlm_k: ExLM's states per [MASK].
        seed: the first seed, at most ``2**32 - seeds`` (every run's seed
            seeds numpy); the same seed gives the same demo.
        jit_compile: compile every step with XLA (the default). ``quick``
            turns it off on TensorFlow, where compiling tiny models takes
            longer than running them.

    Example:
    >>> DemoSettings.quick().epochs, DemoSettings().epochs, DemoSettings().entity_epochs
    (1, 3, 12)
    """

    model_size: str = "small"
    pretraining_steps: int = 250
    sequence_length: int = 64
    entity_length: int = 48
    batch_size: int = 32
    epochs: int = 3
    entity_epochs: int = 12
    sentiment_sizes: tuple = (2000, 400, 800)
    entity_sizes: tuple = (1200, 300, 500)
    seeds: int = 1
    vocabulary_size: int = 3000
    exlm_k: int = 2
    seed: int = 0
    jit_compile: bool = True

    def __post_init__(self):
        check_choice("model_size", self.model_size, sorted(MODEL_SIZES))
        check_int("pretraining_steps", self.pretraining_steps, minimum=1)
        check_int("sequence_length", self.sequence_length, minimum=16, maximum=512)
        check_int("entity_length", self.entity_length, minimum=16, maximum=512)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("epochs", self.epochs, minimum=1)
        check_int("entity_epochs", self.entity_epochs, minimum=1)
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

    @classmethod
    def quick(cls, **overrides):
        """The ``--quick`` settings: the whole pipeline on a tiny budget."""
        values = dict(
            model_size="tiny",
            pretraining_steps=60,
            sequence_length=32,
            entity_length=32,
            epochs=1,
            entity_epochs=1,
            sentiment_sizes=(256, 96, 96),
            entity_sizes=(160, 64, 64),
            vocabulary_size=1500,
            jit_compile=keras.config.backend() != "tensorflow",
        )
        values.update(overrides)
        return cls(**values)

    @property
    def architecture(self):
        """``(layers, hidden, heads, ffn)``."""
        return MODEL_SIZES[self.model_size]

    def method_switches(self, switches):
        """`finetune` switches with the size-dependent ones filled in."""
        hidden = self.architecture[1]
        sizes = {"units": hidden, "prefix": max(4, hidden // 4), "k": self.exlm_k}
        return {name: sizes.get(value, value) for name, value in switches.items()}

    def to_dict(self):
        """A JSON-ready dict."""
        return dataclasses.asdict(self)
