"""Work done by a forked child on the machine's other CPU, sent back as bytes.

A thread cannot take CPU-bound Python off the interpreter's lock; a forked
child can: it starts with a copy of everything the parent holds (a file's
text), does one piece of work, writes the bytes it makes to a pipe and
exits, while the parent goes on with its own work and reads them when it
needs them. The bytes are the work's plain values (`marshal`), which
the parent reads back in a fraction of what making them cost.

The child only saves time: callers do the work themselves when no child can
be made (`fork_work` raises OSError), when it fails in any way (killed, out of
memory: `result` is None), and when the machine has one CPU (`spare_cpu`).
"""

from __future__ import annotations

import gc
import os
import signal
from typing import Callable


def spare_cpu() -> bool:
    """Whether this process may run on more than one CPU (a child's work
    then runs beside it)."""
    return len(os.sched_getaffinity(0)) >= 2


class ForkedWork:
    """A forked child: its pid and the pipe it writes its result to."""

    def __init__(self, pid: int, pipe: int) -> None:
        self.pid, self._pipe = pid, pipe
        self.status: int | None = None

    def result(self) -> bytes | None:
        """What it wrote, once it exited; None if it failed."""
        with os.fdopen(self._pipe, "rb") as reader:
            data = reader.read()
        _, self.status = os.waitpid(self.pid, 0)
        return data if self.status == 0 else None

    def stop(self) -> None:
        """Its result is not needed any more."""
        os.kill(self.pid, signal.SIGKILL)
        self.result()


def fork_work(work: Callable[[], bytes]) -> ForkedWork:
    """A child running `work` (OSError when none can be made). The child
    never returns into the caller's code: it exits when `work` returns or
    raises, and writes nothing but `work`'s result."""
    out, into = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(out)
        os.close(into)
        raise
    if pid:
        os.close(into)
        return ForkedWork(pid, out)
    status = 1
    try:
        # No cycle collection in a child that lives for one piece of work: a
        # collection would walk (and write to) every object it inherited,
        # copying each page of the parent's heap.
        gc.disable()
        # A signal ends the child, and is not passed on to the parent's
        # handlers (their wakeup pipe is shared): the parent then does the
        # work itself.
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        os.close(out)
        data = work()
        with os.fdopen(into, "wb") as pipe:
            pipe.write(data)
        status = 0
    finally:
        os._exit(status)
