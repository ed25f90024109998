"""CLUE / FewCLUE readers on the real FewCLUE files in ../shared/data, and what a
CLUE run records of CLUE's official files."""

import json
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


# === Runs on CLUE's official layouts ===
@pytest.mark.slow
def test_a_run_writes_both_test_files_and_records_what_reading_changed(tmp_path):
    from tests import clue_fixtures

    from keras_masking.clue import finetune

    preset = clue_fixtures.tiny_preset(tmp_path / "preset", max_sequence_length=32)
    settings = dict(epochs=1, batch_size=2, max_length=16, learning_rate=1e-3, verbose=0)
    # TNEWS with CLUE 1.0's test file beside 1.1's: CLUE's baselines submit both.
    folder = tmp_path / "data" / "tnews"
    clue_fixtures.write_lines(
        folder / "train.json",
        [{"sentence": "很好", "label": "100"}, {"sentence": "不", "label": "101"}],
    )
    clue_fixtures.write_lines(folder / "dev.json", [{"sentence": "好", "label": "100"}])
    clue_fixtures.write_lines(folder / "test1.0.json", [{"id": 7, "sentence": "好"}])
    clue_fixtures.write_lines(folder / "test1.1.json", [{"id": 0, "sentence": "不好"}])
    finetune("tnews", tmp_path / "data", tmp_path / "tnews_run", preset=preset, **settings)
    record = json.loads((tmp_path / "tnews_run" / "run.json").read_text(encoding="utf-8"))
    assert (record["submission"], record["submission_1.0"]) == (
        "tnews11_predict.json",
        "tnews10_predict.json",
    )
    lines = (tmp_path / "tnews_run" / "tnews10_predict.json").read_text(encoding="utf-8")
    assert json.loads(lines)["id"] == 7
    # CMRC2018: an answer_start of -1 whose text is nowhere in the context is counted.
    context = "北京是中国的首都。"
    qas = [
        {"id": "Q0", "question": "首都？", "answers": [{"text": "北京", "answer_start": 0}]},
        {"id": "Q1", "question": "哪国？", "answers": [{"text": "中国", "answer_start": 5}]},
        {"id": "Q2", "question": "何处？", "answers": [{"text": "上海。", "answer_start": -1}]},
    ]
    document = {"data": [{"paragraphs": [{"id": "P", "context": context, "qas": qas}]}]}
    for split in ("train", "dev"):
        clue_fixtures.write_json(tmp_path / "data" / "cmrc2018" / f"{split}.json", document)
    finetune("cmrc2018", tmp_path / "data", tmp_path / "cmrc_run", preset=preset, **settings)
    record = json.loads((tmp_path / "cmrc_run" / "run.json").read_text(encoding="utf-8"))
    train, dev = record["data"]["train"], record["data"]["dev"]
    assert (train["examples"], dev["examples"]) == (2, 3)  # Q2 is scored, not trained on
    assert train["counts"] == {
        "answers": 3,
        "answers_relocated": 1,
        "answers_unplaced": 1,
        "questions_unplaced": 1,
        "questions_dropped": 1,
    }
    assert dev["counts"]["answers_unplaced"] == 1 and "questions_dropped" not in dev["counts"]


def test_the_run_record_holds_what_reading_changed(tmp_path):
    from keras_masking.clue import read_split
    from keras_masking.clue.runner import _split_record

    qas = [{"id": "Q", "question": "何处？", "answers": [{"text": "北京", "answer_start": 3}]}]
    document = {"data": [{"paragraphs": [{"context": "在北京", "qas": qas}]}]}
    path = tmp_path / "cmrc2018" / "dev.json"
    path.parent.mkdir()
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    record = _split_record(read_split(tmp_path, "cmrc2018", "dev"))
    assert record["counts"] == {
        "answers": 1,
        "answers_relocated": 1,
        "answers_unplaced": 0,
        "questions_unplaced": 0,
    }
