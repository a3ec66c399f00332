"""SIGTERM and SIGINT, handled without running anything in a signal handler.

A Python signal handler runs in the main thread between two bytecodes, so it
must not take any lock the main thread may hold (a watch client's lock, a
`threading.Event`'s condition, a logging handler's lock): one that does can
deadlock the process it was meant to stop. Here the only thing that happens at
signal time is a one-byte write to a pipe; a thread of our own reads the pipe
and does the rest, where taking locks is fine:

* the first signal runs the stop callback (the command then winds down in its
  main thread) and starts the grace period;
* if the main thread is still busy when the grace period ends (deep in a huge
  apply, or blocked writing to a stalled stdout), the process exits without
  cleaning up: the dataplane is safe to leave as it is (eBPF pins persist and
  keep translating; the userspace proxy re-syncs at its next start);
* a second signal exits at once.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable

from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

# Well below Kubernetes' default terminationGracePeriodSeconds (30 s), so the
# process ends on its own terms before the kubelet's SIGKILL.
GRACE_SECONDS = 10.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Bytes on the pipe. The C-level handler (signal.set_wakeup_fd) writes the
# signal number at once, even while the main thread is inside a long C call;
# the Python-level handler writes it again, marked, when the main thread next
# runs Python. The second also covers the time an event loop running in the
# main thread (uvloop) has taken the wakeup fd for itself. Each source is
# counted on its own, so one signal seen by both counts once.
_FROM_HANDLER = 0x80
_CLOSING = 0  # no signal has number 0
_LOG_WAIT_SECONDS = 1.0  # a last log line must not hold up an exit (stderr may be stalled)
# What signal.signal takes and gives back: a function, SIG_DFL or SIG_IGN, or
# None (a handler not installed from Python).
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Termination:
    """For the duration of a `with` block in the main thread: SIGTERM and
    SIGINT call `stop` (on a thread of their own), then exit the process
    after `grace` seconds if the block has not ended; a second signal exits
    at once. The previous handlers are restored when the block ends."""

    def __init__(self, stop: Callable[[], None], grace: float = GRACE_SECONDS,
                 exit_process: Callable[[int], None] = os._exit) -> None:
        self._stop = stop
        self._grace = grace
        self._exit_process = exit_process
        self._finished = threading.Event()
        self._read_fd = self._write_fd = -1
        self._previous_handlers: dict[int, _Handler] = {}
        self._previous_wakeup_fd = -1
        self._thread = threading.Thread(target=self._run, name="termination", daemon=True)

    def __enter__(self) -> Termination:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a full pipe drops a byte, never blocks
        self._thread.start()
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        self._finished.set()
        _write_byte(self._write_fd, _CLOSING)
        self._thread.join()
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        _write_byte(self._write_fd, signum | _FROM_HANDLER)

    def _run(self) -> None:
        counter = _SignalCounter()
        first: int | None = None  # the signal that started the stop
        deadline = float("inf")
        while not self._finished.is_set():
            timeout = None if first is None else max(0.0, deadline - time.monotonic())
            ready = select.select([self._read_fd], [], [], timeout)[0]
            if not ready and first is not None:  # only a stop in progress has a timeout
                self._exit(first, f"not stopped {self._grace:g} s after {_name(first)}: "
                                  "exiting without cleaning up; the dataplane stays as programmed")
                return
            for byte in os.read(self._read_fd, 64):
                if byte == _CLOSING or self._finished.is_set():
                    return
                signum = counter.new_signal(byte)
                if signum is None:
                    continue
                if first is not None:
                    self._exit(signum, f"second signal ({_name(signum)}): exiting at once "
                                       "without cleaning up; the dataplane stays as programmed")
                    return
                first, deadline = signum, time.monotonic() + self._grace
                log.info("stopping", extra=fields(signal=_name(signum), grace_s=self._grace))
                # On a thread of its own: if `stop` blocks, the grace period still ends.
                threading.Thread(target=self._call_stop, name="stop", daemon=True).start()

    def _call_stop(self) -> None:
        try:
            self._stop()
        except Exception:
            log.exception("stopping failed")

    def _exit(self, signum: int, message: str) -> None:
        """Log `message` (waiting a bounded time for it) and end the process
        with the shell's code for death by `signum`."""
        logger = threading.Thread(target=log.error, args=(message,), daemon=True,
                                  kwargs={"extra": fields(signal=_name(signum))})
        logger.start()
        logger.join(_LOG_WAIT_SECONDS)
        self._exit_process(128 + signum)


class _SignalCounter:
    """Turns the pipe's bytes into signals: each source is counted on its
    own, so one signal written by both counts once."""

    def __init__(self) -> None:
        self._seen = {True: 0, False: 0}  # by source: the Python-level handler or not

    def new_signal(self, byte: int) -> int | None:
        """The signal number if `byte` is a signal not counted yet."""
        signum = byte & ~_FROM_HANDLER
        if signum not in SIGNALS:  # the wakeup fd hears every signal Python handles
            return None
        before = max(self._seen.values())
        self._seen[bool(byte & _FROM_HANDLER)] += 1
        return signum if max(self._seen.values()) > before else None


def _write_byte(fd: int, value: int) -> None:
    try:
        os.write(fd, bytes([value]))
    except OSError:  # the pipe is full (the reader is far behind): one byte is enough
        pass


def _name(signum: int) -> str:
    return signal.Signals(signum).name
