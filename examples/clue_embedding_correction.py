"""MLM embedding correction on a CLUE task: the one-line callback in `fit`.

A masked LM learns its token embeddings from inputs where 15% of the tokens
were replaced (80% by [MASK], 10% by a random token); fine-tuning inputs
have no replacement. `keras_masking.callbacks.MLMEmbeddingCorrection`
corrects the embedding table for that mismatch when `fit` starts, before
the first step; the rest is ordinary fine-tuning of a [CLS] classifier.
The corrected table is part of the saved model (its correction record too,
so a second `fit` does not correct twice).

Usage:
    python examples/clue_embedding_correction.py \\
        --checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt --task tnews
    python examples/clue_embedding_correction.py --preset ./my_preset --task eprstmt \\
        --data-dir fewclue --output-dir runs/eprstmt_corrected

Writes to --output-dir: model.keras, results.json (dev score, the fit
history) and, when the data has a test split, CLUE's submission file.
"""

import sys

import clue_common

import keras_masking
from keras_masking.clue import build_task_model
from keras_masking.clue import fine_tuning_optimizer
from keras_masking.clue import task_loss


def parse_args(argv=None):
    parser = clue_common.argument_parser(__doc__, task="tnews", learning_rate=2e-5)
    return clue_common.parse_args(parser, argv, method="corrected")


def main(argv=None):
    args = parse_args(argv)
    run = clue_common.load(args)
    train = run.encoded["train"]

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
    # The correction runs at the start of `fit`, on the backbone's token embedding:
    # BERT's masking rates (15%, 80/10/10) with [CLS], [SEP], [PAD], [MASK] never picked.
    correction = keras_masking.callbacks.MLMEmbeddingCorrection(
        mask_token_id=run.tokenizer.mask_token_id,
        unselectable_token_ids=run.tokenizer.special_token_ids,
    )
    history = model.fit(
        train.features,
        train.labels,
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=[correction],
        verbose=2,
    )
    clue_common.save_results(run, model, history.history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
