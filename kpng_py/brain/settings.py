"""What the `file` command's flags set, and the error it reports, without the
brain: the CLI builds every command's parser (and catches that error) on
every run, and a backend's run never loads the brain (its YAML reader, its
server) for them."""

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
