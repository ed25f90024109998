"""SentencePiece's ``ModelProto`` pieces in protobuf's wire format, written by hand.

The unigram tokenizer's TensorFlow graph (`unigram_graph`) and its
transformers files (`xlm_roberta_tokenizer_files`) both write a SentencePiece
model from a unigram model's pieces and scores; these are the few protobuf
encodings they need (no protobuf package, no generated classes).

Example:
>>> field(1, b"ab")
b'\\n\\x02ab'
>>> piece_message("▁a", -1.5, NORMAL)[:2]
b'\\n\\x04'
"""

import struct

# SentencePiece's ModelProto.SentencePiece.Type and TrainerSpec.ModelType.
NORMAL, UNKNOWN, CONTROL = 1, 2, 3
UNIGRAM = 1
NO_ID = (1 << 64) - 1  # int32 -1 as protobuf writes it


def varint(value):
    """A non-negative int as a protobuf varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def varint_field(number, value):
    """Field ``number`` holding the int ``value``."""
    return varint(number << 3) + varint(value)


def field(number, payload):
    """A length-delimited field (strings, bytes, messages)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def piece_message(text, score, kind):
    """A ``ModelProto.SentencePiece`` message: the piece, its float32 score and type."""
    message = field(1, text.encode("utf-8"))
    message += varint(2 << 3 | 5) + struct.pack("<f", float(score))
    return message + varint_field(3, kind)
