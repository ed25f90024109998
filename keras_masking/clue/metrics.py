"""CLUE's metrics as plain functions: accuracy, CLUENER's official score and
span-exact entity F1, CMRC2018 EM / F1.

Predictions and gold answers are dicts keyed by example id (a C3 question, a
CHID blank, a CMRC2018 question, a CLUENER sentence). The gold dict says
which examples are scored: a missing prediction counts as wrong.

Scales: `accuracy`, `cluener_scores` and `entity_f1` return fractions in
``[0, 1]``; `cmrc2018_scores` returns percentages (``x 100``) as CMRC2018's
official evaluation script prints them.
"""

import collections
import re


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

    A span-exact score, stricter than CLUENER's official one
    (`cluener_scores`, which compares entity texts): an entity counts as
    found only when its type and both character boundaries equal a gold
    entity's. Each example's entities are
    a set (a duplicate counts once). Micro scores pool every example and
    type; ``per_type`` scores each type alone; ``macro_f1`` is the mean of
    the per-type F1 over the types that occur in the gold or the
    predictions. A score whose denominator is 0 is 0.

    Args:
        predicted: dict id -> iterable of ``(type, start, end)`` (end
            inclusive, as CLUENER writes it). A missing id predicts nothing.
        gold: dict id -> iterable of ``(type, start, end)``; its ids are the
            examples scored.
        types: optional iterable of the entity types to report in
            ``per_type`` (e.g. the task's 10 types); types with neither gold
            nor predicted entities are then listed with zeros and
            ``support`` 0, and left out of ``macro_f1``.

    Returns:
        A dict: ``f1``, ``precision``, ``recall`` (micro, in ``[0, 1]``),
        ``true_positives``, ``predicted``, ``gold`` (entity counts),
        ``per_type`` (type -> ``{"f1", "precision", "recall", "support"}``,
        support = gold entities of the type) and ``macro_f1``.

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
    counts = collections.defaultdict(lambda: [0, 0, 0])  # type -> [tp, predicted, gold]
    for key, entities in gold.items():
        gold_set = _entity_set(entities, key, "gold")
        predicted_set = _entity_set(predicted.get(key, ()), key, "predicted")
        for entity in gold_set:
            counts[entity[0]][2] += 1
        for entity in predicted_set:
            counts[entity[0]][1] += 1
            if entity in gold_set:
                counts[entity[0]][0] += 1
    true_positives = sum(c[0] for c in counts.values())
    num_predicted = sum(c[1] for c in counts.values())
    num_gold = sum(c[2] for c in counts.values())
    scores = _precision_recall_f1(true_positives, num_predicted, num_gold)
    seen = sorted(counts)
    per_type = {}
    for name in list(types) if types is not None else seen:
        tp, n_predicted, n_gold = counts.get(name, (0, 0, 0))
        per_type[name] = dict(_precision_recall_f1(tp, n_predicted, n_gold), support=n_gold)
    for name in seen:  # types outside ``types`` are still reported
        if name not in per_type:
            tp, n_predicted, n_gold = counts[name]
            per_type[name] = dict(_precision_recall_f1(tp, n_predicted, n_gold), support=n_gold)
    macro = [per_type[name]["f1"] for name in seen]
    scores.update(
        true_positives=true_positives,
        predicted=num_predicted,
        gold=num_gold,
        per_type=per_type,
        macro_f1=sum(macro) / len(macro) if macro else 0.0,
    )
    return scores


def cluener_scores(predicted, gold, types=None):
    """CLUENER2020's official score: per-type F1 over entity TEXTS, averaged.

    What CLUENER2020's ``score.py`` computes (the leaderboard's
    "Overall@Macro"): for each sentence and each entity type, the predicted
    entity texts (the keys of ``label[type]`` in a submission line) are
    compared with the gold ones as sets of strings: a predicted text among
    the gold texts is a true positive, any other a false positive, a gold
    text not predicted a false negative; where an entity sits in the
    sentence does not matter. Precision, recall and F1 are computed per
    type over all sentences, and the score is the mean F1 over the types
    (CLUENER's ten): on CLUENER's data, where every type has entities, the
    mean over all ten, as ``score.py`` computes. A type with neither gold
    nor predicted entities is left out of the mean (``score.py`` divides by
    zero there and gives no score), so data with fewer types, such as a
    corpus tagged with person, place and organisation only, is scored over
    its own types rather than diluted by empty ones. A type with entities
    on one side only has F1 0 and counts.

    `entity_f1` is the stricter span-exact (type, start, end) micro F1.

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
    if types is None:
        from keras_masking.clue.tasks import CLUENER_TYPES

        types = CLUENER_TYPES
    types = tuple(types)
    if not types:
        raise ValueError("cluener_scores: expected at least one entity type. Received: types=().")
    counts = {name: [0, 0, 0] for name in types}  # type -> [tp, fp, fn]
    for key, entities in gold.items():
        gold_texts = _texts_by_type(entities, key, "gold")
        predicted_texts = _texts_by_type(predicted.get(key, ()), key, "predicted")
        for name in types:
            found, wanted = predicted_texts.get(name, set()), gold_texts.get(name, set())
            counts[name][0] += len(found & wanted)
            counts[name][1] += len(found - wanted)
            counts[name][2] += len(wanted - found)
    per_type = {}
    for name, (tp, fp, fn) in counts.items():
        per_type[name] = dict(_precision_recall_f1(tp, tp + fp, tp + fn), support=tp + fn)
    scored = [name for name, (tp, fp, fn) in counts.items() if tp + fp + fn]
    return {
        "macro_f1": sum(per_type[name]["f1"] for name in scored) / len(scored) if scored else 0.0,
        "per_type": per_type,
    }


def _texts_by_type(entities, key, which):
    found = {}
    for entity in entities:
        if (
            not isinstance(entity, (tuple, list))
            or len(entity) != 2
            or not isinstance(entity[0], str)
            or not isinstance(entity[1], str)
        ):
            raise ValueError(
                f"cluener_scores: example {key!r} has a {which} entity {entity!r}; expected a "
                "(type, entity text) pair of strings."
            )
        found.setdefault(entity[0], set()).add(entity[1])
    return found


# The characters CMRC2018's official script (cmrc2018_evaluate.py) removes.
# Its list also holds "……", two characters, which never equals one
# character: a lone "…" is therefore kept, as in the official script.
CMRC2018_PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
_CHINESE = re.compile("[\u4e00-\u9fa5]")


def cmrc2018_scores(predictions, gold_answers):
    """CMRC2018's EM and F1, as its official evaluation script computes them.

    What the official script (``cmrc2018_evaluate.py``) does, reproduced:

    * every text is ``str(text).lower().strip()``-ed;
    * EM: 1 when the prediction equals one gold answer after removing the
      characters of `CMRC2018_PUNCTUATION` (ASCII ``,``, ``.``, ``?`` ... are
      NOT in that list and are kept);
    * F1: both texts are cut into "mixed segments" (`mixed_segmentation`:
      each character of ``[\\u4e00-\\u9fa5]`` is one segment, each run of
      other characters is tokenised as words), the listed punctuation
      removed; the overlap is the LONGEST COMMON SUBSTRING of the two
      segment lists (contiguous, not a bag of words): ``precision = lcs /
      len(prediction)``, ``recall = lcs / len(answer)``, ``F1 = 2PR/(P+R)``,
      0 when nothing is shared;
    * both take the maximum over the gold answers, are averaged over ALL
      gold questions (a question without a prediction scores 0) and are
      multiplied by 100. Predictions for unknown ids are ignored.

    Non-Chinese runs are tokenised with NLTK's word tokenizer, as the
    official script does (`word_tokenize`; no NLTK data download needed).

    Args:
        predictions: dict question id -> predicted answer text.
        gold_answers: dict question id -> the gold answers: a list of
            texts, or of ``(text, answer_start)`` pairs as `SpanExample`
            holds them (``answer_start`` None for an answer that could not
            be placed in the context: it is scored all the same, by its
            text, as the official script scores every answer text).

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
        em_total += cmrc2018_exact_match(texts, prediction)
        f1_total += cmrc2018_f1(texts, prediction)
    total = len(gold_answers)
    return {
        "em": 100.0 * em_total / total,
        "f1": 100.0 * f1_total / total,
        "total": total,
        "missing": missing,
    }


def cmrc2018_exact_match(answers, prediction):
    """1 when ``prediction`` equals one of ``answers`` once punctuation is removed.

    Args:
        answers: list of gold answer texts.
        prediction: the predicted text.

    Returns:
        1 or 0.

    Example:
    >>> cmrc2018_exact_match(["《红楼梦》"], "红楼梦"), cmrc2018_exact_match(["a,b"], "ab")
    (1, 0)
    """
    predicted = _remove_punctuation(prediction)
    return int(any(_remove_punctuation(answer) == predicted for answer in answers))


def cmrc2018_f1(answers, prediction):
    """The best F1 over ``answers``: longest common substring of mixed segments.

    Args:
        answers: list of gold answer texts.
        prediction: the predicted text.

    Returns:
        A float in ``[0, 1]``.

    Example:
    >>> round(cmrc2018_f1(["上海交通大学"], "交通大学位于"), 4)  # lcs 4, P 4/6, R 4/6
    0.6667
    """
    predicted = mixed_segmentation(prediction, remove_punctuation=True)
    best = 0.0
    for answer in answers:
        gold = mixed_segmentation(answer, remove_punctuation=True)
        common = longest_common_substring_length(gold, predicted)
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def mixed_segmentation(text, remove_punctuation=False):
    """CMRC2018's mixed segments: Chinese characters alone, other runs as words.

    ``str(text).lower().strip()``, then each character of
    ``[\\u4e00-\\u9fa5]`` or of `CMRC2018_PUNCTUATION` is a segment of its
    own (the punctuation dropped when ``remove_punctuation``), and each run
    of other characters between them is split into words by
    `word_tokenize`.

    Args:
        text: the text.
        remove_punctuation: bool. Drop the characters of
            `CMRC2018_PUNCTUATION`, as the official F1 does.

    Returns:
        A list of strings.

    Example:
    >>> mixed_segmentation("在2008年Beijing Olympics，")
    ['在', '2008', '年', 'beijing', 'olympics', '，']
    """
    segments, run = [], []
    for char in str(text).lower().strip():
        if remove_punctuation and char in CMRC2018_PUNCTUATION:
            continue
        if _CHINESE.match(char) or char in CMRC2018_PUNCTUATION:
            if run:
                segments.extend(word_tokenize("".join(run)))
                run = []
            segments.append(char)
        else:
            run.append(char)
    if run:
        segments.extend(word_tokenize("".join(run)))
    return segments


_WORD_TOKENIZER = None


def word_tokenize(text):
    """Word tokens of a non-Chinese run: NLTK's Treebank word tokenizer.

    The official script calls ``nltk.word_tokenize``, which is
    ``NLTKWordTokenizer().tokenize`` applied to each sentence that NLTK's
    Punkt model (a separate data download) finds. This function applies
    ``NLTKWordTokenizer`` to the whole run: the tokens are the same for any
    run that Punkt reads as one sentence (every CMRC2018 answer run we have
    seen). Abbreviations, clitics, quotes and numbers (``46,600m²``) are
    tokenised by NLTK itself, not approximated.

    Args:
        text: a string.

    Returns:
        A list of strings.

    Example:
    >>> word_tokenize("don't pay $3.50, ok...")
    ['do', "n't", 'pay', '$', '3.50', ',', 'ok', '...']
    """
    global _WORD_TOKENIZER
    if _WORD_TOKENIZER is None:
        from nltk.tokenize.destructive import NLTKWordTokenizer

        _WORD_TOKENIZER = NLTKWordTokenizer()
    return _WORD_TOKENIZER.tokenize(text)


def longest_common_substring_length(first, second):
    """Length of the longest common CONTIGUOUS run of two sequences.

    Args:
        first: a sequence (e.g. a list of segments).
        second: a sequence.

    Returns:
        An int.

    Example:
    >>> longest_common_substring_length(list("abcde"), list("xbcdy"))
    3
    >>> longest_common_substring_length(list("abc"), list("cab"))  # "ab", not 3
    2
    """
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


def _entity_set(entities, key, which):
    found = set()
    for entity in entities:
        if (
            not isinstance(entity, (tuple, list))
            or len(entity) != 3
            or not isinstance(entity[0], str)
            or not all(
                isinstance(value, int) and not isinstance(value, bool) for value in entity[1:]
            )
        ):
            raise ValueError(
                f"entity_f1: example {key!r} has a {which} entity {entity!r}; expected a "
                "(type string, start int, end int) triple."
            )
        found.add((entity[0], entity[1], entity[2]))
    return found


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
