"""multilingual-e5's `UnigramTokenizer` as transformers' ``XLMRobertaTokenizer`` files.

`xlm_roberta_tokenizer_files` gives ``sentencepiece.bpe.model`` (a
SentencePiece ``ModelProto`` in XLM-R's order: ``<unk>``, ``<s>``, ``</s>``,
then the pieces, which transformers shifts by one so that every id is the
package's), ``tokenizer_config.json`` and ``special_tokens_map.json``. The
tokenizer's normalisation map goes into the model's precompiled character
map (SentencePiece's format: a double-array trie of the UTF-8 characters and
their replacements), so transformers normalises each character as the
package does. The proto is written in protobuf's wire format directly.
"""

import struct

import numpy as np

from keras_masking.models.sentencepiece_wire import CONTROL
from keras_masking.models.sentencepiece_wire import NO_ID
from keras_masking.models.sentencepiece_wire import NORMAL
from keras_masking.models.sentencepiece_wire import UNIGRAM
from keras_masking.models.sentencepiece_wire import UNKNOWN
from keras_masking.models.sentencepiece_wire import field
from keras_masking.models.sentencepiece_wire import piece_message
from keras_masking.models.sentencepiece_wire import varint_field

_BLOCK = 256


def precompiled_charsmap(normalization):
    """SentencePiece's precompiled normalisation map of a per-character map.

    The map is ``uint32 trie size`` + a darts-clone double-array trie whose
    keys are the UTF-8 bytes of each character and whose values are offsets
    into the NUL-terminated replacements that follow.

    Args:
        normalization: ``{code point: sequence of code points}`` (keys may
            be strings of the code point), a replacement per character; an
            empty one deletes the character.

    Returns:
        The map as bytes.

    Example:
    >>> blob = precompiled_charsmap({0xFF0C: [0x2C], 0x200B: []})
    >>> blob.endswith(b"\\x00,\\x00")  # the replacements, NUL-terminated: "" and ","
    True
    """
    replacements = bytearray()
    keys = {}
    for code, value in sorted((int(k), v) for k, v in normalization.items()):
        keys[chr(code).encode("utf-8")] = len(replacements)
        replacements += "".join(map(chr, value)).encode("utf-8") + b"\x00"
    units = _double_array(keys)
    return struct.pack("<I", 4 * len(units)) + units.astype("<u4").tobytes() + bytes(replacements)


def _double_array(keys):
    """darts-clone's units for ``{key bytes: value}`` (keys without NUL bytes)."""
    # The trie: node -> {label: child}, label 0 for a node's value.
    root = {}
    for key, value in keys.items():
        node = root
        for byte in key:
            node = node.setdefault(byte, {})
        node[0] = value
    units, used_bases, next_free = {0: 0}, set(), _BLOCK
    # (node, its position, the label that reached it)
    pending = [(root, 0, 0)]
    while pending:
        node, position, label = pending.pop()
        labels = sorted(node)
        base = next_free
        while base in used_bases or any(base ^ child in units for child in labels):
            base += 1
        used_bases.add(base)
        while next_free in units:
            next_free += 1
        offset = position ^ base
        if offset >= 1 << 21:
            raise ValueError("The normalisation map is too large for a precompiled charsmap.")
        units[position] = offset << 10 | (1 << 8 if 0 in node else 0) | label
        for child in labels:
            child_position = base ^ child
            if child == 0:
                units[child_position] = node[0] | 1 << 31
            else:
                units[child_position] = child  # set when the child is placed
                pending.append((node[child], child_position, child))
    size = (max(units) // _BLOCK + 1) * _BLOCK
    array = np.zeros(size, "uint32")
    array[list(units)] = list(units.values())
    return array


def xlm_roberta_sentencepiece_model(unigram_model):
    """``sentencepiece.bpe.model`` for transformers' ``XLMRobertaTokenizer``.

    transformers builds XLM-R's vocabulary as ``<s>``, ``<pad>``, ``</s>``,
    ``<unk>``, the model's pieces from its fourth on, then ``<mask>``; the
    pieces of a full (not pruned) multilingual-e5 `UnigramTokenizer` are in
    that order already, so the ids are the package's.

    Args:
        unigram_model: `UnigramTokenizer.unigram_model` (``pieces``,
            ``scores``, ``special_ids``, ``normalization``).

    Returns:
        The serialized ``ModelProto`` (bytes).

    Raises:
        ValueError: the pieces are not XLM-R's layout (a pruned tokenizer).

    Example:
    >>> model = {
    ...     "pieces": ["<s>", "<pad>", "</s>", "<unk>", "\u2581a", "<mask>"],
    ...     "scores": [0.0, 0.0, 0.0, 0.0, -1.0, 0.0],
    ...     "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 5},
    ...     "normalization": {"65": [97]},  # "A" -> "a"
    ... }
    >>> proto = xlm_roberta_sentencepiece_model(model)  # or e5's tokenizer.unigram_model
    >>> "\\u2581a".encode() in proto, b"<mask>" in proto  # <mask>: transformers adds it
    (True, False)
    """
    pieces, scores = unigram_model["pieces"], unigram_model["scores"]
    special = unigram_model["special_ids"]
    expected = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
    if (
        unigram_model.get("kept_ids") is not None
        or any(special.get(name) != index for name, index in expected.items())
        or pieces[-1] != "<mask>"
    ):
        raise ValueError(
            "transformers' XLMRobertaTokenizer holds XLM-R's pieces in their own order (<s>, "
            "<pad>, </s>, <unk>, ..., <mask>); this tokenizer's are not (a pruned tokenizer). "
            "Export the full tokenizer, or feed the model the ids this package's gives."
        )
    out = bytearray()
    out += field(1, piece_message(pieces[3], 0.0, UNKNOWN))
    out += field(1, piece_message(pieces[0], 0.0, CONTROL))
    out += field(1, piece_message(pieces[2], 0.0, CONTROL))
    for piece, score in zip(pieces[4:-1], scores[4:-1]):
        out += field(1, piece_message(piece, score, NORMAL))
    trainer = varint_field(3, UNIGRAM) + varint_field(40, 0) + varint_field(41, 1)
    trainer += varint_field(42, 2) + varint_field(43, NO_ID)
    out += field(2, trainer)
    normalizer = field(1, b"keras_masking_unigram")
    normalizer += field(2, precompiled_charsmap(unigram_model["normalization"]))
    normalizer += varint_field(3, 1) + varint_field(4, 1) + varint_field(5, 1)
    out += field(3, normalizer)
    return bytes(out)


def xlm_roberta_tokenizer_files(tokenizer, model_max_length):
    """``{file name: bytes or JSON value}`` of an ``XLMRobertaTokenizer`` folder.

    Args:
        tokenizer: a full multilingual-e5 `UnigramTokenizer`.
        model_max_length: int, the longest input.

    Example:
    ```python
    tokenizer = keras_masking.models.UnigramTokenizer({
        "pieces": ["<s>", "<pad>", "</s>", "<unk>", "\u2581a", "<mask>"],
        "scores": [0.0, 0.0, 0.0, 0.0, -1.0, 0.0],
        "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 5},
        "normalization": {},
    })  # or load_multilingual_e5()'s
    files = xlm_roberta_tokenizer_files(tokenizer, 512)
    assert sorted(files)[0] == "sentencepiece.bpe.model"
    ```
    """
    special = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "cls_token": "<s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    }
    config = {
        "tokenizer_class": "XLMRobertaTokenizer",
        "model_max_length": int(model_max_length),
        "add_prefix_space": True,
        **special,
    }
    return {
        "sentencepiece.bpe.model": xlm_roberta_sentencepiece_model(tokenizer.unigram_model),
        "tokenizer_config.json": config,
        "special_tokens_map.json": special,
    }
