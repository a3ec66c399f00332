"""The state model every backend programs: one ServicePort per (service, port,
protocol), with its resolved endpoints.

These are the Python counterparts of kube-proxy's ServicePortName and
BaseServiceInfo (as carried by KPNG's localv1 Service): everything a ClusterIP,
NodePort, ExternalIP or LoadBalancer dataplane needs is here, so backends that
grow new service types need no model change. All values are frozen.

A full sync holds one `Endpoint` per endpoint and port and one `ServicePort`
per port, so the classes have slots (no per-object dict); the state model
shares what many of them hold (an endpoint's address objects across the
ports it serves, the values many endpoints have in common).
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field, replace
from typing import Callable, Container, Iterable, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

MAX_PORT = 65535

# Kubernetes' default for sessionAffinityConfig.clientIP.timeoutSeconds, and
# its cap (one day).
DEFAULT_AFFINITY_TIMEOUT_SECONDS = 10800
MAX_AFFINITY_TIMEOUT_SECONDS = 86400


class Protocol(enum.Enum):
    """The protocols a backend can program (SCTP and unknown ones are skipped)."""

    TCP = "TCP"
    UDP = "UDP"

    # Members are singletons compared by identity: hashing by identity is
    # the same relation, in C (names and frontends hash their protocol).
    __hash__ = object.__hash__


class IPFamily(enum.IntEnum):
    V4 = 4
    V6 = 6


def family_of(ip: IPAddress) -> IPFamily:
    return IPFamily(ip.version)


def format_host_port(ip: IPAddress, port: int) -> str:
    """`10.1.2.3:80` or `[fd00::3]:80`."""
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


@dataclass(frozen=True, slots=True)
class ServicePortName:
    """kube-proxy's ServicePortName: `namespace/name:port` plus the protocol.

    As in kube-proxy, an unnamed port (a single-port service) prints as
    `namespace/name`.
    """

    namespace: str
    name: str
    port: str
    protocol: Protocol

    def __str__(self) -> str:
        suffix = f":{self.port}" if self.port else ""
        return f"{self.namespace}/{self.name}{suffix}"

    def sort_key(self) -> tuple[str, str]:
        """Order of listings: by printed name, then protocol."""
        return (str(self), self.protocol.value)


class FrontendKind(enum.Enum):
    """Why a service port has a frontend (the list its address came from)."""

    CLUSTER_IP = "ClusterIP"
    EXTERNAL_IP = "ExternalIP"
    LOAD_BALANCER_IP = "LoadBalancerIP"
    NODE_PORT = "NodePort"


# The address of a node-port frontend: the node port on every allowed node
# address of that family (`--nodeport-addresses`), as a listening socket
# would say it.
NODE_PORT_ADDRESS: dict[IPFamily, IPAddress] = {
    IPFamily.V4: ipaddress.IPv4Address("0.0.0.0"),
    IPFamily.V6: ipaddress.IPv6Address("::"),
}


@dataclass(frozen=True, slots=True)
class Frontend:
    """What a client dials: an address, a port and a protocol.

    One frontend has one owner in a node state (see `ServicePortChanges`). A
    service port's frontends are its ClusterIPs, ExternalIPs and
    load-balancer IPs at its port, and its node port at the unspecified
    address of each of its families (`is_node_port`), which stands for the
    node's allowed addresses: two services on one node port conflict like two
    on one ClusterIP. (The state model refuses unspecified ExternalIPs and LB
    IPs, so no other frontend has that address.)
    """

    ip: IPAddress
    port: int
    protocol: Protocol
    # Frontends are keys of the state model's and the backends' dicts, and an
    # address hashes in Python code: the hash is computed once.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.ip, self.port, self.protocol)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Frontend], tuple[IPAddress, int, Protocol]]:
        # Made anew where it is unpickled: string hashes differ per process.
        return Frontend, (self.ip, self.port, self.protocol)

    def __str__(self) -> str:
        return f"{format_host_port(self.ip, self.port)}/{self.protocol.value}"

    @property
    def is_node_port(self) -> bool:
        return self.ip.is_unspecified


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One backend address for one service port, with the brain's view flags.

    `internal`/`external` are KPNG's EndpointScopes: ClusterIP traffic may use
    only endpoints with `internal`; NodePort/LoadBalancer traffic only those
    with `external`.
    """

    ip: IPAddress
    port: int
    local: bool = False
    internal: bool = True
    external: bool = True

    @property
    def family(self) -> IPFamily:
        return family_of(self.ip)

    def sort_key(self) -> tuple[int, int, int]:
        return (self.ip.version, int(self.ip), self.port)

    def __str__(self) -> str:
        return format_host_port(self.ip, self.port)


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One service port as a backend programs it (kube-proxy's BaseServiceInfo
    plus the endpoints resolved for this port)."""

    name: ServicePortName
    type: str
    cluster_ips: tuple[IPAddress, ...]
    port: int
    target_port: int = 0
    target_port_name: str = ""
    node_port: int = 0
    external_ips: tuple[IPAddress, ...] = ()
    load_balancer_ips: tuple[IPAddress, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    health_check_node_port: int = 0
    # 0 means no session affinity; otherwise ClientIP affinity with this timeout.
    affinity_timeout_seconds: int = 0
    internal_traffic_local: bool = False
    external_traffic_local: bool = False
    endpoints: tuple[Endpoint, ...] = ()
    # The families whose node addresses answer on `node_port`: those of the
    # ClusterIPs of a NodePort or LoadBalancer service with a node port;
    # none otherwise.
    node_port_families: tuple[IPFamily, ...] = ()
    # `frontends()`, made on first use (a Sync asks for them several times).
    _frontends: tuple[Frontend, ...] | None = field(default=None, init=False, repr=False,
                                                     compare=False)

    @property
    def protocol(self) -> Protocol:
        return self.name.protocol

    def frontends(self) -> tuple[Frontend, ...]:
        """What clients dial to reach this port: one frontend per ClusterIP,
        ExternalIP and load-balancer IP (in that order, each address once),
        then one node-port frontend per family of `node_port_families`."""
        frontends = self._frontends
        if frontends is None:
            frontends = tuple(dict.fromkeys(
                Frontend(ip, self.port, self.protocol)
                for ip in (*self.cluster_ips, *self.external_ips, *self.load_balancer_ips)))
            frontends += tuple(Frontend(NODE_PORT_ADDRESS[family], self.node_port, self.protocol)
                               for family in self.node_port_families)
            object.__setattr__(self, "_frontends", frontends)
        return frontends

    def frontend_kind(self, frontend: Frontend) -> FrontendKind:
        """Which of this port's lists `frontend` comes from (the first, for
        an address listed twice)."""
        if frontend.is_node_port:
            return FrontendKind.NODE_PORT
        if frontend.ip in self.cluster_ips:
            return FrontendKind.CLUSTER_IP
        if frontend.ip in self.external_ips:
            return FrontendKind.EXTERNAL_IP
        return FrontendKind.LOAD_BALANCER_IP

    def only_frontends(self, owned: Container[Frontend]) -> ServicePort:
        """This port with only the frontends in `owned` (the others belong to
        other service ports)."""
        def kept(ips: tuple[IPAddress, ...]) -> tuple[IPAddress, ...]:
            return tuple(ip for ip in ips if Frontend(ip, self.port, self.protocol) in owned)

        return replace(
            self, cluster_ips=kept(self.cluster_ips), external_ips=kept(self.external_ips),
            load_balancer_ips=kept(self.load_balancer_ips),
            node_port_families=tuple(
                family for family in self.node_port_families
                if Frontend(NODE_PORT_ADDRESS[family], self.node_port, self.protocol) in owned))

    def cluster_endpoints(self, family: IPFamily | None = None) -> tuple[Endpoint, ...]:
        """Endpoints ClusterIP traffic may use (Scopes.Internal), optionally of
        one family, in a stable order."""
        return tuple(
            ep
            for ep in self.endpoints
            if ep.internal and (family is None or ep.family == family)
        )

    def source_ranges(self, on_bad: Callable[[str], None]) -> tuple[IPNetwork, ...] | None:
        """Who may reach this port's load-balancer IPs (loadBalancerSourceRanges),
        as every backend filters it: None when anyone may; else the ranges that
        are CIDRs, `on_bad(text)` called for each that is not. A bad entry
        allows nothing (only bad ones: the LB IPs answer no one), and a family
        without a range of its own allows no one either: filtering fails closed.
        NodePorts and ExternalIPs are never filtered (N13)."""
        if not self.load_balancer_source_ranges:
            return None
        ranges = []
        for text in self.load_balancer_source_ranges:
            try:
                ranges.append(ipaddress.ip_network(text.strip(), strict=False))
            except ValueError:
                on_bad(text)
        return tuple(ranges)


def sorted_endpoints(endpoints: Iterable[Endpoint]) -> tuple[Endpoint, ...]:
    """Endpoints in the stable order of a ServicePort."""
    return tuple(sorted(endpoints, key=Endpoint.sort_key))


@dataclass(frozen=True, slots=True)
class ServicePortChanges:
    """What one applied Sync changed, per ServicePortName.

    `added` and `updated` carry the new ServicePort, `removed` the last one the
    backend saw. `full` is set when the backend must reconcile its whole
    dataplane with `added` (first sync, or recovery after a failed apply):
    anything programmed that is not in `added` must go.

    No two service ports of one node state share a `Frontend`: the state model
    gives each frontend to one owner (the service port that claimed it first)
    and publishes every other claimant without it, or not at all when it owns
    none (docs/architecture.md, "Frontend ownership"). Backends rely on it.
    """

    added: tuple[ServicePort, ...] = ()
    updated: tuple[tuple[ServicePort, ServicePort], ...] = ()
    removed: tuple[ServicePort, ...] = ()
    full: bool = False
    service_changes: int = 0
    endpoint_changes: int = 0
    ops: int = 0  # the Sets and Deletes of the change set that made it

    def __len__(self) -> int:
        return len(self.added) + len(self.updated) + len(self.removed)

    def current(self) -> tuple[ServicePort, ...]:
        """The new value of every added or updated service port."""
        return self.added + tuple(new for _, new in self.updated)
