"""What TCP and UDP listeners share: one socket bound to ClusterIP:port, read
by the event loop, and the endpoint picker for new flows."""

from __future__ import annotations

import socket
from typing import ClassVar

from backends.userspace.context import ProxyContext
from backends.userspace.picker import EndpointPicker
from backends.userspace.sockets import listening_socket
from kpng_py.model import Endpoint, IPAddress


class Listener:
    KIND: ClassVar[socket.SocketKind]

    def __init__(self, ctx: ProxyContext, name: str, address: IPAddress, port: int,
                 picker: EndpointPicker) -> None:
        self._ctx = ctx
        self._loop = ctx.loop
        self.name = name
        self.address = address
        self.port = port
        self.picker = picker
        self._sock: socket.socket | None = None

    def start(self) -> None:
        sock = self._sock = listening_socket(self.address, self.port, self.KIND)
        self._loop.add_reader(sock.fileno(), self._on_readable, sock)
        self._ctx.stats.listeners.inc()

    def update(self, endpoints: tuple[Endpoint, ...], affinity_timeout: int) -> None:
        """New endpoints and affinity setting for new flows."""
        self.picker.update(endpoints, affinity_timeout)

    def close(self) -> None:
        """Stop listening."""
        if self._sock is None:
            return
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._sock = None
        self._ctx.stats.listeners.dec()

    def expire(self, now: float) -> bool:
        """Drop expired per-client state; False once there is none, or once
        closed (no new flow can use a closed listener's affinity)."""
        return self._sock is not None and self.picker.expire(now) > 0

    def _on_readable(self, sock: socket.socket) -> None:
        """`sock`, the listening socket, is readable (its reader is removed
        before it is closed)."""
        raise NotImplementedError
