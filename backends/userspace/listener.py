"""What TCP and UDP listeners share: one socket bound to a frontend address
and port, read by the event loop, and the endpoint pickers for new flows."""

from __future__ import annotations

import logging
import socket
from typing import ClassVar

from backends.userspace.context import ProxyContext, Tally
from backends.userspace.picker import EndpointPicker, FrontendPickers
from backends.userspace.sockets import attach_source_filter, detach_filter, listening_socket
from kpng_py.logs import fields
from kpng_py.model import Endpoint, IPAddress

log = logging.getLogger(__name__)


class Listener:
    KIND: ClassVar[socket.SocketKind]

    def __init__(self, ctx: ProxyContext, name: str, address: IPAddress, port: int,
                 pickers: FrontendPickers, tally: Tally) -> None:
        self._ctx = ctx
        self._tally = tally
        self._loop = ctx.loop
        self.name = name
        self.address = address
        self.port = port
        self.pickers = pickers
        self._sock: socket.socket | None = None
        self._filtered = False

    def start(self) -> None:
        sock = self._sock = listening_socket(self.address, self.port, self.KIND)
        self.refresh_filter()
        self._loop.add_reader(sock.fileno(), self._on_readable, sock)
        self._ctx.stats.listeners.inc()

    def picker_for(self, client: IPAddress) -> EndpointPicker:
        return self.pickers.for_client(client)

    def update(self, cluster: tuple[Endpoint, ...], external: tuple[Endpoint, ...] | None,
               affinity_timeout: int) -> set[Endpoint]:
        """New endpoints and affinity setting for new flows; the endpoints
        that went."""
        gone = self.pickers.update(cluster, external, affinity_timeout)
        self.refresh_filter()
        return gone

    def refresh_filter(self) -> None:
        """While clients from outside have no endpoint, the socket drops
        their packets (N8: a timeout, not a reset); clients on the node are
        served. Called again when the node's addresses change."""
        if self._sock is None:
            return
        if not self.pickers.drops_outside:
            if self._filtered:
                detach_filter(self._sock)
                self._filtered = False
            return
        try:
            # A host process dialling this address comes from it, or from
            # an address of the node it bound.
            attach_source_filter(self._sock, self.address.version,
                                 self._ctx.node_addresses.local | {self.address})
        except (OSError, ValueError) as err:
            # Unfiltered, outside clients are still turned away by the proxy
            # (TCP: reset after accept; UDP: dropped).
            self._ctx.stats.error("filter")
            log.error("cannot drop outside clients at the socket", extra=fields(
                listener=self.name, error=str(err)))
            return
        self._filtered = True

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
        return self._sock is not None and self.pickers.expire(now) > 0

    def _on_readable(self, sock: socket.socket) -> None:
        """`sock`, the listening socket, is readable (its reader is removed
        before it is closed)."""
        raise NotImplementedError
