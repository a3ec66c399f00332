"""The command line run in process by its tests: its exit code and output,
and the walk over its commands."""

from __future__ import annotations

import argparse
from typing import Iterator

import pytest

from kpng_py.cmd.cli import build_parser, main


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    """main(argv) run in process: its exit code, and what it wrote."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def all_commands(parser: argparse.ArgumentParser | None = None,
                 prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command and subcommand of the command line, as the words that name it."""
    parser = parser or build_parser()
    yield prefix
    for action in parser._actions:  # argparse has no public walk of subcommands
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                yield from all_commands(sub, prefix + (name,))
