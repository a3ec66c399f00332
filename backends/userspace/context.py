"""What every listener of the proxy shares: settings, metrics, the event loop
and the periodic expiry of per-client state."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from kpng_py.metrics.metrics import Metrics
from kpng_py.metrics.service_counters import ServiceCounts
from kpng_py.model import Endpoint, IPAddress, IPFamily, IPNetwork, format_host_port
from kpng_py.node.nodeport_addresses import LocalAddressSet, NodePortAddresses

# The interface the backend creates (and marks as its own) by default.
DEFAULT_INTERFACE = "kpng-py0"
# The interface alias (IFLA_IFALIAS) that says "this interface is kpng-py's".
MARKER = "kpng-py: ClusterIPs"
# The longest pause between expiry rounds; shorter when the UDP timeout is.
MAX_HOUSEKEEPING_INTERVAL = 1.0


@dataclass(frozen=True)
class ProxyConfig:
    interface: str = DEFAULT_INTERFACE
    # VPP's default flow timeout; longer than most UDP request/response
    # exchanges and DNS retries, short enough to bound the session table.
    udp_idle_timeout: float = 40.0
    tcp_connect_timeout: float = 2.0
    tcp_connect_attempts: int = 3
    # Capacity of each splice pipe (one per TCP direction): the most bytes
    # moved per wake-up of the event loop.
    pipe_size: int = 1 << 20
    # Where node ports and healthCheckNodePorts answer (`--nodeport-addresses`).
    nodeport_addresses: NodePortAddresses = NodePortAddresses()
    # Connections counted per endpoint too (`--endpoint-counters`).
    endpoint_counters: bool = False
    # The pods' addresses (`--cluster-cidr`, kube-proxy's flag): clients in
    # them are served like clients on the node.
    cluster_cidrs: tuple[IPNetwork, ...] = ()


class ProxyStats:
    """The proxy's table sizes and failures, as kpng-py's metrics."""

    def __init__(self, metrics: Metrics) -> None:
        entries = metrics.map_entries
        self.listeners = entries.labels("userspace_listeners")
        self.cluster_ips = entries.labels("userspace_cluster_ips")
        self.tcp_connections = entries.labels("userspace_tcp_connections")
        self.udp_sessions = entries.labels("userspace_udp_sessions")
        self._errors = metrics.dataplane_errors

    def error(self, kind: str) -> None:
        self._errors.labels(kind).inc()


class Tally:
    """What one service port's listeners did with their clients, counted on
    the event loop (kpng_py.metrics.service_counters exports it); per endpoint too
    when asked, for the endpoints the port has."""

    def __init__(self, per_endpoint: bool = False) -> None:
        self.translated = 0  # TCP connections relayed, UDP sessions opened
        self.rejected = 0  # clients refused: no endpoint could be reached
        # Of `translated`, by endpoint ("ip:port"); None: not counted.
        self.endpoints: Counter[str] | None = Counter() if per_endpoint else None

    def sent_to(self, endpoint: Endpoint) -> None:
        self.translated += 1
        if self.endpoints is not None:
            self.endpoints[format_host_port(endpoint.ip, endpoint.port)] += 1

    def keep_only(self, endpoints: Iterable[Endpoint]) -> None:
        """Forget the endpoints the port no longer has (as the eBPF backend
        deletes a gone backend's count)."""
        if self.endpoints:
            kept = {format_host_port(e.ip, e.port) for e in endpoints}
            for gone in self.endpoints.keys() - kept:
                del self.endpoints[gone]

    def counts(self) -> ServiceCounts:
        return ServiceCounts(self.translated, self.rejected)


class Expiring(Protocol):
    def expire(self, now: float) -> bool:
        """Drop state idle past its timeout; False once nothing is left."""


class Closeable(Protocol):
    def close(self) -> None: ...


class Housekeeping:
    """Expires per-client state (UDP sessions, affinity entries) of the
    listeners that have some, so the cost follows the state, not the number
    of services."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self._loop = loop
        self._interval = interval
        self._items: set[Expiring] = set()
        self._task: asyncio.Task | None = None

    def watch(self, item: Expiring) -> None:
        self._items.add(item)

    def start(self) -> None:
        self._task = self._loop.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            now = self._loop.time()
            for item in list(self._items):
                if not item.expire(now):
                    self._items.discard(item)


class NodeAddresses:
    """The node's addresses as the listeners see them (used on the loop only):
    where node ports listen, and which clients are on the node."""

    def __init__(self, flag: NodePortAddresses,
                 cluster_cidrs: tuple[IPNetwork, ...] = ()) -> None:
        self._flag = flag
        self.cluster_cidrs = cluster_cidrs
        self._local: frozenset[IPAddress] = frozenset()
        self._allowed: frozenset[IPAddress] = frozenset()
        # The service addresses on the backend's interface: local too, so a
        # host process dialling an ExternalIP comes from one.
        self.service_addresses: frozenset[IPAddress] = frozenset()

    def set(self, local: LocalAddressSet) -> None:
        self._local = local.addresses
        self._allowed = self._flag.allowed(local)

    def node_port_addresses(self, family: IPFamily) -> list[IPAddress]:
        """Where a node port of `family` listens, in a stable order."""
        return sorted(ip for ip in self._allowed if ip.version == family)

    @property
    def local(self) -> frozenset[IPAddress]:
        """The node's own addresses (not those of the backend's interface)."""
        return self._local

    def is_internal(self, address: IPAddress) -> bool:
        """Whether a client at `address` is served as from inside the cluster
        (N9): a process of the node's network namespace, or a pod when
        `--cluster-cidr` says where pods are (kube-proxy's detect-local-mode
        ClusterCIDR). Without it a pod looks like any client from outside."""
        return (address.is_loopback or address in self._local
                or address in self.service_addresses
                or any(address in cidr for cidr in self.cluster_cidrs))


@dataclass
class ProxyContext:
    loop: asyncio.AbstractEventLoop
    config: ProxyConfig
    stats: ProxyStats
    housekeeping: Housekeeping
    node_addresses: NodeAddresses
    # Established TCP relays: they outlive their listener, so the backend
    # closes them on shutdown.
    connections: set[Closeable] = field(default_factory=set)
