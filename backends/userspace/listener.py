"""What TCP and UDP listeners share: one socket bound to a frontend address
and port, read by the event loop, and the endpoint pickers for new flows."""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import ClassVar

from backends.userspace.context import ProxyContext, Tally
from backends.userspace.picker import EndpointPicker, FrontendPickers
from backends.userspace.sockets import (
    LOOPBACK,
    attach_source_filter,
    detach_filter,
    listening_socket,
)
from kpng_py.model import Endpoint, IPAddress, IPNetwork
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)


class Listener:
    KIND: ClassVar[socket.SocketKind]

    def __init__(self, ctx: ProxyContext, name: str, address: IPAddress, port: int,
                 pickers: FrontendPickers, tally: Tally,
                 source_ranges: tuple[IPNetwork, ...] | None) -> None:
        self._ctx = ctx
        self._tally = tally
        self._loop = ctx.loop
        self.name = name
        self.address = address
        self.port = port
        self.pickers = pickers
        # loadBalancerSourceRanges of an LB IP (ServicePort.source_ranges);
        # None: not filtered.
        self.source_ranges = source_ranges
        self._sock: socket.socket | None = None
        self._filtered = False
        self._allowed: list[IPNetwork] | None = None  # allowed_sources(), as filtered

    def start(self) -> None:
        sock = self._sock = listening_socket(self.address, self.port, self.KIND)
        self.refresh_filter()
        self._loop.add_reader(sock.fileno(), self._on_readable, sock)
        self._ctx.stats.listeners.inc()

    def picker_for(self, client: IPAddress) -> EndpointPicker | None:
        """The picker for a new flow from `client`; None if it may not
        connect (checked here too: the socket may have refused its filter,
        or a client may have come in before it was set)."""
        allowed = self._allowed
        if allowed is not None and not any(client in network for network in allowed):
            return None
        return self.pickers.for_client(client)

    def update(self, cluster: tuple[Endpoint, ...], external: tuple[Endpoint, ...] | None,
               source_ranges: tuple[IPNetwork, ...] | None) -> set[Endpoint]:
        """New endpoints for new flows and who may connect; the endpoints
        that went."""
        gone = self.pickers.update(cluster, external)
        self.source_ranges = source_ranges
        self.refresh_filter()
        return gone

    def allowed_sources(self) -> list[IPNetwork] | None:
        """Who may send to this listener (of its family); None: anyone.

        While clients from outside have no endpoint, only the node and the
        pods of --cluster-cidr (N8: a timeout, not a reset, for the others;
        N9). An LB IP with source ranges admits the ranges, and the node too
        when a range holds one of its addresses, as kube-proxy does (N13);
        both rules apply together."""
        version = self.address.version
        addresses = self._ctx.node_addresses
        # A host process dialling this address comes from it, or from an
        # address of the node it bound.
        node = [n for n in LOOPBACK if n.version == version] + [
            ipaddress.ip_network(ip) for ip in addresses.local | {self.address}
            if ip.version == version]
        internal = node + [c for c in addresses.cluster_cidrs if c.version == version]
        allowed = internal if self.pickers.drops_outside else None
        if self.source_ranges is not None:
            ranges = [r for r in self.source_ranges if r.version == version]
            if any(ip in r for r in ranges for ip in addresses.local):
                ranges += node
            allowed = ranges if allowed is None else _intersection(allowed, ranges)
        return allowed

    def refresh_filter(self) -> None:
        """Filter the socket as `allowed_sources` says (or remove the filter).
        Called again when the node's addresses change."""
        if self._sock is None:
            return
        allowed = self._allowed = self.allowed_sources()
        if allowed is None:
            if self._filtered:
                detach_filter(self._sock)
                self._filtered = False
            return
        try:
            attach_source_filter(self._sock, self.address.version, allowed)
        except (OSError, ValueError) as err:
            # Unfiltered, clients from outside without an endpoint are still
            # turned away by the proxy (TCP: reset after accept; UDP: dropped).
            self._ctx.stats.error("filter")
            log.error("cannot filter clients at the socket", extra=fields(
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

    def _on_readable(self, sock: socket.socket) -> None:
        """`sock`, the listening socket, is readable (its reader is removed
        before it is closed)."""
        raise NotImplementedError


def _intersection(a: list[IPNetwork], b: list[IPNetwork]) -> list[IPNetwork]:
    """The sources in both lists (networks of one family), as networks."""
    # subnet_of takes a network of its own family, which the caller's lists
    # are (filtered by version); their type is the union of both families.
    both = {x for x in a for y in b if x.subnet_of(y)}  # type: ignore[arg-type]
    both |= {y for y in b for x in a if y.subnet_of(x)}  # type: ignore[arg-type]
    return sorted(both)
