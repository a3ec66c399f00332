"""TCP: accept on ClusterIP:port, connect to a Maglev-chosen endpoint, then let
the kernel move the bytes.

Each direction splices socket -> pipe -> socket (`os.splice`), so payload
never enters Python: one wake-up of the event loop moves up to a pipe's
capacity. Half-closes are passed on (EOF becomes shutdown(SHUT_WR) on the
other side); a reset or error on either side resets both. Measurements
behind this choice: docs/userspace.md.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import logging
import os
import socket

from backends.userspace.context import ProxyContext, Tally
from backends.userspace.listener import Listener
from backends.userspace.picker import FrontendPickers
from backends.userspace.sockets import reset, sockaddr, socket_family
from kpng_py.model import Endpoint, IPAddress, IPNetwork
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
# Connections accepted per wake-up, so one busy listener cannot starve others.
_ACCEPT_BATCH = 64
# Pause after accept() fails for lack of resources (EMFILE, ENOBUFS...): the
# listener stays readable, and retrying at once would spin.
_ACCEPT_BACKOFF = 0.1


def _pipe(size: int) -> tuple[int, int, int]:
    """A non-blocking pipe (read end, write end, capacity), grown to `size`
    where the kernel allows (pipe-max-size, per-user limits)."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        capacity = fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, size)
    except OSError:
        capacity = fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
    return read_end, write_end, capacity


class _Direction:
    """Bytes from `src` to `dst` through a pipe, one pipe-full at a time: read
    only when the pipe is empty, so EAGAIN on the read means "no data"."""

    def __init__(self, relay: TcpRelay, src: socket.socket, dst: socket.socket) -> None:
        self._relay = relay
        self._loop = relay.loop
        self._src = src.fileno()
        self._dst_sock = dst
        self._dst = dst.fileno()
        self._pipe_out, self._pipe_in, self._capacity = _pipe(relay.pipe_size)
        self._buffered = 0
        self._blocked = False  # waiting for dst to drain
        self.finished = False

    def start(self) -> None:
        self._loop.add_reader(self._src, self._on_readable)

    def _on_readable(self) -> None:
        try:
            moved = os.splice(self._src, self._pipe_in, self._capacity, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            return
        except OSError as err:
            self._relay.abort(err)
            return
        if moved == 0:
            self._loop.remove_reader(self._src)
            self._end_of_stream()
            return
        self._buffered = moved
        self._drain()

    def _drain(self) -> None:
        while self._buffered:
            try:
                moved = os.splice(self._pipe_out, self._dst, self._buffered, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                if not self._blocked:
                    self._blocked = True
                    self._loop.remove_reader(self._src)
                    self._loop.add_writer(self._dst, self._drain)
                return
            except OSError as err:
                self._relay.abort(err)
                return
            self._buffered -= moved
        if self._blocked:
            self._blocked = False
            self._loop.remove_writer(self._dst)
            self._loop.add_reader(self._src, self._on_readable)

    def _end_of_stream(self) -> None:
        """The source sent FIN (and the pipe is empty): pass the half-close on."""
        try:
            self._dst_sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the destination is already gone; its own direction reports it
        self.finished = True
        self._relay.direction_finished()

    def stop(self) -> None:
        self._loop.remove_reader(self._src)
        self._loop.remove_writer(self._dst)
        os.close(self._pipe_out)
        os.close(self._pipe_in)


class TcpRelay:
    """One proxied connection: client <-> upstream, both directions spliced."""

    def __init__(self, ctx: ProxyContext, client: socket.socket, upstream: socket.socket) -> None:
        self.loop = ctx.loop
        self.pipe_size = ctx.config.pipe_size
        self._ctx = ctx
        self._client = client
        self._upstream = upstream
        self._directions = (_Direction(self, client, upstream), _Direction(self, upstream, client))
        self._closed = False

    def start(self) -> None:
        self._ctx.connections.add(self)
        self._ctx.stats.tcp_connections.inc()
        for direction in self._directions:
            direction.start()

    def direction_finished(self) -> None:
        if all(d.finished for d in self._directions):
            self.close()

    def abort(self, err: OSError) -> None:
        """An error on either side: reset both, as a router would pass the RST on."""
        log.debug("tcp relay reset", extra=fields(error=err.strerror or str(err)))
        self._release()
        reset(self._client)
        reset(self._upstream)

    def close(self) -> None:
        self._release()
        self._client.close()
        self._upstream.close()

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        for direction in self._directions:
            direction.stop()
        self._ctx.connections.discard(self)
        self._ctx.stats.tcp_connections.dec()


class TcpListener(Listener):
    """Accepts on one ClusterIP:port and relays each connection to an endpoint.
    Closing it or changing its endpoints leaves established connections alone."""

    KIND = socket.SOCK_STREAM

    def __init__(self, ctx: ProxyContext, name: str, address: IPAddress, port: int,
                 pickers: FrontendPickers, tally: Tally,
                 source_ranges: tuple[IPNetwork, ...] | None) -> None:
        super().__init__(ctx, name, address, port, pickers, tally, source_ranges)
        self._connecting: set[asyncio.Task] = set()

    def _on_readable(self, sock: socket.socket) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                client, peer = sock.accept()
            except BlockingIOError:
                return
            except OSError as err:
                self._accept_failed(sock, err)
                return
            client.setblocking(False)
            task = self._loop.create_task(self._serve(client, peer))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    def _accept_failed(self, sock: socket.socket, err: OSError) -> None:
        self._ctx.stats.error("tcp-accept")
        log.warning("accept failed; pausing this listener", extra=fields(
            listener=self.name, error=err.strerror, pause_s=_ACCEPT_BACKOFF))
        self._loop.remove_reader(sock.fileno())

        def resume() -> None:
            if self._sock is sock:
                self._loop.add_reader(sock.fileno(), self._on_readable, sock)

        self._loop.call_later(_ACCEPT_BACKOFF, resume)

    async def _serve(self, client: socket.socket, peer: tuple) -> None:
        client_ip = ipaddress.ip_address(peer[0])
        try:
            connected = await self._connect_upstream(client_ip, peer[1])
        except asyncio.CancelledError:  # the backend is shutting down
            client.close()
            raise
        if connected is None:
            self._tally.rejected += 1
            reset(client)
            return
        upstream, endpoint = connected
        self._tally.sent_to(endpoint)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        TcpRelay(self._ctx, client, upstream).start()

    async def _connect_upstream(self, client_ip: IPAddress, client_port: int
                                ) -> tuple[socket.socket, Endpoint] | None:
        """Connect to the client's endpoints in Maglev order, a bounded number of
        them: the socket and the endpoint it reached; None if all failed."""
        config = self._ctx.config
        now = self._loop.time()
        picker = self.picker_for(client_ip)
        if picker is None:
            return None
        for endpoint in picker.candidates(client_ip, client_port, now,
                                          config.tcp_connect_attempts):
            sock = socket.socket(socket_family(endpoint.ip), socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(
                    self._loop.sock_connect(sock, sockaddr(endpoint.ip, endpoint.port)),
                    config.tcp_connect_timeout)
            except asyncio.CancelledError:
                sock.close()
                raise
            except (OSError, asyncio.TimeoutError) as err:
                sock.close()
                self._ctx.stats.error("tcp-connect")
                log.debug("endpoint connect failed", extra=fields(
                    listener=self.name, endpoint=str(endpoint), error=repr(err)))
                continue
            picker.served(client_ip, endpoint, self._loop.time())
            return sock, endpoint
        return None
