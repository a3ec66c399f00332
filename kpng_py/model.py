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
from dataclasses import dataclass, field
from typing import Iterable, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

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


@dataclass(frozen=True, slots=True)
class Frontend:
    """What a client dials: an address, a port and a protocol.

    One frontend has one owner in a node state (see `ServicePortChanges`). Today a
    service port's frontends are its ClusterIPs; node ports, external and
    load-balancer IPs become frontends of the same kind when a backend serves
    them.
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
    # `frontends()`, made on first use (a Sync asks for them several times).
    _frontends: tuple[Frontend, ...] | None = field(default=None, init=False, repr=False,
                                                     compare=False)

    @property
    def protocol(self) -> Protocol:
        return self.name.protocol

    def frontends(self) -> tuple[Frontend, ...]:
        """What clients dial to reach this port: one frontend per ClusterIP,
        in the order of `cluster_ips`."""
        frontends = self._frontends
        if frontends is None:
            frontends = tuple(Frontend(ip, self.port, self.protocol) for ip in self.cluster_ips)
            object.__setattr__(self, "_frontends", frontends)
        return frontends

    def cluster_endpoints(self, family: IPFamily | None = None) -> tuple[Endpoint, ...]:
        """Endpoints ClusterIP traffic may use (Scopes.Internal), optionally of
        one family, in a stable order."""
        return tuple(
            ep
            for ep in self.endpoints
            if ep.internal and (family is None or ep.family == family)
        )


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

    def __len__(self) -> int:
        return len(self.added) + len(self.updated) + len(self.removed)

    def current(self) -> tuple[ServicePort, ...]:
        """The new value of every added or updated service port."""
        return self.added + tuple(new for _, new in self.updated)
