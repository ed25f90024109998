"""WordPiece tokenizers from the files users have, and batch encoding.

Users' checkpoints come with a ``vocab.txt`` (Google's layout, e.g. the
21,128-token Chinese BERT vocabulary) or a Hugging Face ``tokenizer.json``;
both become a keras-hub `BertTokenizer` here, with no network access.
"""

import json
import os

import numpy as np


def read_vocabulary(path):
    """Reads a WordPiece vocabulary from ``vocab.txt``, ``tokenizer.json`` or a folder.

    Args:
        path: a ``vocab.txt`` (one token per line), a Hugging Face
            ``tokenizer.json`` (WordPiece model), or a folder holding either.

    Returns:
        The list of tokens, index = token id.
    """
    path = str(path)
    if os.path.isdir(path):
        for name in ("vocab.txt", "tokenizer.json"):
            candidate = os.path.join(path, name)
            if os.path.exists(candidate):
                return read_vocabulary(candidate)
        raise FileNotFoundError(f"{path}: no vocab.txt or tokenizer.json in this folder.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No vocabulary file at {path!r}.")
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as file:
            model = json.load(file).get("model", {})
        if model.get("type") != "WordPiece" or "vocab" not in model:
            raise ValueError(f"{path}: not a WordPiece tokenizer.json.")
        by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
        if [index for _, index in by_id] != list(range(len(by_id))):
            raise ValueError(f"{path}: token ids are not 0..{len(by_id) - 1}.")
        return [token for token, _ in by_id]
    with open(path, encoding="utf-8") as file:
        tokens = [line.rstrip("\n") for line in file]
    while tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


def bert_tokenizer(vocabulary, lowercase=True, case_folding="bert", **kwargs):
    """A WordPiece tokenizer from a vocabulary file, folder or list.

    The tokenizer is a `keras_masking.models.TransformerTokenizer`, a keras-hub
    `BertTokenizer` that gives BERT's tokens (those of Google's and Hugging
    Face's ``BertTokenizer``), eagerly and in ``tf.data``: space separators
    such as U+3000 and NBSP are spaces, every character of Unicode category
    C* (control, format, private use, and unassigned in this Python's
    Unicode tables) is deleted, as Hugging Face's ``BertTokenizer`` does
    (Google's code and the fast tokenizer give ``[UNK]`` for unassigned
    ones), full-width punctuation such as "，" keeps its own id (keras-hub's
    NFKC folding maps it to ","), accents are stripped when
    ``lowercase``, and a word over 100 characters is one ``[UNK]``.

    Args:
        vocabulary: path accepted by `read_vocabulary`, or a list of tokens.
        lowercase: bool. True for uncased English and for Chinese BERT.
        case_folding: ``"bert"`` (Google's BERT) or ``"nfkc"`` (keras-hub's).
        **kwargs: passed to `TransformerTokenizer` (``max_input_chars_per_word``)
            and `keras_hub.tokenizers.BertTokenizer`.

    Returns:
        A `TransformerTokenizer`.

    Example:
    ```python
    tokenizer = bert_tokenizer("chinese_L-12_H-768_A-12/vocab.txt")  # Google's Chinese BERT
    tokenizer("今天天气很好，")  # the last id is the full-width comma's
    ```
    """
    from keras_masking.models.transformer_tokenizer import TransformerTokenizer

    if not isinstance(vocabulary, (list, tuple)):
        vocabulary = read_vocabulary(vocabulary)
    return TransformerTokenizer(
        vocabulary=list(vocabulary), lowercase=lowercase, case_folding=case_folding, **kwargs
    )


def encode_texts(tokenizer, texts, sequence_length, second_texts=None):
    """Encodes texts (or text pairs) as ``[CLS] a [SEP] (b [SEP])`` arrays.

    The tokens and the packing of `TransformerTextClassifierPreprocessor`
    (keras-hub's `MultiSegmentPacker`, through `pack_segments`), as numpy
    arrays for a whole corpus.

    Args:
        tokenizer: a keras-hub `BertTokenizer`.
        texts: list of strings.
        sequence_length: int. Output length; longer inputs are truncated
            (the longer segment first, keras-hub's "round_robin").
        second_texts: optional list of second segments (sentence pairs).

    Returns:
        A dict of int32 numpy arrays ``token_ids``, ``segment_ids``,
        ``padding_mask``, each ``(len(texts), sequence_length)``.

    Example:
    >>> tokenizer = bert_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好", "吗"])
    >>> encode_texts(tokenizer, ["好吗"], 6, second_texts=["好"])["token_ids"].tolist()
    [[2, 5, 6, 3, 5, 3]]
    """
    from keras_masking.models.transformer_text_classifier_preprocessor import pack_segments
    from keras_masking.utils.arguments import check_int

    # Everything is checked before the tokenizer runs: a bare string would be
    # read as a list of characters, and a length without room for [CLS] and
    # each [SEP] would give keras-hub's packer empty or negative shapes.
    texts = _check_texts("texts", texts)
    minimum = 2 if second_texts is None else 3
    sequence_length = check_int("sequence_length", sequence_length, minimum=minimum)
    segments = [texts]
    if second_texts is not None:
        segments.append(_check_texts("second_texts", second_texts))
        if len(segments[1]) != len(texts):
            raise ValueError(
                "Expected as many second_texts as texts. Received: "
                f"len(texts)={len(texts)}, len(second_texts)={len(segments[1])}."
            )
    token_ids = [tokenizer(segment) for segment in segments]
    token_ids = [ids.to_list() if hasattr(ids, "to_list") else ids for ids in token_ids]
    return pack_segments(tokenizer, list(zip(*token_ids)), sequence_length)


def _check_texts(name, texts):
    """``texts`` as a list of strings, or a ValueError naming ``name``."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple, np.ndarray)):
        raise ValueError(f"Expected a list of strings for {name}. Received: {name}={texts!r:.80}.")
    texts = texts.tolist() if isinstance(texts, np.ndarray) else list(texts)
    bad = [text for text in texts if not isinstance(text, (str, bytes))]
    if bad:
        raise ValueError(
            f"Expected a list of strings for {name}. Received: {name} holding "
            f"{bad[0]!r:.80} of type {type(bad[0]).__name__}."
        )
    return texts
