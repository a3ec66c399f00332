"""Endpoint choice for one listener (one ClusterIP:port, one family):
Maglev consistent hashing on the client's address and port, with
sessionAffinity ClientIP on top.

The Maglev table is built lazily, on the first new flow after the endpoints
changed: a full sync of many services costs nothing here, and services that
see no traffic never build one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable

from backends.userspace.maglev import MaglevTable, table_size
from kpng_py.logs import fields
from kpng_py.model import Endpoint, IPAddress

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


def client_key(address: IPAddress, port: int) -> bytes:
    """What Maglev hashes: the client's packed address and port."""
    return address.packed + port.to_bytes(2, "big")


class EndpointPicker:
    """Chooses endpoints for new flows to one listener."""

    def __init__(self, name: str, endpoints: Iterable[Endpoint], affinity_timeout: int) -> None:
        self.name = name
        self.endpoints: tuple[Endpoint, ...] = ()
        self._table: MaglevTable[Endpoint] | None = None
        self._table_size = 0
        self.affinity: AffinityTable | None = None
        self.update(endpoints, affinity_timeout)

    def update(self, endpoints: Iterable[Endpoint], affinity_timeout: int) -> set[Endpoint]:
        """Take new endpoints and affinity setting; returns the endpoints that went."""
        endpoints = tuple(endpoints)
        gone: set[Endpoint] = set()
        if endpoints != self.endpoints:
            gone = set(self.endpoints).difference(endpoints)
            self.endpoints = endpoints
            self._table = None
        if not affinity_timeout:
            self.affinity = None
        elif self.affinity is None or self.affinity.timeout != affinity_timeout:
            self.affinity = AffinityTable(affinity_timeout)
        elif gone:
            self.affinity.forget_endpoints(gone)
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
        best first: the client's affine endpoint if it has a live one, then
        Maglev's order for the client's address and port."""
        if not self.endpoints:
            return []
        chosen: list[Endpoint] = []
        if self.affinity is not None:
            affine = self.affinity.get(address, now)
            if affine is not None:
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
        if self.affinity is not None:
            self.affinity.remember(address, endpoint, now)

    def expire(self, now: float) -> int:
        """Drop expired affinity entries; returns how many remain."""
        if self.affinity is None:
            return 0
        self.affinity.expire(now)
        return len(self.affinity)


class FrontendPickers:
    """Endpoint choice for one listener, by where the client is.

    A ClusterIP serves every client from the cluster endpoints (Internal
    scope). A node port, ExternalIP or load-balancer IP serves clients on the
    node the same way (N9: "exactly like a ClusterIP"), and clients from
    outside from the External-scope endpoints (with eTP=Local the brain
    leaves only local ones there). A userspace proxy sees no more of the
    client than its address: `is_local` says whether it is the node's.
    """

    def __init__(self, name: str, cluster: tuple[Endpoint, ...],
                 external: tuple[Endpoint, ...] | None, affinity_timeout: int,
                 is_local: Callable[[IPAddress], bool]) -> None:
        self.inside = EndpointPicker(name, cluster, affinity_timeout)
        # None for a ClusterIP: everyone is served from the cluster endpoints.
        self.outside = (None if external is None
                        else EndpointPicker(f"{name} (external)", external, affinity_timeout))
        self._is_local = is_local

    @property
    def drops_outside(self) -> bool:
        """Clients from outside have no endpoint (eTP=Local, none on this
        node): their packets are dropped (N8), not refused."""
        return self.outside is not None and not self.outside.endpoints

    @property
    def has_affinity(self) -> bool:
        return self.inside.affinity is not None

    def for_client(self, address: IPAddress) -> EndpointPicker:
        if self.outside is None or self._is_local(address):
            return self.inside
        return self.outside

    def update(self, cluster: tuple[Endpoint, ...], external: tuple[Endpoint, ...] | None,
               affinity_timeout: int) -> set[Endpoint]:
        """New endpoints and affinity setting; the endpoints that went from
        either side."""
        gone = self.inside.update(cluster, affinity_timeout)
        if self.outside is not None and external is not None:
            gone |= self.outside.update(external, affinity_timeout)
        return gone

    def expire(self, now: float) -> int:
        return self.inside.expire(now) + (0 if self.outside is None else self.outside.expire(now))
