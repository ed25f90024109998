"""FL-tuning on a CLUE task: train added FFN units only, then merge them into the FFNs.

``backbone.enable_fl_tuning(units)`` adds ``--units`` hidden units to every
FFN of the backbone (addFFN) and freezes the rest of it: only those units
and the task head train (160 units are 2.9% of BERT-base). The recipe is
the FL-tuning code's: no warmup, linear decay, and its learning rate per
task (the default of ``--learning-rate``: 5e-5 for TNEWS and IFLYTEK, 2e-4
for AFQMC, 1e-4 for CMNLI, 5e-4 for OCNLI, 3e-4 for CLUEWSC, 8e-5 for CSL;
5e-5 for the other tasks). Then:

* `keras_masking.methods.save_adapter` writes only the trained weights
  (``adapter.npz``, a few MB): `load_adapter` puts them on a fresh copy of
  the pretrained model;
* ``backbone.merge_fl()`` returns a new backbone whose FFNs hold the units,
  ``m + k`` each: with the trained head on it, a plain model with the same
  outputs and no branch (the script checks it on a dev batch), which is the
  ``model.keras`` saved.

Usage:
    python examples/clue_fl_tuning.py --checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt \\
        --task tnews --units 160
    python examples/clue_fl_tuning.py --preset ./my_preset --task afqmc --data-dir clue \\
        --learning-rate 2e-4

Writes to --output-dir: adapter.npz, model.keras (merged), results.json
and, when the data has a test split, CLUE's submission file.
"""

import sys

import clue_common
import numpy as np

import keras_masking
from keras_masking.clue import build_task_model
from keras_masking.clue import fine_tuning_optimizer
from keras_masking.clue import task_loss

# The FL-tuning code's learning rate per task (None: the other tasks).
RECIPE_RATES = {
    "tnews": 5e-5,
    "iflytek": 5e-5,
    "afqmc": 2e-4,
    "cmnli": 1e-4,
    "ocnli": 5e-4,
    "cluewsc": 3e-4,
    "csl": 8e-5,
    None: 5e-5,
}


def parse_args(argv=None):
    parser = clue_common.argument_parser(__doc__, task="tnews", learning_rate=RECIPE_RATES)
    parser.add_argument(
        "--units",
        type=clue_common.integer_at_least(1),
        default=160,
        help="added hidden units per FFN (160)",
    )
    return clue_common.parse_args(parser, argv, method="fl_tuning")


def merged_model(model, run):
    """The task model on ``run.backbone.merge_fl()``, with ``model``'s trained head."""
    merged = build_task_model(
        run.task,
        run.backbone.merge_fl(),
        num_labels=len(run.labels),
        max_length=run.args.max_length,
    )
    for layer in model.layers:
        if layer is not run.backbone and layer.weights:
            merged.get_layer(layer.name).set_weights(layer.get_weights())
    return merged


def main(argv=None):
    args = parse_args(argv)
    run = clue_common.load(args)
    train = run.encoded["train"]

    model = build_task_model(
        run.task, run.backbone, num_labels=len(run.labels), max_length=args.max_length
    )
    run.backbone.enable_fl_tuning(units=args.units)
    print(f"FL-tuning: {keras_masking.methods.parameter_report(model)}")  # what trains
    model.compile(
        optimizer=fine_tuning_optimizer(args.learning_rate, run.total_steps, warmup_proportion=0.0),
        loss=task_loss(run.task),
        jit_compile=True,
    )
    # Your own model on TensorFlow: built now, its first step is traced once (not twice).
    keras_masking.utils.build_optimizer(model, train.features, train.labels)
    history = model.fit(
        train.features, train.labels, batch_size=args.batch_size, epochs=args.epochs, verbose=2
    )

    keras_masking.methods.save_adapter(model, run.output_dir / "adapter.npz", name=args.task)
    batch = {key: value[: args.batch_size] for key, value in run.encoded["dev"].features.items()}
    branched = model.predict_on_batch(batch)
    merged = merged_model(model, run)  # from here on, `merged` is the model
    # The merged FFNs compute what the FFN and its branch computed together.
    np.testing.assert_allclose(
        merged.predict_on_batch(batch),
        branched,
        rtol=1e-4,
        atol=1e-4,
        err_msg="the merged model's dev logits differ from the FL-tuned model's",
    )
    clue_common.save_results(run, merged, history.history, adapter="adapter.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
