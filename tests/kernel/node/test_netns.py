"""in_netns in a namespace of the test's own: the call runs there (its
sockets see only that namespace), on a thread of its own; the caller stays
where it was and gets the call's result or its exception."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from kpng_py.node.netns import in_netns
from lab.netns import NetNS, netns
from tests.support.kernel import require_root

pytestmark = pytest.mark.kernel

THIS_THREADS_NETNS = Path("/proc/thread-self/ns/net")


@pytest.fixture
def namespace() -> Iterator[NetNS]:
    require_root()
    with netns("kpns") as ns:
        yield ns


def path_of(ns: NetNS) -> Path:
    return Path("/run/netns") / ns.name


def test_the_call_runs_in_the_namespace_on_another_thread(namespace: NetNS) -> None:
    caller = threading.current_thread()

    def where() -> tuple[int, bool, list[str]]:
        return (THIS_THREADS_NETNS.stat().st_ino, threading.current_thread() is caller,
                [name for _, name in socket.if_nameindex()])

    before = THIS_THREADS_NETNS.stat().st_ino
    inode, on_caller, interfaces = in_netns(path_of(namespace), where)
    assert (inode, on_caller, interfaces) == (path_of(namespace).stat().st_ino, False, ["lo"])
    assert THIS_THREADS_NETNS.stat().st_ino == before


def test_a_socket_opened_there_listens_there_only(namespace: NetNS) -> None:
    def listener() -> socket.socket:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        return sock

    with in_netns(path_of(namespace), listener) as sock, socket.socket() as here:
        port = sock.getsockname()[1]
        assert here.connect_ex(("127.0.0.1", port)) != 0
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}))"
        namespace.run(sys.executable, "-c", connect)  # raises unless it connects


def test_the_calls_exception_is_raised_in_the_caller(namespace: NetNS) -> None:
    def fail() -> None:
        raise LookupError("not in this namespace")

    with pytest.raises(LookupError, match="not in this namespace"):
        in_netns(path_of(namespace), fail)
