"""The ``keras-masking`` command line.

Subcommands:
    demo      the end-to-end demo on real weights (see `keras_masking.demo`).
    convert   a Google-layout TF checkpoint -> a keras-hub preset folder.
    inspect   list a TF checkpoint's variables and what family it looks like.
    correct-embeddings
              MLM embedding correction of a TF checkpoint or a preset folder,
              written to a new folder (the input is never modified).
"""

import argparse
import sys


def _convert(args):
    from keras_masking.models import from_tf_checkpoint

    model = from_tf_checkpoint(
        args.config,
        args.checkpoint,
        model=args.model,
        with_mlm=args.with_mlm,
        strict=not args.lenient,
    )
    model.save_to_preset(args.output)
    print(f"Wrote a {type(model).__name__} preset to {args.output}")


def _inspect(args):
    from keras_masking.models import read_tf_checkpoint
    from keras_masking.models.google_checkpoint_layout import is_training_state

    values = read_tf_checkpoint(args.checkpoint)
    for name in sorted(values):
        note = "  (training state)" if is_training_state(name) else ""
        print(f"{name:70s} {tuple(values[name].shape)}{note}")
    if "bert/embeddings/position_embeddings" in values:
        family = "absolute positions: model='bert' (or 'roberta')"
    else:
        family = (
            "no absolute position table: model='roformer' or 'nezha' "
            "(NEZHA configs declare max_relative_position)"
        )
    print(f"\n{len(values)} variables; {family}")


def _correct_embeddings(args):
    from keras_masking.methods.mlm_embedding_correction_files import correct_checkpoint_embeddings
    from keras_masking.methods.mlm_embedding_correction_files import correct_preset_embeddings
    from keras_masking.methods.mlm_embedding_correction_files import is_preset_folder

    unselectable = None
    if args.unselectable_token_ids:
        unselectable = [int(i) for i in args.unselectable_token_ids.split(",") if i.strip()]
    settings = dict(
        mask_token_id=args.mask_token_id,
        mask_rate=args.mask_rate,
        mask_token_rate=args.mask_token_rate,
        random_token_rate=args.random_token_rate,
        unselectable_token_ids=unselectable,
    )
    if is_preset_folder(args.input):
        record = correct_preset_embeddings(args.input, args.output, args.tied_output, **settings)
        rows = record.corrected_rows
    else:
        correct_checkpoint_embeddings(
            args.input,
            args.output,
            tied_output=args.tied_output,
            drop_mlm_head=args.drop_mlm_head,
            **settings,
        )
        rows = "all selectable"
    print(f"Corrected {rows} embedding rows; wrote {args.output}")


def main(argv=None):
    """Entry point of the ``keras-masking`` command."""
    parser = argparse.ArgumentParser(prog="keras-masking", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the real-weights demo", add_help=False)

    convert = commands.add_parser("convert", help="TF checkpoint -> keras-hub preset")
    convert.add_argument("config", help="bert_config.json")
    convert.add_argument("checkpoint", help="checkpoint prefix, folder or .index")
    convert.add_argument("output", help="preset folder to write")
    convert.add_argument(
        "--model", default="bert", choices=["bert", "roberta", "roformer", "nezha"]
    )
    convert.add_argument("--with-mlm", action="store_true", help="keep the MLM head")
    convert.add_argument(
        "--lenient", action="store_true", help="skip unknown variables (strict=False)"
    )

    inspect = commands.add_parser("inspect", help="list a TF checkpoint's variables")
    inspect.add_argument("checkpoint")

    correct = commands.add_parser(
        "correct-embeddings", help="MLM embedding correction of a checkpoint or preset"
    )
    correct.add_argument("input", help="TF checkpoint (prefix or folder) or preset folder")
    correct.add_argument("output", help="new folder to write")
    correct.add_argument("--mask-token-id", type=int, required=True)
    correct.add_argument("--mask-rate", type=float, default=0.15)
    correct.add_argument("--mask-token-rate", type=float, default=0.8)
    correct.add_argument("--random-token-rate", type=float, default=0.1)
    correct.add_argument(
        "--unselectable-token-ids",
        default="",
        help="comma-separated ids pretraining never selected (default: correct every row)",
    )
    correct.add_argument("--tied-output", choices=["keep", "correct"], default="keep")
    correct.add_argument(
        "--drop-mlm-head", action="store_true", help="leave cls/predictions out (checkpoints)"
    )

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:
        from keras_masking.demo import main as demo_main

        return demo_main(argv[1:])
    args = parser.parse_args(argv)
    handlers = {
        "convert": _convert,
        "inspect": _inspect,
        "correct-embeddings": _correct_embeddings,
    }
    handlers[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
