"""asyncio helpers: the event loop kpng-py runs, an event that any thread
sets and asyncio tasks, on any event loop, await, and the task a coroutine
runs in."""

from __future__ import annotations

import asyncio
import logging
import threading

log = logging.getLogger(__name__)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (a dependency; much cheaper per
    callback), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        log.info("uvloop is not installed; using asyncio's default event loop")
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ThreadsafeEvent:
    """The brain's watcher thread publishes new state versions to Watch
    streams waiting on the server's event loop, and a termination callback
    stops the loop of `to-local`. `asyncio.Event` may only be used from its own
    loop, and `threading.Event` blocks a thread per waiter: this one wakes
    each waiting task through its loop's `call_soon_threadsafe`, and a waiter
    costs one future."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._waiters: set[asyncio.Future[None]] = set()

    def is_set(self) -> bool:
        with self._lock:
            return self._set

    def set(self) -> None:
        """Wake every waiting task (from any thread); later waits return at once."""
        with self._lock:
            if self._set:
                return
            self._set = True
            waiters, self._waiters = self._waiters, set()
        for future in waiters:
            try:
                future.get_loop().call_soon_threadsafe(resolve, future)
            except RuntimeError:  # its loop is closed: nobody waits there any more
                pass

    async def wait(self) -> None:
        """Return once the event is set; cancelling the task just stops waiting."""
        with self._lock:
            if self._set:
                return
            future = asyncio.get_running_loop().create_future()
            self._waiters.add(future)
        try:
            await future
        finally:
            with self._lock:
                self._waiters.discard(future)


def resolve(future: asyncio.Future[None]) -> None:
    """Set `future`'s result unless it is done already (e.g. cancelled)."""
    if not future.done():
        future.set_result(None)


def running_task() -> asyncio.Task:
    """The task running the calling coroutine, for code that must be able to
    cancel it later."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("running_task() was called outside an asyncio task; "
                           "run the coroutine with asyncio.create_task() or a server")
    return task
