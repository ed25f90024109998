"""DropToken on a CLUE task: the encoder drops a share of the tokens while training.

``backbone.enable_drop_token(rate)`` turns it on: in training every
sequence loses ``--rate`` of its tokens at random ([CLS] and [SEP] are never
dropped) and the encoder runs on the shorter, gathered sequence, so steps
are cheaper; at inference nothing is dropped. The task model is built on the
backbone as usual, and compiled after the call. 0.10-0.15 did best on CLUE.

Usage:
    python examples/clue_drop_token.py \\
        --checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt --task tnews --rate 0.1
    python examples/clue_drop_token.py --preset ./my_preset --task afqmc --data-dir clue

Writes to --output-dir: model.keras (its backbone keeps the DropToken
setting, which is inactive at inference), results.json and, when the data has a test split,
CLUE's submission file.
"""

import sys

import clue_common

import keras_masking
from keras_masking.clue import build_task_model
from keras_masking.clue import fine_tuning_optimizer
from keras_masking.clue import task_loss


def parse_args(argv=None):
    parser = clue_common.argument_parser(__doc__, task="tnews", learning_rate=2e-5)
    parser.add_argument(
        "--rate", type=clue_common.rate, default=0.1, help="share of tokens dropped (0.1)"
    )
    return clue_common.parse_args(parser, argv, method="drop_token")


def main(argv=None):
    args = parse_args(argv)
    # TensorFlow's XLA on CPU runs shortened sequences slowly unless its fusion
    # emitters are off; this must come before the first compiled step (no-op elsewhere).
    keras_masking.utils.disable_xla_cpu_fusion_emitters()
    run = clue_common.load(args)
    train = run.encoded["train"]

    run.backbone.enable_drop_token(
        args.rate, unselectable_token_ids=run.unselectable_token_ids, seed=args.seed
    )
    model = build_task_model(
        run.task, run.backbone, num_labels=len(run.labels), max_length=args.max_length
    )
    model.compile(
        optimizer=fine_tuning_optimizer(args.learning_rate, run.total_steps),
        loss=task_loss(run.task),
        jit_compile=True,
    )
    # Your own model on TensorFlow: built now, its first step is traced once (not twice).
    keras_masking.utils.build_optimizer(model, train.features, train.labels)
    history = model.fit(
        train.features, train.labels, batch_size=args.batch_size, epochs=args.epochs, verbose=2
    )
    clue_common.save_results(run, model, history.history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
