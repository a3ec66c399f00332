"""A small HTTP server for /healthz and /metrics that neighbours cannot exhaust.

`http.server` and prometheus_client's server start a thread per connection and
wait on it forever, so idle connections piled up threads that were never
reclaimed. Here all connections of one server are served by one thread
(asyncio), with one request per connection and a bounded life: the request
line and headers must arrive within `timeout`, and the response must be taken
within `timeout` again. At most `max_connections` are open at once; a new one
beyond that closes the oldest, so a probe gets through however many idle
connections a neighbour holds open. Handlers run on the server's thread: they
must be quick (reading a few counters, rendering a registry).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from typing import Callable, Mapping

from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.aio import resolve, running_task
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

_BACKLOG = 64
_STOP_SECONDS = 10.0


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        headers = (("Content-Type", self.content_type), ("Content-Length", str(len(self.body))),
                   ("Connection", "close"), *self.headers)
        head = f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers)
        return f"{head}\r\n".encode("latin-1") + self.body


Handler = Callable[[], Response]


@dataclass(frozen=True)
class ConnectionLimits:
    timeout: float = 5.0  # seconds to receive the request; again to write the response
    max_connections: int = 16
    max_request_bytes: int = 8192  # request line and headers


class _BadRequest(Exception):
    pass


def _text(status: HTTPStatus, *headers: tuple[str, str]) -> Response:
    return Response(status, "text/plain; charset=utf-8", f"{status.phrase}\n".encode(), headers)


@dataclass(frozen=True)
class _Serving:
    """A started server: its loop, the future that stops it, its thread."""

    loop: asyncio.AbstractEventLoop
    stopped: asyncio.Future[None]
    thread: threading.Thread


class BoundedHTTPServer:
    """Serves GET on a few paths from one thread, with bounded connections."""

    def __init__(self, name: str, routes: Mapping[str, Handler], metrics: Metrics,
                 limits: ConnectionLimits = ConnectionLimits(),
                 any_path: Handler | None = None) -> None:
        self.name = name
        self._routes = dict(routes)
        # What answers a path not in `routes` (None: 404).
        self._any_path = any_path
        self._dropped = metrics.http_connections_dropped
        self._limits = limits
        # Open connections (and the task serving each), oldest first.
        self._open: OrderedDict[asyncio.WriteTransport, asyncio.Task] = OrderedDict()
        self._serving: _Serving | None = None
        self.port = 0

    def start(self, host: str, port: int) -> int:
        """Bind (an OSError names why not) and serve on a thread; returns the port."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Dual-stack for "::", as the kernel's default would have it.
        sock = socket.create_server((host, port), family=family, backlog=_BACKLOG,
                                    dualstack_ipv6=family == socket.AF_INET6)
        self.port = sock.getsockname()[1]
        loop = asyncio.new_event_loop()
        stopped = loop.create_future()
        thread = threading.Thread(target=self._run, args=(loop, stopped, sock),
                                  name=self.name, daemon=True)
        self._serving = _Serving(loop, stopped, thread)
        thread.start()
        return self.port

    def close(self) -> None:
        """Stop serving and close every connection."""
        serving = self._serving
        if serving is None or not serving.thread.is_alive():
            return
        serving.loop.call_soon_threadsafe(resolve, serving.stopped)
        serving.thread.join(_STOP_SECONDS)

    def _run(self, loop: asyncio.AbstractEventLoop, stopped: asyncio.Future[None],
             sock: socket.socket) -> None:
        try:
            loop.run_until_complete(self._serve(stopped, sock))
        finally:
            loop.close()

    async def _serve(self, stopped: asyncio.Future[None], sock: socket.socket) -> None:
        server = await self.serve_socket(sock)
        async with server:
            await stopped
            server.close()
            await self.close_connections()

    async def serve_socket(self, sock: socket.socket) -> asyncio.Server:
        """Serve a bound socket on the running loop (for servers whose sockets
        come and go on a loop of their owner's, instead of `start`); the
        owner closes the asyncio server, then `close_connections`."""
        return await asyncio.start_server(self._connection, sock=sock,
                                          limit=self._limits.max_request_bytes)

    async def close_connections(self) -> None:
        """End every open connection (on the loop that serves them)."""
        serving = list(self._open.values())
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        self._admit(transport)
        try:
            await self._exchange(reader, writer)
        except TimeoutError:
            self._drop("timeout")
        except ConnectionError:
            pass  # the peer went away: nothing to answer
        finally:
            self._open.pop(transport, None)
            transport.abort()

    def _admit(self, transport: asyncio.WriteTransport) -> None:
        while len(self._open) >= self._limits.max_connections:
            oldest, _ = self._open.popitem(last=False)
            oldest.abort()
            self._drop("evicted")
        self._open[transport] = running_task()

    def _drop(self, reason: str) -> None:
        self._dropped.labels(self.name, reason).inc()
        log.debug("connection dropped", extra=fields(server=self.name, reason=reason))

    async def _exchange(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._limits.timeout):
                method, path = await self._read_request(reader)
        except _BadRequest:
            response = _text(HTTPStatus.BAD_REQUEST)
        else:
            response = self._respond(method, path)
        writer.write(response.encode())
        async with asyncio.timeout(self._limits.timeout):
            writer.close()  # once everything written is sent
            await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        """(method, path) of a request; its headers are read and ignored."""
        request_line = await self._read_line(reader)
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            raise _BadRequest
        received = len(request_line)
        while (header := await self._read_line(reader)).strip():
            received += len(header)
            if received > self._limits.max_request_bytes:
                raise _BadRequest
        return parts[0].decode("latin-1"), parts[1].decode("latin-1").split("?")[0]

    @staticmethod
    async def _read_line(reader: asyncio.StreamReader) -> bytes:
        try:
            line = await reader.readline()
        except ValueError as err:  # a line over the reader's limit
            raise _BadRequest from err
        if not line.endswith(b"\n"):
            raise ConnectionResetError("the connection closed inside the request")
        return line

    def _respond(self, method: str, path: str) -> Response:
        handler = self._routes.get(path, self._any_path)
        if handler is None:
            return _text(HTTPStatus.NOT_FOUND)
        if method != "GET":
            return _text(HTTPStatus.METHOD_NOT_ALLOWED, ("Allow", "GET"))
        try:
            return handler()
        except Exception:  # a bug in a handler must not stop the server
            log.exception("serving a request failed", extra=fields(server=self.name, path=path))
            return _text(HTTPStatus.INTERNAL_SERVER_ERROR)
