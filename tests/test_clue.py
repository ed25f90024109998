"""CLUE / FewCLUE readers on the real FewCLUE files in ../shared/data."""

import pathlib

import pytest

from keras_masking.data.clue import TASKS
from keras_masking.data.clue import load_fewclue
from keras_masking.data.clue import read_classification_file

FEWCLUE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "fewclue"
needs_data = pytest.mark.skipif(not FEWCLUE.exists(), reason="../shared/data/fewclue not present")


@needs_data
@pytest.mark.parametrize("task", ["tnews", "iflytek", "eprstmt", "bustm", "ocnli", "csl"])
def test_fewclue_tasks_read_completely(task):
    first, second, labels = load_fewclue(FEWCLUE, task, "train")
    lines = sum(1 for line in open(FEWCLUE / task / "train_few_all.json") if line.strip())
    assert 0 < len(first) <= lines and len(labels) == len(first)
    assert (second is None) == (TASKS[task].second is None)
    assert set(labels) <= set(range(len(TASKS[task].labels)))
    assert all(isinstance(text, str) and text for text in first)


@needs_data
def test_tnews_label_codes_map_to_the_15_classes():
    _, _, labels = load_fewclue(FEWCLUE, "tnews", "dev")
    assert len(set(labels)) == 15


def test_malformed_lines_name_file_and_line(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('{"sentence": "好", "label": "Positive"}\n{"sentence": "坏", "label": "Bad"}\n')
    with pytest.raises(ValueError, match=r"train.json:2: label 'Bad'"):
        read_classification_file(path, "eprstmt")
    path.write_text('{"sentence": "好", "label": "Positive"}\n{"sentence": \n')
    with pytest.raises(ValueError, match=r"train.json:2: not valid JSON"):
        read_classification_file(path, "eprstmt")
    path.write_text('{"text": "好", "label": "Positive"}\n')
    with pytest.raises(ValueError, match=r"train.json:1: missing field 'sentence'"):
        read_classification_file(path, "eprstmt")


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"sentence": "\xff\xfe", "label": "Positive"}\n', r"train.json:1: not UTF-8"),
        (b'["sentence", "Positive"]\n', r"train.json:1: expected a JSON object. Received: list"),
        (
            b'{"sentence": 7, "label": "Positive"}\n',
            r"train.json:1: field 'sentence' must be a str",
        ),
        (b'{"sentence": null, "label": "Positive"}\n', r"field 'sentence' must be a str"),
        (
            b'{"sentence": "ok", "label": "Positive"}\n\n'
            b'{"sentence": ["a"], "label": "Negative"}\n',
            r"train.json:3: field 'sentence' must be a str",
        ),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, content, message):
    path = tmp_path / "train.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_classification_file(path, "eprstmt")


def test_csl_keywords_must_be_strings(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('{"keyword": ["a", 3], "abst": "x", "label": "1"}\n')
    with pytest.raises(
        ValueError, match=r"train.json:1: field 'keyword' must be a list of strings"
    ):
        read_classification_file(path, "csl")
    path.write_text('{"keyword": "a", "abst": "x", "label": "1"}\n')
    with pytest.raises(ValueError, match=r"field 'keyword' must be a list"):
        read_classification_file(path, "csl")


def test_unknown_task_is_named(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('{"sentence": "好", "label": "Positive"}\n')
    with pytest.raises(ValueError, match=r"Unknown task 'sst2'. Expected one of"):
        read_classification_file(path, "sst2")


def test_pairs_and_keywords_read_as_clue_encodes_them(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(
        '{"keyword": ["甲", "乙"], "abst": "摘要", "label": "1"}\n'
        '{"keyword": ["丙"], "abst": "文本", "label": "0"}\n'
    )
    assert read_classification_file(path, "csl") == (["甲；乙", "丙"], ["摘要", "文本"], [1, 0])
    path.write_text(
        '{"sentence1": "a", "sentence2": "b", "label": "contradiction"}\n'
        '{"sentence1": "c", "sentence2": "d", "label": "-"}\n'
    )
    assert read_classification_file(path, "ocnli") == (["a"], ["b"], [2])
