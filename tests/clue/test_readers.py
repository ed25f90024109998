"""keras_masking.clue tasks and readers: every task, both layouts, bad input.

Fixtures in each format are written into tmp_path; the real FewCLUE files are
read when $KERAS_MASKING_DATA names a folder holding them (``fewclue/``).
"""

import hashlib
import inspect
import json
import os
import pathlib

import pytest

from keras_masking.clue import ChoiceExample
from keras_masking.clue import ClueTask
from keras_masking.clue import EntityExample
from keras_masking.clue import IdiomPassage
from keras_masking.clue import SpanExample
from keras_masking.clue import TextExample
from keras_masking.clue import detect_benchmark
from keras_masking.clue import get_task
from keras_masking.clue import iter_examples
from keras_masking.clue import read_split
from keras_masking.clue import task_names
from keras_masking.clue.tasks import TASKS
from tests.clue.fixtures import write_json
from tests.testing import FIXTURES

# Real data (the FewCLUE files, the Chinese BERT vocabulary) is read only from
# the folder $KERAS_MASKING_DATA names; the tests that need it skip without it.
DATA = os.environ.get("KERAS_MASKING_DATA")
FEWCLUE = pathlib.Path(DATA or pathlib.Path(__file__).parent / "no-data") / "fewclue"


def write_lines(path, records):
    """Writes ``records`` a line each: a dict as JSON, a str or bytes as it is."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        for record in records:
            if not isinstance(record, str | bytes):
                record = json.dumps(record, ensure_ascii=False)
            file.write((record if isinstance(record, bytes) else record.encode()) + b"\n")
    return path


# === Tasks ===
def test_the_registry_holds_every_task_of_both_benchmarks():
    clue = ("afqmc", "tnews", "iflytek", "ocnli", "cmnli", "cluewsc", "csl", "cluener", "c3")
    assert task_names("clue") == clue + ("chid", "cmrc2018")
    assert task_names("fewclue") == (
        "tnews",
        "iflytek",
        "ocnli",
        "cluewsc",
        "csl",
        "chid",
        "bustm",
        "eprstmt",
        "csldcp",
    )
    kinds = {name: task.kind for name, task in TASKS.items()}
    assert kinds["c3"] == "multiple_choice" and kinds["chid"] == "idiom"
    assert kinds["cmrc2018"] == "span" and kinds["cluener"] == "entity"
    assert {kinds[name] for name in ("afqmc", "csldcp", "cluewsc", "csl")} == {"classification"}
    assert get_task("cluener").metric == "cluener" and get_task("cmrc2018").metric == "cmrc2018"
    assert get_task("afqmc").metric == "accuracy"


def test_labels_are_the_files_strings_in_id_order():
    tnews = get_task("tnews").labels
    assert len(tnews) == 15 and tnews[0] == "100" and tnews[3] == "103" and tnews[5] == "106"
    assert "105" not in tnews and "111" not in tnews and tnews[-1] == "116"
    assert get_task("iflytek").labels == tuple(str(i) for i in range(119))
    assert get_task("ocnli").labels == ("entailment", "neutral", "contradiction")
    assert get_task("cmnli").labels == get_task("ocnli").labels
    assert get_task("cluewsc").labels == ("true", "false")
    assert get_task("eprstmt").labels == ("Negative", "Positive")
    assert get_task("csl").labels == get_task("bustm").labels == ("0", "1")
    assert len(get_task("csldcp").labels) == 67 and get_task("c3").labels is None
    assert get_task("csldcp").labels[:3] == ("材料科学与工程", "作物学", "口腔医学")
    assert len(get_task("cluener").labels) == 10 and "organization" in get_task("cluener").labels


def test_defaults_follow_the_reference_settings():
    c3 = get_task("c3").defaults
    assert (c3["max_length"], c3["batch_size"], c3["accumulation"]) == (512, 4, 4)
    chid = get_task("chid").defaults
    assert (chid["max_length"], chid["batch_size"], chid["epochs"]) == (64, 12, 5)
    assert get_task("cmrc2018").defaults["stride"] == 128
    assert get_task("cluener").defaults["max_length"] == 256
    assert get_task("cluewsc").defaults["epochs"] == 30
    assert get_task("afqmc").defaults == {
        "max_length": 128,
        "batch_size": 32,
        "epochs": 10,
        "learning_rate": 2e-5,
        "accumulation": 1,
    }


def test_get_task_aliases_and_unknown_names():
    assert get_task("WSC") is get_task("cluewsc2020") is TASKS["cluewsc"]
    assert get_task(" TNews ") is TASKS["tnews"]
    assert get_task(TASKS["c3"]) is TASKS["c3"]
    with pytest.raises(ValueError, match=r"Unknown task 'sst2'. Expected one of \[.*'afqmc'"):
        get_task("sst2")
    with pytest.raises(ValueError, match=r"Expected one of .* for kind"):
        ClueTask("x", "regression", ("clue",), None, "accuracy")
    with pytest.raises(ValueError, match=r"Expected benchmarks"):
        ClueTask("x", "classification", ("glue",), None, "accuracy")
    defaults = {"max_length": 8}
    task = ClueTask("x", "classification", ("clue",), ["a", "b"], "accuracy", defaults)
    defaults["max_length"] = 9
    assert task.defaults == {"max_length": 8} and task.labels == ("a", "b")
    assert hash(task) == hash(ClueTask("x", "classification", ("clue",), ("a", "b"), "accuracy"))


# === CLUE layout, classification ===
def test_clue_pairs_tnews_iflytek_and_nli(tmp_path):
    write_lines(
        tmp_path / "afqmc_public" / "train.json",
        [
            {"sentence1": "花呗怎么还", "sentence2": "花呗如何还款", "label": "1"},
            {"sentence1": "借呗额度", "sentence2": "花呗分期", "label": "0"},
        ],
    )
    split = read_split(tmp_path, "afqmc", "train")
    assert split.benchmark == "clue" and split.split == "train" and split.labelled
    assert split.examples == [
        TextExample(0, "花呗怎么还", "花呗如何还款", "1"),
        TextExample(1, "借呗额度", "花呗分期", "0"),
    ]
    assert split.labels == ("0", "1") and split.skipped == 0

    write_lines(
        tmp_path / "tnews" / "dev.json",
        [
            {"label": "103", "label_desc": "news_sports", "sentence": "球赛", "keywords": ""},
            {"label": "116", "label_desc": "news_game", "sentence": "游戏", "keywords": "a"},
        ],
    )
    write_lines(tmp_path / "tnews" / "test.json", [{"id": 5, "sentence": "新闻", "keywords": ""}])
    dev = read_split(tmp_path, "tnews", "dev")
    assert [(e.id, e.text_a, e.text_b, e.label) for e in dev.examples] == [
        (0, "球赛", None, "103"),
        (1, "游戏", None, "116"),
    ]
    test = read_split(tmp_path, "tnews", "test")
    assert not test.labelled and test.examples == [TextExample(5, "新闻", None, None)]

    write_lines(
        tmp_path / "ocnli" / "train.50k.json",
        [
            {"sentence1": "a", "sentence2": "b", "label": "neutral", "id": 10, "genre": "x"},
            {"sentence1": "c", "sentence2": "d", "label": "-", "id": 11},
            {"sentence1": "e", "sentence2": "f", "label": "entailment", "id": 12},
        ],
    )
    ocnli = read_split(tmp_path, "ocnli", "train")
    assert [(e.id, e.label) for e in ocnli.examples] == [(10, "neutral"), (12, "entailment")]
    assert ocnli.skipped == 1 and ocnli.files[0]["records"] == 3

    write_lines(
        tmp_path / "cmnli" / "dev.json",
        [
            {"sentence1": "a", "sentence2": "b", "label": "-"},
            {"sentence1": "c", "sentence2": "d", "label": "contradiction"},
        ],
    )
    cmnli = read_split(tmp_path, "cmnli", "dev")
    # The id of a record without one is its index in the file, skipped ones counted.
    assert cmnli.examples == [TextExample(1, "c", "d", "contradiction")] and cmnli.skipped == 1

    write_lines(
        tmp_path / "iflytek" / "dev.json", [{"label": "7", "label_des": "x", "sentence": "s"}]
    )
    assert read_split(tmp_path, "iflytek", "dev").examples[0].label == "7"


def test_csl_keywords_join_and_wsc_spans_marked(tmp_path):
    write_lines(
        tmp_path / "csl" / "dev.json",
        [{"id": 3, "abst": "摘要文本", "keyword": ["模型", "训练", "数据"], "label": "0"}],
    )
    assert read_split(tmp_path, "csl", "dev").examples == [
        TextExample(3, "模型；训练；数据", "摘要文本", "0")
    ]
    text = "小明把书给了小红，她很高兴。"
    record = {
        "target": {"span1_index": 6, "span1_text": "小红", "span2_index": 9, "span2_text": "她"},
        "idx": 4,
        "label": "true",
        "text": text,
    }
    write_lines(tmp_path / "wsc" / "train.json", [record])
    split = read_split(tmp_path, "cluewsc", "train")
    assert split.examples == [TextExample(4, "小明把书给了_小红_，[她]很高兴。", None, "true")]
    # span2 before span1, in text order
    reverse = dict(
        record,
        target={"span1_index": 9, "span1_text": "她", "span2_index": 0, "span2_text": "小明"},
        idx=5,
        label="false",
    )
    test = dict(record, id=7)
    test.pop("idx")
    test.pop("label")
    write_lines(tmp_path / "cluewsc2020" / "dev.json", [reverse])
    write_lines(tmp_path / "cluewsc2020" / "test.json", [test])
    # Two CLUE folders for one task are refused; the task folder as data_dir works.
    with pytest.raises(
        ValueError, match=r"More than one folder holds cluewsc files: .*cluewsc2020"
    ):
        read_split(tmp_path, "cluewsc", "dev")
    dev = read_split(tmp_path / "cluewsc2020", "wsc", "dev")
    assert dev.examples == [TextExample(5, "[小明]把书给了小红，_她_很高兴。", None, "false")]
    assert read_split(tmp_path / "cluewsc2020", "wsc", "test").examples == [
        TextExample(7, "小明把书给了_小红_，[她]很高兴。", None, None)
    ]


def test_classification_texts_are_the_texts_a_run_reads(tmp_path):
    """What `convert-e5 --prune-to` adds: CLUEWSC's marked spans, CSL's joined
    keywords (pruned to the files' own strings, their pieces were <unk>)."""
    from keras_masking.clue.readers import classification_texts

    record = {
        "target": {"span1_index": 6, "span1_text": "小红", "span2_index": 9, "span2_text": "她"},
        "idx": 4,
        "label": "true",
        "text": "小明把书给了小红，她很高兴。",
    }
    test = {"id": 7, "target": record["target"], "text": record["text"]}
    write_lines(tmp_path / "cluewsc" / "train.json", [record])
    write_lines(tmp_path / "cluewsc" / "test.json", [test])
    marked = "小明把书给了_小红_，[她]很高兴。"
    assert classification_texts(tmp_path / "cluewsc" / "train.json") == [marked]
    assert classification_texts(tmp_path / "cluewsc" / "test.json") == [marked]  # no labels
    csl = {"id": 3, "abst": "摘要文本", "keyword": ["模型", "训练"], "label": "0"}
    write_lines(tmp_path / "csl" / "dev.json", [csl])
    assert classification_texts(tmp_path / "csl" / "dev.json") == ["模型；训练", "摘要文本"]
    write_lines(tmp_path / "notes" / "dev.json", [csl])
    assert classification_texts(tmp_path / "notes" / "dev.json") == []  # no such task


@pytest.mark.parametrize(
    "span1, span2, marked",
    [
        ((0, "小明的他"), (3, "他"), "_小明的[他]_来了"),  # nested, one end: inner closes first
        ((0, "小明"), (0, "小明的他"), "[_小明_的他]来了"),  # nested, one start: outer opens first
        ((0, "小明"), (2, "的"), "_小明_[的]他来了"),  # adjacent: one closes, then one opens
    ],
)
def test_wsc_spans_that_touch_or_nest_are_marked_nested(tmp_path, span1, span2, marked):
    target = {"span1_index": span1[0], "span1_text": span1[1]}
    target.update(span2_index=span2[0], span2_text=span2[1])
    record = {"target": target, "idx": 0, "label": "true", "text": "小明的他来了"}
    write_lines(tmp_path / "cluewsc" / "dev.json", [record])
    assert read_split(tmp_path, "cluewsc", "dev").examples[0].text_a == marked


# === FewCLUE layout ===
def test_fewclue_integer_labels_few_shot_splits_and_test_ids(tmp_path):
    folder = tmp_path / "tnews"
    write_lines(
        folder / "train_few_all.json",
        [
            {"label": 103, "label_desc": "news_sports", "sentence": "球", "keywords": "", "id": 9},
            {"label": 100, "label_desc": "news_story", "sentence": "故事", "keywords": "", "id": 2},
        ],
    )
    write_lines(
        folder / "train_1.json",
        [{"label": 115, "label_desc": "x", "sentence": "农业", "keywords": "", "id": 4}],
    )
    write_lines(folder / "test_public.json", [{"label": 116, "sentence": "游", "id": 30}])
    write_lines(folder / "test.json", [{"sentence": "未知", "id": 31}])
    train = read_split(tmp_path, "tnews", "train")
    assert train.benchmark == "fewclue" and train.split == "train"
    assert train.examples == [
        TextExample(9, "球", None, "103"),
        TextExample(2, "故事", None, "100"),
    ]
    one = read_split(tmp_path, "tnews", "train", few_shot=1)
    assert one.split == "train_1" and one.examples == [TextExample(4, "农业", None, "115")]
    assert read_split(tmp_path, "tnews", "train_1").examples == one.examples
    public = read_split(tmp_path, "tnews", "test_public")
    assert public.labelled and public.examples == [TextExample(30, "游", None, "116")]
    test = read_split(tmp_path, "tnews", "test")
    assert not test.labelled and test.examples == [TextExample(31, "未知", None, None)]
    with pytest.raises(FileNotFoundError, match=r"Tried: .*tnews/train_3.json"):
        read_split(tmp_path, "tnews", "train", few_shot=3)
    with pytest.raises(ValueError, match=r"Expected an integer <= 4 for few_shot"):
        read_split(tmp_path, "tnews", "train", few_shot=5)
    with pytest.raises(ValueError, match=r"Unknown FewCLUE split 'valid'"):
        read_split(tmp_path, "tnews", "valid")


def test_fewclue_single_texts_pairs_and_csldcp_labels(tmp_path):
    write_lines(
        tmp_path / "eprstmt" / "dev_few_all.json",
        [
            {"id": 0, "sentence": "好用", "label": "Positive"},
            {"id": 1, "sentence": "差", "label": "Negative"},
        ],
    )
    assert [e.label for e in read_split(tmp_path, "eprstmt", "dev").examples] == [
        "Positive",
        "Negative",
    ]
    write_lines(
        tmp_path / "bustm" / "train_few_all.json",
        [{"id": 0, "sentence1": "你好", "sentence2": "您好", "label": "1"}],
    )
    assert read_split(tmp_path, "bustm", "train").examples == [TextExample(0, "你好", "您好", "1")]
    folder = tmp_path / "csldcp"
    write_lines(
        folder / "train_few_all.json",
        [
            {"content": "材料", "label": "材料科学与工程", "id": 0},
            {"content": "力学", "label": "力学", "id": 1},
            {"content": "材料2", "label": "材料科学与工程", "id": 2},
        ],
    )
    write_lines(folder / "dev_few_all.json", [{"content": "力", "label": "力学", "id": 5}])
    train = read_split(tmp_path, "csldcp", "train")
    # The task's 67 disciplines, not the two this training file holds.
    assert train.labels == get_task("csldcp").labels and len(train.labels) == 67
    assert train.examples[1] == TextExample(1, "力学", None, "力学")
    # A dev label the training file lacks is still one of the task's.
    write_lines(folder / "dev_few_all.json", [{"content": "药", "label": "药学", "id": 5}])
    dev = read_split(tmp_path, "csldcp", "dev")
    assert dev.labels == train.labels and dev.examples == [TextExample(5, "药", None, "药学")]
    assert [pathlib.Path(entry["path"]).name for entry in dev.files] == ["dev_few_all.json"]
    write_lines(folder / "dev_few_all.json", [{"content": "化", "label": "化学", "id": 5}])
    with pytest.raises(ValueError, match=r"dev_few_all.json:1: label '化学' is not one of csldcp"):
        read_split(tmp_path, "csldcp", "dev")


def test_csldcp_labels_are_the_tasks_full_list(tmp_path):
    labels_all = FEWCLUE / "csldcp" / "labels_all.txt"
    if not labels_all.exists():
        pytest.skip("needs $KERAS_MASKING_DATA/fewclue (FewCLUE's csldcp labels_all.txt)")
    listed = [line.strip() for line in labels_all.open(encoding="utf-8") if line.strip()]
    assert get_task("csldcp").labels == tuple(listed)  # the same names, in the same order
    # A 200-line subset of the real training file is read with all 67 labels, and the
    # real dev file's labels (some not in the subset) are accepted.
    lines = (FEWCLUE / "csldcp" / "train_few_all.json").read_text(encoding="utf-8").splitlines()
    folder = tmp_path / "csldcp"
    folder.mkdir()
    (folder / "train_few_all.json").write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
    (folder / "dev_few_all.json").write_bytes(
        (FEWCLUE / "csldcp" / "dev_few_all.json").read_bytes()
    )
    train = read_split(tmp_path, "csldcp", "train")
    dev = read_split(tmp_path, "csldcp", "dev")
    assert len({e.label for e in train.examples}) < 67 == len(train.labels) == len(dev.labels)
    assert {e.label for e in dev.examples} - {e.label for e in train.examples}


def test_fewclue_chid_one_blank_a_line(tmp_path):
    folder = tmp_path / "chid"
    candidates = [
        "一心一意",
        "三心二意",
        "七上八下",
        "九牛一毛",
        "十全十美",
        "五湖四海",
        "六神无主",
    ]
    write_lines(
        folder / "dev_few_all.json",
        [{"id": 1500, "candidates": candidates, "content": "他做事#idiom#。", "answer": 0}],
    )
    write_lines(
        folder / "test.json", [{"id": 77, "candidates": candidates, "content": "#idiom#了"}]
    )
    dev = read_split(tmp_path, "chid", "dev")
    assert dev.benchmark == "fewclue"
    assert dev.examples == [IdiomPassage(1500, tuple(candidates), ("他做事", "。"), (1500,), (0,))]
    test = read_split(tmp_path, "chid", "test")
    assert test.examples == [IdiomPassage(77, tuple(candidates), ("", "了"), (77,), None)]


# === CLUE's other kinds ===
def test_cluener_entities_end_inclusive(tmp_path):
    folder = tmp_path / "cluener"
    write_lines(
        folder / "train.json",
        [
            {
                "text": "浙商银行企业信贷部叶老桂博士",
                "label": {"name": {"叶老桂": [[9, 11]]}, "company": {"浙商银行": [[0, 3]]}},
            },
            {"text": "没有实体", "label": {}},
        ],
    )
    write_lines(folder / "test.json", [{"id": 0, "text": "北京欢迎你"}])
    train = read_split(tmp_path, "cluener", "train")
    assert train.examples == [
        EntityExample(0, "浙商银行企业信贷部叶老桂博士", (("company", 0, 3), ("name", 9, 11))),
        EntityExample(1, "没有实体", ()),
    ]
    assert train.labels == get_task("cluener").labels
    assert read_split(tmp_path, "cluener", "test").examples == [
        EntityExample(0, "北京欢迎你", None)
    ]


def _c3_document(with_answers=True, first_id=0):
    questions = [
        {"question": "男的要去哪儿？", "choice": ["北京", "上海", "广州"], "answer": "上海"},
        {"question": "什么时候？", "choice": ["今天", "明天"], "answer": "明天"},
    ]
    if not with_answers:
        questions = [
            {"question": q["question"], "choice": q["choice"], "id": first_id + i}
            for i, q in enumerate(questions)
        ]
    return [[["男：我明天去上海。", "女：好的。"], questions, "m1-1"]]


def test_c3_two_files_one_record_a_question(tmp_path):
    folder = tmp_path / "c3"
    write_json(folder / "m-train.json", _c3_document())
    d_doc = [
        [["对话"], [{"question": "问", "choice": ["甲", "乙", "丙", "丁"], "answer": "丁"}], "d2"]
    ]
    write_json(folder / "d-train.json", d_doc)
    write_json(folder / "test1.1.json", _c3_document(False, first_id=100))
    write_json(folder / "test1.0.json", _c3_document(False, first_id=200))
    train = read_split(tmp_path, "c3", "train")
    context = "男：我明天去上海。女：好的。"
    assert train.examples == [
        ChoiceExample(0, context, "男的要去哪儿？", ("北京", "上海", "广州"), 1),
        ChoiceExample(1, context, "什么时候？", ("今天", "明天"), 1),
        ChoiceExample(2, "对话", "问", ("甲", "乙", "丙", "丁"), 3),
    ]
    assert [(pathlib.Path(f["path"]).name, f["records"]) for f in train.files] == [
        ("m-train.json", 1),
        ("d-train.json", 1),
    ]
    test = read_split(tmp_path, "c3", "test")
    assert [(e.id, e.label) for e in test.examples] == [(100, None), (101, None)]
    assert pathlib.Path(test.files[0]["path"]).name == "test1.1.json"
    assert [e.id for e in read_split(tmp_path, "c3", "test1.0").examples] == [200, 201]
    (folder / "d-train.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing: .*c3/d-train.json"):
        read_split(tmp_path, "c3", "train")


def _chid_line(tags, candidates=None):
    candidates = candidates or [f"成语{i}" for i in range(10)]
    return {
        "candidates": candidates,
        "content": [f"第一段{tags[0]}中间{tags[1]}结尾", f"第二段{tags[2]}。"],
    }


def test_clue_chid_passages_with_answer_files(tmp_path):
    folder = tmp_path / "chid"
    tags = ["#idiom000000#", "#idiom000001#", "#idiom000002#"]
    write_lines(
        folder / "train.json",
        [_chid_line(tags), {"candidates": ["甲", "乙"], "content": ["#idiom000003#"]}],
    )
    answers = write_json(
        folder / "train_answer.json", {tags[0]: 4, tags[1]: 0, tags[2]: 9, "#idiom000003#": 1}
    )
    write_lines(
        folder / "test1.1.json", [_chid_line(["#idiom000100#", "#idiom000101#", "#idiom000102#"])]
    )
    train = read_split(tmp_path, "chid", "train")
    candidates = tuple(f"成语{i}" for i in range(10))
    assert train.examples == [
        IdiomPassage(
            0, candidates, ("第一段", "中间", "结尾\n第二段", "。"), tuple(tags), (4, 0, 9)
        ),
        IdiomPassage(1, ("甲", "乙"), ("", ""), ("#idiom000003#",), (1,)),
    ]
    assert train.files[0] == {
        "path": str(answers),
        "sha256": hashlib.sha256(answers.read_bytes()).hexdigest(),
        "records": 4,
    }
    assert pathlib.Path(train.files[1]["path"]).name == "train.json"
    test = read_split(tmp_path, "chid", "test")
    assert test.examples[0].labels is None and test.examples[0].blank_ids[0] == "#idiom000100#"

    write_json(folder / "train_answer.json", {tags[0]: 4, tags[1]: 0, "#idiom000003#": 1})
    with pytest.raises(ValueError, match=r"train.json:1: blank '#idiom000002#' has no answer in "):
        read_split(tmp_path, "chid", "train")
    write_json(
        folder / "train_answer.json",
        {tags[0]: 4, tags[1]: 0, tags[2]: 1, "#idiom000003#": 1, "#idiom000009#": 2},
    )
    with pytest.raises(
        ValueError, match=r"train_answer.json: 1 tags have no blank in .*train.json"
    ):
        read_split(tmp_path, "chid", "train")
    write_json(
        folder / "train_answer.json", {tags[0]: 4, tags[1]: 0, tags[2]: 10, "#idiom000003#": 1}
    )
    with pytest.raises(
        ValueError,
        match=r"train.json:1: blank '#idiom000002#': expected a candidate index in \[0, 9\]",
    ):
        read_split(tmp_path, "chid", "train")
    (folder / "train_answer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"Tried: .*chid/train_answer.json"):
        read_split(tmp_path, "chid", "train")


def _squad(answer_start=0, with_answers=True):
    qa = {"id": "TRAIN_1_QUERY_0", "question": "首都是哪里？"}
    if with_answers:
        qa["answers"] = [
            {"text": "北京", "answer_start": answer_start},
            {"text": "北京", "answer_start": 0},
        ]
    return {
        "version": "v1.0",
        "data": [
            {
                "id": "TRAIN_1",
                "paragraphs": [
                    {
                        "id": "TRAIN_1",
                        "context": "北京是中国的首都。",
                        "qas": [
                            qa,
                            {
                                "id": "TRAIN_1_QUERY_1",
                                "question": "是什么？",
                                "answers": [{"text": "首都", "answer_start": 6}],
                            },
                        ],
                    }
                ],
            }
        ],
    }


def test_cmrc2018_squad_questions(tmp_path):
    folder = tmp_path / "cmrc2018"
    write_json(folder / "dev.json", _squad())
    dev = read_split(tmp_path, "cmrc2018", "dev")
    assert dev.examples == [
        SpanExample(
            "TRAIN_1_QUERY_0", "北京是中国的首都。", "首都是哪里？", (("北京", 0), ("北京", 0))
        ),
        SpanExample("TRAIN_1_QUERY_1", "北京是中国的首都。", "是什么？", (("首都", 6),)),
    ]
    assert dev.files[0]["records"] == 2
    test = _squad(with_answers=False)
    test["data"][0]["paragraphs"][0]["qas"] = test["data"][0]["paragraphs"][0]["qas"][:1]
    write_json(folder / "test.json", test)
    assert read_split(tmp_path, "cmrc2018", "test").examples == [
        SpanExample("TRAIN_1_QUERY_0", "北京是中国的首都。", "首都是哪里？", None)
    ]


CMRC2018_OFFICIAL = FIXTURES / "cmrc2018_official.json"


def _official_cmrc2018():
    return json.loads(CMRC2018_OFFICIAL.read_text(encoding="utf-8"))


def test_cmrc2018_official_squad_records_are_placed_by_their_text(tmp_path):
    # Real paragraphs of CMRC2018's squad-style dev and trial files.
    official = _official_cmrc2018()["squad_style"]
    write_json(tmp_path / "cmrc2018" / "dev.json", official)
    dev = read_split(tmp_path, "cmrc2018", "dev")
    by_id = {e.id: e for e in dev.examples}
    assert len(dev.examples) == 16  # every question is kept for scoring
    # DEV_6_QUERY_2: answer_start 165, -1, 130; the second text is not in the context.
    answers = by_id["DEV_6_QUERY_2"].answers
    assert [start for _, start in answers] == [165, None, 130]
    assert answers[1][0] == "2010年是邹游在河南建业効力的最后一个赛季更无法得到出场机会。"
    # TRIAL_210_QUERY_0: answer_start 14 points one character late: placed at 13.
    example = by_id["TRIAL_210_QUERY_0"]
    assert example.answers == (("俗名龙尖", 13),)
    assert example.context[13:17] == "俗名龙尖"
    # DEV_101_QUERY_3: 175, 175, 174 where the texts are at 174, 174, 173.
    assert [start for _, start in by_id["DEV_101_QUERY_3"].answers] == [174, 174, 173]
    for e in dev.examples:
        for text, start in e.answers:
            assert start is None or e.context[start : start + len(text)] == text
    assert dev.counts == {
        "answers": 38,
        "answers_relocated": 8,  # DEV_101_QUERY_3 x3, TRIAL_210 x5
        "answers_unplaced": 2,  # DEV_6_QUERY_2's second and DEV_10_QUERY_2's third
        "questions_unplaced": 0,
    }
    assert by_id["DEV_6_QUERY_2"].source.endswith("dev.json: question 'DEV_6_QUERY_2'")


def test_cmrc2018_training_leaves_out_questions_it_cannot_place(tmp_path):
    official = _official_cmrc2018()["squad_style"]
    # A real question whose every answer is the one text missing from the context.
    qa = official["data"][0]["paragraphs"][0]["qas"][2]
    qa["answers"] = [dict(qa["answers"][1]) for _ in range(2)]
    write_json(tmp_path / "cmrc2018" / "train.json", official)
    write_json(tmp_path / "cmrc2018" / "dev.json", official)
    train = read_split(tmp_path, "cmrc2018", "train")
    assert "DEV_6_QUERY_2" not in [e.id for e in train.examples] and len(train) == 15
    assert train.counts["questions_unplaced"] == train.counts["questions_dropped"] == 1
    dev = read_split(tmp_path, "cmrc2018", "dev")  # dev keeps it: it is scored by text
    assert len(dev) == 16 and "questions_dropped" not in dev.counts
    from keras_masking.clue import score

    kept = [e for e in dev.examples if e.id == "DEV_6_QUERY_2"]
    text = kept[0].answers[0][0]
    assert score("cmrc2018", {"DEV_6_QUERY_2": text}, kept)["em"] == 100.0


def test_cmrc2018_original_layout_reads_as_the_squad_style(tmp_path):
    official = _official_cmrc2018()
    # CMRC2018's own files: a JSON list; CLUE's README: {"version", "data": [...]}.
    for document in (official["original"], {"version": "1.0", "data": official["original"]}):
        write_json(tmp_path / "cmrc2018" / "dev.json", document)
        dev = read_split(tmp_path, "cmrc2018", "dev")
        write_json(tmp_path / "squad" / "cmrc2018" / "dev.json", official["squad_style"])
        squad = {e.id: e for e in read_split(tmp_path / "squad", "cmrc2018", "dev").examples}
        assert len(dev) == 16
        for e in dev.examples:
            same = squad[e.id]
            assert (e.context, e.question) == (same.context, same.question)
            assert [text for text, _ in e.answers] == [text for text, _ in same.answers]
        by_id = {e.id: e for e in dev.examples}
        # DEV_10_QUERY_2's third answer is the number 39764.0 in the original file.
        assert by_id["DEV_10_QUERY_2"].answers[2] == ("39764.0", None)
        assert by_id["TRIAL_210_QUERY_0"].answers == (("俗名龙尖", 13),)
        assert dev.counts["answers_unplaced"] == 2 and dev.counts["answers_relocated"] == 0
    unlabelled = [dict(official["original"][0], qas=[{"query_id": "Q", "query_text": "?"}])]
    write_json(tmp_path / "cmrc2018" / "test.json", unlabelled)
    test = read_split(tmp_path, "cmrc2018", "test")
    assert test.examples[0].id == "Q" and test.examples[0].answers is None


# === Files, streaming, layout detection ===
def test_files_record_sha256_and_counts(tmp_path):
    path = write_lines(
        tmp_path / "bustm" / "dev_few_all.json",
        [
            {"id": 0, "sentence1": "a", "sentence2": "b", "label": "0"},
            "",
            {"id": 1, "sentence1": "c", "sentence2": "d", "label": "1"},
        ],
    )
    split = read_split(tmp_path, "bustm", "dev")
    assert split.files == [
        {
            "path": str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "records": 2,
        }
    ]
    assert len(split) == 2


def test_iter_examples_streams_one_record_at_a_time(tmp_path):
    path = write_lines(
        tmp_path / "train.json",
        [
            {"sentence1": "a", "sentence2": "b", "label": "0"},
            {"sentence1": "c", "sentence2": "d", "label": "1"},
            '{"sentence1": broken',
        ],
    )
    records = iter_examples(path, "afqmc")
    assert inspect.isgenerator(records)
    # Lazy: the first two records come out before the broken third line is read.
    assert next(records) == TextExample(0, "a", "b", "0")
    assert next(records) == TextExample(1, "c", "d", "1")
    with pytest.raises(ValueError, match=r"train.json:3: not valid JSON"):
        next(records)
    report = {}
    path.write_text('{"sentence1": "a", "sentence2": "b", "label": "1"}\n', encoding="utf-8")
    assert [e.label for e in iter_examples(path, "afqmc", report=report)] == ["1"]
    assert report["files"][0]["records"] == 1 and report["skipped"] == 0


def test_detect_benchmark_layouts(tmp_path):
    write_lines(
        tmp_path / "afqmc" / "dev.json", [{"sentence1": "a", "sentence2": "b", "label": "0"}]
    )
    assert detect_benchmark(tmp_path, "afqmc") == ("clue", tmp_path / "afqmc")
    assert detect_benchmark(tmp_path / "afqmc", "afqmc") == ("clue", tmp_path / "afqmc")
    write_lines(tmp_path / "ocnli" / "test.json", [{"id": 0, "sentence1": "a", "sentence2": "b"}])
    with pytest.raises(ValueError, match=r"test.json alone does not tell CLUE from FewCLUE"):
        detect_benchmark(tmp_path, "ocnli")
    assert detect_benchmark(tmp_path, "ocnli", "fewclue")[0] == "fewclue"
    with pytest.raises(ValueError, match=r"afqmc is not a FewCLUE task"):
        read_split(tmp_path, "afqmc", "dev", benchmark="fewclue")
    write_lines(tmp_path / "tnews" / "dev.json", [{"sentence": "a", "label": "100"}])
    with pytest.raises(
        FileNotFoundError,
        match=r"No FewCLUE files of tnews found. Tried: .*; CLUE files are in .*tnews\.",
    ):
        detect_benchmark(tmp_path, "tnews", benchmark="fewclue")
    with pytest.raises(ValueError, match=r"few_shot=2 is a FewCLUE option"):
        read_split(tmp_path, "tnews", "dev", few_shot=2)
    write_lines(tmp_path / "bustm" / "test.json", [{"id": 0, "sentence1": "a", "sentence2": "b"}])
    with pytest.raises(ValueError, match=r"few_shot=1 selects a train / dev file"):
        read_split(tmp_path, "bustm", "test", few_shot=1)
    with pytest.raises(ValueError, match=r"Unknown CLUE split 'validation'"):
        read_split(tmp_path, "tnews", "validation")


# === Bad input: each names the file and the line ===
def test_missing_folder_and_split_list_every_path_tried(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        read_split(tmp_path, "cluewsc", "train")
    message = str(error.value)
    for name in ("cluewsc2020", "wsc", "cluewsc", "cluewsc2020_public"):
        assert str(tmp_path / name) in message
    assert message.rstrip(".").endswith(str(tmp_path))
    write_lines(tmp_path / "chid" / "train.json", [_chid_line(["#idiom000000#"] * 3)])
    with pytest.raises(FileNotFoundError) as error:
        read_split(tmp_path, "chid", "test")
    for name in ("test1.1.json", "test.json", "test1.0.json"):
        assert str(tmp_path / "chid" / name) in str(error.value)


def test_clue_and_fewclue_files_in_one_folder_are_refused(tmp_path):
    write_lines(tmp_path / "tnews" / "train.json", [{"sentence": "a", "label": "100"}])
    write_lines(tmp_path / "tnews" / "dev_few_all.json", [{"sentence": "a", "label": 100, "id": 0}])
    with pytest.raises(
        ValueError,
        match=r"both CLUE files \(.*tnews/train.json\) and FewCLUE "
        r"files \(.*tnews/dev_few_all.json\)",
    ):
        read_split(tmp_path, "tnews", "train")


WSC_TARGET = {"span1_index": 0, "span1_text": "小明", "span2_index": 3, "span2_text": "他"}
PAIR = {"sentence1": "a", "sentence2": "b", "label": "0"}


@pytest.mark.parametrize(
    "task, lines, message",
    [
        ("afqmc", [PAIR, '{"sentence1": '], r"train.json:2: not valid JSON"),
        (
            "afqmc",
            [b'{"sentence1": "\xff", "sentence2": "b", "label": "0"}'],
            r"train.json:1: not UTF-8",
        ),
        ("afqmc", ['["a", "b"]'], r"train.json:1: expected a JSON object. Received: list"),
        ("afqmc", [{"sentence1": "a", "label": "0"}], r"train.json:1: missing field 'sentence2'"),
        (
            "afqmc",
            [dict(PAIR, sentence1=3)],
            r"train.json:1: field 'sentence1': expected a str. Received: int 3",
        ),
        (
            "afqmc",
            [dict(PAIR, label=1)],
            r"train.json:1: field 'label': expected a str. Received: int 1",
        ),
        (
            "tnews",
            [{"sentence": "a", "label": 105}],
            r"train.json:1: label 105 is not one of tnews's labels",
        ),
        (
            "ocnli",
            [dict(PAIR, label="maybe")],
            r"train.json:1: label 'maybe' is not one of ocnli's labels",
        ),
        (
            "csl",
            [{"keyword": "模型", "abst": "x", "label": "1"}],
            r"train.json:1: field 'keyword': expected a non-empty list of strings. Received: str",
        ),
        (
            "csl",
            [{"keyword": ["a", 3], "abst": "x", "label": "1"}],
            r"train.json:1: field 'keyword': expected a non-empty list of strings",
        ),
        (
            "afqmc",
            [dict(PAIR, id=1), dict(PAIR, id=1)],
            r"train.json:2: duplicate id 1 \(first used at .*train.json:1\)",
        ),
        (
            "afqmc",
            [dict(PAIR, id=1.5)],
            r"train.json:1: field 'id': expected an int or a non-empty str",
        ),
        ("afqmc", ["", "  "], r"train.json: the file is empty"),
        (
            "cluewsc",
            [dict(target=dict(WSC_TARGET, span2_index=4), idx=0, label="true", text="小明说他来")],
            r"train.json:1: target span2_text '他' is not at span2_index 4 of the text",
        ),
        (
            "cluewsc",
            [
                dict(
                    target={"span1_index": 0, "span1_text": "小明"}, label="true", text="小明说他来"
                )
            ],
            r"train.json:1: target: missing field 'span2_index'",
        ),
        (
            "cluener",
            [{"text": "北京欢迎你", "label": {"address": {"北京": [[0, 2]]}}}],
            r"train.json:1: address entity '北京' at \[0, 2\] \(end inclusive\) does not match the "
            r"text: text\[0:3\] is '北京欢'",
        ),
        (
            "cluener",
            [{"text": "北京", "label": {"city": {"北京": [[0, 1]]}}}],
            r"train.json:1: entity type 'city' is not one of cluener's types",
        ),
        (
            "chid",
            [{"candidates": ["甲", "乙"], "content": "#idiom# #idiom#", "answer": 0}],
            r"train.json:1: FewCLUE CHID's content must hold exactly one #idiom# blank. Found 2",
        ),
        (
            "chid",
            [{"candidates": ["甲", "乙"], "content": "#idiom#", "answer": 2}],
            r"train.json:1: field 'answer': expected a candidate index in \[0, 1\]",
        ),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, task, lines, message):
    path = write_lines(tmp_path / "train.json", lines)
    with pytest.raises(ValueError, match=message):
        list(iter_examples(path, task))


def test_test_examples_need_ids_and_unique_ids(tmp_path):
    folder = tmp_path / "afqmc"
    write_lines(
        folder / "test.json",
        [{"id": 0, "sentence1": "a", "sentence2": "b"}, {"sentence1": "c", "sentence2": "d"}],
    )
    with pytest.raises(ValueError, match=r"test.json:2: missing field 'id'. Test examples must"):
        read_split(tmp_path, "afqmc", "test")
    write_lines(
        folder / "test.json",
        [
            {"id": 0, "sentence1": "a", "sentence2": "b"},
            {"id": 0, "sentence1": "c", "sentence2": "d"},
        ],
    )
    with pytest.raises(ValueError, match=r"test.json:2: duplicate id 0"):
        read_split(tmp_path, "afqmc", "test")
    # C3's ids are checked across its two files
    write_json(tmp_path / "c3" / "m-dev.json", _c3_document())
    write_json(
        tmp_path / "c3" / "d-dev.json",
        [[["x"], [{"id": 1, "question": "q", "choice": ["a"], "answer": "a"}], "d"]],
    )
    with pytest.raises(
        ValueError, match=r"d-dev.json: .*duplicate id 1 \(first used at .*m-dev.json"
    ):
        read_split(tmp_path, "c3", "dev")


def test_bad_documents_name_file_and_question(tmp_path):
    path = tmp_path / "dev.json"
    document = _c3_document()
    document[0][1][1]["answer"] = "后天"
    write_json(path, document)
    with pytest.raises(
        ValueError,
        match=r"dev.json: document 0 \('m1-1'\), question 1 \(id 1\): "
        r"answer '后天' is not among the choices \('今天', '明天'\)",
    ):
        list(iter_examples(path, "c3"))
    write_json(path, [])
    with pytest.raises(ValueError, match=r"dev.json: the file is empty"):
        list(iter_examples(path, "c3"))
    path.write_text('[[["a"],\n [{"question": }]]]', encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev.json:2: not valid JSON"):
        list(iter_examples(path, "c3"))
    path.write_bytes(b'{"data": [\n"\xfe"]}')
    with pytest.raises(ValueError, match=r"dev.json:2: not UTF-8"):
        list(iter_examples(path, "cmrc2018"))
    document = _squad()
    document["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] = " "
    write_json(path, document)
    with pytest.raises(
        ValueError,
        match=r"dev.json: question 'TRAIN_1_QUERY_0', answer 0: the answer text is empty",
    ):
        list(iter_examples(path, "cmrc2018"))
    write_json(path, {"data": [{"title": "t", "qas": []}]})
    with pytest.raises(ValueError, match=r"dev.json: data\[0\]: expected 'paragraphs' \(SQuAD"):
        list(iter_examples(path, "cmrc2018"))
    write_json(path, {"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q"}]}]}]})
    with pytest.raises(
        ValueError,
        match=r"dev.json: data\[0\].paragraphs\[0\].qas\[0\]: missing "
        r"field 'id'",
    ):
        list(iter_examples(path, "cmrc2018"))
    path.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev.json: the file is empty"):
        list(iter_examples(path, "cmrc2018"))


def test_clue_chid_needs_its_answers(tmp_path):
    path = write_lines(
        tmp_path / "dev.json", [_chid_line(["#idiom000000#", "#idiom000001#", "#idiom000002#"])]
    )
    with pytest.raises(ValueError, match=r"dev.json:1: CLUE CHID's labels are in a separate"):
        list(iter_examples(path, "chid"))
    passages = list(iter_examples(path, "chid", labelled=False))
    assert passages[0].labels is None and len(passages[0].parts) == 4
    write_lines(path, [{"candidates": ["甲"], "content": ["没有空"]}])
    with pytest.raises(ValueError, match=r"dev.json:1: the passage has no #idiomNNNNNN# blank"):
        list(iter_examples(path, "chid", labelled=False))
    write_lines(path, [_chid_line(["#idiom000000#", "#idiom000000#", "#idiom000002#"])])
    with pytest.raises(ValueError, match=r"dev.json:1: duplicate id '#idiom000000#'"):
        list(iter_examples(path, "chid", labelled=False))


# === The real FewCLUE files ===
REAL_LABEL_COUNTS = {
    ("tnews", "train_few_all"): 15,
    ("tnews", "dev_few_all"): 15,
    ("iflytek", "train_few_all"): 119,
    ("iflytek", "dev_few_all"): 117,
    ("ocnli", "train_few_all"): 3,
    ("eprstmt", "train_few_all"): 2,
    ("bustm", "train_few_all"): 2,
    ("csl", "train_few_all"): 2,
    ("cluewsc", "train_few_all"): 2,
}


def _real_files():
    if not FEWCLUE.exists():
        return []
    return sorted(
        (task.name, path.stem)
        for task in (get_task(name) for name in task_names("fewclue"))
        for path in (FEWCLUE / task.name).glob("*.json")
        if path.name != "label_index2en2zh.json"
    )


@pytest.mark.parametrize("task, stem", _real_files() or [pytest.param(None, None, marks=[])])
def test_real_fewclue_files_read_completely(task, stem):
    if task is None:
        pytest.skip("needs $KERAS_MASKING_DATA/fewclue (FewCLUE files)")
    split = {"train_few_all": "train", "dev_few_all": "dev"}.get(stem, stem)
    result = read_split(FEWCLUE, task, split)
    path = FEWCLUE / task / f"{stem}.json"
    lines = sum(1 for line in path.open(encoding="utf-8") if line.strip())
    assert result.benchmark == "fewclue"
    assert len(result.examples) + result.skipped == lines == result.files[-1]["records"]
    assert result.files[-1]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    ids = [e.id for e in result.examples]
    assert len(set(ids)) == len(ids)
    if not result.labelled:
        return
    if get_task(task).kind == "classification":
        found = {e.label for e in result.examples}
        assert found <= set(result.labels)
        if (task, stem) in REAL_LABEL_COUNTS:
            assert len(found) == REAL_LABEL_COUNTS[task, stem]
        assert all(isinstance(e.text_a, str) and e.text_a for e in result.examples)
    else:
        assert all(len(p.candidates) == 7 and len(p.parts) == 2 for p in result.examples)
        assert {p.labels[0] for p in result.examples} <= set(range(7))


def test_real_fewclue_tnews_codes_and_wsc_marks():
    if not FEWCLUE.exists():
        pytest.skip("needs $KERAS_MASKING_DATA/fewclue (FewCLUE files)")
    tnews = read_split(FEWCLUE, "tnews", "train")
    first = json.loads((FEWCLUE / "tnews" / "train_few_all.json").open(encoding="utf-8").readline())
    assert tnews.examples[0] == TextExample(
        first["id"], first["sentence"], None, str(first["label"])
    )
    wsc = read_split(FEWCLUE, "cluewsc", "dev")
    assert all(
        e.text_a.count("_") >= 2 and "[" in e.text_a and "]" in e.text_a for e in wsc.examples
    )
    assert len(wsc.examples) == 159


# === What a run records of reading CLUE's official layouts ===


def test_only_the_clue_1_0_tasks_read_a_test1_0_file(tmp_path):
    """AFQMC has one test file: a test1.0.json beside its test.json was read as a
    second test split, whose submission (the same file name) overwrote test's."""
    from keras_masking.clue.readers import read_task_splits

    def pairs(first_id, labelled=True):
        return [
            {"id": first_id + i, "sentence1": "今天", "sentence2": "明天",
             **({"label": "1"} if labelled else {})}
            for i in range(2)
        ]  # fmt: skip

    for split, lines in (("train", pairs(0)), ("dev", pairs(10)), ("test", pairs(100, False))):
        write_lines(tmp_path / "afqmc" / f"{split}.json", lines)
    write_lines(tmp_path / "afqmc" / "test1.0.json", pairs(200, False))
    splits = read_task_splits(tmp_path, "afqmc")
    assert sorted(splits) == ["dev", "test", "train"]
    assert [example.id for example in splits["test"].examples] == [100, 101]
