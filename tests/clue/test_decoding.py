"""Decoding model outputs on hand-made scores whose answers are known, and scoring."""

import itertools

import numpy as np
import pytest

from keras_masking.clue.decoding import decode_predictions
from keras_masking.clue.decoding import joint_assignment
from keras_masking.clue.decoding import score
from keras_masking.clue.encoding import encode_examples
from keras_masking.clue.examples import ChoiceExample
from keras_masking.clue.examples import EntityExample
from keras_masking.clue.examples import IdiomPassage
from keras_masking.clue.examples import SpanExample
from keras_masking.clue.examples import TextExample
from tests.clue.helpers import tokenizer


# === CHID: joint decoding per passage ===
def test_joint_assignment_equals_brute_force():
    rng = np.random.default_rng(0)
    for rows, columns in [(1, 4), (3, 3), (4, 7), (5, 10)]:
        for _ in range(5):
            scores = rng.normal(size=(rows, columns))
            picked = joint_assignment(scores)
            assert len(set(picked)) == rows
            best = max(
                itertools.permutations(range(columns), rows),
                key=lambda p: sum(scores[r, c] for r, c in enumerate(p)),
            )
            total = sum(scores[r, c] for r, c in enumerate(picked))
            assert total == pytest.approx(sum(scores[r, c] for r, c in enumerate(best)))


def test_joint_assignment_bad_input():
    with pytest.raises(
        ValueError, match=r"rows <= columns <= 20. Received scores of shape \(3, 2\)"
    ):
        joint_assignment(np.zeros((3, 2)))
    assert joint_assignment(np.zeros((0, 3))) == []


def _two_passages():
    return [
        IdiomPassage(
            "p0",
            ("一心一意", "三心二意", "一意"),
            ("他", "和", "。"),
            ("#idiom1#", "#idiom2#"),
            (1, 0),
        ),
        IdiomPassage("p1", ("一心一意", "三心二意"), ("他", "。"), ("#idiom3#",), (0,)),
    ]


def test_chid_decoding_is_joint_where_greedy_repeats_a_candidate():
    passages = _two_passages()
    encoded = encode_examples("chid", passages, tokenizer(), 24, num_choices=4)
    # Both blanks of p0 prefer candidate 0; the first only slightly, the second strongly.
    # Greedy picks (0, 0); the best distinct pair is (1, 0): log .45 + log .9 > log .5 + log .05.
    probabilities = np.array(
        [
            [0.50, 0.45, 0.05],
            [0.90, 0.05, 0.05],
        ]
    )
    logits = np.full((3, 4), -1e9, "float32")  # column 3 is a padded choice
    logits[:2, :3] = np.log(probabilities) + 7.0  # logits, not probabilities: shift invariant
    logits[2, :2] = [0.3, -0.2]  # p1's single blank: its argmax
    greedy = np.argmax(logits, -1)[:2]
    assert greedy.tolist() == [0, 0]
    predictions = decode_predictions("chid", logits, encoded, passages)
    assert predictions == {"#idiom1#": 1, "#idiom2#": 0, "#idiom3#": 0}
    assert score("chid", predictions, passages)["accuracy"] == 100.0
    # Padded candidates never win, however large their logits.
    logits[2, 2:] = 50.0
    assert decode_predictions("chid", logits, encoded, passages)["#idiom3#"] == 0


# === CMRC2018: the best span over every window ===
def _span_split():
    context = "今天天气很好北京是中国的首都大学上海交通"
    example = SpanExample("q1", context, "他说", (("上海", context.index("上海")),))
    other = SpanExample("q2", "北京", "他说", (("北京", 0),))
    encoded = encode_examples("cmrc2018", [example, other], tokenizer(), 13, stride=4)
    return [example, other], encoded


def test_cmrc2018_decoding_takes_the_best_valid_span_of_all_windows():
    examples, encoded = _span_split()
    assert encoded.meta["example_index"] == [0, 0, 0, 0, 1]
    logits = np.full((5, 13, 2), -10.0, "float32")
    logits[4, 4, 0], logits[4, 5, 1] = 1.0, 1.0  # q2: 北京
    # Window 1 (characters 4-11): a span 北京 (6-7) at positions 6-7, total 5.
    logits[1, 6, 0], logits[1, 7, 1] = 2.0, 3.0
    # Window 3 (characters 12-19): 上海 (16-17) at positions 8-9, total 6: the best.
    logits[3, 8, 0], logits[3, 9, 1] = 3.0, 3.0
    # Traps: an end before a start (total 20), a too long span, the question and [CLS].
    logits[2, 10, 0], logits[2, 5, 1] = 10.0, 10.0
    logits[0, 1, 0], logits[0, 1, 1] = 50.0, 50.0  # question tokens: not the context
    logits[0, 0, :] = 40.0  # [CLS]: no answer is never predicted
    predictions = decode_predictions("cmrc2018", logits, encoded, examples)
    assert predictions == {"q1": "上海", "q2": "北京"}
    # With max_answer_length 30 a long span (6 to 11, total 6.5) would win; with 2 it cannot.
    logits[1, 11, 1] = 4.5
    assert decode_predictions("cmrc2018", logits, encoded, examples)["q1"] == "北京是中国的"
    short = decode_predictions("cmrc2018", logits, encoded, examples, max_answer_length=2)
    assert short["q1"] == "上海"
    parts = score("cmrc2018", {"q1": "上海", "q2": "北"}, examples)
    assert parts["score"] == parts["em"] == 50.0
    assert parts["f1"] == pytest.approx(100 * (1 + 2 * 1 * 0.5 / 1.5) / 2)


def test_cmrc2018_windows_start_answers_only_where_a_token_has_the_most_context():
    examples, encoded = _span_split()
    # 20 characters, windows of 8 tokens every 4: [0, 8), [4, 12), [8, 16), [12, 20);
    # run_squad.py's score min(left, right) + 0.01 * length gives character 4 to
    # window 0 (3 vs 0), 6 to window 1 (2 vs 1), 11 to window 2, 19 to window 3.
    first = 4  # [CLS] 他 说 [SEP]: the context starts at position 4 of every window
    owner = {4: 0, 5: 0, 6: 1, 7: 1, 8: 1, 9: 1, 10: 2, 11: 2, 19: 3}
    for char, window in owner.items():
        row_starts = [w * 4 for w in range(4)]
        for row, start in enumerate(row_starts):
            if start <= char < start + 8:
                expected = row == window
                assert encoded.meta["max_context"][row, first + char - start] == expected
    assert not encoded.meta["max_context"][:, :first].any()  # question, [CLS], [SEP]
    logits = np.full((5, 13, 2), -10.0, "float32")
    logits[4, 4, 0], logits[4, 5, 1] = 1.0, 1.0
    logits[3, 8, 0], logits[3, 9, 1] = 3.0, 3.0  # 上海 in window 3: total 6
    # 很好 (characters 4-5) scores 40 in window 1, where 很 has no left context: not an
    # answer start there (window 0 holds it); in window 0 it scores 2.
    logits[1, 4, 0], logits[1, 5, 1] = 20.0, 20.0
    logits[0, 8, 0], logits[0, 9, 1] = 1.0, 1.0
    assert decode_predictions("cmrc2018", logits, encoded, examples)["q1"] == "上海"
    logits[0, 8, 0], logits[0, 9, 1] = 4.0, 4.0  # now window 0's 很好 beats 上海
    assert decode_predictions("cmrc2018", logits, encoded, examples)["q1"] == "很好"
    # Only starts are restricted: 北 (6, window 1's) to 的 (11, window 2's).
    logits[1, 6, 0], logits[1, 11, 1] = 30.0, 30.0
    assert decode_predictions("cmrc2018", logits, encoded, examples)["q1"] == "北京是中国的"


# === Entities ===
def test_entity_decoding_reads_positive_scores_as_character_spans():
    text = "浙商银行playing北京"
    examples = [EntityExample("s1", text, ()), EntityExample("s2", "北京", ())]
    encoded = encode_examples("cluener", examples, tokenizer(), 12)
    scores = np.full((2, 10, 12, 12), -1e12, "float32")
    company, address, game = 2, 0, 3
    scores[0, company, 1, 4] = 3.0  # 浙商银行 -> characters 0-3
    scores[0, game, 5, 6] = 0.5  # play ##ing -> 4-10
    scores[0, address, 7, 8] = 0.0  # not > 0
    scores[0, address, 8, 7] = 9.0  # end before start: never an entity
    scores[0, address, 0, 3] = 9.0  # [CLS] is not text
    scores[1, address, 1, 2] = 1.0
    # Batches of outputs decode as one array does.
    predictions = decode_predictions("cluener", [scores[:1], scores[1:]], encoded, examples)
    assert predictions == {
        "s1": [("company", 0, 3), ("game", 4, 10)],
        "s2": [("address", 0, 1)],
    }
    gold = [
        EntityExample("s1", text, (("company", 0, 3), ("address", 11, 12))),
        EntityExample("s2", "北京", (("address", 0, 1),)),
    ]
    parts = score("cluener", predictions, gold)
    # Official: company F1 1, address P 1 R 1/2 F1 2/3, game 0; the 7 types with no
    # entity on either side are left out (score.py divides by zero there).
    assert parts["score"] == parts["macro_f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert parts["metric"] == "cluener"
    # Span-exact micro F1 beside it: tp 2 (company, s2 address) of 3 predicted and 3 gold.
    assert parts["span_f1"] == pytest.approx(100 * 2 / 3)
    assert parts["per_type"]["game"]["precision"] == 0.0
    assert parts["per_type"]["address"]["recall"] == 50.0
    assert parts["per_type"]["book"]["support"] == 0
    with pytest.raises(ValueError, match=r"Expected entity scores \(rows, 10, 12, 12\)"):
        decode_predictions("cluener", scores[:, :3], encoded, examples)


def test_a_zero_width_piece_is_no_entity_and_no_answer():
    """multilingual-e5's tokenizer puts a "▁" piece before the text, at offsets
    (0, 0): a score there is neither an entity (it decoded as ``(type, 0, -1)``)
    nor an answer's start or end (it decoded as the empty answer)."""
    from keras_masking.models import UnigramTokenizer
    from tests.models.unigram_testing import unigram_model

    pieces = [(" ", -2.0), ("张", -3.0), ("三", -3.0), ("在", -3.0), ("北京", -3.0)]
    e5_like = UnigramTokenizer(unigram_model(pieces))
    text = "张三在北京"
    examples = [EntityExample("s1", text, (("name", 0, 1),))]
    encoded = encode_examples("cluener", examples, e5_like, 10)
    assert encoded.meta["offsets"][0, 1].tolist() == [0, 0]  # [CLS], then "▁"
    scores = np.full((1, 10, 10, 10), -1.0, "float32")
    name = encoded.meta["entity_types"].index("name")
    scores[0, name, 2, 3] = 1.0  # 张三
    scores[0, name, 1, 1] = 5.0  # the "▁" piece alone
    scores[0, name, 1, 3] = 5.0  # from "▁" to 三: the entity starts at 张
    predictions = decode_predictions("cluener", scores, encoded, examples)
    assert predictions == {"s1": [("name", 0, 1)]}

    examples = [SpanExample("q1", text, "谁", (("张三", 0),))]
    encoded = encode_examples("cmrc2018", examples, e5_like, 16)
    offsets = encoded.meta["offsets"][0]
    first = int(np.flatnonzero(offsets[:, 0] >= 0)[0])
    assert offsets[first].tolist() == [0, 0]
    outputs = np.zeros((1, 16, 2), "float32")
    outputs[0, first] = 9.0  # the best logits on "▁"
    outputs[0, first + 1, 0], outputs[0, first + 2, 1] = 2.0, 2.0  # 张 ... 三
    assert decode_predictions("cmrc2018", outputs, encoded, examples) == {"q1": "张三"}


def _official_cluener(pre_lines, gold_lines):
    """A naive transcription of CLUENER2020's score.py (get_f1_score), with the
    zero divisions it would raise read as 0 for a type with entities on one
    side, and a type with none on either side left out (no score there)."""
    labels = ["address", "book", "company", "game", "government", "movie", "name",
              "organization", "position", "scene"]  # fmt: skip
    total, scored = 0, 0
    for label in labels:
        tp = fp = fn = 0
        for pre, gold in zip(pre_lines, gold_lines):
            pre = pre["label"].get(label, {}).keys()
            gold = gold["label"].get(label, {}).keys()
            for i in pre:
                if i in gold:
                    tp += 1
                else:
                    fp += 1
            for i in gold:
                if i not in pre:
                    fn += 1
        if tp + fp + fn == 0:
            continue
        scored += 1
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        total += 2 * p * r / (p + r) if p + r else 0.0
    return total / scored


def _cluener_line(example, entities):
    label = {}
    for kind, start, end in entities:
        label.setdefault(kind, {}).setdefault(example.text[start : end + 1], []).append(
            [start, end]
        )
    return {"id": example.id, "label": label}


def test_cluener_score_is_the_official_one_by_entity_text():
    rng = np.random.default_rng(0)
    texts = ["北京人在北京上海", "小明去北京大学", "浙商银行北京分行", "电影游戏电影"]
    types = ("address", "name", "company", "organization", "movie", "game", "book", "scene")
    examples, predictions = [], {}
    for index, text in enumerate(texts * 3):

        def entities(count):
            found = set()
            for _ in range(count):
                start = int(rng.integers(0, len(text) - 1))
                end = int(rng.integers(start, min(len(text), start + 3)))
                found.add((str(rng.choice(types)), start, end))
            return sorted(found)

        examples.append(EntityExample(index, text, tuple(entities(3))))
        predictions[index] = entities(3)
    # The same text at another position: the official score counts it, the span one does not.
    examples.append(EntityExample("x", "北京人在北京", (("address", 0, 1),)))
    predictions["x"] = [("address", 4, 5)]
    parts = score("cluener", predictions, examples)
    official = _official_cluener(
        [_cluener_line(e, predictions[e.id]) for e in examples],
        [_cluener_line(e, e.entities) for e in examples],
    )
    assert parts["score"] == pytest.approx(100 * official, abs=1e-9)
    alone = score("cluener", {"x": predictions["x"]}, examples[-1:])
    assert alone["per_type"]["address"]["f1"] == 100.0 and alone["span_f1"] == 0.0
    assert alone["score"] == 100.0  # the one type with entities; the nine others have none


# === Classification and multiple choice ===
def test_classification_and_choice_decoding_and_scores():
    examples = [TextExample(0, "好", None, "Positive"), TextExample(1, "坏", None, "Negative")]
    encoded = encode_examples("eprstmt", examples, tokenizer(), 8)
    predictions = decode_predictions(
        "eprstmt", np.array([[0.0, 1.0], [0.0, 1.0]]), encoded, examples
    )
    assert predictions == {0: "Positive", 1: "Positive"}  # label strings, not indices
    assert score("eprstmt", predictions, examples) == {
        "score": 50.0,
        "metric": "accuracy",
        "accuracy": 50.0,
        "total": 2,
    }
    questions = [ChoiceExample("q1", "好", "问", ("一", "二"), 1)]
    encoded = encode_examples("c3", questions, tokenizer(), 12)
    logits = np.array([[0.0, 1.0, 9.0, 9.0]])  # padded choices 2, 3 are not candidates
    assert decode_predictions("c3", logits, encoded, questions) == {"q1": 1}


def test_decoding_bad_input():
    examples = [TextExample(0, "好", None, "Positive")]
    encoded = encode_examples("eprstmt", examples, tokenizer(), 8)
    with pytest.raises(ValueError, match=r"outputs has 2 rows; the encoded split has 1"):
        decode_predictions("eprstmt", np.zeros((2, 2)), encoded, examples)
    with pytest.raises(ValueError, match=r"Expected outputs of shape \(rows, num_labels\)"):
        decode_predictions("eprstmt", np.zeros((1, 3)), encoded, examples)
    with pytest.raises(ValueError, match=r"encoded split is of kind 'classification'; task 'c3'"):
        decode_predictions("c3", np.zeros((1, 4)), encoded, examples)
    with pytest.raises(ValueError, match=r"2 examples for an encoded split made from 1"):
        decode_predictions("eprstmt", np.zeros((1, 2)), encoded, examples * 2)
    with pytest.raises(ValueError, match=r"Example 0 has no gold 'label': an unlabelled split"):
        score("eprstmt", {0: "Positive"}, [TextExample(0, "好", None, None)])
