"""Which keras_masking methods a fine-tuning run applies, checked before loading.

`MethodPlan` holds the method switches of a run (the embedding correction,
DropToken, ASA, FL-tuning, P-tuning v2, LoRA, ExLM). `check(task)` refuses a
combination that does not make sense before anything is read, naming both
switches and the reason; the other methods then apply in a fixed order:
correction and parameter-efficient tuning on the backbone, the encoder
(DropToken or ExLM) around it, the task head, and ASA as the trainer.
"""

import dataclasses

from keras_masking.utils.arguments import check_float
from keras_masking.utils.arguments import check_int

# The command-line names of the switches, used in messages.
FLAGS = {
    "correct_embeddings": "--correct-embeddings",
    "drop_token": "--drop-token",
    "asa": "--asa",
    "fl_tuning": "--fl-tuning",
    "prefix_tuning": "--prefix-tuning",
    "lora": "--lora",
    "exlm_k": "--exlm-k",
}
TUNING = ("fl_tuning", "prefix_tuning", "lora")


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
        if not isinstance(self.correct_embeddings, bool):
            raise ValueError(
                "Expected True or False for correct_embeddings. "
                f"Received: correct_embeddings={self.correct_embeddings!r}."
            )
        set_value = object.__setattr__
        set_value(
            self,
            "drop_token",
            check_float("drop_token", self.drop_token, 0.0, 1.0, open_maximum=True),
        )
        if self.asa is not None:
            set_value(self, "asa", check_float("asa", self.asa, minimum=0.0))
        for name in ("fl_tuning", "prefix_tuning", "lora", "exlm_k"):
            set_value(self, name, check_int(name, getattr(self, name), minimum=0))

    def active(self):
        """The names of the methods that are on."""
        return [name for name in FLAGS if self.is_on(name)]

    def is_on(self, name):
        """Whether the method ``name`` (a field of this plan) is on."""
        value = getattr(self, name)
        if name == "asa":
            return value is not None  # tau 0 is ASA without the mask penalty
        return bool(value)

    def check(self, task):
        """Refuses combinations that make no sense for ``task``.

        Args:
            task: a `ClueTask` or task name.

        Raises:
            ValueError: naming both switches (or the switch and the task)
                and the reason.
        """
        from keras_masking.clue.tasks import get_task

        task = get_task(task)
        on = set(self.active())
        tuning = [name for name in TUNING if name in on]
        if len(tuning) > 1:
            _refuse(
                tuning[0],
                tuning[1],
                "each freezes the backbone and trains its own parameters; a run compares one "
                "parameter-efficient method with full fine-tuning, so choose one",
            )
        if "exlm_k" in on:
            if "drop_token" in on:
                _refuse(
                    "exlm_k",
                    "drop_token",
                    "the ExLM encoder expands [MASK], [CLS] and [SEP] into states with 2D "
                    "positions, which DropToken's shortened sequence does not carry",
                )
            if "correct_embeddings" in on:
                _refuse(
                    "exlm_k",
                    "correct_embeddings",
                    "the correction undoes MLM's 80/10/10 input mismatch; an ExLM backbone "
                    "is fine-tuned through its expanding encoder instead",
                )
            if "asa" in on:
                _refuse(
                    "exlm_k",
                    "asa",
                    "ASA's adversaries mask the attention of a plain backbone; the expanding "
                    "encoder's states are not the sequence the task model sees",
                )
        if "asa" in on and task.kind == "entity":
            raise ValueError(
                f"--asa does not apply to {task.name}: ASA's divergence compares two "
                "distributions, and GlobalPointer's entity scores are independent binary "
                "decisions, not a distribution."
            )

    def drop_token_mode(self, task):
        """DropToken's mode for ``task``: ``"gather"`` unless a token-level
        output or ASA needs every position (``"attention"``)."""
        from keras_masking.clue.tasks import get_task

        task = get_task(task)
        if self.asa is not None or task.kind in ("span", "entity"):
            return "attention"
        return "gather"

    def describe(self):
        """A JSON-ready dict of the switches."""
        return dataclasses.asdict(self)


def _refuse(first, second, reason):
    raise ValueError(f"{FLAGS[first]} and {FLAGS[second]} do not combine: {reason}.")
