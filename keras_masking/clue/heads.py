"""Task models for every CLUE task kind, on any encoder of the package, and their
losses: one functional model with ONE logits output, so `ASATrainer` wraps it."""

import functools

import keras

from keras_masking.clue.encoding import DEFAULT_NUM_CHOICES
from keras_masking.clue.tasks import get_task
from keras_masking.distribution import ReplicaDropout
from keras_masking.layers import ChoiceLogits
from keras_masking.layers import FlattenChoices
from keras_masking.layers import GlobalPointer
from keras_masking.layers import MaskedSpanLogits
from keras_masking.losses import MultilabelCategoricalCrossentropy
from keras_masking.losses import SpanCrossentropy
from keras_masking.utils.arguments import check_int

_SEQUENCE_INPUTS = ("token_ids", "segment_ids", "padding_mask")
_OPTIONS = {
    "classification": {"dropout"},
    "multiple_choice": {"dropout", "num_choices"},
    "idiom": {"dropout", "num_choices"},
    "span": set(),
    "entity": {"head_size", "use_rotary"},
}


def build_task_model(task, encoder, num_labels=None, max_length=None, **options):
    """The model of a CLUE task: an encoder and the head of the task's kind.

    Heads (bert4keras' CLUE baselines):

    * classification: pooled [CLS] -> Dropout -> Dense(``num_labels``),
      logits ``(batch, num_labels)``;
    * multiple_choice (C3) and idiom (CHID, candidates as choices): inputs
      ``(batch, choices, length)`` are scored as ``batch * choices``
      sequences, pooled -> Dropout -> Dense(1) -> ``(batch, choices)``, the
      padded choices (``choice_mask`` 0) at ``-1e9`` (probability exactly 0);
    * span (CMRC2018): sequence -> Dense(2) -> ``(batch, length, 2)`` start
      and end logits, ``-1e9`` but on [CLS] (the no-answer target) and the
      context's segment (segment 1, its [SEP] included);
    * entity (CLUENER): `GlobalPointer` scores ``(batch, types, length,
      length)``, float32.

    Every kind's logits are computed in float32 (the last Dense, or
    GlobalPointer's scores after its projection), under mixed precision too. An
    `ExLMEncoder` expands every [CLS] / [SEP] / [MASK]: give it a large
    enough ``max_expanded_tokens`` (C3 rows have four, CHID rows [MASK]s).

    Args:
        task: a `ClueTask` or a task name.
        encoder: any layer taking the input dict and returning
            ``sequence_output`` and ``pooled_output`` (a `TransformerBackbone`
            or an `ExLMEncoder`).
        num_labels: classification: the number of classes (default: the
            task's labels; required for csldcp); entity: the number of types
            (default: the task's). Unused by the other kinds.
        max_length: int or None, the static sequence length of the inputs.
        **options: ``dropout`` (0.1; classification, multiple choice,
            idiom), ``num_choices`` (4 for C3, 10 for CHID), ``head_size``
            (64) and ``use_rotary`` (True) for entities, ``name``.

    Returns:
        A functional `keras.Model`; inputs ``token_ids``, ``segment_ids``,
        ``padding_mask`` ``(batch, length)`` (``(batch, choices, length)``
        plus ``choice_mask`` ``(batch, choices)`` for multiple choice and
        idiom); one float32 logits output.

    Raises:
        ValueError: an unknown option; no label count for a task without
            labels; an encoder that needs inputs the task model does not have.

    Example:
    ```python
    backbone = keras_masking.models.TransformerBackbone(
        vocabulary_size=128, num_layers=2, num_heads=4, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=32,
    )
    model = build_task_model("c3", backbone, max_length=32)
    model.compile(optimizer="adam", loss=task_loss("c3"))
    logits = model({
        "token_ids": np.full((2, 4, 32), 5, "int32"),
        "segment_ids": np.zeros((2, 4, 32), "int32"),
        "padding_mask": np.ones((2, 4, 32), "int32"),
        "choice_mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], "int32"),
    })  # (2, 4), the padded choices at -1e9: probability 0
    ```
    """
    task = get_task(task)
    name = options.pop("name", f"{task.name}_model")
    unknown = sorted(set(options) - _OPTIONS[task.kind])
    if unknown:
        raise ValueError(
            f"Unknown options {unknown} for the {task.kind} task {task.name!r}; expected some "
            f"of {sorted(_OPTIONS[task.kind])} (and name)."
        )
    if max_length is not None:
        check_int("max_length", max_length, minimum=2)
    wanted = _encoder_inputs(encoder)
    dropout = options.get("dropout", 0.1)
    if task.kind in ("multiple_choice", "idiom"):
        num_choices = options.get("num_choices", DEFAULT_NUM_CHOICES[task.kind])
        check_int("num_choices", num_choices, minimum=1)
        inputs = _inputs((num_choices, max_length))
        inputs["choice_mask"] = keras.Input((num_choices,), dtype="int32", name="choice_mask")
        flatten = FlattenChoices(name="flatten_choices")
        flat = {key: flatten(inputs[key]) for key in _SEQUENCE_INPUTS}
        pooled = encoder({key: flat[key] for key in wanted})["pooled_output"]
        pooled = ReplicaDropout(dropout, name="choice_dropout")(pooled)
        scores = keras.layers.Dense(1, dtype="float32", name="choice_score")(pooled)
        logits = ChoiceLogits(name="choice_logits")(scores, inputs["choice_mask"])
        return keras.Model(inputs, logits, name=name)
    inputs = _inputs((max_length,))
    outputs = encoder({key: inputs[key] for key in wanted})
    if task.kind == "classification":
        if num_labels is None:
            if not task.labels:
                raise ValueError(
                    f"Task {task.name!r} has no fixed labels: pass num_labels (e.g. "
                    "len(train_split.labels))."
                )
            num_labels = len(task.labels)
        check_int("num_labels", num_labels, minimum=1)
        pooled = ReplicaDropout(dropout, name="classifier_dropout")(outputs["pooled_output"])
        logits = keras.layers.Dense(num_labels, dtype="float32", name="logits")(pooled)
    elif task.kind == "span":
        span = keras.layers.Dense(2, dtype="float32", name="span_logits")
        logits = span(outputs["sequence_output"])
        logits = MaskedSpanLogits(name="context_logits")(
            logits, inputs["segment_ids"], inputs["padding_mask"]
        )
    else:  # entity
        num_types = len(task.labels) if num_labels is None else num_labels
        check_int("num_labels", num_types, minimum=1)
        pointer = GlobalPointer(
            num_types,
            head_size=options.get("head_size", 64),
            use_rotary=options.get("use_rotary", True),
            name="global_pointer",
        )
        logits = pointer(outputs["sequence_output"], inputs["padding_mask"])
    return keras.Model(inputs, logits, name=name)


def task_loss(task):
    """The loss a task's model is trained with.

    Args:
        task: a `ClueTask` or a task name.

    Returns:
        classification, multiple choice, idiom: sparse categorical
        cross-entropy on logits; span: `SpanCrossentropy`; entity:
        `MultilabelCategoricalCrossentropy` (GlobalPointer's).

    Example:
    >>> type(task_loss("cluener")).__name__
    'MultilabelCategoricalCrossentropy'
    """
    losses = {"span": SpanCrossentropy, "entity": MultilabelCategoricalCrossentropy}
    sparse = functools.partial(keras.losses.SparseCategoricalCrossentropy, from_logits=True)
    return losses.get(get_task(task).kind, sparse)()


def _inputs(shape):
    return {key: keras.Input(shape, dtype="int32", name=key) for key in _SEQUENCE_INPUTS}


def _encoder_inputs(encoder):
    """The input names the encoder takes (all three for a subclassed encoder)."""
    if not callable(encoder):
        raise ValueError(f"Expected an encoder layer or model. Received: encoder={encoder!r:.80}.")
    try:
        spec = encoder.input
    except (AttributeError, ValueError):  # a subclassed model (ExLMEncoder) takes the dict
        return _SEQUENCE_INPUTS
    if not isinstance(spec, dict):
        raise ValueError(
            "Expected an encoder whose input is a dict of token_ids / segment_ids / "
            f"padding_mask. Received an encoder with input {spec!r:.120}."
        )
    extra = sorted(set(spec) - set(_SEQUENCE_INPUTS))
    if extra:
        raise ValueError(
            f"The encoder needs the inputs {extra}, which CLUE task models do not feed "
            "(they feed token_ids, segment_ids, padding_mask). For an ExLM-pretrained "
            "rotary2d backbone use keras_masking.models.ExLMEncoder(backbone)."
        )
    return tuple(key for key in _SEQUENCE_INPUTS if key in spec)
