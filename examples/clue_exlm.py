"""ExLM on a CLUE task: fine-tune an ExLM-pretrained backbone through its expanding encoder.

An ExLM backbone (``position="rotary2d"`` with ``custom_position_ids``,
pretrained with `keras_masking.models.ExLMPretrainer` and saved with
``save_to_preset``) saw every [CLS] and [SEP] as ``k`` copies with 2D
positions. `keras_masking.models.ExLMEncoder` feeds fine-tuning inputs the
same way, as the official fine-tuning does, and gives its outputs back in
the input's layout, so the usual task head goes on top of it.

Usage:
    python examples/clue_exlm.py --preset ./exlm_preset --vocab vocab.txt --task tnews --k 4

Writes to --output-dir: model.keras (the task model with its ExLMEncoder),
results.json and, when the data has a test split, CLUE's submission file.
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
        "--k",
        type=clue_common.integer_at_least(1),
        default=4,
        help="copies per expanded token: the pretraining k (4)",
    )
    args = parser.parse_args(argv)
    if args.checkpoint is not None:
        parser.error(
            "--checkpoint: an ExLM backbone is a preset folder (ExLMPretrainer's backbone saved "
            "with save_to_preset); pass --preset."
        )
    return clue_common.check_args(parser, args, method="exlm")


def main(argv=None):
    args = parse_args(argv)
    run = clue_common.load(args)
    train = run.encoded["train"]

    encoder = keras_masking.models.ExLMEncoder(
        run.backbone,
        k=args.k,
        mask_token_id=run.tokenizer.mask_token_id,
        unselectable_token_ids=run.unselectable_token_ids,
        max_expanded_tokens=3,  # [CLS] text_a [SEP] text_b [SEP]
        objective="exlm",  # [CLS]/[SEP] at (index, 1..k), as ExLM pretraining saw them, k=1 too
    )
    model = build_task_model(
        run.task, encoder, num_labels=len(run.labels), max_length=args.max_length
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
