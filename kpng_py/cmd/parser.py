"""The command line's parser: argparse's, with the errors the README promises.

A parse error, at the top level or in any command, sink or tool, is one line,
`kpng-py: error: ...`, then one line naming the `--help` that lists the
flags, and exit code 2 (argparse prints the whole usage first). A misspelt
flag or choice gets the closest one of its parser ("did you mean --cgroup?"),
which argparse before Python 3.14 does not offer; a flag of a command given
after its sink is named with the command it belongs to.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import re
import sys
from typing import Any, NoReturn, Sequence

PROGRAM = "kpng-py"
# What argparse takes for a negative number (a value), not a flag.
_NUMBER = re.compile(r"-\d+$|-\d*\.\d+$")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose commands (made with add_subparsers, which
    makes them of this class too) refuse on their own what they do not know:
    a misspelt flag is named by the command it was given to, with the
    closest flag of that command."""

    enclosing: Parser | None = None  # the parser this one is a command of

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction:
        # argparse hands keyword arguments it does not know to the action class
        # (_Commands takes `enclosing`); typeshed's overloads list only its own.
        return super().add_subparsers(  # type: ignore[call-overload]
            action=_Commands, enclosing=self, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROGRAM}: error: {message}\n"
                     f"run `{self.prog} --help` for the flags\n")

    # typeshed overloads the namespace's own type (a caller's object comes back
    # typed as itself); this parser is given and gives a Namespace only.
    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        # argparse would take a value after an unknown flag for the command
        # (`--eror-delay 1 to-print`: "invalid choice: '1'"): named first.
        unknown = self._unknown_before_command(args)
        if unknown is not None:
            self._refuse([unknown])
        parsed, extras = super().parse_known_args(
            args, argparse.Namespace() if namespace is None else namespace)
        if extras:
            self._refuse(extras)
        return parsed, extras

    def _refuse(self, extras: list[str]) -> NoReturn:
        flag = next((word.partition("=")[0] for word in extras if word.startswith("-")), "")
        self.error(f"unrecognized arguments: {' '.join(extras)}"
                   + (self._placement(flag) or _suggestion(flag, self._option_strings())))

    def _unknown_before_command(self, args: list[str]) -> str | None:
        """The first flag this parser does not have before its command (None
        if there is none, or the parser has no commands). A flag's value is
        skipped: argparse names a value that looks like a flag (`-inf`)."""
        commands = next((action.choices for action in self._actions
                         if isinstance(action, argparse._SubParsersAction)), None)
        if not commands:
            return None
        words = itertools.takewhile(lambda word: word not in commands and word != "--", args)
        for word in words:
            action = self._option_string_actions.get(word)
            if action is not None and action.nargs != 0:
                next(words, None)
            elif self._is_unknown(word):
                return word
        return None

    def _is_unknown(self, arg: str) -> bool:
        """Whether argparse takes `arg` for a flag this parser does not have
        (a long flag may be abbreviated; short ones may be run together)."""
        if len(arg) < 2 or not arg.startswith("-") or " " in arg or _NUMBER.fullmatch(arg):
            return False
        flags = self._option_strings()
        if arg.startswith("--"):
            name = arg.partition("=")[0]
            return not any(flag.startswith(name) for flag in flags)
        return arg[:2] not in flags

    def _placement(self, flag: str) -> str:
        """Where `flag` goes if it is a flag of a command enclosing this one."""
        command = self.prog.rpartition(" ")[2]
        outer = self.enclosing
        while outer is not None:
            if flag in outer._option_strings():
                return f"; {flag} is a flag of `{outer.prog}`: give it before {command}"
            outer = outer.enclosing
        return ""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check, with the closest choice added to its message
        # (argparse has no public hook for it).
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            choices = [str(choice) for choice in action.choices or ()]
            hint = _suggestion(str(value), choices, quoted=True)
            if not hint:
                raise
            raise argparse.ArgumentError(action, err.message + hint) from err

    def _option_strings(self) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings]


class _Commands(argparse._SubParsersAction):
    """A parser's commands; each knows the parser it is a command of."""

    def __init__(self, *args: Any, enclosing: Parser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._enclosing = enclosing

    def add_parser(self, name: str, **kwargs: Any) -> Parser:
        parser = super().add_parser(name, **kwargs)
        parser.enclosing = self._enclosing
        return parser


def _suggestion(given: str, known: list[str], quoted: bool = False) -> str:
    """The hint `; did you mean X?` for the closest of `known` to `given`,
    or "". Flags are compared without their dashes, which all of them share."""
    by_name = {name.lstrip("-"): name for name in known}
    close = difflib.get_close_matches(given.lstrip("-"), list(by_name), n=1) if given else []
    if not close:
        return ""
    name = by_name[close[0]]
    return f"; did you mean {name!r}?" if quoted else f"; did you mean {name}?"
