"""A backbone or classifier as a Hugging Face folder that PyTorch's ``transformers`` loads.

`export_to_transformers` writes ``config.json``, ``model.safetensors`` and,
given a tokenizer, its files (WordPiece: ``vocab.txt``; multilingual-e5's
unigram pieces: ``sentencepiece.bpe.model``; both with
``tokenizer_config.json`` and ``special_tokens_map.json``): the folder loads with ``AutoModel`` /
``AutoModelForSequenceClassification`` and ``AutoTokenizer``. The weights
are those of the model's serving copy (`serving_backbone`): FL-tuning and
LoRA merged, DropToken and ASA gone.
"""

import logging
import os
import pathlib

import keras
import numpy as np

from keras_masking.models.google_checkpoint_layout import backbone_variables_by_name
from keras_masking.models.google_config import google_config_from_backbone
from keras_masking.models.mlm_embedding_correction_record import write_correction_record
from keras_masking.models.serving_copy import serving_backbone
from keras_masking.models.xlm_roberta_tokenizer_files import xlm_roberta_tokenizer_files
from keras_masking.utils.arguments import check_int
from keras_masking.utils.eager_checks import non_finite_variables
from keras_masking.utils.files import replace_folder_atomically
from keras_masking.utils.files import write_folder_atomically
from keras_masking.utils.files import write_json_atomically

logger = logging.getLogger("keras_masking")

INSTALL_HINT = 'pip install "keras-masking[export]"'

# The package's activation names -> transformers' ``hidden_act``.
_HIDDEN_ACT = {
    "gelu": "gelu",
    "gelu_erf": "gelu",
    "gelu_exact": "gelu",
    "gelu_approximate": "gelu_new",
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}

# Position schemes -> (transformers model_type, its model class).
_FAMILIES = {"absolute": ("bert", "BertModel"), "rotary": ("roformer", "RoFormerModel")}

_REFUSED_POSITIONS = {
    "relative": (
        "NEZHA (position='relative'): transformers has no NEZHA model any more (it was removed "
        "from the library), so no Hugging Face folder can hold it. Save it as a Google "
        "checkpoint instead (keras_masking.models.save_tf_checkpoint)."
    ),
    "rotary2d": (
        "ExLM's 2D rotary positions (position='rotary2d'): no transformers model rotates by "
        "two position indices. Export the fine-tuning encoder's own checkpoint instead."
    ),
}


def export_to_transformers(
    model, folder, tokenizer=None, labels=None, overwrite=False, sequence_length=None
):
    """Writes a backbone or classifier as a Hugging Face folder for PyTorch.

    What is written:

    * ``config.json`` and ``model.safetensors`` (float32): a ``BertModel``
      for BERT, RoBERTa-wwm and multilingual-e5 (``position="absolute"``),
      a ``RoFormerModel`` for RoFormer (``position="rotary"``: transformers
      rotates interleaved pairs of queries and keys, as this package does);
    * for a `TransformerTextClassifier` on a BERT backbone whose pooled
      vector is BERT's (``pooling="first"`` through the tanh pooler), a
      ``BertForSequenceClassification``: ``classifier.weight/bias``,
      ``num_labels``, ``id2label``. Its ``logits`` are the Dense layer's
      outputs before the classifier's ``activation`` (softmax or sigmoid, if
      any). Another head (a RoFormer classifier, mean pooling, no pooler, an
      other activation) has no transformers class: the backbone alone is
      written, with a warning;
    * the tokenizer files, for the classifier's preprocessor or the
      ``tokenizer`` given: ``vocab.txt``, ``tokenizer_config.json`` and
      ``special_tokens_map.json`` for WordPiece (``BertTokenizer``, also for
      RoFormer); for multilingual-e5's `UnigramTokenizer`,
      ``sentencepiece.bpe.model`` and its config (``XLMRobertaTokenizer``,
      the same ids but where the package keeps a final ``"▁"`` after a
      trailing space or gives one ``<unk>`` per unknown character, which
      SentencePiece strips and fuses). A pruned `UnigramTokenizer` has no
      SentencePiece form: the model is written without tokenizer files
      (with a warning); feed it the package's ids.

    The weights are the serving copy's (`serving_backbone`): FL-tuning's
    branches merged into wider FFNs (``intermediate_size`` grows), LoRA
    merged, DropToken and ASA dropped (they act in training only); the model
    itself is not changed. Refused, before anything is written: prefix
    tuning (P-tuning v2's key/value prefixes) and MA-tuning's attention
    units, which a ``BertModel`` cannot hold; NEZHA (transformers removed
    it) and ExLM's 2D rotary positions; non-finite weights.

    A backbone without a pooler (multilingual-e5), or one that pools by
    anything but the [CLS] state (``pooling="mean"``: a ``BertModel``'s
    pooler reads [CLS], so its ``pooler_output`` would be another vector,
    with a warning), gets a zero pooler: ``pooler_output`` is zeros (the
    sentence embedding is then the mean of ``last_hidden_state``). One
    without segments gets one zero token-type row.

    Args:
        model: a `TransformerBackbone` or a `TransformerTextClassifier`.
        folder: the folder to write (written through a temporary folder
            next to it, then renamed: an error leaves nothing).
        tokenizer: None (the classifier's preprocessor's tokenizer, if any),
            or a tokenizer or preprocessor whose files to write.
        labels: None (``LABEL_0``...) or the class names, one per class, for
            a classifier's ``id2label``.
        overwrite: bool. Whether to replace an existing non-empty ``folder``.
        sequence_length: None or the token count the model was trained on,
            written as the tokenizer's ``model_max_length`` (what
            ``truncation=True`` cuts to). None: the preprocessor's
            ``sequence_length``, else ``max_position_embeddings``.

    Returns:
        The folder's absolute path, a `pathlib.Path`.

    Raises:
        TypeError: ``model`` is neither a backbone nor a classifier.
        ValueError: a model or method no transformers folder can hold.
        FileExistsError: ``folder`` exists and is not empty (without
            ``overwrite``).
        ModuleNotFoundError: the ``safetensors`` package is missing.

    Example:
    ```python
    keras_masking.models.export_to_transformers(backbone, "bert_for_torch")
    # In PyTorch: transformers.AutoModel.from_pretrained("bert_for_torch")
    ```
    """
    output = pathlib.Path(os.path.abspath(os.fspath(folder)))
    if not isinstance(overwrite, (bool, np.bool_)):
        raise ValueError(f"Expected a bool for overwrite. Received: overwrite={overwrite!r}.")
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"{output}: exists and is not a folder; nothing was written.")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{output}: the folder exists and is not empty; nothing was written. Choose a new "
            "folder, or pass overwrite=True to replace it."
        )
    try:
        from safetensors.numpy import save_file
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "export_to_transformers writes model.safetensors with the safetensors package, "
            f"which is not installed: {INSTALL_HINT}"
        ) from error
    backbone, head = _split(model)
    if labels is not None and head is None:
        raise ValueError(
            "labels name a classifier's classes; this model is a backbone. Received: "
            f"labels={labels!r}."
        )
    _check_backbone(backbone)
    if sequence_length is not None:
        sequence_length = check_int(
            "sequence_length", sequence_length, 2, backbone.max_sequence_length
        )
    if tokenizer is None and head is not None:
        tokenizer = getattr(model, "preprocessor", None)
    head = _exportable_head(backbone, head)
    # DropToken's and ASA's weights are not among the exported ones: only merges need the copy.
    merging = backbone.add_ffn is not None or backbone.lora is not None
    serving = serving_backbone(backbone) if merging else backbone
    config, tensors = _backbone_folder(serving)
    if head is not None:
        config, tensors = _with_classifier_head(config, tensors, head, labels)
    tokenizer_files = _tokenizer_files(tokenizer, config, sequence_length)
    for name, value in tensors.items():
        if not np.all(np.isfinite(value)):
            raise ValueError(f"The exported tensor {name!r} holds NaN or infinite values.")

    def write(path):
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        write_json_atomically(os.path.join(path, "config.json"), config)
        # Read back by from_preset: a corrected model is not corrected twice.
        write_correction_record(path, backbone.mlm_embedding_correction, "export_to_transformers")
        for name, content in tokenizer_files.items():
            target = os.path.join(path, name)
            if isinstance(content, bytes):
                pathlib.Path(target).write_bytes(content)
            elif isinstance(content, str):
                pathlib.Path(target).write_text(content, encoding="utf-8")
            else:
                write_json_atomically(target, content)

    needed = sum(value.nbytes for value in tensors.values())
    _write(output, write, needed, overwrite)
    return output


# === Checks ===
def _is_backbone(model):
    needed = ("transformer_layers", "position", "embeddings", "key_value_prefix", "serving_copy")
    return all(hasattr(model, name) for name in needed)


def _split(model):
    """``(backbone, classifier or None)``."""
    if _is_backbone(model):
        return model, None
    backbone = getattr(model, "backbone", None)
    if _is_backbone(backbone) and hasattr(model, "output_dense") and hasattr(model, "num_classes"):
        return backbone, model
    raise TypeError(
        "export_to_transformers writes a keras_masking.models.TransformerBackbone or "
        f"TransformerTextClassifier. Received: model of type {type(model).__name__}."
    )


def _check_backbone(backbone):
    if backbone.position in _REFUSED_POSITIONS:
        raise ValueError(f"Cannot export {_REFUSED_POSITIONS[backbone.position]}")
    if backbone.key_value_prefix is not None:
        raise ValueError(
            "Cannot export a prefix-tuned model (enable_prefix_tuning): P-tuning v2's key/value "
            "prefixes are extra keys and values in every attention layer, which a transformers "
            "BertModel has no place for. Serve it with this package instead "
            "(classifier.export, a SavedModel)."
        )
    if backbone.add_attention_units is not None:
        raise ValueError(
            "Cannot export MA-tuning's attention units (enable_fl_tuning(attention_units=...)): "
            "they widen each head's queries and keys, which a transformers BertModel cannot "
            "hold and which do not merge. Serve the model with this package."
        )
    activation = backbone.activation
    if not isinstance(activation, str) or activation.lower() not in _HIDDEN_ACT:
        raise ValueError(
            f"Cannot export the activation {activation!r}: transformers' hidden_act takes "
            f"one of {sorted(set(_HIDDEN_ACT))}."
        )
    for path, count in non_finite_variables(backbone.weights)[:1]:
        raise ValueError(
            f"The backbone's weight {path!r} holds {count} NaN or infinite value(s); expected "
            "finite weights (the training that wrote them diverged)."
        )


def _exportable_head(backbone, head):
    """The classifier, or None (with a warning) when transformers has no class for its head."""
    if head is None:
        return None
    reasons = []
    if backbone.position != "absolute":
        reasons.append(
            "transformers' RoFormerForSequenceClassification reads the [CLS] state through its "
            "own dense + activation head, not BERT's tanh pooler"
        )
    if not backbone.use_pooler:
        reasons.append("the backbone has no pooler (BertForSequenceClassification pools)")
    if backbone.pooling != "first":
        reasons.append(f"the backbone pools by {backbone.pooling!r}, BERT by the [CLS] state")
    activation = getattr(head.output_dense.activation, "__name__", repr(head.activation))
    if activation not in ("linear", "softmax", "sigmoid"):
        reasons.append(f"its outputs are {activation}(logits), not logits or their probabilities")
    if reasons:
        logger.warning(
            "export_to_transformers: the classifier's head is not BertForSequenceClassification's "
            "(%s); writing the backbone alone.",
            "; ".join(reasons),
        )
        return None
    return head


# === Tensors and config ===
def _numpy(variable):
    return np.array(keras.ops.convert_to_numpy(variable), dtype="float32")


def _hf_name(google_name):
    """``bert/encoder/layer_0/attention/self/query/kernel`` -> ``encoder.layer.0....weight``."""
    parts = google_name.removeprefix("bert/").split("/")
    renamed = []
    for part in parts:
        if part.startswith("layer_") and part[6:].isdigit():
            renamed += ["layer", part[6:]]
        else:
            renamed.append({"kernel": "weight", "gamma": "weight", "beta": "bias"}.get(part, part))
    if renamed[-1].endswith("_embeddings"):
        renamed.append("weight")  # an embedding table
    return ".".join(renamed)


def _backbone_folder(backbone):
    """``(config, tensors)`` of a plain (serving) backbone."""
    model_type, architecture = _FAMILIES[backbone.position]
    tensors = {}
    for google_name, variable in backbone_variables_by_name(backbone).items():
        value = _numpy(variable)
        if google_name.endswith("/kernel"):
            value = value.T  # Keras (in, out) -> torch Linear (out, in)
        tensors[_hf_name(google_name)] = np.ascontiguousarray(value)
    hidden = backbone.hidden_dim
    if backbone.num_segments == 0:
        tensors["embeddings.token_type_embeddings.weight"] = np.zeros((1, hidden), "float32")
    if model_type == "bert" and backbone.pooled_dense is not None and backbone.pooling != "first":
        logger.warning(
            "export_to_transformers: the backbone pools by %r through its tanh pooler, which "
            "transformers' BertModel applies to the [CLS] state: writing a zero pooler "
            "(pooler_output is zeros; last_hidden_state is the model's).",
            backbone.pooling,
        )
    if model_type == "bert" and (backbone.pooled_dense is None or backbone.pooling != "first"):
        tensors["pooler.dense.weight"] = np.zeros((hidden, hidden), "float32")
        tensors["pooler.dense.bias"] = np.zeros((hidden,), "float32")
    if model_type == "roformer":
        tensors.pop("pooler.dense.weight", None)
        tensors.pop("pooler.dense.bias", None)
        head_dim = hidden // backbone.num_heads
        tensors["encoder.embed_positions.weight"] = roformer_sinusoidal_table(
            backbone.max_sequence_length, head_dim
        )
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        **google_config_from_backbone(backbone),
        "hidden_act": _HIDDEN_ACT[backbone.activation.lower()],
        "type_vocab_size": max(backbone.num_segments, 1),
        "pad_token_id": 0,
        "dtype": "float32",
    }
    if model_type == "bert":
        config["position_embedding_type"] = "absolute"
    else:
        config.update(embedding_size=hidden, rotary_value=False)
    if backbone.pooled_dense is None:
        # Ours (transformers reads no such key): the zero pooler above is not
        # the model's, and `TransformerBackbone.from_preset` leaves it out.
        config["use_pooler"] = False
    return config, tensors


def roformer_sinusoidal_table(positions, head_dim):
    """transformers' RoFormer position table: ``sin`` in the first half, ``cos`` in the second.

    Row ``p`` holds ``sin(p * 10000**(-2i / d))`` for ``i < d / 2``, then the
    cosines of the same angles: the angles `apply_interleaved_rotary` rotates
    pair ``i`` by.

    Args:
        positions: int, the rows (``max_position_embeddings``).
        head_dim: int, even, the features per head.

    Returns:
        A float32 array ``(positions, head_dim)``.

    Example:
    >>> roformer_sinusoidal_table(2, 4)[1].round(4)
    array([0.8415, 0.01  , 0.5403, 1.    ], dtype=float32)
    """
    inverse = np.power(10000.0, -np.arange(0, head_dim, 2, dtype="float64") / head_dim)
    angles = np.arange(positions, dtype="float64")[:, None] * inverse[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype("float32")


def _with_classifier_head(config, tensors, head, labels):
    """A BertForSequenceClassification: the backbone under ``bert.`` and ``classifier.*``."""
    dense = head.output_dense
    num_classes = int(head.num_classes)
    if labels is None:
        labels = [f"LABEL_{i}" for i in range(num_classes)]
    if isinstance(labels, (str, bytes)):
        raise ValueError(f"Expected a list of class names for labels. Received: {labels!r}.")
    labels = [str(label) for label in labels]
    if len(labels) != num_classes or len(set(labels)) != num_classes:
        raise ValueError(
            f"Expected {num_classes} distinct labels, one per class. Received: labels={labels!r}."
        )
    tensors = {f"bert.{name}": value for name, value in tensors.items()}
    tensors["classifier.weight"] = np.ascontiguousarray(_numpy(dense.kernel).T)
    tensors["classifier.bias"] = _numpy(dense.bias)
    activation = getattr(dense.activation, "__name__", "linear")
    config = dict(
        config,
        architectures=["BertForSequenceClassification"],
        id2label={str(i): label for i, label in enumerate(labels)},
        label2id={label: i for i, label in enumerate(labels)},
        classifier_dropout=float(head.dropout),
        problem_type=f"{'multi' if activation == 'sigmoid' else 'single'}_label_classification",
    )
    return config, tensors


# === Tokenizer files ===
def _tokenizer_files(tokenizer, config, sequence_length=None):
    """``{file name: text or JSON value}`` of the tokenizer (or preprocessor) given."""
    if tokenizer is None:
        return {}
    if sequence_length is None:
        sequence_length = getattr(tokenizer, "sequence_length", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a preprocessor's
    if type(tokenizer).__name__ == "UnigramTokenizer":
        return _unigram_files(tokenizer, sequence_length, config)
    vocabulary = getattr(tokenizer, "vocabulary", None)
    if not isinstance(vocabulary, (list, tuple)) or not hasattr(tokenizer, "cls_token"):
        raise ValueError(
            "export_to_transformers writes a WordPiece tokenizer (a keras-hub BertTokenizer, "
            "such as keras_masking.data.bert_tokenizer's). Received: tokenizer of type "
            f"{type(tokenizer).__name__}."
        )
    if len(vocabulary) != config["vocab_size"]:
        raise ValueError(
            f"The tokenizer has {len(vocabulary)} tokens but the model {config['vocab_size']} "
            "embedding rows; export the tokenizer that belongs to the model."
        )
    lowercase = any(getattr(tokenizer, name, False) for name in ("lowercase", "bert_lowercase"))
    if lowercase and getattr(tokenizer, "case_folding", "nfkc") != "bert":
        logger.warning(
            "export_to_transformers: this tokenizer lowercases with NFKC (keras-hub's), which "
            "maps full-width characters to ASCII; transformers' BertTokenizer does not, so ids "
            "of such text will differ. keras_masking.data.bert_tokenizer tokenizes as BERT."
        )
    special = {
        "unk_token": tokenizer.oov_token,
        "sep_token": tokenizer.sep_token,
        "pad_token": tokenizer.pad_token,
        "cls_token": tokenizer.cls_token,
        "mask_token": tokenizer.mask_token,
    }
    strip_accents = getattr(tokenizer, "strip_accents", None)
    config["pad_token_id"] = vocabulary.index(tokenizer.pad_token)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "tokenize_chinese_chars": True,
        "strip_accents": None if strip_accents is None else bool(strip_accents),
        "model_max_length": int(sequence_length or config["max_position_embeddings"]),
        **special,
    }
    return {
        "vocab.txt": "".join(f"{token}\n" for token in vocabulary),
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": special,
    }


def _unigram_files(tokenizer, sequence_length, config):
    """multilingual-e5's pieces as ``XLMRobertaTokenizer`` files; none (a warning) when pruned."""
    if getattr(tokenizer, "pad_token_id", None) is not None:
        config["pad_token_id"] = int(tokenizer.pad_token_id)
    if tokenizer.vocabulary_size() != config["vocab_size"]:
        raise ValueError(
            f"The tokenizer has {tokenizer.vocabulary_size()} ids but the model "
            f"{config['vocab_size']} embedding rows; export the tokenizer that belongs to the "
            "model."
        )
    length = int(sequence_length or config["max_position_embeddings"])
    try:
        return xlm_roberta_tokenizer_files(tokenizer, length)
    except ValueError as error:
        logger.warning(
            "export_to_transformers: %s The folder holds the model without tokenizer files.", error
        )
        return {}


# === Writing ===
def _write(output, write, needed_bytes, overwrite):
    """Writes the folder through a temporary one; with ``overwrite``, swaps it in at the end."""
    if overwrite:
        replace_folder_atomically(output, write, needed_bytes=needed_bytes)
    else:
        write_folder_atomically(output, write, needed_bytes=needed_bytes)
