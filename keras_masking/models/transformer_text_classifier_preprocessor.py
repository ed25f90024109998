"""TransformerTextClassifierPreprocessor: raw strings or pairs -> backbone inputs.

The keras-hub preprocessor of `TransformerTextClassifier`; `pack_segments`
packs token ids already at hand (the CLUE encodings) with the same packer.
"""

import functools
import sys

import keras
import keras_hub
import numpy as np

from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.models.transformer_tokenizer import TransformerTokenizer
from keras_masking.models.unigram_tokenizer import UnigramTokenizer
from keras_masking.utils.arguments import check_choice
from keras_masking.utils.arguments import check_int

TRUNCATE_CHOICES = ("round_robin", "waterfall")
_EAGER_ROWS = 2048  # larger batches pack in a traced graph


@keras.saving.register_keras_serializable(package="keras_masking")
class TransformerTextClassifierPreprocessor(keras_hub.models.TextClassifierPreprocessor):
    """Tokenizes and packs strings or string pairs for a `TransformerBackbone`.

    Each input becomes ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``,
    padded with [PAD] to ``sequence_length``, and a dict of

    * ``token_ids``: int32 ``(batch, sequence_length)``;
    * ``segment_ids``: int32, 0 for [CLS], ``a`` and its [SEP], 1 for ``b``
      and the last [SEP], 0 for padding;
    * ``padding_mask``: True for real tokens, through the last [SEP] (bool,
      as keras-hub's BERT preprocessor gives it; the backbone's int32 input
      takes it as 1/0); a text's own pad piece (e5's ``<pad>``) is a token.

    Labels and sample weights pass through unchanged: `TransformerTextClassifier`
    runs it on the strings given to ``fit``, ``evaluate`` and ``predict``.

    Args:
        tokenizer: a keras-hub `BertTokenizer` (e.g.
            ``keras_masking.data.bert_tokenizer("vocab.txt")``) or a
            `UnigramTokenizer` (multilingual-e5: ``<s> a </s> b </s>``, the
            second text in segment 1); its vocabulary must be the
            backbone's (`TransformerTextClassifier` checks the size).
        sequence_length: int >= 3. Length of the packed inputs; at most the
            backbone's ``max_sequence_length`` for absolute positions.
        truncate: ``"round_robin"`` (default: one token at a time from the
            longer segment, as BERT's ``_truncate_seq_pair``) or
            ``"waterfall"`` (the first segment keeps as much as fits).
        **kwargs: base `keras_hub.models.Preprocessor` arguments (``name``).

    Call arguments:
        x: a string, a batch of strings, or a tuple ``(texts_a, texts_b)``
            of two batches of the same size (a tuple: a list is a batch).
            Called with one positional tuple of two, keras-hub reads it as
            ``(x, y)``: pass a pair as ``preprocessor(x=(texts_a, texts_b))``
            or with its labels, ``preprocessor((texts_a, texts_b), labels)``.
        y: labels, passed through unaltered.
        sample_weight: passed through unaltered.

    Returns:
        The feature dict, or ``(features, y)`` / ``(features, y,
        sample_weight)`` when labels are given.

    Example:
    ```python
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "今", "天", "好", "吗"]
    tokenizer = keras_masking.data.bert_tokenizer(vocabulary)
    preprocessor = keras_masking.models.TransformerTextClassifierPreprocessor(
        tokenizer, sequence_length=8
    )
    packed = preprocessor(x=(["今天好"], ["好吗"]))  # a pair: name x (see above)
    assert np.asarray(packed["token_ids"]).tolist() == [[2, 5, 6, 7, 3, 7, 8, 3]]
    assert np.asarray(packed["segment_ids"]).tolist() == [[0, 0, 0, 0, 0, 1, 1, 1]]
    ```
    """

    backbone_cls = TransformerBackbone
    tokenizer_cls = TransformerTokenizer

    def __init__(self, tokenizer, sequence_length=512, truncate="round_robin", **kwargs):
        if not isinstance(tokenizer, (keras_hub.tokenizers.BertTokenizer, UnigramTokenizer)):
            raise ValueError(
                "Expected a keras-hub BertTokenizer (build one with "
                "keras_masking.data.bert_tokenizer('vocab.txt') or from a token list) or a "
                f"UnigramTokenizer for tokenizer. Received: tokenizer={tokenizer!r}."
            )
        if getattr(tokenizer, "sequence_length", None) is not None:
            raise ValueError(
                "Expected a tokenizer without a sequence_length of its own: it pads and cuts "
                "each text, and the packer then took its padding for tokens (inside the row, "
                "before [SEP]). Build the tokenizer without one; the preprocessor's "
                "sequence_length sets the length. Received: tokenizer.sequence_length="
                f"{tokenizer.sequence_length}."
            )
        sequence_length = check_int("sequence_length", sequence_length, minimum=3)
        check_choice("truncate", truncate, TRUNCATE_CHOICES)
        super().__init__(
            tokenizer=tokenizer, sequence_length=sequence_length, truncate=truncate, **kwargs
        )

    def check_raw_inputs(self, x):
        """Refuses raw data ``fit`` / ``evaluate`` / ``predict`` would misread.

        A list of pairs (or a rank-2 batch of strings) instead of a tuple of
        two batches, and a `tf.data.Dataset` whose elements are ``(texts_a,
        texts_b)``: Keras reads a dataset's tuple as ``(x, y)``, so ``predict``
        would score ``texts_a`` alone. Pairs in a dataset go as
        ``((texts_a, texts_b),)`` or ``((texts_a, texts_b), labels)``.

        Args:
            x: the data given to ``fit``, ``evaluate`` or ``predict``.
        """
        tf = sys.modules.get("tensorflow")
        if tf is not None and isinstance(x, tf.data.Dataset):
            spec = x.element_spec
            if isinstance(spec, tuple) and len(spec) > 1:
                second = spec[1]
                if isinstance(second, tf.TensorSpec) and second.dtype == tf.string:
                    raise ValueError(
                        "Expected a dataset of texts, (texts, labels) or ((texts_a, texts_b), "
                        "labels). Received: a dataset whose elements' second item is strings, "
                        "which Keras reads as the labels (predict would score the first texts "
                        "alone); pass pairs as ((texts_a, texts_b),)."
                    )
            return
        _check_segments(x)

    def call(self, x, y=None, sample_weight=None):
        _check_segments(x)
        outputs = super().call(x, y=y, sample_weight=sample_weight)
        features = outputs[0] if isinstance(outputs, tuple) else outputs
        features["padding_mask"] = content_mask(features["token_ids"], self.tokenizer.pad_token_id)
        return outputs


def content_mask(token_ids, pad_token_id):
    """True through each row's last token that is not [PAD], False after it.

    A text can hold the pad piece itself (e5's tokenizer reads ``<pad>`` in a
    text as that piece, as e5's own engine does): it is a token, attended to,
    not padding. Every packed row ends with [SEP], so only the padding is
    False. TensorFlow tensors (a ``tf.data`` map) get TensorFlow ops, others
    the backend's.

    Args:
        token_ids: int tensor or array ``(..., sequence)``, packed rows.
        pad_token_id: int, the [PAD] id.

    Example:
    >>> content_mask(np.array([[2, 5, 0, 5, 3, 0, 0]]), 0).astype(int).tolist()
    [[1, 1, 1, 1, 1, 0, 0]]
    """
    import tensorflow as tf

    if isinstance(token_ids, tf.Tensor):
        content = tf.cast(token_ids != pad_token_id, tf.int32)
        return tf.math.cumsum(content, axis=-1, reverse=True) > 0
    if isinstance(token_ids, np.ndarray):
        content = (token_ids != pad_token_id).astype("int32")
        return np.flip(np.cumsum(np.flip(content, -1), -1), -1) > 0
    content = keras.ops.cast(keras.ops.not_equal(token_ids, pad_token_id), "int32")
    return keras.ops.flip(keras.ops.cumsum(keras.ops.flip(content, -1), -1), -1) > 0


def _packer(cls_id, sep_id, pad_id, sequence_length, truncate):
    """keras-hub's `MultiSegmentPacker` as `TextClassifierPreprocessor.build` makes it."""
    return keras_hub.layers.MultiSegmentPacker(
        start_value=cls_id,
        end_value=sep_id,
        pad_value=pad_id,
        truncate=truncate,
        sequence_length=sequence_length,
    )


def pack_segments(tokenizer, rows, sequence_length, truncate="round_robin"):
    """Packs rows of token ids as `TransformerTextClassifierPreprocessor` does.

    Large batches run the packer as a TensorFlow graph (as in ``tf.data``: a
    million rows take seconds), small ones eagerly.

    Args:
        tokenizer: a keras-hub `BertTokenizer`.
        rows: a list of tuples of one or two segments (token id lists
            without [CLS] or [SEP]); rows may mix one and two.
        sequence_length: int, the packed length.
        truncate: ``"round_robin"`` or ``"waterfall"``.

    Returns:
        A dict of int32 numpy arrays ``token_ids``, ``segment_ids`` and
        ``padding_mask`` (1 through each row's last [SEP], 0 for the padding), each ``(len(rows),
        sequence_length)``.

    Example:
    >>> vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]
    >>> tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=vocabulary)
    >>> packed = pack_segments(tokenizer, [([5, 5],), ([5], [6, 6])], 6)
    >>> packed["token_ids"].tolist(), packed["segment_ids"].tolist()[1]
    ([[2, 5, 5, 3, 0, 0], [2, 5, 3, 6, 6, 3]], [0, 0, 0, 1, 1, 1])
    """
    import tensorflow as tf

    packed = {
        name: np.zeros((len(rows), sequence_length), "int32")
        for name in ("token_ids", "segment_ids")
    }
    settings = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    settings += (sequence_length, truncate)
    for count in sorted({len(row) for row in rows}):
        indices = [index for index, row in enumerate(rows) if len(row) == count]
        pack = _graph_packer(*settings) if len(indices) > _EAGER_ROWS else _packer(*settings)
        segments = []
        for position in range(count):
            pieces = [rows[index][position] for index in indices]
            flat = np.fromiter((i for piece in pieces for i in piece), "int32")
            segments.append(tf.RaggedTensor.from_row_lengths(flat, [len(p) for p in pieces]))
        token_ids, segment_ids = pack(tuple(segments))
        packed["token_ids"][indices] = keras.ops.convert_to_numpy(token_ids)
        packed["segment_ids"][indices] = keras.ops.convert_to_numpy(segment_ids)
    packed["padding_mask"] = content_mask(packed["token_ids"], tokenizer.pad_token_id).astype(
        "int32"
    )
    return packed


@functools.lru_cache(maxsize=32)
def _graph_packer(*settings):
    """A `MultiSegmentPacker` of ``settings`` (see `_packer`) traced as a ``tf.function``."""
    import tensorflow as tf

    return tf.function(_packer(*settings), reduce_retracing=True)


def _check_segments(x):
    """Refuses inputs the packer would misread: too many segments, lists of pairs."""
    if isinstance(x, tuple):
        if len(x) not in (1, 2):
            raise ValueError(
                "Expected a string, a batch of strings, or a pair (texts_a, texts_b) for x. "
                f"Received: a tuple of {len(x)} segments."
            )
        sizes = [len(segment) for segment in x if isinstance(segment, (list, np.ndarray))]
        if len(sizes) == 2 and sizes[0] != sizes[1]:
            raise ValueError(
                "Expected two batches of the same size in x=(texts_a, texts_b). "
                f"Received: {sizes[0]} first texts and {sizes[1]} second texts."
            )
        segments = x
    else:
        segments = (x,)
    for segment in segments:
        nested = isinstance(segment, list) and segment and isinstance(segment[0], (list, tuple))
        if nested or (getattr(segment, "ndim", None) or 0) > 1:  # numpy, tf
            first = segment[0]
            raise ValueError(
                "Expected a batch of strings in x; pass sentence pairs as a tuple of two "
                "batches, x=(texts_a, texts_b), not as a list of pairs. "
                f"Received: a batch whose first item is {first!r}."
            )
