"""The state model every backend programs: one ServicePort per (service, port,
protocol), with its resolved endpoints.

These are the Python counterparts of kube-proxy's ServicePortName and
BaseServiceInfo (as carried by KPNG's localv1 Service): everything a ClusterIP,
NodePort, ExternalIP or LoadBalancer dataplane needs is here, so backends that
grow new service types need no model change. All values are frozen.

A full sync holds one `ServicePort` per port, so the classes have slots (no
per-object dict); a port's endpoints are one bytes value (`Endpoints`), not
an object each: an `Endpoint` is made when one is read.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass, field, replace
from typing import Callable, Container, Iterable, Iterator, Sequence, Union, overload

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
    """One endpoint address for one service port, with the brain's view flags.

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


# An address as `Endpoints` packs it: its version (one byte), then 16 bytes
# in network order, an IPv4 address in its IPv4-mapped form (the state model
# refuses that form for IPv6 addresses, so no two addresses pack alike).
PACKED_ADDRESS_SIZE = 17
V4_MAPPED_PREFIX = bytes(10) + b"\xff\xff"
_V4_VERSION, _V6_VERSION = b"\x04", b"\x06"
_V4_START = 1 + len(V4_MAPPED_PREFIX)
# An endpoint: its packed address, its port (network order), its flags.
_ENDPOINT = struct.Struct(f"!{PACKED_ADDRESS_SIZE}sHB")
ENDPOINT_SIZE = _ENDPOINT.size
# Where an endpoint's target (address bytes and port) and its flags are.
_TARGET_START, _FLAGS_AT = 1, PACKED_ADDRESS_SIZE + 2
ENDPOINT_LOCAL, ENDPOINT_INTERNAL, ENDPOINT_EXTERNAL = 1, 2, 4


def packed_address(ip: IPAddress) -> bytes:
    """`ip` as `Endpoints` packs it (PACKED_ADDRESS_SIZE bytes)."""
    if ip.version == 4:
        return packed_v4_address(ip.packed)
    return _V6_VERSION + ip.packed


def packed_v4_address(packed: bytes) -> bytes:
    """The 4 bytes of an IPv4 address (inet_pton's) as `packed_address` packs it."""
    return _V4_VERSION + V4_MAPPED_PREFIX + packed


def unpacked_address(packed: bytes) -> IPAddress:
    """The address of `packed_address`'s bytes."""
    if packed[0] == 4:
        return ipaddress.IPv4Address(packed[_V4_START:PACKED_ADDRESS_SIZE])
    return ipaddress.IPv6Address(packed[1:PACKED_ADDRESS_SIZE])


def endpoint_flags(local: bool, internal: bool, external: bool) -> int:
    return ((ENDPOINT_LOCAL if local else 0) | (ENDPOINT_INTERNAL if internal else 0)
            | (ENDPOINT_EXTERNAL if external else 0))


_FLAG_BYTES = tuple(bytes((flags,)) for flags in range(8))


def endpoint_flag_byte(local: bool, internal: bool, external: bool) -> bytes:
    """The last byte of a packed endpoint: an `Endpoints` entry is its packed
    address, its port (2 bytes, network order) and this."""
    return _FLAG_BYTES[endpoint_flags(local, internal, external)]


class Endpoints(Sequence[Endpoint]):
    """A service port's endpoints, packed in one bytes value (ENDPOINT_SIZE
    bytes each: packed address, port, flags): a full sync holds hundreds of
    thousands, which as objects would cost ten times the memory. Reading one
    makes its `Endpoint`; two values are equal when their bytes are, and a
    tuple of the same `Endpoint`s is equal to them too. The state model
    packs them in `Endpoint.sort_key` order, each (address, port) once."""

    __slots__ = ("packed",)
    packed: bytes

    def __init__(self, packed: bytes = b"") -> None:
        if len(packed) % ENDPOINT_SIZE:
            raise ValueError(f"{len(packed)} bytes are not whole endpoints of "
                             f"{ENDPOINT_SIZE} bytes")
        object.__setattr__(self, "packed", bytes(packed))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Endpoints are a value: make new ones instead of setting {name}")

    @classmethod
    def of(cls, endpoints: Iterable[Endpoint]) -> Endpoints:
        """`endpoints`, in their order."""
        if isinstance(endpoints, Endpoints):
            return endpoints
        return cls(b"".join(
            _ENDPOINT.pack(packed_address(ep.ip), ep.port,
                           endpoint_flags(ep.local, ep.internal, ep.external))
            for ep in endpoints))

    def __len__(self) -> int:
        return len(self.packed) // ENDPOINT_SIZE

    def __iter__(self) -> Iterator[Endpoint]:
        for address, port, flags in _ENDPOINT.iter_unpack(self.packed):
            yield _endpoint(address, port, flags)

    @overload
    def __getitem__(self, index: int) -> Endpoint: ...

    @overload
    def __getitem__(self, index: slice) -> Endpoints: ...

    def __getitem__(self, index: int | slice) -> Endpoint | Endpoints:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return Endpoints.of(tuple(self)[index])
            return Endpoints(self.packed[start * ENDPOINT_SIZE:stop * ENDPOINT_SIZE])
        count = len(self)
        if not -count <= index < count:
            raise IndexError(f"endpoint {index} of {count}")
        at = (index % count) * ENDPOINT_SIZE
        return _endpoint(*_ENDPOINT.unpack_from(self.packed, at))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Endpoints):
            return self.packed == other.packed
        if isinstance(other, (tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.packed)

    def __repr__(self) -> str:
        return f"Endpoints({list(self)!r})"

    def __reduce__(self) -> tuple[type[Endpoints], tuple[bytes]]:
        return Endpoints, (self.packed,)

    def targets(self, version: int, flag: int = ENDPOINT_INTERNAL) -> tuple[bytes, ...]:
        """The address (16 bytes) and port (2, network order) of each endpoint
        of an IP version with `flag`, packed, in order: what a dataplane
        writes, without an object per endpoint."""
        packed, first = self.packed, _V4_VERSION[0] if version == 4 else _V6_VERSION[0]
        return tuple(packed[at + _TARGET_START:at + _FLAGS_AT]
                     for at in range(0, len(packed), ENDPOINT_SIZE)
                     if packed[at] == first and packed[at + _FLAGS_AT] & flag)


def _endpoint(address: bytes, port: int, flags: int) -> Endpoint:
    return Endpoint(unpacked_address(address), port, bool(flags & ENDPOINT_LOCAL),
                    bool(flags & ENDPOINT_INTERNAL), bool(flags & ENDPOINT_EXTERNAL))


_NO_ENDPOINTS = Endpoints()


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
    # Given as any iterable of Endpoint, kept as Endpoints.
    endpoints: Endpoints = _NO_ENDPOINTS
    # The families whose node addresses answer on `node_port`: those of the
    # ClusterIPs of a NodePort or LoadBalancer service with a node port;
    # none otherwise.
    node_port_families: tuple[IPFamily, ...] = ()
    # `frontends()`, made on first use (a Sync asks for them several times).
    _frontends: tuple[Frontend, ...] | None = field(default=None, init=False, repr=False,
                                                     compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.endpoints, Endpoints):
            object.__setattr__(self, "endpoints", Endpoints.of(self.endpoints))

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

    def external_endpoints(self, family: IPFamily | None = None) -> tuple[Endpoint, ...]:
        """Endpoints traffic from outside the node may use (Scopes.External),
        optionally of one family, in a stable order: with externalTrafficPolicy
        Local only this node's (the brain already leaves out the others;
        checked again so that a brain that does not cannot send outside
        traffic to another node)."""
        return tuple(
            ep
            for ep in self.endpoints
            if ep.external and (ep.local or not self.external_traffic_local)
            and (family is None or ep.family == family)
        )

    def outside_families(self) -> tuple[IPFamily, ...]:
        """The families this port serves to clients outside the node: those of
        its ExternalIPs, load-balancer IPs and node port; none for a port
        with ClusterIPs only."""
        served = {family_of(ip) for ip in (*self.external_ips, *self.load_balancer_ips)}
        served.update(self.node_port_families)
        return tuple(family for family in IPFamily if family in served)

    def drops_outside(self, family: IPFamily) -> bool:
        """What a client from outside gets at a frontend of `family` that has
        no external endpoint of that family: True, its packets are dropped
        (externalTrafficPolicy Local with endpoints on other nodes only: the
        client times out, and a load balancer's health check moves on to
        another node); False, it is refused at once (no endpoint of that
        family at all)."""
        return self.external_traffic_local and any(ep.family == family for ep in self.endpoints)

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


def sorted_endpoints(endpoints: Iterable[Endpoint]) -> Endpoints:
    """Endpoints in the stable order of a ServicePort."""
    return Endpoints.of(sorted(endpoints, key=Endpoint.sort_key))


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
