"""Endpoint choice for one listener (one ClusterIP:port, one family):
Maglev consistent hashing on the client's address and port, with
sessionAffinity ClientIP on top, shared by every listener of the service
port.

The Maglev table is built lazily, on the first new flow after the endpoints
changed: a full sync of many services costs nothing here, and services that
see no traffic never build one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable

from backends.userspace.context import Expiring
from backends.userspace.maglev import MaglevTable, table_size
from kpng_py.model import Endpoint, IPAddress
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)


@dataclass
class _Affinity:
    endpoint: Endpoint
    expires_at: float


class AffinityTable:
    """sessionAffinity ClientIP: client IP -> endpoint, as kube-proxy keeps it.

    A client's entry is refreshed each time it starts a flow (a TCP connection
    or a UDP session, as iptables' `recent` match does on new connections) and
    forgotten after `timeout` seconds without one, or when its endpoint goes.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._entries: dict[IPAddress, _Affinity] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, client: IPAddress, now: float) -> Endpoint | None:
        entry = self._entries.get(client)
        if entry is None:
            return None
        if entry.expires_at <= now:
            del self._entries[client]
            return None
        return entry.endpoint

    def remember(self, client: IPAddress, endpoint: Endpoint, now: float) -> None:
        self._entries[client] = _Affinity(endpoint, now + self.timeout)

    def forget_endpoints(self, gone: set[Endpoint]) -> None:
        for client in [c for c, e in self._entries.items() if e.endpoint in gone]:
            del self._entries[client]

    def expire(self, now: float) -> None:
        for client in [c for c, e in self._entries.items() if e.expires_at <= now]:
            del self._entries[client]


class PortAffinity:
    """sessionAffinity ClientIP of one service port, shared by all its
    listeners: kube-proxy keeps one list per service port and endpoint, so a
    client sent to an endpoint through the ClusterIP stays with it through
    the node port, an ExternalIP or an LB IP of the same port (N15), and the
    other way round. `table` is None while the port has no affinity.

    `watch(self)` is called when an entry is remembered, so that expiry
    (`Housekeeping`) runs only while the port has entries.
    """

    def __init__(self, watch: Callable[[Expiring], None]) -> None:
        self._watch = watch
        self.table: AffinityTable | None = None

    def update(self, timeout: int, gone: set[Endpoint]) -> None:
        """The port's timeout now (0: no affinity) and the endpoints it lost."""
        if not timeout:
            self.table = None
        elif self.table is None or self.table.timeout != timeout:
            self.table = AffinityTable(timeout)
        elif gone:
            self.table.forget_endpoints(gone)

    def remember(self, client: IPAddress, endpoint: Endpoint, now: float) -> None:
        if self.table is not None:
            self.table.remember(client, endpoint, now)
            self._watch(self)

    def expire(self, now: float) -> bool:
        """Drop expired entries; False once none is left."""
        if self.table is None:
            return False
        self.table.expire(now)
        return len(self.table) > 0


def client_key(address: IPAddress, port: int) -> bytes:
    """What Maglev hashes: the client's packed address and port."""
    return address.packed + port.to_bytes(2, "big")


class EndpointPicker:
    """Chooses endpoints for new flows to one listener, from one side's
    endpoints (see FrontendPickers)."""

    def __init__(self, name: str, endpoints: Iterable[Endpoint], affinity: PortAffinity) -> None:
        self.name = name
        self.affinity = affinity
        self.endpoints: tuple[Endpoint, ...] = ()
        self._members: frozenset[Endpoint] = frozenset()
        self._table: MaglevTable[Endpoint] | None = None
        self._table_size = 0
        self.update(endpoints)

    def update(self, endpoints: Iterable[Endpoint]) -> set[Endpoint]:
        """Take new endpoints; returns the endpoints that went."""
        endpoints = tuple(endpoints)
        gone: set[Endpoint] = set()
        if endpoints != self.endpoints:
            gone = set(self.endpoints).difference(endpoints)
            self.endpoints = endpoints
            self._members = frozenset(endpoints)
            self._table = None
        return gone

    def _maglev(self) -> MaglevTable[Endpoint]:
        if self._table is None:
            self._table_size = table_size(len(self.endpoints), self._table_size)
            self._table = MaglevTable(self.endpoints, self._table_size)
            if log.isEnabledFor(logging.DEBUG):  # counting walks every slot
                counts = self._table.slot_counts()
                log.debug("maglev table built", extra=fields(
                    listener=self.name, endpoints=len(self.endpoints), size=self._table_size,
                    min_slots=min(counts), max_slots=max(counts)))
        return self._table

    def candidates(self, address: IPAddress, port: int, now: float, limit: int) -> list[Endpoint]:
        """Up to `limit` distinct endpoints for a new flow from address:port,
        best first: the client's affine endpoint if it has a live one among
        this side's endpoints (from outside with eTP=Local, an affinity to a
        remote endpoint does not apply), then Maglev's order for the client's
        address and port."""
        if not self.endpoints:
            return []
        chosen: list[Endpoint] = []
        table = self.affinity.table
        if table is not None:
            affine = table.get(address, now)
            if affine is not None and affine in self._members:
                chosen.append(affine)
        if len(chosen) >= limit:  # the affine endpoint is all that was asked for
            return chosen
        for endpoint in self._maglev().preference(client_key(address, port)):
            if endpoint not in chosen:
                chosen.append(endpoint)
                if len(chosen) == limit:
                    break
        return chosen

    def served(self, address: IPAddress, endpoint: Endpoint, now: float) -> None:
        """A flow from `address` now runs to `endpoint`: refresh its affinity."""
        self.affinity.remember(address, endpoint, now)


class FrontendPickers:
    """Endpoint choice for one listener, by where the client is.

    A ClusterIP serves every client from the cluster endpoints (Internal
    scope). A node port, ExternalIP or load-balancer IP serves clients on the
    node the same way (N9: "exactly like a ClusterIP"), and clients from
    outside from the external endpoints (`ServicePort.external_endpoints`:
    with eTP=Local only local ones). A userspace proxy sees no more of the
    client than its address: `is_internal` says whether it is the node's
    (or a pod's, with --cluster-cidr).
    """

    def __init__(self, name: str, cluster: tuple[Endpoint, ...],
                 external: tuple[Endpoint, ...] | None, affinity: PortAffinity,
                 is_internal: Callable[[IPAddress], bool]) -> None:
        self.inside = EndpointPicker(name, cluster, affinity)
        # None for a ClusterIP: everyone is served from the cluster endpoints.
        self.outside = (None if external is None
                        else EndpointPicker(f"{name} (external)", external, affinity))
        self._is_internal = is_internal

    @property
    def drops_outside(self) -> bool:
        """Clients from outside have no endpoint (eTP=Local, none on this
        node): their packets are dropped (N8), not refused."""
        return self.outside is not None and not self.outside.endpoints

    def for_client(self, address: IPAddress) -> EndpointPicker:
        if self.outside is None or self._is_internal(address):
            return self.inside
        return self.outside

    def update(self, cluster: tuple[Endpoint, ...], external: tuple[Endpoint, ...] | None
               ) -> set[Endpoint]:
        """New endpoints; the endpoints that went from either side."""
        gone = self.inside.update(cluster)
        if self.outside is not None and external is not None:
            gone |= self.outside.update(external)
        return gone
