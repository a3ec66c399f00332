"""What the `file` and `kube` commands' flags set, and the errors they
report, without the brain: the CLI builds every command's parser (and
catches those errors) on every run, and a backend's run never loads the
brain (its YAML reader, its server) for them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The largest state file read (`kpng-py file --max-file-size`). The bench's
# largest scenario, 30 000 services of 10 endpoints, is 58.5 MB as yaml.dump
# writes it (and takes minutes and about 3 GB to parse): it fits.
DEFAULT_MAX_FILE_SIZE = 64 << 20
# `-i -`: standard input (a relative path, which no other -i is once read).
STDIN = Path("-")


@dataclass(frozen=True)
class Settle:
    """How long a new content must stay the same before it is used."""

    seconds: float = 1.0
    incomplete_seconds: float = 5.0  # for a content that looks cut short

    @classmethod
    def after(cls, seconds: float) -> Settle:
        """`seconds` for a content that looks whole, and never less than the
        default wait for one that looks cut short."""
        return cls(seconds, max(seconds, cls.incomplete_seconds))


class StateFileError(ValueError):
    """A state file that cannot be used; the message names the file, the line,
    the place in the document and the problem."""


@dataclass(frozen=True)
class Coalesce:
    """`kpng-py kube`: how long a burst of changes is waited for before a
    new state is made."""

    quiet: float = 0.1  # no change for this long
    longest: float = 1.0  # or this long after the burst's first change

    @classmethod
    def after(cls, quiet: float) -> Coalesce:
        """`quiet` seconds, and at most ten times that after the first change."""
        return cls(quiet, 10 * quiet)


class KubeAccessError(ValueError):
    """`kpng-py kube` cannot reach the API server as configured (a kubeconfig
    that cannot be read, no server at all); the message names the flag or
    file to fix."""
