"""keras_masking.utils.command_line: whole flag names, each flag given once."""

import argparse

import pytest

from keras_masking import cli
from keras_masking.demo import pipeline
from keras_masking.utils.command_line import CollectPairs
from keras_masking.utils.command_line import CommandLineParser


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
