"""CLUE's metrics against hand-computed values: accuracy, entity F1, CMRC2018 EM/F1."""

import itertools

import numpy as np
import pytest

from keras_masking.clue.metrics import _cmrc2018_exact_match
from keras_masking.clue.metrics import _cmrc2018_f1
from keras_masking.clue.metrics import _longest_common_substring_length
from keras_masking.clue.metrics import _mixed_segmentation
from keras_masking.clue.metrics import _word_tokenize
from keras_masking.clue.metrics import accuracy
from keras_masking.clue.metrics import cluener_scores
from keras_masking.clue.metrics import cmrc2018_scores
from keras_masking.clue.metrics import entity_f1


# === Accuracy ===
def test_accuracy_counts_missing_predictions_as_wrong():
    gold = {"a": "1", "b": "0", "c": "1", "d": "0"}
    assert accuracy({"a": "1", "b": "1", "c": "1"}, gold) == 0.5  # d missing, b wrong
    assert accuracy([2, 0, 1], [2, 1, 1]) == pytest.approx(2 / 3)
    # Label strings are compared as they are: "1" is not 1.
    assert accuracy({"a": 1}, {"a": "1"}) == 0.0


def test_accuracy_bad_input_is_named():
    with pytest.raises(ValueError, match=r"accuracy: 1 predictions for ids that have no gold.*'z'"):
        accuracy({"a": "1", "z": "0"}, {"a": "1"})
    with pytest.raises(ValueError, match=r"accuracy: 2 predictions for 3 gold labels"):
        accuracy([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match=r"accuracy: no gold examples"):
        accuracy({}, {})
    with pytest.raises(ValueError, match=r"accuracy expects two dicts.*list and dict"):
        accuracy([1], {"a": 1})


# === Entity F1 ===
def test_entity_f1_micro_per_type_and_macro_by_hand():
    gold = {
        "s1": [("name", 0, 1), ("address", 4, 6)],
        "s2": [("name", 2, 3)],
        "s3": [],
    }
    predicted = {
        "s1": [("name", 0, 1), ("address", 4, 5), ("organization", 7, 8), ("name", 0, 1)],
        "s3": [("name", 0, 0)],
    }  # s2 predicts nothing; the duplicate ("name", 0, 1) counts once
    scores = entity_f1(predicted, gold, types=("name", "address", "organization", "book"))
    # Predicted: {name 0-1, address 4-5, organization 7-8, name 0-0} = 4; gold 3; tp 1.
    assert (scores["true_positives"], scores["predicted"], scores["gold"]) == (1, 4, 3)
    assert scores["precision"] == pytest.approx(1 / 4)
    assert scores["recall"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx(2 * (1 / 4) * (1 / 3) / (1 / 4 + 1 / 3))
    name = scores["per_type"]["name"]  # tp 1 of 2 predicted, 2 gold
    assert (name["precision"], name["recall"], name["f1"], name["support"]) == (0.5, 0.5, 0.5, 2)
    assert scores["per_type"]["address"] == {
        "f1": 0.0,
        "precision": 0.0,
        "recall": 0.0,
        "support": 1,
    }
    assert scores["per_type"]["book"]["support"] == 0
    # Macro over the types seen (name, address, organization), not "book".
    assert scores["macro_f1"] == pytest.approx(0.5 / 3)


def test_entity_f1_needs_exact_boundaries_and_type():
    gold = {0: [("name", 3, 5)]}
    for wrong in [("name", 3, 4), ("name", 2, 5), ("book", 3, 5)]:
        assert entity_f1({0: [wrong]}, gold)["f1"] == 0.0
    assert entity_f1({0: [["name", 3, 5]]}, gold)["f1"] == 1.0  # a JSON list is a triple too
    assert entity_f1({}, {0: []})["f1"] == 0.0  # nothing to find, nothing found


def test_entity_f1_bad_input_names_the_example():
    with pytest.raises(ValueError, match=r"example 's9' has a predicted entity \('name', 1\)"):
        entity_f1({"s9": [("name", 1)]}, {"s9": []})
    with pytest.raises(ValueError, match=r"example 's1' has a gold entity"):
        entity_f1({}, {"s1": [("name", "0", 1)]})
    with pytest.raises(ValueError, match=r"entity_f1: 1 predictions for ids .*'x'"):
        entity_f1({"x": []}, {"s1": []})


def test_cluener_scores_compare_texts_per_line_and_average_all_types():
    gold = {
        "s1": [("name", "张三"), ("address", "北京"), ("address", "北京")],  # a set: once
        "s2": [("name", "李四")],
    }
    predicted = {
        "s1": [("name", "张三"), ("address", "北京市"), ("company", "北京")],
        "s2": [("name", "张三")],  # right text, wrong line: a false positive
    }
    scores = cluener_scores(predicted, gold)
    # name: tp 1, fp 1, fn 1 -> 1/2; address: fn 1 -> 0; company: fp 1 -> 0; the 7
    # types with no entity on either side have no score (score.py divides by 0).
    assert scores["per_type"]["name"] == {"f1": 0.5, "precision": 0.5, "recall": 0.5, "support": 2}
    assert scores["per_type"]["address"]["support"] == 1
    assert len(scores["per_type"]) == 10 and scores["macro_f1"] == pytest.approx(0.5 / 3)
    assert cluener_scores({}, {"s1": []})["macro_f1"] == 0.0  # nothing to find or found
    assert cluener_scores(predicted, gold, types=("name",))["macro_f1"] == 0.5
    with pytest.raises(ValueError, match=r"cluener_scores: example 's1' has a predicted entity"):
        cluener_scores({"s1": [("name", 0, 1)]}, gold)
    with pytest.raises(ValueError, match=r"cluener_scores: 1 predictions for ids .*'s9'"):
        cluener_scores({"s9": []}, gold)


# === CMRC2018 ===
def test_cmrc2018_scores_by_hand():
    gold = {
        "q1": ["北京大学"],
        "q2": [("1998年", 3), ("1998年8月", 3)],  # SpanExample answers
        "q3": ["Beijing Olympics"],
        "q4": ["上海"],
        "q5": ["《红楼梦》"],
    }
    predictions = {
        "q1": "大学北京",  # LCS 2 of 4 segments: F1 0.5 (a bag of words would give 1)
        "q2": "1998年8月",  # equals the second answer: EM 1, F1 1
        "q3": "the beijing olympics",  # [the, beijing, olympics] vs [beijing, olympics]
        "q5": "红楼梦",  # 《》 removed: EM 1
        "unknown": "ignored",  # as the official script: ids not in the gold are ignored
    }  # q4 unanswered: 0
    scores = cmrc2018_scores(predictions, gold)
    f1_q3 = 2 * (2 / 3) * 1 / (2 / 3 + 1)
    assert scores["em"] == pytest.approx(100 * 2 / 5)
    assert scores["f1"] == pytest.approx(100 * (0.5 + 1 + f1_q3 + 0 + 1) / 5)
    assert (scores["total"], scores["missing"]) == (5, 1)


def test_cmrc2018_punctuation_is_the_official_list():
    # Removed: the official list (Chinese punctuation, - : _ * ^ / \ ~ ` + =).
    assert _cmrc2018_exact_match(["“你好”！"], "你好")
    assert _cmrc2018_exact_match(["《红楼梦》"], "红楼梦")
    assert _cmrc2018_exact_match(["a-b"], "ab")
    assert _cmrc2018_exact_match(["ABC"], " abc ")  # lowercased and stripped
    # Kept: ASCII , . ! ? and a lone "…" (the official list holds "……", never one char).
    assert not _cmrc2018_exact_match(["a,b"], "ab")
    assert not _cmrc2018_exact_match(["你好…"], "你好")
    assert not _cmrc2018_exact_match(["hello!"], "hello")


def test_cmrc2018_f1_uses_the_longest_common_substring_and_the_best_answer():
    # Segments: 上 海 交 通 大 学 / 交 通 大 学 位 于: LCS 4, P = R = 4/6.
    assert _cmrc2018_f1(["上海交通大学"], "交通大学位于") == pytest.approx(4 / 6)
    # Common characters in another order do not count beyond the longest run.
    assert _cmrc2018_f1(["今天天气"], "天气今天") == pytest.approx(0.5)
    assert _cmrc2018_f1(["北京", "北京大学"], "北京大学") == 1.0  # max over the answers
    assert _cmrc2018_f1(["北京"], "上海") == 0.0
    assert _cmrc2018_f1(["。"], "，") == 0.0  # only punctuation: nothing left


def test_mixed_segmentation_and_word_tokenize():
    assert _mixed_segmentation("在2008年Beijing Olympics，") == [
        "在",
        "2008",
        "年",
        "beijing",
        "olympics",
        "，",
    ]
    assert _mixed_segmentation("在2008年，", remove_punctuation=True) == ["在", "2008", "年"]
    assert _mixed_segmentation("a-b") == ["a", "-", "b"]  # "-" is in the official list
    # NLTK's own Treebank tokens, as nltk.word_tokenize gives them.
    assert _word_tokenize("It's 3.14, U.S. (ok)...") == [
        "It",
        "'s",
        "3.14",
        ",",
        "U.S.",
        "(",
        "ok",
        ")",
        "...",
    ]
    assert _word_tokenize("1,000 won't") == ["1,000", "wo", "n't"]
    assert _word_tokenize("don't pay $3.50, ok...") == [
        "do",
        "n't",
        "pay",
        "$",
        "3.50",
        ",",
        "ok",
        "...",
    ]


def test_word_tokenize_is_nltks_not_a_regex():
    # Each of these differed under the earlier regex stand-in.
    assert _word_tokenize("46,600m²") == ["46,600m²"]
    assert _word_tokenize("cannot") == ["can", "not"]
    assert _word_tokenize('"hi" there') == ["``", "hi", "''", "there"]
    assert _word_tokenize("a.b.c.") == ["a.b.c", "."]
    assert _mixed_segmentation("长46,600m²", remove_punctuation=True) == ["长", "46,600m²"]


def _official_word_tokenize(text):
    """``nltk.word_tokenize`` when NLTK's Punkt data is installed, else its
    word tokenizer alone (the same tokens for a one-sentence run)."""
    import nltk

    try:
        return nltk.word_tokenize(text)
    except LookupError:
        from nltk.tokenize.destructive import NLTKWordTokenizer

        return NLTKWordTokenizer().tokenize(text)


def _official_cmrc2018(answers, prediction):
    """A naive transcription of CMRC2018's cmrc2018_evaluate.py (v5), Python 3."""
    import re

    sp_char = ["-", ":", "_", "*", "^", "/", "\\", "~", "`", "+", "=",
               "，", "。", "：", "？", "！", "“", "”", "；", "’", "《", "》", "……", "·", "、",
               "「", "」", "（", "）", "－", "～", "『", "』"]  # fmt: skip

    def mixed_segmentation(in_str, rm_punc=False):
        in_str = str(in_str).lower().strip()
        segs_out = []
        temp_str = ""
        for char in in_str:
            if rm_punc and char in sp_char:
                continue
            if re.search("[\u4e00-\u9fa5]", char) or char in sp_char:
                if temp_str != "":
                    segs_out.extend(_official_word_tokenize(temp_str))
                    temp_str = ""
                segs_out.append(char)
            else:
                temp_str += char
        if temp_str != "":
            segs_out.extend(_official_word_tokenize(temp_str))
        return segs_out

    def remove_punctuation(in_str):
        return "".join(c for c in str(in_str).lower().strip() if c not in sp_char)

    def find_lcs(s1, s2):
        m = [[0 for i in range(len(s2) + 1)] for j in range(len(s1) + 1)]
        mmax = 0
        for i in range(len(s1)):
            for j in range(len(s2)):
                if s1[i] == s2[j]:
                    m[i + 1][j + 1] = m[i][j] + 1
                    mmax = max(mmax, m[i + 1][j + 1])
        return mmax

    f1_scores = []
    for ans in answers:
        ans_segs = mixed_segmentation(ans, rm_punc=True)
        prediction_segs = mixed_segmentation(prediction, rm_punc=True)
        lcs_len = find_lcs(ans_segs, prediction_segs)
        if lcs_len == 0:
            f1_scores.append(0)
            continue
        precision = 1.0 * lcs_len / len(prediction_segs)
        recall = 1.0 * lcs_len / len(ans_segs)
        f1_scores.append((2 * precision * recall) / (precision + recall))
    em = int(any(remove_punctuation(a) == remove_punctuation(prediction) for a in answers))
    return max(f1_scores), em


# Answers and predictions where word tokenizers disagree (abbreviations,
# clitics, quotes, units, numbers, mixed scripts), with official dev answers.
_TRICKY = [
    (["46,600m²"], "约46,600m²"),
    (["46,600 m²"], "46,600m²"),
    (["U.S. Army"], "美国U.S. Army部队"),
    (["cannot"], "can"),
    (['"Hello" world'], "hello world"),
    (["Dr. Smith's cat"], "smith's cat"),
    (["光荣和ω-force"], "光荣和ω-force开发"),
    (["39764.0"], "39764"),
    (["(1895-1943)"], "1895"),
    (["A.B.C."], "a.b.c"),
    (["rock'n'roll"], "rock n roll"),
    (["ca. 3.5km"], "3.5 km"),
    (["I'm here…"], "i am here"),
    (["2010年是邹游在河南建业効力的最后一个赛季", "2010年"], "2010年是邹游"),
    (["第三续作"], "《战国无双3》"),
]


def test_cmrc2018_scores_equal_the_official_script_on_tricky_strings():
    gold = {f"q{i}": answers for i, (answers, _) in enumerate(_TRICKY)}
    predictions = {f"q{i}": prediction for i, (_, prediction) in enumerate(_TRICKY)}
    ours = cmrc2018_scores(predictions, gold)
    official = [_official_cmrc2018(answers, prediction) for answers, prediction in _TRICKY]
    for (answers, prediction), (f1, em) in zip(_TRICKY, official):
        assert _cmrc2018_f1(answers, prediction) == pytest.approx(f1, abs=1e-12), prediction
        assert _cmrc2018_exact_match(answers, prediction) == em, prediction
    assert ours["f1"] == pytest.approx(100 * sum(f1 for f1, _ in official) / len(_TRICKY), abs=1e-4)
    assert ours["em"] == pytest.approx(100 * sum(em for _, em in official) / len(_TRICKY), abs=1e-4)
    # Pinned, so that the comparison is not only with NLTK: 46,600m² is one token.
    assert _cmrc2018_f1(["46,600m²"], "约46,600m²") == pytest.approx(2 / 3)


def test_longest_common_substring_equals_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = list(rng.integers(0, 3, rng.integers(0, 8)))
        b = list(rng.integers(0, 3, rng.integers(0, 8)))
        brute = max(
            [0]
            + [
                j - i
                for i, j in itertools.combinations(range(len(a) + 1), 2)
                if any(a[i:j] == b[k : k + j - i] for k in range(len(b)))
            ]
        )
        assert _longest_common_substring_length(a, b) == brute
    assert _longest_common_substring_length(list("abcde"), list("xbcdy")) == 3
    assert _longest_common_substring_length(list("abc"), list("cab")) == 2  # "ab", not 3


def test_cmrc2018_bad_input():
    with pytest.raises(ValueError, match=r"question 'q7' has no gold answer"):
        cmrc2018_scores({}, {"q7": []})
    with pytest.raises(ValueError, match=r"no gold questions"):
        cmrc2018_scores({}, {})
    with pytest.raises(ValueError, match=r"expects two dicts .* list and dict"):
        cmrc2018_scores(["a"], {"q": ["a"]})
