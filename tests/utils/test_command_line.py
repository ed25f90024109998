"""keras_masking.utils.command_line: whole flag names, each flag given once."""

import argparse

import pytest

from keras_masking import cli
from keras_masking.demo import pipeline
from keras_masking.utils.command_line import CollectPairs
from keras_masking.utils.command_line import CommandLineParser
from keras_masking.utils.command_line import DeprecatedSpelling


def _parser():
    parser = CommandLineParser(prog="tool")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--tag", action="append")
    parser.add_argument("--rate-for", type=lambda text: text.split("="), action=CollectPairs)
    parser.add_argument("rest", nargs="*")
    return parser


def test_each_flag_once_and_whole_while_collecting_flags_repeat():
    args = _parser().parse_args(
        ["--seeds", "0", "1", "--tag", "a", "--tag", "b", "--rate-for", "x=1", "--rate-for=y=2"]
    )
    assert args.seeds == [0, 1] and args.tag == ["a", "b"]
    assert args.rate_for == {"x": "1", "y": "2"}
    # After "--" a text that looks like a flag is a positional value.
    assert _parser().parse_args(["--quiet", "--", "--quiet"]).rest == ["--quiet"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "0", "--seeds", "1"], "--seeds given twice"),  # argparse kept [1]
        (["--seeds", "0", "--seeds=1"], "--seeds given twice"),
        (["--quiet", "--quiet"], "--quiet given twice"),
        (["--seed", "3"], "unrecognized arguments: --seed"),  # argparse read --seeds 3
        (["--rate-for", "x=1", "--rate-for", "x=2"], "'x' given twice"),  # argparse kept 2
    ],
)
def test_a_flag_given_twice_or_cut_short_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_request:
        _parser().parse_args(argv)
    assert exit_request.value.code == 2
    assert message in capsys.readouterr().err


def test_an_old_spelling_sets_the_new_flag_and_both_together_are_one_setting_twice(capsys):
    parser = CommandLineParser(prog="tool")
    parser.add_argument("--dev-noise", type=float, default=0.0)
    parser.add_argument(
        "--noise",
        dest="dev_noise",
        type=float,
        action=DeprecatedSpelling,
        replacement="--dev-noise",
    )
    parser.add_argument("--jit-compile", dest="jit", action="store_true", default=True)
    parser.add_argument("--no-jit-compile", dest="jit", action="store_false")
    assert parser.parse_args(["--noise", "0.2"]).dev_noise == 0.2
    assert "tool: --noise is deprecated and goes in the next release; pass --dev-noise." in (
        capsys.readouterr().err
    )
    for argv, message in (
        (["--noise", "0.2", "--dev-noise", "0"], "--dev-noise and --noise given twice"),
        (["--jit-compile", "--no-jit-compile"], "--no-jit-compile and --jit-compile given twice"),
    ):
        with pytest.raises(SystemExit) as exit_request:
            parser.parse_args(argv)  # argparse kept the last one
        assert exit_request.value.code == 2
        assert message in capsys.readouterr().err


def test_the_demo_refuses_entity_epochs_without_the_entity_task(capsys):
    with pytest.raises(SystemExit) as exit_request:
        pipeline.main(["--quick", "--entity-epochs", "5"])  # no entity run: ignored before
    assert exit_request.value.code == 2
    assert "--entity-epochs sets the entity task's epochs: pass --entities" in (
        capsys.readouterr().err
    )


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_command_parses_with_it():
    parsers = [
        *_parsers(cli.build_parser()),
        cli.build_submit_parser(),
        pipeline.build_parser(),
    ]
    assert len(parsers) > 8
    assert all(type(parser) is CommandLineParser for parser in parsers)
    assert cli.main(["demo", "--quic"]) == 2  # was read as --quick
    assert cli.main(["clue", "tnews", "data", "--output-dir", "a", "--output-dir", "b"]) == 2
