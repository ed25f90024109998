"""Model outputs -> predictions per example id, and scoring them with CLUE's metric.

`decode_predictions` turns a task model's logits on an `EncodedSplit` into
what `write_submission` writes; `score` compares predictions with a
labelled split's records.
"""

import numpy as np

from keras_masking.clue.examples import RECORD_TYPES
from keras_masking.clue.metrics import accuracy
from keras_masking.clue.metrics import cluener_scores
from keras_masking.clue.metrics import cmrc2018_scores
from keras_masking.clue.metrics import entity_f1
from keras_masking.clue.tasks import get_task
from keras_masking.utils.arguments import check_int

_MAX_JOINT_CANDIDATES = 20


def decode_predictions(task, outputs, encoded, examples, **options):
    """Predictions per example id from a task model's outputs.

    Args:
        task: a `ClueTask` or a task name.
        outputs: the model's logits for every row of ``encoded``, in order:
            one array, or an iterable of per-batch arrays (so entity scores,
            ``(rows, types, length, length)``, need not be held at once).
        encoded: the `EncodedSplit` the outputs were computed on.
        examples: the records ``encoded`` was made from.
        **options: span: ``max_answer_length`` (tokens; default the one
            recorded at encoding).

    Returns:
        A dict id -> prediction: classification the label STRING;
        multiple_choice the choice index; idiom per BLANK id the candidate
        index (a passage's blanks take distinct candidates, `joint_assignment`
        of the log-probabilities); span the answer text (the best ``start +
        end`` logit over all windows, starting only where the window has the
        token's most context, as BERT's ``run_squad.py``); entity a sorted
        list of ``(type, start, end)`` (end inclusive, characters) for every
        pair of text tokens scored > 0.

    Raises:
        ValueError: outputs of the wrong shape or row count, or examples that
            do not match ``encoded``.

    Example:
    >>> from keras_masking.clue.encoding import EncodedSplit
    >>> encoded = EncodedSplit(
    ...     {"token_ids": np.zeros((2, 4), "int32")}, None,
    ...     {"kind": "classification", "ids": [7, 8], "example_index": [0, 1],
    ...      "label_names": ("Negative", "Positive")})
    >>> decode_predictions("eprstmt", np.array([[0.1, 2.0], [1.0, -1.0]]), encoded, [None, None])
    {7: 'Positive', 8: 'Negative'}
    """
    task = get_task(task)
    unknown = sorted(set(options) - ({"max_answer_length"} if task.kind == "span" else set()))
    if unknown:
        raise ValueError(
            f"Unknown options {unknown} for decoding the {task.kind} task {task.name!r}."
        )
    meta = encoded.meta
    if meta.get("kind") != task.kind:
        raise ValueError(
            f"The encoded split is of kind {meta.get('kind')!r}; task {task.name!r} is "
            f"{task.kind!r}. Encode the split for this task."
        )
    examples = list(examples)
    rows = len(meta["ids"])
    count = max(meta["example_index"]) + 1 if meta["example_index"] else 0
    if len(examples) != count:
        raise ValueError(
            f"{len(examples)} examples for an encoded split made from {count}; pass the "
            "records the split was encoded from."
        )
    if task.kind == "entity":
        return _decode_entities(outputs, encoded, rows)
    outputs = np.concatenate(_batches(outputs), axis=0)
    _check_rows(len(outputs), rows)
    if task.kind == "classification":
        names = meta["label_names"]
        _check_shape(outputs, (rows, len(names)), "(rows, num_labels)")
        return {key: names[int(i)] for key, i in zip(meta["ids"], np.argmax(outputs, -1))}
    if task.kind == "multiple_choice":
        valid = encoded.features["choice_mask"].astype(bool)
        _check_shape(outputs, valid.shape, "(rows, choices)")
        picked = np.argmax(np.where(valid, outputs, -np.inf), axis=-1)
        return {key: int(i) for key, i in zip(meta["ids"], picked)}
    if task.kind == "idiom":
        return _decode_idioms(outputs, encoded)
    length = options.get("max_answer_length", meta["max_answer_length"])  # span, the last kind
    length = check_int("max_answer_length", length, minimum=1)
    return _decode_spans(outputs, encoded, examples, length)


def joint_assignment(scores):
    """The rows' columns, all different, that maximise the summed scores: exactly.

    A dynamic programme over the subsets of columns used so far (the best
    total of rows ``0..k`` per subset), traced back from the best final
    subset: ``rows * columns * 2**columns`` steps; CHID has at most 10
    candidates.

    Args:
        scores: float array ``(rows, columns)``, ``rows <= columns <= 20``
            (CHID: the log-probabilities of each blank's candidates).

    Returns:
        A list of column indices, one per row, all distinct.

    Raises:
        ValueError: more rows than columns, or more than 20 columns.

    Example:
    >>> scores = np.log(np.array([[0.6, 0.4], [0.9, 0.1]]))  # both rows prefer column 0
    >>> joint_assignment(scores)  # 0.4 * 0.9 > 0.6 * 0.1
    [1, 0]
    """
    scores = np.asarray(scores, "float64")
    rows, columns = scores.shape
    if rows > columns or columns > _MAX_JOINT_CANDIDATES:
        raise ValueError(
            f"joint_assignment needs rows <= columns <= {_MAX_JOINT_CANDIDATES}. Received "
            f"scores of shape {scores.shape}."
        )
    if rows == 0:
        return []
    subsets = np.arange(1 << columns)
    best = np.full(1 << columns, -np.inf)
    best[0] = 0.0
    choices = np.zeros((rows, 1 << columns), "int8")
    for row in range(rows):
        totals = np.full((columns, 1 << columns), -np.inf)
        for column in range(columns):
            bit = 1 << column
            holding = subsets[(subsets & bit) != 0]
            totals[column, holding] = best[holding ^ bit] + scores[row, column]
        choices[row] = np.argmax(totals, axis=0)
        best = totals.max(axis=0)
    subset = int(np.argmax(best))
    picked = []
    for row in reversed(range(rows)):
        column = int(choices[row, subset])
        picked.append(column)
        subset ^= 1 << column
    return picked[::-1]


def score(task, predictions, examples):
    """Scores predictions against a labelled split with the task's CLUE metric.

    Every value is a PERCENTAGE (``x 100``), the scale of CLUE's leaderboard.

    Args:
        task: a `ClueTask` or a task name.
        predictions: dict id -> prediction, as `decode_predictions` returns
            (idiom: keyed by blank id).
        examples: the split's labelled records.

    Returns:
        A dict with ``score`` (accuracy; CLUENER's official `cluener_scores`
        macro F1; CMRC2018's EM, as CLUE ranks them), ``metric`` (its name)
        and the metric's parts: accuracy ``accuracy``, ``total``; cluener
        ``macro_f1``, ``per_type`` and the span-exact `entity_f1` scores
        ``span_f1``, ``span_precision``, ``span_recall``,
        ``true_positives``, ``predicted``, ``gold``; cmrc2018 ``em``,
        ``f1``, ``total``, ``missing``.

    Raises:
        ValueError: unlabelled examples, or records of another kind.

    Example:
    >>> from keras_masking.clue.examples import ChoiceExample
    >>> examples = [ChoiceExample("q1", "", "", ("a", "b"), 1)]
    >>> examples.append(ChoiceExample("q2", "", "", ("a", "b"), 0))
    >>> score("c3", {"q1": 1, "q2": 1}, examples)
    {'score': 50.0, 'metric': 'accuracy', 'accuracy': 50.0, 'total': 2}
    """
    task = get_task(task)
    gold = _gold(task, list(examples))
    if task.metric == "cmrc2018":
        parts = cmrc2018_scores(predictions, gold)
        return {"score": parts["em"], "metric": task.metric, **parts}
    if task.metric == "cluener":
        return _cluener_score(task, predictions, list(examples), gold)
    value = 100.0 * accuracy(predictions, gold)
    return {"score": value, "metric": "accuracy", "accuracy": value, "total": len(gold)}


def _cluener_score(task, predictions, examples, gold):
    """CLUENER's official score (by entity text) with the span-exact one beside it."""
    spans = entity_f1(predictions, gold, types=task.labels)
    texts = {example.id: example.text for example in examples}

    def by_text(entities_by_id):
        return {
            key: [(kind, texts[key][start : end + 1]) for kind, start, end in entities]
            for key, entities in entities_by_id.items()
        }

    official = cluener_scores(by_text(predictions), by_text(gold), types=task.labels)
    per_type = {
        name: {key: (100.0 * v if key != "support" else v) for key, v in values.items()}
        for name, values in official["per_type"].items()
    }
    value = 100.0 * official["macro_f1"]
    return {
        "score": value,
        "metric": task.metric,
        "macro_f1": value,
        "per_type": per_type,
        **{f"span_{key}": 100.0 * spans[key] for key in ("f1", "precision", "recall")},
        **{key: spans[key] for key in ("true_positives", "predicted", "gold")},
    }


# === Per kind ===
def _decode_idioms(outputs, encoded):
    meta = encoded.meta
    valid = encoded.features["choice_mask"].astype(bool)
    _check_shape(outputs, valid.shape, "(rows, choices)")
    by_passage = {}
    for row, passage in enumerate(meta["example_index"]):
        by_passage.setdefault(passage, []).append(row)
    predictions = {}
    for rows in by_passage.values():
        count = meta["num_candidates"][rows[0]]
        logits = np.asarray(outputs[rows, :count], "float64")
        peak = logits.max(axis=-1, keepdims=True)
        log_probabilities = logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
        picked = joint_assignment(log_probabilities)
        predictions.update({meta["ids"][row]: column for row, column in zip(rows, picked)})
    return predictions


def _decode_spans(outputs, encoded, examples, max_answer_length):
    meta = encoded.meta
    offsets = meta["offsets"]
    _check_shape(outputs, offsets.shape[:2] + (2,), "(windows, length, 2)")
    max_context = meta.get("max_context")
    best = {}  # example index -> (score, start char, end char)
    for window, index in enumerate(meta["example_index"]):
        starts = None if max_context is None else max_context[window]
        found = _best_span(outputs[window], offsets[window], max_answer_length, starts)
        if found is not None and (index not in best or found[0] > best[index][0]):
            best[index] = found
    predictions = {}
    for index, example in enumerate(examples):
        _, start, end = best.get(index, (None, 0, 0))
        predictions[example.id] = example.context[start:end]
    return predictions


def _best_span(logits, offsets, max_answer_length, allowed_starts=None):
    """``(score, start, end)`` of the best span starting in ``allowed_starts``, or None."""
    valid = _holds_text(offsets)
    start_valid = valid if allowed_starts is None else valid & np.asarray(allowed_starts, bool)
    if not start_valid.any():
        return None
    starts = np.where(start_valid, logits[:, 0].astype("float64"), -np.inf)
    ends = np.where(valid, logits[:, 1].astype("float64"), -np.inf)
    length = len(starts)
    best = (-np.inf, None, None)
    for width in range(min(max_answer_length, length)):
        totals = starts[: length - width] + ends[width:]
        i = int(np.argmax(totals))
        if totals[i] > best[0]:
            best = (float(totals[i]), i, i + width)
    if best[1] is None:
        return None
    _, i, j = best
    return best[0], int(offsets[i, 0]), int(offsets[j, 1])


def _holds_text(offsets):
    """Tokens that cover characters: not [CLS], [SEP], padding (offsets -1), nor
    a zero-width piece (SentencePiece's leading "▁", offsets ``(0, 0)``)."""
    return (offsets[..., 0] >= 0) & (offsets[..., 1] > offsets[..., 0])


def _decode_entities(outputs, encoded, rows):
    meta = encoded.meta
    offsets, types = meta["offsets"], meta["entity_types"]
    predictions, row = {}, 0
    for batch in _batches(outputs):
        if (
            batch.ndim != 4
            or batch.shape[1] != len(types)
            or batch.shape[2:] != offsets.shape[1:2] * 2
        ):
            raise ValueError(
                f"Expected entity scores (rows, {len(types)}, {offsets.shape[1]}, "
                f"{offsets.shape[1]}). Received a batch of shape {batch.shape}."
            )
        for scores in batch:
            if row >= rows:
                raise ValueError(f"outputs has more rows than the encoded split's {rows}.")
            text = _holds_text(offsets[row])
            found = [
                (types[kind], int(offsets[row, i, 0]), int(offsets[row, j, 1]) - 1)
                for kind, i, j in np.argwhere(scores > 0)
                if i <= j and text[i] and text[j]
            ]
            predictions[meta["ids"][row]] = sorted(found, key=lambda e: (e[1], e[2], e[0]))
            row += 1
    _check_rows(row, rows)
    return predictions


def _gold(task, examples):
    record = RECORD_TYPES[task.kind]
    field = {"idiom": "labels", "span": "answers", "entity": "entities"}.get(task.kind, "label")
    for example in examples:
        if not isinstance(example, record):
            raise ValueError(
                f"Task {task.name!r} is scored on {record.__name__} records. Received: "
                f"{type(example).__name__} (id {getattr(example, 'id', None)!r})."
            )
        if getattr(example, field) is None:
            raise ValueError(
                f"Example {example.id!r} has no gold {field!r}: an unlabelled split cannot be "
                "scored."
            )
    if task.kind == "idiom":
        return {
            blank: label
            for passage in examples
            for blank, label in zip(passage.blank_ids, passage.labels)
        }
    return {example.id: getattr(example, field) for example in examples}


def _batches(outputs):
    """``outputs`` (one array or an iterable of per-batch arrays) as a list of arrays."""
    if hasattr(outputs, "shape"):
        return [np.asarray(outputs)]
    return [np.asarray(batch) for batch in outputs]


def _check_rows(found, rows):
    if found != rows:
        raise ValueError(
            f"outputs has {found} rows; the encoded split has {rows}. Pass the model's outputs "
            "for every row, in order."
        )


def _check_shape(outputs, shape, what):
    if tuple(outputs.shape) != tuple(shape):
        raise ValueError(
            f"Expected outputs of shape {what} = {tuple(shape)}. Received {outputs.shape}."
        )
