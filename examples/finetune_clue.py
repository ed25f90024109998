"""Fine-tune a Chinese BERT-family encoder on any CLUE or FewCLUE task, every method a switch.

A thin command line over `keras_masking.clue.finetune` (the same run as
``keras-masking clue TASK``): it reads the task's splits from a data folder
(CLUE 1.1 or FewCLUE layout, detected from the files), fine-tunes the task's
model (a [CLS] classifier, multiple choice, idioms, spans or entities),
scores dev after every epoch with CLUE's metric, keeps the best epoch's
weights and writes CLUE's submission file when the data has a test split.

The model comes from a Google-layout TF checkpoint (BERT, RoBERTa-wwm,
RoFormer v1, NEZHA: what bert4keras users have on disk; ``bert_config.json``
and ``vocab.txt`` are looked up next to it) or a preset folder (ours,
keras-hub's, or a Hugging Face BERT folder). The methods are switches:

* ``--correct-embeddings``: MLM embedding correction before fine-tuning;
* ``--drop-token RATE``: DropToken while training ([CLS]/[SEP] kept);
* ``--fl-tune UNITS``: FL-tuning, only addFFN units and the head train;
* ``--asa TAU``: ASA (adversarial self-attention), every layer attacked;
  the saved model is the clean one;
* ``--exlm-k K``: an ExLM-pretrained (rotary2d) preset, run through
  `keras_masking.models.ExLMEncoder` as the official fine-tuning does.

Training uses AdamW (weight decay 0.01, none on biases and LayerNorm) with a
linear warmup and decay, compiled with XLA. Settings left out take the
task's defaults (``keras_masking.clue.get_task(task).defaults``).

The run folder (``--output-dir``; default: a new folder under ./runs named
after the task) holds ``run.json`` (arguments, data files and their hashes,
dev scores per epoch, the methods' evidence), the best weights, the resume
state and the submission file; run the same command with the same
``--output-dir`` to resume an interrupted run. ``--output model.keras``
also saves the fine-tuned model (it loads with no ``custom_objects``).
To train on other files, put them in a data folder: ``DIR/TASK/train.json``
and ``dev.json`` (CLUE) or ``train_few_all.json`` and ``dev_few_all.json``
(FewCLUE), and pass ``--data-dir DIR``.

The ``clue_*.py`` scripts next to this one show each method in plain Keras
code (read, encode, build, apply the method, compile, fit, score, submit).

Usage:
    python examples/finetune_clue.py --tf-checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt \\
        --task tnews --correct-embeddings --drop-token 0.1 --epochs 3 --learning-rate 2e-5
    python examples/finetune_clue.py --tf-checkpoint nezha_base/model.ckpt-900000 --family nezha \\
        --task afqmc --data-dir clue --fl-tune 160 --learning-rate 2e-4
    python examples/finetune_clue.py --preset ./exlm_preset --vocab vocab.txt --task tnews \\
        --exlm-k 4
"""

import argparse
import os
import sys

import clue_common

from keras_masking.clue import MethodPlan
from keras_masking.clue import finetune
from keras_masking.clue import task_names


def parse_args(argv=None):
    parser = clue_common.argument_parser(
        __doc__, task="tnews", learning_rate=None, tasks=task_names()
    )
    methods = parser.add_argument_group("methods")
    methods.add_argument("--correct-embeddings", action="store_true")
    methods.add_argument("--drop-token", type=clue_common.rate, default=0.0, metavar="RATE")
    methods.add_argument(
        "--fl-tune",
        "--fl-tuning",
        dest="fl_tune",
        type=clue_common.integer_at_least(0),
        default=0,
        metavar="UNITS",
    )
    methods.add_argument("--exlm-k", type=clue_common.integer_at_least(0), default=0, metavar="K")
    methods.add_argument(
        "--asa", type=clue_common.non_negative_float, default=None, metavar="TAU", help="tau 0.5"
    )
    parser.add_argument("--output", help="also save the fine-tuned model here (.keras)")
    for gone in ("--train-file", "--dev-file"):
        parser.add_argument(gone, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # First the refusals that need no file, then the files' checks.
    for flag in ("train_file", "dev_file"):
        if getattr(args, flag) is not None:
            parser.error(
                f"--{flag.replace('_', '-')} is no longer taken: runs read a data folder. Pass "
                "--data-dir DIR with DIR/TASK/train.json and dev.json (CLUE) or "
                "train_few_all.json and dev_few_all.json (FewCLUE)."
            )
    if args.exlm_k and not args.preset:
        parser.error("--exlm-k needs --preset: an ExLM backbone saved with save_to_preset.")
    try:
        method_plan(args).check(args.task)
    except ValueError as error:
        parser.error(str(error))
    if args.output:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not args.output.endswith(".keras"):
            parser.error(f"--output must end in .keras. Received: {args.output!r}.")
        if not os.path.isdir(folder):
            parser.error(f"--output's folder {folder!r} does not exist.")
        if os.path.exists(args.output):
            parser.error(f"--output {args.output!r} exists; choose a new file.")
    # --output-dir may hold an earlier run of the same arguments: finetune resumes it.
    return clue_common.check_args(parser, args, method=None, new_output_dir=False)


def method_plan(args):
    return MethodPlan(
        correct_embeddings=args.correct_embeddings,
        drop_token=args.drop_token,
        asa=args.asa,
        fl_tuning=args.fl_tune,
        exlm_k=args.exlm_k,
    )


def main(argv=None):
    args = parse_args(argv)
    result = finetune(
        args.task,
        args.data_dir,
        args.output_dir,
        checkpoint=args.checkpoint,
        model=args.model,
        preset=args.preset,
        config=args.config,
        vocab=args.vocab,
        correct_embeddings=args.correct_embeddings,
        drop_token=args.drop_token,
        asa=args.asa,
        fl_tuning=args.fl_tune,
        exlm_k=args.exlm_k,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        seed=args.seed,
        verbose=2,
    )
    if result.status != "finished":
        print(f"failed: {result.record['failure']}", file=sys.stderr)
        return 1
    best = f"best dev {result.best_score:.2f} at epoch {result.best_epoch}"
    print(f"{args.task}: {best}; run record {result.record_path}")
    if args.output:
        clue_common.save_model_atomically(result.model, args.output)
        print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
