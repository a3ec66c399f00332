"""Work in another network namespace from this process: setns(2) moves only
the calling thread, so a thread that entered a namespace opens every socket
(TCP, UDP, netlink) there and starts threads that stay there."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def enter_netns(path: str | Path) -> None:
    """Moves the calling thread into the network namespace at `path`
    (`/run/netns/NAME`, `/proc/PID/ns/net`); OSError naming it otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns {path}: {os.strerror(code)}")
    finally:
        os.close(fd)


def in_netns(path: str | Path, call: Callable[[], T]) -> T:
    """`call()` in another network namespace, on a short-lived thread. Its
    exception, an OSError from setns included, is raised here."""
    result: list[T] = []
    failure: list[Exception] = []

    def enter_and_call() -> None:
        try:
            enter_netns(path)
            result.append(call())
        except Exception as err:  # noqa: BLE001 - raised again in the caller
            failure.append(err)

    thread = threading.Thread(target=enter_and_call, name="kpng-netns")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
