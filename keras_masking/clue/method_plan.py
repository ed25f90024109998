"""Which keras_masking methods a fine-tuning run applies (`MethodPlan`), refusing
combinations that make no sense before anything is read, and applying them."""

import dataclasses

import keras
import numpy as np

from keras_masking.clue.tasks import get_task
from keras_masking.utils.arguments import check_bool
from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

# The command-line names of the switches, used in messages.
_SWITCHES = "correct_embeddings drop_token asa fl_tuning prefix_tuning lora exlm_k".split()
FLAGS = {name: "--" + name.replace("_", "-") for name in _SWITCHES}
PEFT = "each freezes the backbone and trains its own parameters; a run compares one "
PEFT += "parameter-efficient method with full fine-tuning, so choose one"
# Switches that do not combine, and why.
EXCLUSIVE = (
    ("fl_tuning", "prefix_tuning", PEFT),
    ("fl_tuning", "lora", PEFT),
    ("prefix_tuning", "lora", PEFT),
    ("exlm_k", "drop_token", "the ExLM encoder expands [MASK], [CLS] and [SEP] into states "
     "with 2D positions, which DropToken's shortened sequence does not carry"),
    ("exlm_k", "correct_embeddings", "the correction undoes MLM's 80/10/10 input mismatch; an "
     "ExLM backbone is fine-tuned through its expanding encoder instead"),
    ("exlm_k", "asa", "ASA's adversaries mask the attention of a plain backbone; the expanding "
     "encoder's states are not the sequence the task model sees"),
)  # fmt: skip


@dataclasses.dataclass
class AppliedPlan:
    """The models `MethodPlan.apply` built.

    Attributes:
        encoder: the backbone (DropToken, ASA and the parameter-efficient
            methods turned on in it), or the ExLM encoder around it.
        task_model: the task model on ``encoder`` (what predicts and is saved).
        trainer: what ``fit`` trains: ASA's trainer around ``task_model``, or
            ``task_model`` itself.
        callbacks: callbacks for the first ``fit`` (the embedding correction
            when it applies as training begins).
        correction: the correction record applied while building (a dict), or None.
    """

    encoder: keras.Model
    task_model: keras.Model
    trainer: keras.Model
    callbacks: list
    correction: dict | None = None


@dataclasses.dataclass(frozen=True)
class MethodPlan:
    """The methods of a fine-tuning run.

    Args:
        correct_embeddings: bool, MLM embedding correction before training.
        drop_token: float in [0, 1), DropToken's rate (0: off).
        asa: float >= 0 or None, ASA's tau (None: off).
        fl_tuning: int >= 0, FL-tuning's addFFN units (0: off).
        prefix_tuning: int >= 0, P-tuning v2's prefix length (0: off).
        lora: int >= 0, LoRA's rank (keras-hub's ``enable_lora``; 0: off).
        exlm_k: int >= 0, states per [MASK] of an ExLM-pretrained backbone
            (0: a plain backbone).

    Example:
    >>> plan = MethodPlan(drop_token=0.1, fl_tuning=160)
    >>> plan.active()
    ['drop_token', 'fl_tuning']
    >>> MethodPlan(exlm_k=4, drop_token=0.1).check("tnews")
    Traceback (most recent call last):
    ...
    ValueError: --exlm-k and --drop-token do not combine: ...
    """

    correct_embeddings: bool = False
    drop_token: float = 0.0
    asa: float | None = None
    fl_tuning: int = 0
    prefix_tuning: int = 0
    lora: int = 0
    exlm_k: int = 0

    def __post_init__(self):
        set_value = object.__setattr__
        correct = check_bool("correct_embeddings", self.correct_embeddings)
        set_value(self, "correct_embeddings", correct)
        drop = check_float("drop_token", self.drop_token, 0.0, 1.0, open_maximum=True)
        set_value(self, "drop_token", drop)
        if self.asa is not None:
            set_value(self, "asa", check_float("asa", self.asa, minimum=0.0))
        for name in ("fl_tuning", "prefix_tuning", "lora", "exlm_k"):
            set_value(self, name, check_int(name, getattr(self, name), minimum=0))

    def active(self):
        """The names of the methods that are on."""
        return [name for name in FLAGS if self.is_on(name)]

    def is_on(self, name):
        """Whether the method ``name`` (a field of this plan) is on."""
        value = getattr(self, name)  # ASA's tau 0 is ASA without the mask penalty: on
        return value is not None if name == "asa" else bool(value)

    def check(self, task):
        """Refuses combinations that make no sense for ``task``.

        Args:
            task: a `ClueTask` or task name.

        Raises:
            ValueError: naming both switches (or the switch and the task)
                and the reason.
        """
        task = get_task(task)
        for first, second, reason in EXCLUSIVE:
            if self.is_on(first) and self.is_on(second):
                raise ValueError(f"{FLAGS[first]} and {FLAGS[second]} do not combine: {reason}.")
        if self.is_on("asa") and task.kind == "entity":
            raise ValueError(
                f"--asa does not apply to {task.name}: ASA's divergence compares two "
                "distributions, and GlobalPointer's entity scores are independent binary "
                "decisions, not a distribution."
            )

    def drop_token_mode(self, task):
        """DropToken's mode for ``task``: ``"gather"`` unless a token-level
        output or ASA needs every position (``"attention"``)."""
        task = get_task(task)
        return "attention" if self.asa is not None or task.kind in ("span", "entity") else "gather"

    def describe(self):
        """A JSON-ready dict of the switches."""
        return dataclasses.asdict(self)

    def check_source(self, source):
        """Refuses a method the model cannot take, before anything is written.

        ``exlm_k`` needs an ExLM-pretrained backbone (2D rotary positions of
        its own); the other methods take any BERT-family backbone.

        Args:
            source: the run's `ModelSource`.

        Example:
        ```python
        from keras_masking.clue.model_source import ModelSource

        backbone.save_to_preset("my_preset")
        MethodPlan(fl_tuning=8).check_source(ModelSource(preset="my_preset"))  # any backbone
        ```
        """
        if not self.exlm_k:
            return
        position, custom = source.position_scheme()
        if position != "rotary2d" or not custom:
            raise ValueError(
                f"--exlm-k needs an ExLM-pretrained backbone (position='rotary2d' with "
                f"custom_position_ids=True); this model has position={position!r}."
            )

    def apply(self, backbone, task, tokenizer, build_head, seed=0, correct_now=False,
              token_ids=()):  # fmt: skip
        """Applies the methods to ``backbone`` and builds the models to train.

        In order: the embedding correction (now, or as a callback of the first
        ``fit``), FL-tuning / P-tuning v2 / LoRA on the backbone, the encoder
        (DropToken or ExLM) around it, the task model and ASA's trainer.

        Args:
            backbone: a `TransformerBackbone`.
            task: a `ClueTask` or task name.
            tokenizer: the run's keras-hub `BertTokenizer`.
            build_head: a callable taking the encoder, returning the task model.
            seed: the seed of DropToken's and ASA's draws.
            correct_now: correct the embeddings while building (a resumed
                run) rather than when training begins.
            token_ids: the encoded token id arrays of every split (ExLM makes
                room for the most [CLS] / [SEP] / [MASK] one row holds).

        Returns:
            An `AppliedPlan`.

        Example:
        ```python
        from keras_masking.clue import build_task_model, task_loss

        tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tokenizer = keras_masking.data.bert_tokenizer(tokens + [f"t{i}" for i in range(123)])
        applied = MethodPlan(fl_tuning=8).apply(
            backbone, "tnews", tokenizer, lambda e: build_task_model("tnews", e, max_length=8)
        )
        applied.trainer.compile(optimizer="adam", loss=task_loss("tnews"))  # addFFN and head train
        ```
        """
        import keras_masking
        from keras_masking.methods import ASATrainer

        task = get_task(task)
        callbacks, correction = [], None
        if self.correct_embeddings:
            settings = dict(
                mask_token_id=tokenizer.mask_token_id,
                unselectable_token_ids=tokenizer.special_token_ids,
            )
            if correct_now:
                record = keras_masking.correct_mlm_embeddings(backbone, **settings)
                correction = None if record is None else record.to_config()
            else:
                callbacks.append(keras_masking.callbacks.MLMEmbeddingCorrection(**settings))
        if self.fl_tuning:
            backbone.enable_fl_tuning(self.fl_tuning)
        if self.prefix_tuning:
            backbone.enable_prefix_tuning(self.prefix_tuning)
        if self.lora:
            backbone.enable_lora(self.lora)
        if task.kind in ("span", "entity") and backbone.pooled_dense is not None:
            backbone.pooled_dense.trainable = False  # token-level heads never read the pooler
        special = (tokenizer.cls_token_id, tokenizer.sep_token_id)
        encoder = backbone
        if self.drop_token:
            # The backbone outputs ``token_mask``: `MethodEvidence` measures the drop share.
            backbone.enable_drop_token(self.drop_token, unselectable_token_ids=special,
                                       mode=self.drop_token_mode(task), seed=seed)  # fmt: skip
        elif self.exlm_k:
            expanded = special + (tokenizer.mask_token_id,)
            counts = [int(np.isin(ids, expanded).sum(axis=-1).max()) for ids in token_ids]
            encoder = keras_masking.models.ExLMEncoder(
                backbone,
                k=self.exlm_k,
                mask_token_id=tokenizer.mask_token_id,
                unselectable_token_ids=special,
                max_expanded_tokens=max([1, *counts]),
                objective="exlm",  # [CLS]/[SEP] at (index, 1..k), as pretraining saw them, k=1 too
            )
        task_model = build_head(encoder)
        trainer = task_model
        if self.asa is not None:
            # After the head: its initial weights are drawn first, as a run of
            # ASATrainer's own adversaries drew them.
            backbone.enable_asa(tau=self.asa, seed=seed)
            divergence = (
                keras_masking.losses.span_position_divergence if task.kind == "span" else None
            )
            trainer = ASATrainer(task_model, divergence=divergence)
        return AppliedPlan(encoder, task_model, trainer, callbacks, correction)
