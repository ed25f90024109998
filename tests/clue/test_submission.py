"""keras_masking.clue submission files: names, writing, checking, the zip."""

import json
import os
import zipfile

import pytest

from keras_masking.clue import build_submission_zip
from keras_masking.clue import check_submission
from keras_masking.clue import read_split
from keras_masking.clue import read_task_splits
from keras_masking.clue import submission_file_name
from keras_masking.clue import write_submission
from keras_masking.clue.examples import TextExample
from keras_masking.clue.submission import default_zip_name
from tests.clue.fixtures import write_json
from tests.clue.fixtures import write_lines


# === Test splits of each kind ===
def tnews_test(tmp_path, name="test.json"):
    write_lines(
        tmp_path / "tnews" / name,
        [
            {"id": 10, "sentence": "球赛"},
            {"id": 11, "sentence": "股市"},
            {"id": 12, "sentence": "游戏"},
        ],
    )
    split = "test" if name == "test.json" else "test1.0"
    return read_split(tmp_path, "tnews", split, benchmark="clue")


def c3_test(tmp_path):
    write_json(
        tmp_path / "c3" / "test1.1.json",
        [
            [["男：去上海。"], [{"id": 0, "question": "去哪？", "choice": ["北京", "上海"]}], "m1"],
            [["女：好。"], [{"id": 1, "question": "说什么？", "choice": ["好", "不", "行"]}], "d1"],
        ],
    )
    return read_split(tmp_path, "c3", "test")


def chid_clue_test(tmp_path):
    write_lines(
        tmp_path / "chid" / "test1.1.json",
        [
            {
                "candidates": [f"成语{i}" for i in range(10)],
                "content": ["甲#idiom000100#乙#idiom000101#"],
            },
            {"candidates": [f"词{i}" for i in range(10)], "content": ["丙#idiom000102#"]},
        ],
    )
    return read_split(tmp_path, "chid", "test")


def chid_fewclue_test(tmp_path):
    candidates = [f"成语{i}" for i in range(7)]
    write_lines(
        tmp_path / "chid" / "test.json",
        [
            {"id": 5, "candidates": candidates, "content": "甲#idiom#乙"},
            {"id": 6, "candidates": candidates, "content": "#idiom#丙"},
        ],
    )
    return read_split(tmp_path, "chid", "test", benchmark="fewclue")


def cmrc_test(tmp_path):
    qas = [
        {"id": "TEST_0_QUERY_0", "question": "首都？"},
        {"id": "TEST_0_QUERY_1", "question": "国家？"},
    ]
    document = {"data": [{"paragraphs": [{"context": "北京是中国的首都。", "qas": qas}]}]}
    write_json(tmp_path / "cmrc2018" / "test.json", document)
    return read_split(tmp_path, "cmrc2018", "test")


def cluener_test(tmp_path):
    write_lines(
        tmp_path / "cluener" / "test.json",
        [{"id": 0, "text": "浙商银行叶老桂在北京"}, {"id": 1, "text": "没有"}],
    )
    return read_split(tmp_path, "cluener", "test")


# === Names ===
def test_file_names_per_task_and_benchmark():
    clue = {
        "afqmc": "afqmc_predict.json",
        "tnews": "tnews11_predict.json",
        "iflytek": "iflytek_predict.json",
        "ocnli": "ocnli_50k_predict.json",
        "cmnli": "cmnli_predict.json",
        "cluewsc": "cluewsc11_predict.json",
        "csl": "csl_predict.json",
        "cluener": "cluener_predict.json",
        "c3": "c311_predict.json",
        "chid": "chid11_predict.json",
        "cmrc2018": "cmrc2018_predict.json",
    }
    fewclue = {
        "tnews": "tnewsf_predict.json",
        "iflytek": "iflytekf_predict.json",
        "ocnli": "ocnlif_predict.json",
        "cluewsc": "cluewscf_predict.json",
        "csl": "cslf_predict.json",
        "chid": "chidf_predict.json",
        "bustm": "bustm_predict.json",
        "eprstmt": "eprstmt_predict.json",
        "csldcp": "csldcp_predict.json",
    }
    assert {task: submission_file_name(task, "clue") for task in clue} == clue
    assert {task: submission_file_name(task, "FewCLUE") for task in fewclue} == fewclue
    old = {
        task: submission_file_name(task, "clue", "1.0") for task in ("tnews", "wsc", "c3", "chid")
    }
    assert old == {
        "tnews": "tnews10_predict.json",
        "wsc": "cluewsc10_predict.json",
        "c3": "c310_predict.json",
        "chid": "chid10_predict.json",
    }
    assert submission_file_name("afqmc", "clue", "1.0") == "afqmc_predict.json"
    with pytest.raises(ValueError, match=r"bustm is not a CLUE task"):
        submission_file_name("bustm", "clue")
    with pytest.raises(ValueError, match=r"Expected version in \('1.1',\) for fewclue"):
        submission_file_name("tnews", "fewclue", "1.0")
    with pytest.raises(ValueError, match=r"Expected benchmark in"):
        submission_file_name("tnews", "superglue")


# === Writing and checking, every kind ===
def test_classification_round_trip_keeps_test_order_and_label_strings(tmp_path):
    test = tnews_test(tmp_path)
    predictions = {12: "116", 10: "103", 11: "104"}
    path = write_submission(tmp_path / "out", "tnews", "clue", predictions, test)
    assert path == tmp_path / "out" / "tnews11_predict.json"
    assert path.read_text(encoding="utf-8") == (
        '{"id": 10, "label": "103"}\n{"id": 11, "label": "104"}\n{"id": 12, "label": "116"}\n'
    )
    assert check_submission(path, "tnews", "clue", test) == []
    assert check_submission(path, "tnews", "clue") == []
    assert [p.name for p in path.parent.iterdir()] == ["tnews11_predict.json"]  # no temporaries


def test_clue_1_0_test_file_gets_the_1_0_name(tmp_path):
    test = tnews_test(tmp_path, "test1.0.json")
    assert test.split == "test1.0"
    path = write_submission(tmp_path, "tnews", "clue", {10: "100", 11: "100", 12: "100"}, test)
    assert path.name == "tnews10_predict.json"
    assert check_submission(path, "tnews", "clue", test) == []
    renamed = path.rename(path.with_name("tnews11_predict.json"))
    assert check_submission(renamed, "tnews", "clue", test) == [
        "file name 'tnews11_predict.json' is not what CLUE expects for tnews: "
        "'tnews10_predict.json'"
    ]


def test_multiple_choice_round_trip(tmp_path):
    test = c3_test(tmp_path)
    path = write_submission(tmp_path / "out", "c3", "clue", {0: 1, 1: 2}, test)
    assert path.name == "c311_predict.json"
    assert path.read_text(encoding="utf-8").splitlines() == [
        '{"id": "0", "label": "1"}',
        '{"id": "1", "label": "2"}',
    ]
    assert check_submission(path, "c3", "clue", test) == []
    with pytest.raises(ValueError, match=r"id 0: choice 2 is out of range: 2 choices"):
        write_submission(tmp_path / "out", "c3", "clue", {0: 2, 1: 0}, test)
    path.write_text('{"id": "0", "label": 1}\n{"id": "1", "label": "3"}\n', encoding="utf-8")
    assert check_submission(path, "c3", "clue", test) == [
        "line 1: label 1 must be the choice index as a string, e.g. '1'",
        "line 2: choice 3 is out of range: 3 choices",
    ]
    path.write_text('{"id": 0, "label": "1"}\n{"id": "1", "label": "2"}\n', encoding="utf-8")
    assert check_submission(path, "c3", "clue", test) == [
        "line 1: id 0 must be a string, as the test file has it ('0')",
        "1 of 2 test ids are missing (first: ['0'])",
    ]


def test_clue_chid_is_one_object_fewclue_chid_lines(tmp_path):
    test = chid_clue_test(tmp_path / "clue")
    predictions = {"#idiom000100#": 3, "#idiom000101#": 0, "#idiom000102#": 9}
    path = write_submission(tmp_path / "out", "chid", "clue", predictions, test)
    assert path.name == "chid11_predict.json"
    assert json.loads(path.read_text(encoding="utf-8")) == predictions
    assert check_submission(path, "chid", "clue", test) == []
    with pytest.raises(ValueError, match=r"1 of 3 test ids are missing .*'#idiom000102#'"):
        write_submission(
            tmp_path / "out", "chid", "clue", {"#idiom000100#": 3, "#idiom000101#": 0}, test
        )
    path.write_text(
        '{"#idiom000100#": 3, "#idiom000100#": 4, "#idiom000101#": "0", "#idiom000102#": 10}',
        encoding="utf-8",
    )
    assert check_submission(path, "chid", "clue", test) == [
        "id '#idiom000100#' appears more than once",
        "id '#idiom000101#': the answer must be a candidate index (an int). Received: '0'",
        "id '#idiom000102#': candidate 10 is out of range: 10 candidates",
    ]

    few = chid_fewclue_test(tmp_path / "few")
    path = write_submission(tmp_path / "out", "chid", "fewclue", {5: 6, 6: 0}, few)
    assert path.name == "chidf_predict.json"
    assert path.read_text(encoding="utf-8") == '{"id": 5, "answer": 6}\n{"id": 6, "answer": 0}\n'
    assert check_submission(path, "chid", "fewclue", few) == []
    with pytest.raises(
        ValueError, match=r"id 5: the answer must be a candidate index .*Received: True"
    ):
        write_submission(tmp_path / "out", "chid", "fewclue", {5: True, 6: 0}, few)
    path.write_text('{"id": 5, "label": 6}\n{"id": 6, "answer": 7}\n', encoding="utf-8")
    assert check_submission(path, "chid", "fewclue", few) == [
        "line 1: missing 'answer'",
        "line 2: candidate 7 is out of range: 7 candidates",
        "1 of 2 test ids are missing (first: [5])",
    ]


def test_span_round_trip_is_one_object(tmp_path):
    test = cmrc_test(tmp_path)
    answers = {"TEST_0_QUERY_1": "中国", "TEST_0_QUERY_0": "北京"}
    path = write_submission(tmp_path / "out", "cmrc2018", "clue", answers, test)
    assert path.read_text(encoding="utf-8") == (
        '{"TEST_0_QUERY_0": "北京", "TEST_0_QUERY_1": "中国"}\n'
    )
    assert check_submission(path, "cmrc2018", "clue", test) == []
    write_lines(
        path, [{"id": "TEST_0_QUERY_0", "label": "北京"}, {"id": "TEST_0_QUERY_1", "label": "中国"}]
    )
    assert check_submission(path, "cmrc2018", "clue", test) == [
        "line 2: a second JSON value; cmrc2018 expects ONE JSON object {question id: answer} "
        "(not a record a line)"
    ]
    write_lines(path, [{"id": "TEST_0_QUERY_0", "label": "北京"}])
    assert check_submission(path, "cmrc2018", "clue") == [
        "the file holds one record ['id', 'label']; cmrc2018 expects ONE JSON object "
        "{question id: answer} over all test ids"
    ]
    write_json(path, {"TEST_0_QUERY_0": ["北京"]})
    assert check_submission(path, "cmrc2018", "clue", test) == [
        "id 'TEST_0_QUERY_0': the answer must be a text. Received: ['北京']",
        "1 of 2 test ids are missing (first: ['TEST_0_QUERY_1'])",
    ]


def test_entity_round_trip_groups_spans_by_type_and_text(tmp_path):
    test = cluener_test(tmp_path)
    predictions = {
        0: [("name", 4, 6), ("company", 0, 3), ("address", 8, 9)],
        1: [],
    }
    path = write_submission(tmp_path / "out", "cluener", "clue", predictions, test)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines == [
        {
            "id": 0,
            "label": {
                "company": {"浙商银行": [[0, 3]]},
                "name": {"叶老桂": [[4, 6]]},
                "address": {"北京": [[8, 9]]},
            },
        },
        {"id": 1, "label": {}},
    ]
    assert check_submission(path, "cluener", "clue", test) == []
    with pytest.raises(ValueError, match=r"id 0: entity type 'city' is not one of cluener's types"):
        write_submission(tmp_path / "o", "cluener", "clue", {0: [("city", 8, 9)], 1: []}, test)
    with pytest.raises(ValueError, match=r"id 1: entity \('name', 0, 2\) is outside the text"):
        write_submission(tmp_path / "o", "cluener", "clue", {0: [], 1: [("name", 0, 2)]}, test)
    assert not (tmp_path / "o").exists()  # validated before anything was written
    write_lines(path, [{"id": 0, "label": {"name": {"叶老": [[4, 6]]}}}, {"id": 1, "label": {}}])
    assert check_submission(path, "cluener", "clue", test) == [
        "line 1: label['name']['叶老']: span [4, 6] covers 3 characters, the entity 2 "
        "(end is inclusive)"
    ]
    write_lines(path, [{"id": 0, "label": {"name": {"叶老": [[5, 6]]}}}, {"id": 1, "label": {}}])
    assert check_submission(path, "cluener", "clue", test) == [
        "line 1: name entity '叶老' at [5, 6] does not match the text ('老桂' there)"
    ]


def test_an_entity_holding_a_line_separator_is_checked_as_the_file_reads(tmp_path):
    # json.dumps leaves U+2028 as it is; the check split lines there too (a
    # valid file refused, and `clue submit` with it), where a file's lines do not end.
    write_lines(tmp_path / "cluener" / "test.json", [{"id": 0, "text": "上海\u2028北京"}])
    test = read_split(tmp_path, "cluener", "test")
    path = write_submission(tmp_path / "out", "cluener", "clue", {0: [("address", 0, 4)]}, test)
    assert "\u2028" in path.read_text(encoding="utf-8")
    assert check_submission(path, "cluener", "clue", test) == []


# === What users trip over ===
def test_class_indices_instead_of_label_strings_are_refused(tmp_path):
    test = tnews_test(tmp_path)
    with pytest.raises(ValueError) as error:
        write_submission(tmp_path / "out", "tnews", "clue", {10: 3, 11: "3", 12: "103"}, test)
    message = str(error.value)
    assert "Not writing tnews11_predict.json" in message
    assert (
        "id 10: label 3 is an int; tnews expects the label string; it looks like a class index: "
        in message
    )
    assert "class 3 of tnews is '103'" in message
    assert "id 11: label '3' is not one of tnews's labels" in message
    assert not (tmp_path / "out").exists()


def test_write_refuses_missing_and_unknown_ids_and_keeps_the_old_file(tmp_path):
    test = tnews_test(tmp_path)
    path = write_submission(tmp_path, "tnews", "clue", {10: "100", 11: "100", 12: "100"}, test)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"1 of 3 test ids are missing \(first: \[12\]\)"):
        write_submission(tmp_path, "tnews", "clue", {10: "100", 11: "100"}, test)
    with pytest.raises(ValueError, match=r"1 ids are not in the test split \(first: \[13\]\)"):
        write_submission(
            tmp_path, "tnews", "clue", {10: "100", 11: "100", 12: "100", 13: "100"}, test
        )
    with pytest.raises(ValueError, match=r"Expected predictions, a dict"):
        write_submission(tmp_path, "tnews", "clue", ["100", "100", "100"], test)
    with pytest.raises(
        ValueError, match=r"test_split is clue tnews's test split; expected one of clue afqmc"
    ):
        write_submission(tmp_path, "afqmc", "clue", {}, test)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tnews", "tnews11_predict.json"]


def test_dev_split_is_no_submission(tmp_path):
    write_lines(
        tmp_path / "eprstmt" / "dev_few_all.json",
        [{"id": 0, "sentence": "好", "label": "Positive"}],
    )
    dev = read_split(tmp_path, "eprstmt", "dev")
    with pytest.raises(
        ValueError, match=r"test_split is the 'dev' split; submissions are for a test"
    ):
        write_submission(tmp_path, "eprstmt", "fewclue", {0: "Positive"}, dev)


def test_check_names_unversioned_and_wrong_benchmark_files(tmp_path):
    path = write_lines(tmp_path / "tnews_predict.json", [{"id": 10, "label": "103"}])
    assert check_submission(path, "tnews", "clue") == [
        "file name 'tnews_predict.json' is not what CLUE expects for tnews: 'tnews11_predict.json' "
        "(or 'tnews10_predict.json' for CLUE 1.0's test file)"
    ]
    assert check_submission(path, "tnews", "fewclue") == [
        "file name 'tnews_predict.json' is not what FewCLUE expects for tnews: "
        "'tnewsf_predict.json'"
    ]
    assert check_submission(tmp_path / "afqmc_predict.json", "afqmc", "clue") == [
        f"{tmp_path / 'afqmc_predict.json'}: no such file"
    ]


def test_check_finds_missing_repeated_unknown_and_misordered_ids(tmp_path):
    test = tnews_test(tmp_path)
    path = tmp_path / "tnews11_predict.json"
    write_lines(
        path, [{"id": 10, "label": "103"}, {"id": 10, "label": "104"}, {"id": 99, "label": "100"}]
    )
    assert check_submission(path, "tnews", "clue", test) == [
        "line 2: id 10 repeats line 1",
        "2 of 3 test ids are missing (first: [11, 12])",
        "1 ids are not in the test split (first: [99])",
    ]
    write_lines(
        path, [{"id": 11, "label": "103"}, {"id": 10, "label": "104"}, {"id": 12, "label": "100"}]
    )
    assert check_submission(path, "tnews", "clue", test) == [
        "line 1: records are not in the test file's order (expected id 10 at record 0, found 11)"
    ]
    write_lines(
        path,
        [{"id": "10", "label": "103"}, {"id": "11", "label": "104"}, {"id": "12", "label": "100"}],
    )
    assert check_submission(path, "tnews", "clue", test) == [
        "ids have the wrong type: the file has '10' where the test file has 10 (write the test "
        "file's ids as they are)"
    ]
    # Python takes 10.0 and True for 10 and 1: the file does not.
    write_lines(
        path,
        [{"id": 10.0, "label": "103"}, {"id": 11, "label": "104"}, {"id": 12, "label": "100"}],
    )
    assert check_submission(path, "tnews", "clue", test) == [
        "line 1: id 10.0 is a float: write the test file's ids as they are",
        "1 of 3 test ids are missing (first: [10])",
    ]
    with pytest.raises(ValueError, match="id True is a bool"):
        write_submission(tmp_path / "o", "tnews", "clue", {True: "103", 11: "104", 12: "100"}, test)
    assert not (tmp_path / "o").exists()


def test_check_finds_labels_outside_the_set_and_bad_lines(tmp_path):
    path = tmp_path / "ocnli_50k_predict.json"
    path.write_text(
        '{"id": 0, "label": "neutral"}\n'
        '{"id": 1, "label": "2"}\n'
        '{"id": 2, "label": "Neutral"}\n'
        '{"id": 3}\n'
        "not json\n"
        '["id", 4]\n',
        encoding="utf-8",
    )
    assert check_submission(path, "ocnli", "clue") == [
        "line 2: label '2' is not one of ocnli's labels ('entailment', 'neutral', "
        "'contradiction'); it looks like a class index: class 2 of ocnli is 'contradiction' "
        "(write task.labels[index])",
        "line 3: label 'Neutral' is not one of ocnli's labels ('entailment', 'neutral', "
        "'contradiction')",
        "line 4: missing 'label'",
        "line 5: not valid JSON (Expecting value)",
        "line 6: expected a JSON object {'id': ..., 'label': ...}. Received: list",
    ]
    path.write_bytes(b'{"id": 0, "label": "\xff"}\n')
    assert check_submission(path, "ocnli", "clue") == ["line 1: not UTF-8 (CLUE reads UTF-8)"]
    path.write_text("\n", encoding="utf-8")
    assert check_submission(path, "ocnli", "clue") == ["the file is empty"]


def test_csldcp_labels_are_the_tasks_67(tmp_path):
    folder = tmp_path / "csldcp"
    write_lines(folder / "train_few_all.json", [{"id": 0, "content": "a", "label": "力学"}])
    write_lines(folder / "test.json", [{"id": 3, "content": "b"}])
    test = read_split(tmp_path, "csldcp", "test")
    assert len(test.labels) == 67 and "药学" in test.labels  # not only the training file's
    with pytest.raises(ValueError, match=r"id 3: label '化学' is not one of csldcp's labels"):
        write_submission(tmp_path / "out", "csldcp", "fewclue", {3: "化学"}, test)
    path = write_submission(tmp_path / "out", "csldcp", "fewclue", {3: "药学"}, test)
    assert path.read_text(encoding="utf-8") == '{"id": 3, "label": "药学"}\n'
    assert check_submission(path, "csldcp", "fewclue", test) == []


def test_a_folder_with_both_test_files_gives_both_submissions(tmp_path):
    folder = tmp_path / "tnews"
    write_lines(folder / "train.json", [{"sentence": "好", "label": "100"}])
    write_lines(folder / "dev.json", [{"sentence": "好", "label": "101"}])
    write_lines(folder / "test1.0.json", [{"id": 0, "sentence": "旧"}, {"id": 1, "sentence": "旧"}])
    write_lines(folder / "test1.1.json", [{"id": 5, "sentence": "新"}])
    splits = read_task_splits(tmp_path, "tnews")
    assert sorted(splits) == ["dev", "test", "test1.0", "train"]
    assert [e.id for e in splits["test"].examples] == [5]
    assert [e.id for e in splits["test1.0"].examples] == [0, 1]
    new = write_submission(tmp_path / "out", "tnews", "clue", {5: "102"}, splits["test"])
    old = write_submission(
        tmp_path / "out", "tnews", "clue", {0: "100", 1: "103"}, splits["test1.0"]
    )
    assert (new.name, old.name) == ("tnews11_predict.json", "tnews10_predict.json")
    assert check_submission(old, "tnews", "clue", splits["test1.0"]) == []
    # A folder with test1.0.json alone: that file is the test split, once.
    (folder / "test1.1.json").unlink()
    splits = read_task_splits(tmp_path, "tnews")
    assert sorted(splits) == ["dev", "test", "train"] and splits["test"].split == "test"
    assert [e.id for e in splits["test"].examples] == [0, 1]


def test_problems_are_capped(tmp_path):
    path = write_lines(
        tmp_path / "iflytek_predict.json", [{"id": i, "label": i} for i in range(30)]
    )
    problems = check_submission(path, "iflytek", "clue")
    assert len(problems) == 21 and problems[-1] == "... and 10 more problems."
    assert problems[0].startswith("line 1: label 0 is an int; iflytek expects the label string")


# === The zip ===
def test_zip_holds_the_files_at_its_root(tmp_path):
    afqmc = write_lines(tmp_path / "a" / "afqmc_predict.json", [{"id": 0, "label": "1"}])
    tnews = write_lines(tmp_path / "b" / "tnews11_predict.json", [{"id": 0, "label": "100"}])
    path = build_submission_zip([afqmc, tnews], tmp_path / "z" / "submit_team_20240101.zip")
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["afqmc_predict.json", "tnews11_predict.json"]
        assert archive.read("tnews11_predict.json") == tnews.read_bytes()
    assert os.listdir(tmp_path / "z") == ["submit_team_20240101.zip"]
    other = write_lines(tmp_path / "c" / "afqmc_predict.json", [{"id": 0, "label": "1"}])
    with pytest.raises(ValueError, match=r"Two files named 'afqmc_predict.json'"):
        build_submission_zip([afqmc, other], tmp_path / "x.zip")
    few = write_lines(tmp_path / "tnewsf_predict.json", [{"id": 0, "label": "100"}])
    with pytest.raises(ValueError, match=r"mix CLUE and FewCLUE submissions"):
        build_submission_zip([afqmc, few], tmp_path / "x.zip")
    stray = write_lines(tmp_path / "predictions.json", [])
    with pytest.raises(ValueError, match=r"'predictions.json' is no CLUE / FewCLUE submission"):
        build_submission_zip([stray], tmp_path / "x.zip")
    with pytest.raises(FileNotFoundError, match=r"No such submission file: .*cmnli_predict.json"):
        build_submission_zip([tmp_path / "cmnli_predict.json"], tmp_path / "x.zip")
    with pytest.raises(ValueError, match=r"at least one"):
        build_submission_zip([], tmp_path / "x.zip")
    assert not (tmp_path / "x.zip").exists()


def test_default_zip_names_are_the_benchmarks_own():
    # FewCLUE's README: "zip fewclue_submit_examples.zip *.json".
    assert default_zip_name("fewclue", "team", "20240101") == "fewclue_submit_examples.zip"
    assert default_zip_name("clue", "mylab", "20240101") == "submit_mylab_20240101.zip"
    with pytest.raises(ValueError, match=r"Expected benchmark in"):
        default_zip_name("glue")


def test_plain_lists_of_examples_serve_as_the_test_split(tmp_path):
    test = [TextExample("a", "x", None, None), TextExample("b", "y", None, None)]
    path = write_submission(tmp_path, "afqmc", "clue", {"a": "0", "b": "1"}, test)
    assert (
        path.read_text(encoding="utf-8") == '{"id": "a", "label": "0"}\n{"id": "b", "label": "1"}\n'
    )
    assert check_submission(path, "afqmc", "clue", test) == []
    with pytest.raises(ValueError, match=r"Expected test_split, cluener's EntityExample records"):
        write_submission(tmp_path, "cluener", "clue", {"a": [], "b": []}, test)
