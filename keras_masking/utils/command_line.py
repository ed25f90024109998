"""The commands' argument parser: whole flag names, each flag given once."""

import argparse
import sys

# argparse's actions that take a flag more than once on purpose (it exposes
# them only as these classes); `CollectPairs` below is one too.
_REPEATABLE = (
    argparse._AppendAction,
    argparse._AppendConstAction,
    argparse._CountAction,
    argparse._ExtendAction,
)


class CommandLineParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` that reads whole flag names only and refuses a flag given twice.

    Plain argparse reads a prefix of a flag as the flag (``--seed 3`` as
    ``--seeds 3``) and keeps the last value of a flag given twice
    (``--methods asa --methods drop_token`` runs DropToken alone): both run
    something other than what was typed. Here a prefix is an unknown flag and
    a second use of a setting (``--x 1`` or ``--x=1``, or another flag of the
    same destination: ``--jit-compile`` and ``--no-jit-compile``, an old
    spelling, `DeprecatedSpelling`) is a usage error (exit code 2), except for
    flags whose action collects every use (``action="append"``, ``"extend"``,
    ``"count"``, `CollectPairs`). Sub-command parsers made by `add_subparsers`
    are of this class too.

    Args:
        *args: as `argparse.ArgumentParser`.
        **kwargs: as `argparse.ArgumentParser`; ``allow_abbrev`` is always False.

    Example:
    >>> parser = CommandLineParser(prog="tool")
    >>> _ = parser.add_argument("--seeds", type=int, nargs="+")
    >>> parser.parse_args(["--seeds", "0", "1"]).seeds
    [0, 1]
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs):
        """As `argparse.ArgumentParser.add_subparsers`, with sub-parsers of this class."""
        kwargs.setdefault("parser_class", CommandLineParser)
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """As argparse's, after refusing a flag of this parser given twice."""
        args = sys.argv[1:] if args is None else list(args)
        once = {
            option: action
            for action in self._actions  # argparse keeps no public list of them
            if not isinstance(action, (*_REPEATABLE, CollectPairs))
            for option in action.option_strings
        }
        seen = {}
        for text in args:
            if text == "--":  # what follows is positional
                break
            action = once.get(text.split("=", 1)[0])
            if action is None:
                continue
            if action.dest in seen:
                first = seen[action.dest].split("=", 1)[0]
                also = (
                    "" if action.option_strings == once[first].option_strings else f" and {first}"
                )
                self.error(f"{action.option_strings[-1]}{also} given twice: give each setting once")
            seen[action.dest] = text
        return super().parse_known_args(args, namespace)


class DeprecatedSpelling(argparse.Action):
    """An old flag that sets another flag's destination, with a warning that it goes.

    Give it the same ``dest`` (and ``type``) as the flag it stands for: the
    two together are one setting given twice, a usage error.

    Example:
    >>> parser = CommandLineParser(prog="tool")
    >>> _ = parser.add_argument("--dev-noise", type=float, default=0.0)
    >>> _ = parser.add_argument("--noise", dest="dev_noise", type=float,
    ...                         action=DeprecatedSpelling, replacement="--dev-noise")
    >>> parser.parse_args(["--noise", "0.2"]).dev_noise  # and a warning on stderr
    0.2
    """

    def __init__(self, option_strings, dest, replacement, **kwargs):
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.replacement = replacement

    def __call__(self, parser, namespace, values, option_string=None):
        print(
            f"{parser.prog}: {option_string} is deprecated and goes in the next release; pass "
            f"{self.replacement}.",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


class CollectPairs(argparse.Action):
    """An argparse action that collects a repeatable flag's ``(key, value)`` pairs into a dict.

    The flag's ``type`` turns each text into a ``(key, value)`` pair; a key
    given twice is a usage error, rather than the last value winning.

    Example:
    >>> parser = CommandLineParser(prog="tool")
    >>> pair = lambda text: text.split("=")
    >>> _ = parser.add_argument("--rate-for", type=pair, action=CollectPairs)
    >>> parser.parse_args(["--rate-for", "a=1", "--rate-for", "b=2"]).rate_for
    {'a': '1', 'b': '2'}
    """

    def __call__(self, parser, namespace, pair, option_string=None):
        collected = dict(getattr(namespace, self.dest, None) or {})
        key, value = pair
        if key in collected:
            raise argparse.ArgumentError(self, f"{key!r} given twice: give each one once")
        collected[key] = value
        setattr(namespace, self.dest, collected)
