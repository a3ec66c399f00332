"""The file `record -o` and `file convert -o` write.

A file that exists and is not empty is not overwritten unless `--force` is
given: a recording or a state file is not lost to a name given twice. The
file is opened, and so truncated, only when there is something to write:
`record` opens it at the first op its brain sends, so one that never reaches
its brain leaves the file as it was. It is opened lazily rather than written
to a temporary file renamed into place: a recording is written as the stream
comes, to be read while it grows (and kept when the process is killed), and
a rename would replace a FIFO or a device (`-o /dev/stdout`) with a file.

Whatever can be checked without touching the file is checked at start (the
directory, a directory given as the file, the permission); a FIFO or a device
has nothing to lose and is opened at start, so that a FIFO that no process
reads is refused at once rather than hanging the command.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO


class OutputFileError(ValueError):
    """An output that cannot be written; the message names the flag, the
    file and the fix."""


class OutputFile:
    """`path` (given with `flag`), checked, and opened by `open` only."""

    def __init__(self, path: Path, flag: str, force: bool) -> None:
        self.path = path
        self._flag = flag
        self._file: IO[str] | None = None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._check_directory()
            return
        except OSError as err:  # ENOTDIR: a parent is a file
            raise self.error(err) from err
        if stat.S_ISDIR(st.st_mode):
            raise self._refused("is a directory; give a file to write")
        if not stat.S_ISREG(st.st_mode):
            try:
                self._file = self._open()
            except OSError as err:
                raise self.error(err) from err
        elif st.st_size and not force:
            raise self._refused(f"exists and is not empty ({st.st_size} bytes); give --force "
                                "to overwrite it, or another file")
        elif not os.access(path, os.W_OK):
            raise self._refused("permission denied; give a file to write")

    def open(self) -> IO[str]:
        """The file, opened for writing (and truncated) at the first call;
        OSError if it cannot be."""
        if self._file is None:
            self._file = self._open()
        return self._file

    def close(self) -> None:
        """Closes the file if it was opened."""
        if self._file is not None:
            self._file.close()

    def error(self, err: OSError) -> OutputFileError:
        """What an OSError of this file means, as the error to report."""
        cause = "a FIFO that no process reads" if err.errno == errno.ENXIO else err.strerror
        return self._refused(f"{cause}; give a file to write")

    def _refused(self, problem: str) -> OutputFileError:
        return OutputFileError(f"{self._flag} {self.path}: {problem}")

    def _check_directory(self) -> None:
        parent = self.path.parent
        try:
            is_directory = stat.S_ISDIR(os.stat(parent).st_mode)
        except OSError as err:
            raise self.error(err) from err
        if not is_directory:
            raise self._refused(f"{parent} is not a directory; give a file to write")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise self._refused(f"cannot create a file in {parent} (permission denied); "
                                "give a file to write")

    def _open(self) -> IO[str]:
        return open(self.path, "w", encoding="utf-8", opener=_open_nonblocking)


def _open_nonblocking(path: str, flags: int) -> int:
    """Opens without blocking, then blocks as usual: a FIFO that no process
    reads is refused at once (ENXIO) instead of hanging the command."""
    fd = os.open(path, flags | os.O_NONBLOCK, 0o666)
    os.set_blocking(fd, True)
    return fd
