"""The /healthz and /metrics server under bad neighbours, over real loopback
sockets: idle and trickling connections take no thread, are closed after the
timeout, and never keep a probe out."""

from __future__ import annotations

import select
import socket
import threading
import time
from contextlib import ExitStack
from typing import Callable, Iterator

import pytest

from kpng_py.healthcheck.httpserver import BoundedHTTPServer, ConnectionLimits, Response
from kpng_py.healthcheck.proxier_health import BindAddress, SyncHealth, serve_healthz
from kpng_py.metrics.metrics import Metrics

WAIT = 30.0  # liveness bound: generous, the machine is shared


def ok() -> Response:
    return Response(200, "text/plain", b"ok\n")


def fail() -> Response:
    raise RuntimeError("a bug in a handler")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def serve(metrics: Metrics) -> Iterator[Callable[[ConnectionLimits], int]]:
    with ExitStack() as servers:
        def start(limits: ConnectionLimits) -> int:
            server = BoundedHTTPServer("healthz", {"/healthz": ok, "/fail": fail}, metrics,
                                       limits)
            servers.callback(server.close)
            return server.start("127.0.0.1", 0)
        yield start


@pytest.fixture
def connect() -> Iterator[Callable[[int], socket.socket]]:
    with ExitStack() as clients:
        yield lambda port: clients.enter_context(
            socket.create_connection(("127.0.0.1", port), timeout=WAIT))


def request(port: int, raw: bytes) -> bytes:
    """Send `raw`, read the whole answer (the server closes after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def probe(port: int) -> bytes:
    return request(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.30\r\n\r\n")


def closed_by_server(sock: socket.socket, wait: float) -> bool:
    """True once the server has closed `sock` (EOF or reset) within `wait` s."""
    if not select.select([sock], [], [], wait)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def dropped(metrics: Metrics, reason: str) -> float:
    return metrics.http_connections_dropped.labels("healthz", reason)._value.get()


def test_idle_connections_take_no_thread_and_a_probe_gets_through(connect) -> None:
    health = SyncHealth(timeout=60)
    health.changeset_started()
    health.changeset_applied()
    # Threads of earlier tests may end meanwhile: count only threads started since.
    before = set(threading.enumerate())

    def started_since() -> list[threading.Thread]:
        return [thread for thread in threading.enumerate() if thread not in before]

    server = serve_healthz(BindAddress("127.0.0.1", 0), health, Metrics())  # the defaults
    try:
        for _ in range(300):
            connect(server.port)
        time.sleep(0.5)  # give a thread-per-connection server the time to start its threads
        assert len(started_since()) == 1  # the server's one thread
        assert probe(server.port).startswith(b"HTTP/1.1 200 OK\r\n")
        assert len(started_since()) == 1
    finally:
        server.close()
    assert started_since() == []


def test_idle_and_trickling_connections_are_closed_after_the_timeout(
        serve, connect, metrics: Metrics) -> None:
    port = serve(ConnectionLimits(timeout=1.0))
    idle = [connect(port) for _ in range(5)]
    trickling = connect(port)
    sent = 0
    for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
        try:
            trickling.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 1
        if closed_by_server(trickling, 0.1):
            break
    # Each byte came within a second of the last: only a deadline for the whole
    # request ends it (100 bytes take 10 s, ten times the timeout).
    assert sent < 100
    assert all(closed_by_server(sock, WAIT) for sock in idle)
    assert dropped(metrics, "timeout") == 6
    assert probe(port).startswith(b"HTTP/1.1 200 OK\r\n")


def test_past_the_cap_the_oldest_connection_makes_room(
        serve, connect, metrics: Metrics) -> None:
    port = serve(ConnectionLimits(timeout=WAIT, max_connections=4))
    held = [connect(port) for _ in range(4)]
    assert probe(port).startswith(b"HTTP/1.1 200 OK\r\n")
    assert closed_by_server(held[0], WAIT)
    assert not any(closed_by_server(sock, 0) for sock in held[1:])
    assert dropped(metrics, "evicted") == 1


@pytest.mark.parametrize(("raw", "status"), [
    (b"GET /nope HTTP/1.1\r\n\r\n", b"404 Not Found"),
    (b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405 Method Not Allowed"),
    (b"GET /fail HTTP/1.1\r\n\r\n", b"500 Internal Server Error"),
    (b"\x00\xff garbage\r\n\r\n", b"400 Bad Request"),
    (b"GET /healthz\r\n\r\n", b"400 Bad Request"),
    (b"GET /healthz HTTP/1.1\r\n" + b"X-Big: " + b"a" * 10000 + b"\r\n\r\n", b"400 Bad Request"),
    (b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 2000 + b"\r\n", b"400 Bad Request"),
    (b"GET /healthz?verbose HTTP/1.0\n\n", b"200 OK"),
], ids=["unknown-path", "post", "handler-bug", "garbage", "no-version", "long-header",
        "many-headers", "query-and-bare-newlines"])
def test_bad_requests_get_an_answer_and_the_server_carries_on(
        serve, raw: bytes, status: bytes) -> None:
    port = serve(ConnectionLimits())
    answer = request(port, raw)
    assert answer.startswith(b"HTTP/1.1 " + status + b"\r\n"), answer[:200]
    if status.startswith(b"405"):
        assert b"\r\nAllow: GET\r\n" in answer
    assert probe(port).startswith(b"HTTP/1.1 200 OK\r\n")


def test_an_answer_is_sent_whole() -> None:
    """A body larger than the socket buffers arrives complete before the close."""
    body = bytes(range(256)) * 16384  # 4 MiB
    server = BoundedHTTPServer("metrics", {"/metrics": lambda: Response(200, "x/y", body)},
                               Metrics())
    port = server.start("127.0.0.1", 0)
    try:
        answer = request(port, b"GET /metrics HTTP/1.1\r\n\r\n")
    finally:
        server.close()
    head, _, received = answer.partition(b"\r\n\r\n")
    assert f"Content-Length: {len(body)}".encode() in head and received == body


def test_a_port_in_use_is_an_os_error(serve) -> None:
    port = serve(ConnectionLimits())
    with pytest.raises(OSError):
        BoundedHTTPServer("again", {}, Metrics()).start("127.0.0.1", port)
