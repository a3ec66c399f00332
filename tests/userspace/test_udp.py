"""UDP sessions (backends/userspace/udp.py) on loopback, no root: replies
come from the listener's address, one session per client, ended when idle
or when its endpoint goes (the next datagram opens one to a live endpoint)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Callable, Iterator

import pytest

from backends.userspace.context import ProxyContext
from backends.userspace.udp import UdpListener
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Endpoint
from tests.support.userspace import Started, sample

LOOPBACK = ipaddress.ip_address("127.0.0.1")


class Echo:
    """A UDP endpoint that answers each datagram with its own name."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: bytes) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.endpoint = Endpoint(LOOPBACK, self.sock.getsockname()[1])
        loop.add_reader(self.sock.fileno(), self._answer, name)
        self._loop = loop

    def _answer(self, name: bytes) -> None:
        data, peer = self.sock.recvfrom(2048)
        self.sock.sendto(name + b":" + data, peer)

    def close(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


@pytest.fixture
def echoes(ctx: ProxyContext) -> Iterator[Callable[[bytes], Echo]]:
    made: list[Echo] = []

    def make(name: bytes) -> Echo:
        made.append(Echo(ctx.loop, name))
        return made[-1]

    yield make
    for echo in made:
        echo.close()


@pytest.fixture
def client() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def _ask(ctx: ProxyContext, client: socket.socket, port: int, data: bytes
         ) -> tuple[bytes, tuple[str, int]]:
    """Send `data` to the listener and run the loop until the reply comes."""
    client.sendto(data, ("127.0.0.1", port))

    async def reply() -> tuple[bytes, tuple[str, int]]:
        return await asyncio.wait_for(ctx.loop.sock_recvfrom(client, 2048), 5)

    return ctx.loop.run_until_complete(reply())


def test_replies_come_from_the_listener_and_a_client_keeps_its_session(
        ctx: ProxyContext, metrics: Metrics, client: socket.socket,
        echoes: Callable[[bytes], Echo], start_listener: Callable[..., Started]) -> None:
    _, tally, port = start_listener(UdpListener, echoes(b"a").endpoint)
    assert _ask(ctx, client, port, b"1") == (b"a:1", ("127.0.0.1", port))
    assert _ask(ctx, client, port, b"2") == (b"a:2", ("127.0.0.1", port))
    assert tally.translated == 1  # one session
    assert sample(metrics, "kpng_py_map_entries", map="userspace_udp_sessions") == 1


def test_an_idle_session_ends_and_the_listener_says_when_none_is_left(
        ctx: ProxyContext, metrics: Metrics, client: socket.socket,
        echoes: Callable[[bytes], Echo], start_listener: Callable[..., Started]) -> None:
    listener, tally, port = start_listener(UdpListener, echoes(b"a").endpoint)
    _ask(ctx, client, port, b"1")
    now = ctx.loop.time()
    assert isinstance(listener, UdpListener)
    assert listener.expire(now)  # not idle yet
    assert not listener.expire(now + ctx.config.udp_idle_timeout + 1)
    assert sample(metrics, "kpng_py_map_entries", map="userspace_udp_sessions") == 0
    _ask(ctx, client, port, b"2")
    assert tally.translated == 2  # a new session


def test_a_session_moves_off_an_endpoint_that_went(
        ctx: ProxyContext, client: socket.socket, echoes: Callable[[bytes], Echo],
        start_listener: Callable[..., Started]) -> None:
    a, b = echoes(b"a"), echoes(b"b")
    listener, _, port = start_listener(UdpListener, a.endpoint, b.endpoint)
    first = _ask(ctx, client, port, b"1")[0]
    served, other = (a, b) if first.startswith(b"a:") else (b, a)
    assert listener.update((other.endpoint,), None, None) == {served.endpoint}
    name = b"a" if other is a else b"b"
    assert _ask(ctx, client, port, b"2")[0] == name + b":2"


def test_a_datagram_without_an_endpoint_is_dropped_and_counted(
        ctx: ProxyContext, client: socket.socket,
        start_listener: Callable[..., Started]) -> None:
    _, tally, port = start_listener(UdpListener)
    client.sendto(b"1", ("127.0.0.1", port))
    ctx.loop.run_until_complete(asyncio.sleep(0.2))
    assert (tally.translated, tally.rejected) == (0, 1)
    with pytest.raises(BlockingIOError):
        client.recvfrom(2048)
