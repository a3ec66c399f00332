"""One thread that runs an action once a delay has passed; re-armed or
cancelled at will.

A `threading.Timer` per retry would start a new thread each time, and
libraries that keep per-thread state (pyroute2 opens a netlink socket and an
event loop for each thread that uses it) would leak them on every retry. This
timer reuses its one thread, started on the first `arm`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)


class RetryTimer:
    def __init__(self, action: Callable[[], None], name: str) -> None:
        self._action = action
        self._name = name
        self._changed = threading.Condition()
        self._due: float | None = None  # time.monotonic() to run at; None: not armed
        self._closed = False
        self._thread: threading.Thread | None = None

    def arm(self, delay: float) -> None:
        """Run the action `delay` seconds from now (replacing an earlier arm)."""
        with self._changed:
            if self._closed:
                return
            self._due = time.monotonic() + delay
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._changed.notify()

    def cancel(self) -> None:
        with self._changed:
            self._due = None
            self._changed.notify()

    def armed(self) -> bool:
        with self._changed:
            return self._due is not None

    def close(self) -> None:
        """Cancel, and wait for an action in progress to return."""
        with self._changed:
            self._closed = True
            self._due = None
            self._changed.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                if self._due is None:
                    self._changed.wait()
                    continue
                remaining = self._due - time.monotonic()
                if remaining > 0:
                    self._changed.wait(remaining)
                    continue
                self._due = None
                # The action may take the caller's locks, whose holders call arm/cancel.
                self._changed.release()
                try:
                    self._action()
                except Exception:  # a bug in one run must not end the retries
                    log.exception("a timed retry failed", extra=fields(timer=self._name))
                finally:
                    self._changed.acquire()
