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
    a second use of a flag (``--x 1`` or ``--x=1``) is a usage error (exit
    code 2), except for flags whose action collects every use
    (``action="append"``, ``"extend"``, ``"count"``, `CollectPairs`). Sub-command parsers made
    by `add_subparsers` are of this class too.

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
            if action in seen:
                self.error(f"{action.option_strings[-1]} given twice: give each flag once")
            seen[action] = text
        return super().parse_known_args(args, namespace)


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
