"""Hand-made SentencePiece-unigram models for the `UnigramTokenizer` tests.

XLM-R's layout: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3 (score 0),
then the content pieces, then ``<mask>`` (score 0). Imported normally
(``from tests.models.unigram_testing import ...``).
"""

META = "\u2581"
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def unigram_model(scored, normalization=None, rows=None):
    """A unigram model dict from ``[(piece, score), ...]``.

    Args:
        scored: the content pieces and their log probabilities, in id order
            (ids from 4); ``" "`` in a piece stands for U+2581.
        normalization: ``{character or code point: replacement string}``
            (``""`` deletes the character).
        rows: the embedding rows, or None (as many as pieces).
    """
    pieces = list(SPECIALS) + [piece.replace(" ", META) for piece, _ in scored] + ["<mask>"]
    scores = [0.0] * len(SPECIALS) + [float(score) for _, score in scored] + [0.0]
    table = {}
    for key, value in (normalization or {}).items():
        code = ord(key) if isinstance(key, str) else int(key)
        table[str(code)] = [ord(character) for character in value]
    model = {
        "pieces": pieces,
        "scores": scores,
        "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": len(pieces) - 1},
        "normalization": table,
    }
    if rows is not None:
        model["rows"] = rows
    return model


# A small English-like model: "▁ab" beats "▁" + "a" + "b"; tabs and newlines
# are spaces, U+0001 is deleted and "ﬁ" is "fi", as XLM-R's map does.
TOY_PIECES = [
    (" ", -2.0),
    ("a", -3.0),
    ("b", -3.0),
    (" ab", -4.0),
    ("c", -3.5),
    ("f", -4.0),
    ("i", -4.0),
    ("ix", -3.0),
    (" f", -3.0),
    ("x", -4.5),
    (" y", -3.0),
    ("z", -3.0),
    (" cab", -5.0),
]
TOY_NORMALIZATION = {"\t": " ", "\n": " ", "\x01": "", "\ufb01": "fi", "\u3000": " "}


def toy_model(rows=None):
    """`TOY_PIECES` with `TOY_NORMALIZATION` (ids: ``"▁"`` 4, ``"a"`` 5 ... ``<mask>`` 17)."""
    return unigram_model(TOY_PIECES, TOY_NORMALIZATION, rows=rows)
