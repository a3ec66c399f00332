"""TCP relays (backends/userspace/tcp.py) on loopback, no root: the bytes and
the half-close reach the endpoint and back, a connection is counted, and a
client no endpoint accepts is reset and counted as rejected."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Callable

import pytest

from backends.userspace.context import ProxyContext
from backends.userspace.tcp import TcpListener
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Endpoint
from tests.support.userspace import Started, sample

LOOPBACK = ipaddress.ip_address("127.0.0.1")


async def _echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer everything the client sent once it half-closed."""
    data = await reader.read()
    writer.write(data.upper())
    await writer.drain()
    writer.close()


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    writer.write_eof()
    answer = await reader.read()
    writer.close()
    return answer


def test_a_connection_is_relayed_both_ways_with_its_half_close(
        ctx: ProxyContext, metrics: Metrics, start_listener: Callable[..., Started]) -> None:
    async def run() -> tuple[bytes, int]:
        server = await asyncio.start_server(_echo_once, "127.0.0.1", 0)
        endpoint = Endpoint(LOOPBACK, server.sockets[0].getsockname()[1])
        _, tally, port = start_listener(TcpListener, endpoint)
        async with server:
            answer = await _exchange(port, b"ping" * 100_000)
            while ctx.connections:  # the relay closes once both sides finished
                await asyncio.sleep(0.01)
        assert tally.endpoints is None
        return answer, tally.translated

    answer, translated = ctx.loop.run_until_complete(run())
    assert answer == b"PING" * 100_000
    assert translated == 1
    assert sample(metrics, "kpng_py_map_entries", map="userspace_tcp_connections") == 0


def _closed_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return unused.getsockname()[1]


def test_a_client_no_endpoint_accepts_is_reset_and_counted(
        ctx: ProxyContext, metrics: Metrics, start_listener: Callable[..., Started]) -> None:
    refusing = [Endpoint(LOOPBACK, _closed_port()) for _ in range(2)]
    _, tally, port = start_listener(TcpListener, *refusing)

    async def run() -> bytes:
        return await _exchange(port, b"ping")

    with pytest.raises(ConnectionResetError):
        ctx.loop.run_until_complete(run())
    assert (tally.translated, tally.rejected) == (0, 1)
    # Each endpoint tried once, each a failed connect.
    assert sample(metrics, "kpng_py_dataplane_errors_total", kind="tcp-connect") == 2
