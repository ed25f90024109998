"""CLUE's metrics as plain functions: accuracy, CLUENER's official score and
span-exact entity F1, CMRC2018 EM / F1.

Predictions and gold answers are dicts keyed by example id; the gold dict
says which examples are scored (a missing prediction counts as wrong).
Scales: `accuracy`, `cluener_scores` and `entity_f1` return fractions in
``[0, 1]``; `cmrc2018_scores` returns percentages (``x 100``) as CMRC2018's
official evaluation script prints them.
"""

import collections
import re

from keras_masking.clue.tasks import CLUENER_TYPES


def accuracy(predictions, gold):
    """The fraction of examples whose prediction equals the gold label.

    Args:
        predictions: dict id -> predicted label (a label string, a choice or
            candidate index), or a sequence aligned with ``gold``.
        gold: dict id -> gold label, or a sequence of the same length as
            ``predictions``. Every gold example is scored; an id without a
            prediction counts as wrong.

    Returns:
        A float in ``[0, 1]``.

    Raises:
        ValueError: no gold examples; predictions for ids that are not in
            ``gold`` (some are named); sequences of different lengths.

    Example:
    >>> accuracy({"a": "1", "b": "0", "c": "1"}, {"a": "1", "b": "1", "c": "1"})
    0.6666666666666666
    >>> accuracy({"a": 2}, {"a": 2, "b": 0})  # "b" has no prediction: wrong
    0.5
    """
    predictions, gold = _aligned("accuracy", predictions, gold)
    correct = sum(
        1 for key, label in gold.items() if key in predictions and predictions[key] == label
    )
    return correct / len(gold)


def entity_f1(predicted, gold, types=None):
    """Entity-level precision, recall and F1 over exact (type, start, end) matches.

    Stricter than CLUENER's official `cluener_scores`, which compares entity
    texts. Each example's entities are a set (a duplicate counts once). A
    score whose denominator is 0 is 0.

    Args:
        predicted: dict id -> iterable of ``(type, start, end)`` (end
            inclusive, as CLUENER writes it). A missing id predicts nothing.
        gold: dict id -> iterable of ``(type, start, end)``; its ids are the
            examples scored.
        types: optional iterable of entity types always listed in
            ``per_type`` (with zeros and ``support`` 0 when absent).

    Returns:
        A dict: ``f1``, ``precision``, ``recall`` (micro, in ``[0, 1]``),
        ``true_positives``, ``predicted``, ``gold`` (entity counts),
        ``per_type`` (type -> ``{"f1", "precision", "recall", "support"}``,
        support = gold entities of the type) and ``macro_f1`` (the mean
        per-type F1 over the types found in the gold or the predictions).

    Raises:
        ValueError: predictions for ids not in ``gold``; an entity that is
            not a ``(type, start, end)`` triple (the id is named).

    Example:
    >>> gold = {"s1": [("name", 0, 1), ("address", 4, 6)]}
    >>> predicted = {"s1": [("name", 0, 1), ("address", 4, 5)]}
    >>> scores = entity_f1(predicted, gold)
    >>> scores["f1"], scores["per_type"]["name"]["f1"], scores["macro_f1"]
    (0.5, 1.0, 0.5)
    """
    predicted, gold = _aligned("entity_f1", predicted, gold)
    counts = _type_counts("entity_f1", predicted, gold)
    seen = sorted(counts)
    names = dict.fromkeys([*(types if types is not None else ()), *seen])
    per_type = _per_type(counts, names)
    true_positives, num_predicted, num_gold = (sum(c[i] for c in counts.values()) for i in range(3))
    macro = [per_type[name]["f1"] for name in seen]
    return dict(
        _precision_recall_f1(true_positives, num_predicted, num_gold),
        true_positives=true_positives,
        predicted=num_predicted,
        gold=num_gold,
        per_type=per_type,
        macro_f1=sum(macro) / len(macro) if macro else 0.0,
    )


def cluener_scores(predicted, gold, types=None):
    """CLUENER2020's official score: per-type F1 over entity TEXTS, averaged.

    As CLUENER2020's ``score.py`` (the leaderboard's "Overall@Macro"): per
    sentence and type, the predicted entity texts are compared with the
    gold ones as sets of strings, wherever they sit in the sentence;
    precision, recall and F1 are pooled per type over all sentences and
    averaged over the types. A type with neither gold nor predicted
    entities is left out of the mean (``score.py`` divides by zero there),
    so data tagged with fewer types is not diluted by empty ones.

    Args:
        predicted: dict id -> iterable of ``(type, text)`` pairs. A missing
            id predicts nothing.
        gold: dict id -> iterable of ``(type, text)``; its ids are the
            sentences scored.
        types: the types to average over (default: CLUENER's ten).

    Returns:
        A dict: ``macro_f1`` (in ``[0, 1]``; 0 when nothing is to be found
        and nothing is predicted) and ``per_type`` (every type ->
        ``{"f1", "precision", "recall", "support"}``, support = gold
        entity texts of the type).

    Raises:
        ValueError: predictions for ids not in ``gold``; an entity that is
            not a ``(type, text)`` pair (the id is named).

    Example:
    >>> gold = {"s1": [("name", "张三"), ("address", "北京")]}
    >>> predicted = {"s1": [("name", "张三"), ("address", "北京市")]}
    >>> scores = cluener_scores(predicted, gold, types=("name", "address"))
    >>> scores["macro_f1"], scores["per_type"]["name"]["f1"]
    (0.5, 1.0)
    """
    predicted, gold = _aligned("cluener_scores", predicted, gold)
    types = CLUENER_TYPES if types is None else tuple(types)
    if not types:
        raise ValueError("cluener_scores: expected at least one entity type. Received: types=().")
    counts = _type_counts("cluener_scores", predicted, gold)
    per_type = _per_type(counts, types)
    scored = [name for name in types if any(counts.get(name, ()))]
    return {
        "macro_f1": sum(per_type[name]["f1"] for name in scored) / len(scored) if scored else 0.0,
        "per_type": per_type,
    }


def _type_counts(name, predicted, gold):
    """``{type: [true positives, predicted, gold]}``; each example's entities are a set."""
    counts = collections.defaultdict(lambda: [0, 0, 0])
    for key, entities in gold.items():
        wanted = _entity_set(name, entities, key, "gold")
        for entity in wanted:
            counts[entity[0]][2] += 1
        for entity in _entity_set(name, predicted.get(key, ()), key, "predicted"):
            counts[entity[0]][1] += 1
            counts[entity[0]][0] += entity in wanted
    return counts


def _per_type(counts, names):
    """The scores of each type of ``names`` from `_type_counts`."""
    found = {name: counts.get(name, (0, 0, 0)) for name in names}  # (tp, predicted, gold)
    return {name: dict(_precision_recall_f1(*c), support=c[2]) for name, c in found.items()}


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


# The entities each metric scores: what they are, and the test of one.
_ENTITY_SHAPES = {
    "entity_f1": (
        "a (type string, start int, end int) triple",
        lambda entity: (
            len(entity) == 3 and isinstance(entity[0], str) and all(map(_is_int, entity[1:]))
        ),
    ),
    "cluener_scores": (
        "a (type, entity text) pair of strings",
        lambda entity: len(entity) == 2 and all(isinstance(value, str) for value in entity),
    ),
}


def _entity_set(name, entities, key, which):
    """One example's entities as a set of tuples, each checked for the metric ``name``."""
    shape, fits = _ENTITY_SHAPES[name]
    found = set()
    for entity in entities:
        if not isinstance(entity, (tuple, list)) or not fits(entity):
            raise ValueError(
                f"{name}: example {key!r} has a {which} entity {entity!r}; expected {shape}."
            )
        found.add(tuple(entity))
    return found


# The characters CMRC2018's official script (cmrc2018_evaluate.py) removes.
# Its list also holds "……", two characters, which never equals one
# character: a lone "…" is therefore kept, as in the official script.
CMRC2018_PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
_CHINESE = re.compile("[\u4e00-\u9fa5]")


def cmrc2018_scores(predictions, gold_answers):
    """CMRC2018's EM and F1, as its official script ``cmrc2018_evaluate.py`` computes them.

    Texts are ``str(text).lower().strip()``-ed. EM: the prediction equals a
    gold answer once the characters of `CMRC2018_PUNCTUATION` are removed.
    F1: over "mixed segments" (each Chinese character alone, other runs
    tokenized as words by NLTK, punctuation removed), the overlap is the
    LONGEST COMMON SUBSTRING of the two segment lists, not a bag of words.
    Both take the best gold answer, are
    averaged over ALL gold questions (a missing prediction scores 0) and
    multiplied by 100; predictions for unknown ids are ignored.

    Args:
        predictions: dict question id -> predicted answer text.
        gold_answers: dict question id -> the gold answers: a list of
            texts, or of ``(text, answer_start)`` pairs as `SpanExample`
            holds them (scored by their text, whatever ``answer_start``).

    Returns:
        A dict: ``em`` and ``f1`` (x 100), ``total`` (gold questions) and
        ``missing`` (questions without a prediction).

    Raises:
        ValueError: no gold questions, or a question without a gold answer
            (the id is named).

    Example:
    >>> gold = {"q1": ["北京大学"], "q2": [("1998年", 10)]}
    >>> scores = cmrc2018_scores({"q1": "北京大学。", "q2": "1998"}, gold)
    >>> scores["em"], round(scores["f1"], 4)  # q2: lcs ["1998"] of ["1998", "年"]
    (50.0, 83.3333)
    """
    if not isinstance(predictions, dict) or not isinstance(gold_answers, dict):
        raise ValueError(
            "cmrc2018_scores expects two dicts keyed by question id. Received: "
            f"{type(predictions).__name__} and {type(gold_answers).__name__}."
        )
    if not gold_answers:
        raise ValueError("cmrc2018_scores: no gold questions to score (gold_answers is empty).")
    em_total = f1_total = 0.0
    missing = 0
    for key, answers in gold_answers.items():
        texts = [
            str(answer[0] if isinstance(answer, (tuple, list)) else answer) for answer in answers
        ]
        if not texts:
            raise ValueError(f"cmrc2018_scores: question {key!r} has no gold answer.")
        if key not in predictions:
            missing += 1
            continue
        prediction = str(predictions[key])
        em_total += _cmrc2018_exact_match(texts, prediction)
        f1_total += _cmrc2018_f1(texts, prediction)
    total = len(gold_answers)
    return {
        "em": 100.0 * em_total / total,
        "f1": 100.0 * f1_total / total,
        "total": total,
        "missing": missing,
    }


def _cmrc2018_exact_match(answers, prediction):
    """1 when ``prediction`` equals one of ``answers`` once punctuation is removed, else 0."""
    predicted = _remove_punctuation(prediction)
    return int(any(_remove_punctuation(answer) == predicted for answer in answers))


def _cmrc2018_f1(answers, prediction):
    """The best F1 over ``answers``: longest common substring of mixed segments."""
    predicted = _mixed_segmentation(prediction, remove_punctuation=True)
    best = 0.0
    for answer in answers:
        gold = _mixed_segmentation(answer, remove_punctuation=True)
        common = _longest_common_substring_length(gold, predicted)
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _mixed_segmentation(text, remove_punctuation=False):
    """CMRC2018's segments: Chinese characters and listed punctuation alone, other runs as words."""
    segments, run = [], []
    for char in str(text).lower().strip():
        if remove_punctuation and char in CMRC2018_PUNCTUATION:
            continue
        if _CHINESE.match(char) or char in CMRC2018_PUNCTUATION:
            if run:
                segments.extend(_word_tokenize("".join(run)))
                run = []
            segments.append(char)
        else:
            run.append(char)
    if run:
        segments.extend(_word_tokenize("".join(run)))
    return segments


_WORD_TOKENIZER = None


def _word_tokenize(text):
    """Word tokens of a non-Chinese run: NLTK's Treebank word tokenizer."""
    # The official script calls ``nltk.word_tokenize``, which first splits sentences
    # with NLTK's Punkt model (a separate data download); the tokens are the same for
    # any run that Punkt reads as one sentence.
    global _WORD_TOKENIZER
    if _WORD_TOKENIZER is None:
        from nltk.tokenize.destructive import NLTKWordTokenizer

        _WORD_TOKENIZER = NLTKWordTokenizer()
    return _WORD_TOKENIZER.tokenize(text)


def _longest_common_substring_length(first, second):
    """Length of the longest common CONTIGUOUS run of two sequences."""
    best = 0
    previous = [0] * (len(second) + 1)
    for item in first:
        current = [0] * (len(second) + 1)
        for j, other in enumerate(second):
            if item == other:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def _remove_punctuation(text):
    return "".join(c for c in str(text).lower().strip() if c not in CMRC2018_PUNCTUATION)


def _precision_recall_f1(true_positives, predicted, gold):
    precision = true_positives / predicted if predicted else 0.0
    recall = true_positives / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"f1": f1, "precision": precision, "recall": recall}


def _aligned(name, predictions, gold):
    """Both as dicts keyed by id; checks that every predicted id is gold."""
    if isinstance(gold, dict) != isinstance(predictions, dict):
        raise ValueError(
            f"{name} expects two dicts keyed by id, or two sequences. Received: "
            f"{type(predictions).__name__} and {type(gold).__name__}."
        )
    if not isinstance(gold, dict):
        predictions, gold = list(predictions), list(gold)
        if len(predictions) != len(gold):
            raise ValueError(
                f"{name}: {len(predictions)} predictions for {len(gold)} gold labels; "
                "expected one prediction per gold label."
            )
        predictions, gold = dict(enumerate(predictions)), dict(enumerate(gold))
    if not gold:
        raise ValueError(f"{name}: no gold examples to score (gold is empty).")
    unknown = [key for key in predictions if key not in gold]
    if unknown:
        raise ValueError(
            f"{name}: {len(unknown)} predictions for ids that have no gold label, e.g. "
            f"{unknown[:5]}; expected predictions for the gold ids only."
        )
    return predictions, gold
