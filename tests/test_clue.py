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
