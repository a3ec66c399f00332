"""Run Python callables inside another network namespace, in this process:
one worker thread that entered the namespace with setns(2) (which moves only
the calling thread), so every socket it opens (TCP, UDP, netlink) belongs to
that namespace. A test drives a dataplane library (libnftables, conntrack)
or a client socket in a namespace of its own without a helper process."""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _enter(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns {path}: {os.strerror(code)}")
    finally:
        os.close(fd)


class NetnsWorker:
    """`call(fn, *args)` runs `fn` in the network namespace `ip netns` knows
    as `name`, one call at a time, and returns its result (or raises its
    exception). `close()` ends the thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{name}",
                                        initializer=_enter, initargs=(f"/run/netns/{name}",))
        self.call(os.getpid)  # enters now: a missing namespace fails here, not later

    def call(self, fn: Callable[..., T], *args: object) -> T:
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
