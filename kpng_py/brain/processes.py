"""A big state file's services read by two processes at once.

Reading a service of a state file is Python's work (the checks, and the
protobuf messages built from what the parser read: about 11 us an endpoint),
so one process reads a 10 000 x 10 file in about 2.4 s of CPU whatever the
style. Nearly half of its services (45 %) go to a second process, started
for the read (a new interpreter running this module, not a fork of this
process, which has threads; nothing of the program that started it is run
again) and ended by it: this process reads the rest meanwhile and takes the
second's values back, pickled. docs/bench.md ("The brain's reader") has the figures;
a second process pays only for a big file, hence `min_share`.

A share is a list of what the function reading it takes (a file's item
texts: items.py), read by a module-level function (pickled by its name).
The services of a file read whole are not shared: they are plain values
once the file is parsed, and a second process, given them pickled, saved
12 % of an in-process read at 10 000 x 10 and nothing of the brain's start,
for 115 MiB more (docs/bench.md).

A share the second process could not read (it did not start, it died) is
read here after one warning: the same values, only later. What the read
itself raises there (`Unchecked`: the strict reader must read the file) is
raised here.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, TypeVar

from kpng_py.runtime.collector import collector_paused
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

In = TypeVar("In")
Out = TypeVar("Out")

# Services a process must have for a second one to pay for its own start (an
# interpreter importing protobuf and the parsers: about 0.2 s of a CPU).
MIN_SHARE = 2_000
# The part of the inputs the second process reads: less than half, as it
# starts later and pickles its values back, which this process takes in a
# third of that time (docs/bench.md, "The brain's reader").
SECOND_SHARE = 0.45
# The cgroup v2 limit of this process's CPU time ("max" or "QUOTA PERIOD"),
# as a container sees it.
_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


@dataclass(frozen=True)
class ReadProcesses:
    """How many processes read a file's services (this one included), and
    the fewest services worth a process of their own."""

    count: int
    min_share: int = MIN_SHARE

    @classmethod
    def available(cls) -> ReadProcesses:
        """Two where this process may run on two CPUs or more, else one."""
        return cls(min(2, usable_cpus()))

    def read_each(self, read: Callable[[In], Out], inputs: list[In]) -> list[Out]:
        """`read` of each input, in order; `inputs` is emptied as they are
        read (a big file's plain values are not all kept beside what they
        become)."""
        if min(self.count, len(inputs) // self.min_share) < 2:
            return read_in_order(read, inputs)
        split = len(inputs) - round(len(inputs) * SECOND_SHARE)
        try:
            second = _SecondProcess(read, inputs[split:])  # the share pickled...
        except OSError as err:
            log.warning("no second process to read a share of the state file's services; "
                        "reading them all here", extra=fields(error=str(err)))
            return read_in_order(read, inputs)
        del inputs[split:]  # ... and freed here
        with second:
            outputs = read_in_order(read, inputs)
            outputs.extend(second.outputs())
        return outputs


def usable_cpus(cpu_max: Path = _CPU_MAX) -> int:
    """The CPUs this process may run on, fewer if its cgroup's CPU quota
    allows less time than that (a container's CPU limit)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit to read: the affinity alone
    return cpus


def read_in_order(read: Callable[[In], Out], inputs: list[In]) -> list[Out]:
    """`read` of each input, in order, each input let go once read."""
    inputs.reverse()
    outputs = []
    while inputs:
        outputs.append(read(inputs.pop()))
    return outputs


class _SecondProcess:
    """This module run by a new interpreter over one share: the share is
    written to a file it reads as stdin, its values to one it writes as
    stdout (files, not pipes: neither side waits for the other to read).
    Killed if it is still running when the block ends (this process's own
    share failed)."""

    def __init__(self, read: Callable[[In], Out], share: list[In]) -> None:
        """Started; OSError if it could not be (no file of its own left open)."""
        self._input: IO[bytes] = tempfile.TemporaryFile(prefix="kpng-py-share-")
        # The same modules as this process: its import path, not the new
        # interpreter's own (a checkout run from its directory).
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
        try:
            self._output: IO[bytes] = tempfile.TemporaryFile(prefix="kpng-py-share-")
        except OSError:
            self._input.close()
            raise
        try:
            pickle.dump((read, share), self._input, protocol=pickle.HIGHEST_PROTOCOL)
            self._input.seek(0)
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=self._input, stdout=self._output,
                env=environment)
        except OSError:
            self._close_files()
            raise

    def __enter__(self) -> _SecondProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._close_files()

    def _close_files(self) -> None:
        self._input.close()
        self._output.close()

    def outputs(self) -> list[Any]:
        """Its values, once it has ended; if it gave none, the share read
        here (from what it was given)."""
        code = self._process.wait()
        self._output.seek(0)
        try:
            outcome, value, peak_kib = pickle.load(self._output)
        except Exception as err:  # noqa: BLE001 - whatever a dead process left
            return self._read_here_instead(f"it ended with code {code} and no values ({err!r})")
        log.info("a second process read its share of the state file's services",
                 extra=fields(services=len(value) if outcome == "read" else None,
                              peak_rss_mib=round(peak_kib / 1024, 1)))
        if outcome == "raised":
            raise value
        return value

    def _read_here_instead(self, failure: str) -> list[Any]:
        self._input.seek(0)
        read, share = pickle.load(self._input)
        log.warning("a second process could not read its share of the state file's "
                    "services; reading them here",
                    extra=fields(services=len(share), error=failure))
        return read_in_order(read, share)


def _serve_share() -> int:
    """The second process: the share on stdin, its values (or what reading
    them raised) and this process's peak RSS on stdout."""
    read, share = pickle.load(sys.stdin.buffer)
    try:
        with collector_paused():  # a million new objects, none of them garbage
            result: tuple[str, Any] = ("read", read_in_order(read, share))
    except Exception as err:  # noqa: BLE001 - given back, raised by the first process
        result = ("raised", err)
    pickle.dump((*result, _peak_kib()), sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


def _peak_kib() -> int:
    """This process's peak RSS: the kernel's high-water mark of its memory
    (not getrusage's, which keeps the starting process's across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


if __name__ == "__main__":
    sys.exit(_serve_share())
