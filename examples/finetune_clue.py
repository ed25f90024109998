"""Fine-tune a Chinese BERT-family encoder on a CLUE classification task.

The model comes from a Google-layout TF checkpoint (BERT, RoBERTa-wwm,
RoFormer v1, NEZHA; what bert4keras users have on disk) or from a local preset
folder (ours, keras-hub's, or a Hugging Face BERT folder). Data are CLUE /
FewCLUE JSON-lines files. The keras_masking methods are switches:

* ``--correct-embeddings``: MLM embedding correction before fine-tuning;
* ``--drop-token RATE``: DropToken while training ([CLS]/[SEP] kept);
* ``--fl-tune UNITS``: FL-tuning, only addFFN units and the head train;
* ``--asa TAU``: ASA (adversarial self-attention, `keras_masking.with_asa`),
  every layer attacked; the saved model is the clean classifier;
* ``--exlm-k K``: an ExLM-pretrained (rotary2d) backbone, run as the official
  fine-tuning does (`keras_masking.models.ExLMEncoder`).

A [CLS] classifier (dropout 0.1, one dense layer) trains with AdamW (weight
decay 0.01) and a linear decay, compiled with XLA; dev accuracy is printed
after every epoch.

Usage:
    python examples/finetune_clue.py --tf-checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt \\
        --task tnews --epochs 3 --learning-rate 2e-5
    python examples/finetune_clue.py --preset ./my_preset --task afqmc \\
        --train-file afqmc/train.json --dev-file afqmc/dev.json --drop-token 0.1
"""

import argparse
import os
import pathlib
import sys

import keras
import numpy as np

import keras_masking
from keras_masking.data import bert_tokenizer
from keras_masking.data import encode_texts
from keras_masking.data.clue import TASKS
from keras_masking.data.clue import read_classification_file

DEFAULT_FEWCLUE = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "fewclue"
VOCAB_NAMES = ("vocab.txt", os.path.join("assets", "tokenizer", "vocabulary.txt"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tf-checkpoint", help="checkpoint prefix, folder or .index file")
    source.add_argument("--preset", help="local preset folder")
    parser.add_argument("--config", help="bert_config.json (default: next to the checkpoint)")
    parser.add_argument(
        "--family", default="bert", choices=("bert", "roberta", "roformer", "nezha")
    )
    parser.add_argument("--vocab", help="vocab.txt (default: next to the checkpoint or preset)")
    parser.add_argument("--task", default="tnews", choices=sorted(TASKS))
    parser.add_argument("--data-dir", default=str(DEFAULT_FEWCLUE), help="FewCLUE folder")
    parser.add_argument("--train-file", help="default: DATA_DIR/TASK/train_few_all.json")
    parser.add_argument("--dev-file", help="default: DATA_DIR/TASK/dev_few_all.json")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--correct-embeddings", action="store_true")
    parser.add_argument("--drop-token", type=float, default=0.0, metavar="RATE")
    parser.add_argument("--fl-tune", type=int, default=0, metavar="UNITS")
    parser.add_argument("--exlm-k", type=int, default=0, metavar="K")
    parser.add_argument("--asa", type=float, default=None, metavar="TAU", help="ASA, tau 0.5")
    parser.add_argument("--output", help="save the fine-tuned model here (.keras)")
    args = parser.parse_args(argv)
    if args.exlm_k and args.drop_token:
        parser.error("--exlm-k and --drop-token do not combine (DropToken has no 2D positions).")
    if args.exlm_k and not args.preset:
        parser.error("--exlm-k needs --preset: an ExLM backbone saved with save_to_preset.")
    if args.exlm_k and args.correct_embeddings:
        parser.error("--correct-embeddings is for MLM-pretrained models, not ExLM.")
    for name, value, low in (
        ("--sequence-length", args.sequence_length, 3),
        ("--batch-size", args.batch_size, 1),
        ("--epochs", args.epochs, 1),
        ("--fl-tune", args.fl_tune, 0),
        ("--exlm-k", args.exlm_k, 0),
    ):
        if value < low:
            parser.error(f"{name} must be at least {low}. Received: {value}.")
    if not args.learning_rate > 0:
        parser.error(f"--learning-rate must be positive. Received: {args.learning_rate}.")
    if not 0.0 <= args.drop_token < 1.0:
        parser.error(f"--drop-token must be in [0, 1). Received: {args.drop_token}.")
    if args.output:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not args.output.endswith(".keras"):
            parser.error(f"--output must end in .keras. Received: {args.output!r}.")
        if not os.path.isdir(folder):
            parser.error(f"--output's folder {folder!r} does not exist.")
        if os.path.exists(args.output):
            parser.error(f"--output {args.output!r} exists; choose a new file.")
    if args.asa is not None and (args.exlm_k or args.drop_token):
        parser.error(
            "--asa does not combine with --exlm-k (the expanding encoder) or --drop-token "
            "(gather mode changes the sequence the adversary masks)."
        )
    return args


def _model_folder(args):
    path = args.tf_checkpoint or args.preset
    return path if os.path.isdir(path) else os.path.dirname(path)


def _find_file(explicit, folder, names, what):
    if explicit:
        return explicit
    for name in names:
        candidate = os.path.join(folder, name)
        if os.path.exists(candidate):
            return candidate
    raise SystemExit(f"No {what} found next to the model in {folder!r}; pass it explicitly.")


def load_backbone(args):
    """The pretrained `TransformerBackbone` the arguments name."""
    if args.preset:
        return keras_masking.models.TransformerBackbone.from_preset(args.preset)
    config = _find_file(args.config, _model_folder(args), ("bert_config.json",), "bert_config.json")
    return keras_masking.models.from_tf_checkpoint(config, args.tf_checkpoint, model=args.family)


def load_split(args, tokenizer, split):
    explicit = args.train_file if split == "train" else args.dev_file
    path = explicit or os.path.join(args.data_dir, args.task, f"{split}_few_all.json")
    first, second, labels = read_classification_file(path, args.task)
    features = encode_texts(tokenizer, first, args.sequence_length, second)
    return features, np.asarray(labels, "int32")


def build_classifier(backbone, tokenizer, args, num_classes):
    """[CLS] classifier on the backbone, with the chosen methods applied."""
    special = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    if args.correct_embeddings:
        keras_masking.correct_mlm_embeddings(
            backbone,
            mask_token_id=tokenizer.mask_token_id,
            unselectable_token_ids=tokenizer.special_token_ids,
        )
    if args.exlm_k:
        encoder = keras_masking.models.ExLMEncoder(
            backbone,
            k=args.exlm_k,
            mask_token_id=tokenizer.mask_token_id,
            special_token_ids=special,
        )
    elif args.drop_token:
        encoder = keras_masking.with_drop_token(
            backbone, args.drop_token, protected_token_ids=special, seed=args.seed
        )
    else:
        encoder = backbone
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name)
        for name in ("token_ids", "segment_ids", "padding_mask")
    }
    pooled = keras.layers.Dropout(0.1)(encoder(inputs)["pooled_output"])
    logits = keras.layers.Dense(num_classes, name="classifier")(pooled)
    model = keras.Model(inputs, logits)
    if args.fl_tune:
        keras_masking.fl_tune(model, units=args.fl_tune, verbose=True)
    return model


def run(args):
    """Loads, fine-tunes and evaluates; returns the model and its fit history."""
    keras.utils.set_random_seed(args.seed)
    if args.drop_token:
        # Fast token dropping under TensorFlow's XLA on CPU (a no-op elsewhere).
        keras_masking.utils.disable_xla_cpu_fusion_emitters()
    backbone = load_backbone(args)
    vocab = _find_file(args.vocab, _model_folder(args), VOCAB_NAMES, "vocabulary")
    tokenizer = bert_tokenizer(vocab)
    if tokenizer.vocabulary_size() != backbone.vocabulary_size:
        raise SystemExit(
            f"The vocabulary has {tokenizer.vocabulary_size()} tokens but the model "
            f"{backbone.vocabulary_size}; pass the model's own vocab.txt."
        )
    train, dev = load_split(args, tokenizer, "train"), load_split(args, tokenizer, "dev")
    num_classes = len(TASKS[args.task].labels)
    model = build_classifier(backbone, tokenizer, args, num_classes)
    steps = args.epochs * -(-len(train[1]) // args.batch_size)
    schedule = keras.optimizers.schedules.PolynomialDecay(args.learning_rate, steps, 0.0)
    # ASA trains through a trainer around the classifier; `model` stays the
    # clean classifier that is evaluated and saved (no adversary weights).
    trained = model if args.asa is None else keras_masking.with_asa(model, tau=args.asa)
    trained.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    print(
        f"{args.task}: {len(train[1])} train / {len(dev[1])} dev, {num_classes} classes, "
        f"backend {keras.config.backend()}"
    )
    history = trained.fit(
        train[0],
        train[1],
        validation_data=dev,
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=2,
    ).history
    print(f"dev accuracy after {args.epochs} epochs: {history['val_accuracy'][-1]:.4f}")
    if args.output:
        # A finished file or none: a crash while saving leaves no partial model.
        partial = f"{args.output}.partial.keras"
        model.save(partial)
        os.replace(partial, args.output)
        print(f"saved {args.output}")
    return model, history


def main(argv=None):
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
