"""Run Python callables inside another network namespace, in this process:
one worker thread that entered the namespace with setns(2) (which moves only
the calling thread), so every socket it opens (TCP, UDP, netlink) belongs to
that namespace. A test drives a dataplane library (libnftables, conntrack)
or a client socket in a namespace of its own without a helper process."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from kpng_py.node.netns import enter_netns

T = TypeVar("T")


class NetnsWorker:
    """`call(fn, *args)` runs `fn` in the network namespace `ip netns` knows
    as `name`, one call at a time, and returns its result (or raises its
    exception). `close()` ends the thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{name}",
                                        initializer=enter_netns, initargs=(f"/run/netns/{name}",))
        self.call(os.getpid)  # enters now: a missing namespace fails here, not later

    def call(self, fn: Callable[..., T], *args: object) -> T:
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
