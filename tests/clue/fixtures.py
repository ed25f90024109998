"""Tiny CLUE / FewCLUE data folders and a tiny preset for the runner tests."""

import json
import pathlib
import random

from tests.clue.helpers import VOCABULARY

POSITIVE = ["很好", "喜欢", "今天很好", "好的", "喜欢这个地方"]
NEGATIVE = ["不好", "不喜欢", "今天不好", "不", "不喜欢这个"]
IDIOMS = ["一心一意", "三心二意", "大学中国", "北京上海", "天气很好", "电影游戏", "小明小红"]


def write_lines(path, records):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    path.write_text(text, encoding="utf-8")
    return path


def write_json(path, document):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    return path


def tiny_preset(folder, max_sequence_length=32, vocabulary=VOCABULARY, **overrides):
    """A 1-layer TransformerBackbone preset with its vocab.txt."""
    import keras

    from keras_masking.models import TransformerBackbone

    keras.utils.set_random_seed(0)
    kwargs = dict(
        vocabulary_size=len(vocabulary),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=0.0,
        max_sequence_length=max_sequence_length,
    )
    kwargs.update(overrides)
    TransformerBackbone(**kwargs).save_to_preset(str(folder))
    (pathlib.Path(folder) / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    return pathlib.Path(folder)


def eprstmt(root, train=16, dev=8, seed=0):
    """FewCLUE EPRSTMT: separable sentiment lines, test_public and test."""
    rng = random.Random(seed)

    def lines(count, start, labelled=True):
        records = []
        for index in range(count):
            positive = index % 2 == 0
            record = {
                "id": start + index,
                "sentence": rng.choice(POSITIVE if positive else NEGATIVE),
            }
            if labelled:
                record["label"] = "Positive" if positive else "Negative"
            records.append(record)
        rng.shuffle(records)
        return records

    folder = pathlib.Path(root) / "eprstmt"
    write_lines(folder / "train_few_all.json", lines(train, 0))
    write_lines(folder / "dev_few_all.json", lines(dev, 1000))
    write_lines(folder / "test_public.json", lines(dev, 2000))
    write_lines(folder / "test.json", lines(6, 3000, labelled=False))
    return pathlib.Path(root)


def c3(root):
    """CLUE C3: m- and d- files, one JSON array each, and test1.1."""

    def document(first_id=None):
        questions = [
            {"question": "他去哪儿？", "choice": ["北京", "上海", "公园"], "answer": "北京"},
            {"question": "什么时候？", "choice": ["今天", "明天"], "answer": "今天"},
        ]
        if first_id is not None:
            questions = [
                {"question": q["question"], "choice": q["choice"], "id": first_id + i}
                for i, q in enumerate(questions)
            ]
        return [[["他今天去北京。", "好的。"], questions, "m1"]]

    folder = pathlib.Path(root) / "c3"
    for split in ("train", "dev"):
        write_json(folder / f"m-{split}.json", document())
        write_json(folder / f"d-{split}.json", document())
    write_json(folder / "test1.1.json", document(first_id=0))
    return pathlib.Path(root)


def chid(root):
    """FewCLUE CHID: a blank a line, seven candidates."""

    def lines(count, start, labelled=True):
        records = []
        for index in range(count):
            record = {"id": start + index, "candidates": IDIOMS, "content": "他做事#idiom#。"}
            if labelled:
                record["answer"] = 0
            records.append(record)
        return records

    folder = pathlib.Path(root) / "chid"
    write_lines(folder / "train_few_all.json", lines(4, 0))
    write_lines(folder / "dev_few_all.json", lines(2, 100))
    write_lines(folder / "test.json", lines(2, 200, labelled=False))
    return pathlib.Path(root)


def cmrc2018(root):
    """CLUE CMRC2018 in SQuAD format."""
    context = "北京是中国的首都。上海在中国。"

    def document(prefix, with_answers=True):
        questions = [
            ("首都是哪里？", "北京", 0),
            ("上海在哪里？", "中国", 12),
        ]
        qas = []
        for index, (question, text, start) in enumerate(questions):
            qa = {"id": f"{prefix}_{index}", "question": question}
            if with_answers:
                qa["answers"] = [{"text": text, "answer_start": start}]
            qas.append(qa)
        paragraph = {"id": prefix, "context": context, "qas": qas}
        return {"version": "v1.0", "data": [{"id": prefix, "paragraphs": [paragraph]}]}

    folder = pathlib.Path(root) / "cmrc2018"
    write_json(folder / "train.json", document("TRAIN"))
    write_json(folder / "dev.json", document("DEV"))
    write_json(folder / "test.json", document("TEST", with_answers=False))
    return pathlib.Path(root)


def cluener(root):
    """CLUE CLUENER: entity spans, end inclusive."""
    records = [
        {
            "text": "小明在北京",
            "label": {"name": {"小明": [[0, 1]]}, "address": {"北京": [[3, 4]]}},
        },
        {
            "text": "小红去上海",
            "label": {"name": {"小红": [[0, 1]]}, "address": {"上海": [[3, 4]]}},
        },
    ]
    folder = pathlib.Path(root) / "cluener"
    write_lines(folder / "train.json", records * 2)
    write_lines(folder / "dev.json", records)
    write_lines(folder / "test.json", [{"id": 0, "text": "小明去北京"}, {"id": 1, "text": "你好"}])
    return pathlib.Path(root)


WRITERS = {"eprstmt": eprstmt, "c3": c3, "chid": chid, "cmrc2018": cmrc2018, "cluener": cluener}
