"""The ``keras-masking`` command line.

Subcommands:
    demo      the end-to-end demo on real weights (see `keras_masking.demo`).
    convert   a Google-layout TF checkpoint -> a keras-hub preset folder.
    inspect   list a TF checkpoint's variables and what family it looks like.
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

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:
        from keras_masking.demo import main as demo_main

        return demo_main(argv[1:])
    args = parser.parse_args(argv)
    {"convert": _convert, "inspect": _inspect}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
