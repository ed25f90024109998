"""ASA (adversarial self-attention) on a CLUE task: train against attention adversaries.

``backbone.enable_asa(tau)`` attaches one adversary per layer to the
backbone, and `keras_masking.methods.ASATrainer` trains the task model with
them: in every step each adversary learns which attention links to cut to
hurt the prediction most (paying ``tau**2`` per cut), and the model learns
to stay right without them. The adversaries act in training only: ``model``,
the task model the trainer wraps, predicts with the clean pass, and it is
what is scored and saved (its backbone keeps the adversaries, so training
can resume from ``model.keras``). The recipe is the official one: learning
rate 1e-5, 3 epochs, 6% warmup, every layer attacked.

Usage:
    python examples/clue_asa.py --checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt \\
        --task ocnli --tau 0.5
    python examples/clue_asa.py --preset ./my_preset --task tnews --output-dir runs/tnews_asa

Writes to --output-dir: model.keras (the classifier), results.json (its
scores; the history has ASA's divergence, mask term and the masked share
of each layer's attention) and, when the data has a test split, CLUE's
submission file.
"""

import sys

import clue_common

from keras_masking.clue import build_task_model
from keras_masking.clue import fine_tuning_optimizer
from keras_masking.clue import task_loss
from keras_masking.methods import ASATrainer


def parse_args(argv=None):
    parser = clue_common.argument_parser(__doc__, task="ocnli", learning_rate=1e-5)
    parser.add_argument(
        "--tau",
        type=clue_common.non_negative_float,
        default=0.5,
        help="the mask penalty's temperature (0.5)",
    )
    parser.set_defaults(epochs=3)
    return clue_common.parse_args(parser, argv, method="asa")


def main(argv=None):
    args = parse_args(argv)
    run = clue_common.load(args)
    train = run.encoded["train"]

    run.backbone.enable_asa(tau=args.tau, seed=args.seed)
    model = build_task_model(
        run.task, run.backbone, num_labels=len(run.labels), max_length=args.max_length
    )
    trainer = ASATrainer(model)  # its settings come from the backbone
    trainer.compile(
        optimizer=fine_tuning_optimizer(
            args.learning_rate, run.total_steps, warmup_proportion=0.06
        ),
        loss=task_loss(run.task),
        jit_compile=True,
    )
    history = trainer.fit(
        train.features, train.labels, batch_size=args.batch_size, epochs=args.epochs, verbose=2
    )
    # `model` shares every trained weight with the trainer; it predicts with the clean pass.
    clue_common.save_results(run, model, history.history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
