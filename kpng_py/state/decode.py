"""localv1 bytes -> validated, decoded values.

Decoding happens once per distinct value (the state store compares raw bytes
first), so each problem is reported once per version of the object. A value
that cannot be decoded at all, or is over a limit, returns None and the caller
keeps the previous version in force. Addresses come out canonical and
ordinary (`address_problem`), so that two addresses are one dataplane key
exactly when they are equal.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from google.protobuf.message import DecodeError

from kpng_py.api import localv1
from kpng_py.model import (
    DEFAULT_AFFINITY_TIMEOUT_SECONDS,
    MAX_AFFINITY_TIMEOUT_SECONDS,
    MAX_PORT,
    PACKED_ADDRESS_SIZE,
    IPAddress,
    Protocol,
    ServicePort,
    ServicePortName,
    family_of,
    packed_address,
    packed_v4_address,
    unpacked_address,
)
from kpng_py.state.limits import MAX_ENDPOINT_IPS, Limits
from kpng_py.state.skips import SkipReason, Skips

_PROTOCOLS = {localv1.TCP: Protocol.TCP, localv1.UDP: Protocol.UDP}
# The service types whose node port is served (kube-proxy's: the API server
# allocates node ports only to these).
_NODE_PORT_TYPES = frozenset({"NodePort", "LoadBalancer"})


@dataclass(frozen=True)
class DecodedService:
    """A decoded Service: its programmable ports (without endpoints yet)."""

    namespace: str
    name: str
    ports: tuple[ServicePort, ...]
    internal_traffic_local: bool
    external_traffic_local: bool


class EndpointTail(NamedTuple):
    """What an Endpoint's fields after its IPs decode to: the same for the
    endpoints of a service (often of a node), so one object shared by all of
    them (EndpointTails)."""

    port_overrides: tuple[tuple[str, int], ...]
    local: bool
    # None when the brain sent no Scopes (older brains, hand-written streams);
    # the state model then derives them as KPNG's brain does.
    scopes: tuple[bool, bool] | None


class DecodedEndpoint(NamedTuple):
    """A decoded Endpoint of one service. Its addresses are packed
    (`packed_address`, PACKED_ADDRESS_SIZE bytes each), its tail shared with
    the service's other endpoints."""

    addresses: bytes
    tail: EndpointTail
    # The bytes it was decoded from, which a new value is compared with
    # before it is decoded.
    raw: bytes = b""

    @property
    def ips(self) -> tuple[IPAddress, ...]:
        return tuple(unpacked_address(self.addresses[at:at + PACKED_ADDRESS_SIZE])
                     for at in range(0, len(self.addresses), PACKED_ADDRESS_SIZE))

    @property
    def address_count(self) -> int:
        return len(self.addresses) // PACKED_ADDRESS_SIZE

    @property
    def port_overrides(self) -> tuple[tuple[str, int], ...]:
        return self.tail.port_overrides

    @property
    def local(self) -> bool:
        return self.tail.local

    @property
    def scopes(self) -> tuple[bool, bool] | None:
        return self.tail.scopes

    def override(self, name: str) -> int | None:
        for n, port in self.tail.port_overrides:
            if n == name:
                return port
        return None


# Decoded scopes, one shared pair per value: _SCOPES[internal][external].
_SCOPES = (((False, False), (False, True)), ((True, False), (True, True)))


class EndpointTails:
    """The decoded tails of Endpoint values, by their bytes. Endpoints of a
    service (often of a node) differ in their addresses only, which the
    brain encodes first: the rest of their bytes is decoded once, and its
    values are one object shared by all of them. At most `limit` distinct
    tails of at most `longest` bytes each are remembered (a brain's values
    cost the state no more than their own size); past that it starts
    afresh."""

    def __init__(self, limit: int = 4096, longest: int = 256) -> None:
        self._tails: dict[bytes, EndpointTail] = {}
        self._limit = limit
        self.longest = longest

    def get(self, tail: bytes) -> EndpointTail | None:
        return self._tails.get(tail)

    def put(self, tail: bytes, value: EndpointTail) -> None:
        if len(self._tails) >= self._limit:
            self._tails.clear()
        self._tails[tail] = value


# The tag of Endpoint.IPs (field 2, length-delimited).
_IPS_TAG = 0x12


def _ips_end(data: bytes) -> int | None:
    """Where the short IPs field that `data` starts with ends, as the brain
    encodes an endpoint; None when it starts otherwise."""
    if len(data) < 2 or data[0] != _IPS_TAG or data[1] >= 0x80 or 2 + data[1] > len(data):
        return None
    return 2 + data[1]


def _split_at_ips(data: bytes) -> tuple[bytes, bytes] | None:
    """(the IPSet's bytes, the bytes after it) when `data` starts with a
    short IPs field; else None."""
    end = _ips_end(data)
    return None if end is None else (data[2:end], data[end:])


def split_service_path(path: str) -> tuple[str, str] | None:
    parts = path.split("/")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


def split_endpoint_path(path: str) -> tuple[str, str] | None:
    """`ns/svc/key` -> (`ns/svc`, `key`), none of the three empty; keys are
    opaque and may hold '/'."""
    first = path.find("/")
    second = path.find("/", first + 1) if first > 0 else -1
    if second <= first + 1 or second + 1 == len(path):
        return None
    return path[:second], path[second + 1:]


_FAMILIES: dict[int, tuple[socket.AddressFamily, Callable[[bytes], IPAddress]]] = {
    4: (socket.AF_INET, ipaddress.IPv4Address), 6: (socket.AF_INET6, ipaddress.IPv6Address)}


@dataclass(frozen=True)
class AddressProblem:
    """Why an address may not be a frontend or an endpoint."""

    reason: SkipReason
    detail: str


@dataclass(frozen=True)
class _Refused:
    """A range of addresses no service or endpoint may use."""

    first: int
    last: int
    reason: SkipReason
    what: str


def _refused(cidr: str, what: str, reason: SkipReason = SkipReason.SPECIAL_IP) -> _Refused:
    net = ipaddress.ip_network(cidr)
    return _Refused(int(net.network_address), int(net.broadcast_address), reason, what)


# Special addresses are not one service's or one pod's: a ClusterIP among them
# would capture the node's own traffic (0.0.0.0 listens on every address,
# 169.254.169.254 is the cloud metadata server), an endpoint among them would
# send clients into their own pod's localhost (Kubernetes' EndpointSlice
# validation refuses the same classes). An IPv4-mapped IPv6 address is its
# IPv4 address in another spelling: as both, two services would share one
# dataplane key.
_REFUSED = {
    4: (_refused("0.0.0.0/32", "the unspecified address"),
        _refused("127.0.0.0/8", "a loopback address (127.0.0.0/8)"),
        _refused("169.254.0.0/16", "a link-local address (169.254.0.0/16)"),
        _refused("224.0.0.0/4", "a multicast address (224.0.0.0/4)"),
        _refused("255.255.255.255/32", "the limited broadcast address")),
    6: (_refused("::/128", "the unspecified address"),
        _refused("::1/128", "the loopback address"),
        _refused("::ffff:0:0/96", "an IPv4-mapped IPv6 address", SkipReason.BAD_IP),
        _refused("fe80::/10", "a link-local address (fe80::/10)"),
        _refused("ff00::/8", "a multicast address (ff00::/8)")),
}


def _first_bytes(version: int) -> frozenset[int]:
    """The first bytes of every refused address of a family."""
    shift = (32 if version == 4 else 128) - 8
    return frozenset(byte for r in _REFUSED[version]
                     for byte in range(r.first >> shift, (r.last >> shift) + 1))


# parse_ips asks address_problem only about addresses starting like a refused
# one: the table above stays the one place that decides.
_MAYBE_REFUSED = {version: _first_bytes(version) for version in _REFUSED}


def address_problem(ip: IPAddress) -> AddressProblem | None:
    """Why no service or endpoint may use `ip`, or None when it may.

    Only canonical, ordinary addresses pass, so that two different values are
    never one dataplane key and no service can capture the node's own
    traffic: no scope id (it names an interface of one host), no IPv4-mapped
    form, nothing unspecified, loopback, link-local, multicast or broadcast.
    Every address from the brain goes through here."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return AddressProblem(SkipReason.BAD_IP,
                              f"{ip} has a scope id (the name of one host's interface); "
                              f"list it as {ipaddress.IPv6Address(int(ip))}")
    value = int(ip)
    refused = next((r for r in _REFUSED[ip.version] if r.first <= value <= r.last), None)
    if refused is None:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return AddressProblem(refused.reason,
                              f"::ffff:{ip.ipv4_mapped} is {refused.what}; list "
                              f"{ip.ipv4_mapped} under V4")
    return AddressProblem(refused.reason,
                          f"{ip} is {refused.what}; no service or endpoint may use it")


def parse_ips(values: Iterable[str], version: int, owner: str, skips: Skips) -> list[IPAddress]:
    """Parse the IPs of one family; bad, special or wrong-family ones are skipped."""
    if not values:
        return []
    family, address_type = _FAMILIES[version]
    maybe_refused = _MAYBE_REFUSED[version]
    ips: list[IPAddress] = []
    for value in values:
        try:  # inet_pton is strict and fast; a full sync parses every endpoint IP
            packed = socket.inet_pton(family, value)
        except (OSError, ValueError):
            try:  # forms inet_pton refuses but ipaddress reads (another family, a scope id)
                ip: IPAddress = ipaddress.ip_address(value)
            except ValueError:
                skips.skip(SkipReason.BAD_IP, owner, f"{value!r} is not an IP address")
                continue
        else:
            ip = address_type(packed)
            if packed[0] not in maybe_refused:
                ips.append(ip)
                continue
        problem = address_problem(ip)
        if problem is not None:
            skips.skip(problem.reason, owner, problem.detail)
        elif ip.version != version:
            skips.skip(SkipReason.BAD_IP, owner, f"{value} is listed as IPv{version}")
        else:
            ips.append(ip)
    return ips


def _ipset(ipset: localv1.IPSet, owner: str, skips: Skips) -> tuple[IPAddress, ...]:
    return tuple(parse_ips(ipset.V4, 4, owner, skips) + parse_ips(ipset.V6, 6, owner, skips))


def _cluster_ips(ipset: localv1.IPSet, owner: str, skips: Skips) -> tuple[IPAddress, ...]:
    """At most one ClusterIP per family (Kubernetes' clusterIPs): every
    backend then serves the same ones."""
    kept: list[IPAddress] = []
    for ip in _ipset(ipset, owner, skips):
        first = next((k for k in kept if k.version == ip.version), None)
        if first is None:
            kept.append(ip)
        else:
            skips.skip(SkipReason.BAD_IP, owner,
                       f"ClusterIP {ip} is a second IPv{ip.version} one; a service has at "
                       f"most one per family ({first} is used)")
    return tuple(kept)


def _affinity_timeout(svc: localv1.Service, owner: str, skips: Skips) -> int:
    if svc.WhichOneof("SessionAffinity") != "ClientIP":
        return 0
    timeout = svc.ClientIP.TimeoutSeconds
    if timeout == 0:
        return DEFAULT_AFFINITY_TIMEOUT_SECONDS
    if not 0 < timeout <= MAX_AFFINITY_TIMEOUT_SECONDS:
        skips.skip(SkipReason.BAD_AFFINITY, owner,
                   f"affinity timeout {timeout}s is outside 1..{MAX_AFFINITY_TIMEOUT_SECONDS}; "
                   f"using the default {DEFAULT_AFFINITY_TIMEOUT_SECONDS}s")
        return DEFAULT_AFFINITY_TIMEOUT_SECONDS
    return timeout


def decode_service(path: str, data: bytes, skips: Skips, limits: Limits) -> DecodedService | None:
    names = split_service_path(path)
    if names is None:
        skips.skip(SkipReason.BAD_PATH, f"service {path!r}", "path is not <namespace>/<name>")
        return None
    namespace, name = names
    owner = f"service {path}"
    try:
        svc = localv1.Service.FromString(data)
    except DecodeError as err:
        skips.skip(SkipReason.BAD_BYTES, owner, f"cannot decode a Service: {err}")
        return None
    if len(svc.Ports) > limits.max_service_ports:
        skips.skip(SkipReason.LIMIT, owner,
                   f"{len(svc.Ports)} ports, over --max-service-ports {limits.max_service_ports}; "
                   "its previous version, if any, stays in force (raise --max-service-ports)")
        return None

    decoded = DecodedService(namespace, name, (), svc.InternalTrafficToLocal,
                             svc.ExternalTrafficToLocal)
    if svc.Type == "ExternalName":
        skips.skip(SkipReason.EXTERNAL_NAME, owner, "ExternalName services are resolved by DNS")
        return decoded
    if svc.IPs.Headless:
        skips.skip(SkipReason.HEADLESS, owner, "headless services have no ClusterIP")
        return decoded
    cluster_ips = _cluster_ips(svc.IPs.ClusterIPs, owner, skips)
    if not cluster_ips:
        # ClusterIPs that were listed but bad have had their line already.
        if not (svc.IPs.ClusterIPs.V4 or svc.IPs.ClusterIPs.V6):
            skips.skip(SkipReason.NO_CLUSTER_IP, owner, "no ClusterIP")
        return decoded

    common = dict(
        type=svc.Type or "ClusterIP",
        cluster_ips=cluster_ips,
        external_ips=_ipset(svc.IPs.ExternalIPs, owner, skips),
        load_balancer_ips=_ipset(svc.IPs.LoadBalancerIPs, owner, skips),
        load_balancer_source_ranges=tuple(
            cidr for f in svc.IPFilters for cidr in f.SourceRanges),
        health_check_node_port=svc.HealthCheckNodePort,
        affinity_timeout_seconds=_affinity_timeout(svc, owner, skips),
        internal_traffic_local=svc.InternalTrafficToLocal,
        external_traffic_local=svc.ExternalTrafficToLocal,
    )
    ports: dict[ServicePortName, ServicePort] = {}
    for mapping in svc.Ports:
        port = _decode_port(namespace, name, mapping, common, skips)
        if port is None:
            continue
        if port.name in ports:
            skips.skip(SkipReason.DUPLICATE_PORT, f"service port {port.name}",
                       f"{port.protocol.value} port {mapping.Port} repeats an earlier port's "
                       "name and protocol")
            continue
        ports[port.name] = port
    return DecodedService(namespace, name, tuple(ports.values()), svc.InternalTrafficToLocal,
                          svc.ExternalTrafficToLocal)


def _decode_port(namespace: str, name: str, mapping: localv1.PortMapping, common: dict,
                 skips: Skips) -> ServicePort | None:
    protocol = _PROTOCOLS.get(mapping.Protocol)
    owner = f"service port {namespace}/{name}:{mapping.Name or mapping.Port}"
    if protocol is None:
        shown = localv1.Protocol.Name(mapping.Protocol) if mapping.Protocol in (
            localv1.SCTP, localv1.UnknownProtocol) else str(mapping.Protocol)
        skips.skip(SkipReason.UNSUPPORTED_PROTOCOL, owner,
                   f"protocol {shown} is not supported (TCP and UDP are)")
        return None
    for label, value in (("port", mapping.Port), ("nodePort", mapping.NodePort),
                         ("targetPort", mapping.TargetPort)):
        allowed_zero = label != "port"
        if not (0 <= value <= MAX_PORT) or (value == 0 and not allowed_zero):
            skips.skip(SkipReason.BAD_PORT, owner,
                       f"{label} {value} is outside {0 if allowed_zero else 1}..{MAX_PORT}")
            return None
    node_port_families = tuple(family_of(ip) for ip in common["cluster_ips"]) if (
        mapping.NodePort and common["type"] in _NODE_PORT_TYPES) else ()
    return ServicePort(
        name=ServicePortName(namespace, name, mapping.Name, protocol),
        port=mapping.Port,
        target_port=mapping.TargetPort,
        target_port_name=mapping.TargetPortName,
        node_port=mapping.NodePort,
        node_port_families=node_port_families,
        **common,
    )


def fast_endpoint(data: bytes, tails: EndpointTails) -> DecodedEndpoint | None:
    """The decoded value of an endpoint whose bytes after its IPs were decoded
    before (and needed no skip) and whose IPs are ordinary IPv4 addresses
    (`_ordinary_v4`), decoded without protobuf; None for any other, which
    `decode_endpoint` decodes and checks. What it returns needs no report:
    the same bytes decode to the same value every time. A full sync reads
    each endpoint through here twice (staged, then computed), most of them
    with one address: that case is read without a loop."""
    end = _ips_end(data)
    if end is None:
        return None
    tail = tails.get(data[end:])
    if tail is None:
        return None
    if end > 4 and data[2] == _V4_TAG and data[3] + 4 == end:  # one V4 entry, all of it
        addresses = _ordinary_v4_entry(data[4:end])
    else:
        addresses = _ordinary_v4(data[2:end])
    return None if addresses is None else DecodedEndpoint(addresses, tail, data)


def decode_endpoint(service_path: str, key: str, data: bytes, skips: Skips,
                    tails: EndpointTails | None = None) -> DecodedEndpoint | None:
    """With `tails`, an endpoint whose bytes after its IPs were decoded
    before (and needed no skip) decodes only its IPs and shares the rest."""
    fast = fast_endpoint(data, tails) if tails is not None else None
    if fast is not None:
        return fast
    parts = _split_at_ips(data) if tails is not None else None
    owner = f"endpoint {service_path}/{key}"
    shared = _ips_with_known_tail(parts, tails)
    if shared is not None:
        ipset, tail = shared
        if _too_many_ips(ipset, owner, skips):
            return None
    else:
        try:
            ep = localv1.Endpoint.FromString(data)
        except DecodeError as err:
            skips.skip(SkipReason.BAD_BYTES, owner, f"cannot decode an Endpoint: {err}")
            return None
        ipset = ep.IPs
        if _too_many_ips(ipset, owner, skips):
            return None
        tail, clean = _decode_tail(ep, owner, skips)
        if (tails is not None and parts is not None and clean
                and len(parts[1]) <= tails.longest and _ips_only_first(parts[1])):
            tails.put(parts[1], tail)
    v4, v6 = ipset.V4, ipset.V6
    ips = parse_ips(v4, 4, owner, skips)
    if v6:
        ips += parse_ips(v6, 6, owner, skips)
    return DecodedEndpoint(b"".join(map(packed_address, ips)), tail, data)


def _ips_with_known_tail(parts: tuple[bytes, bytes] | None, tails: EndpointTails | None
                         ) -> tuple[localv1.IPSet, EndpointTail] | None:
    """The endpoint's IPs and its tail when the bytes after its IPs were
    decoded before; None when they were not, or when the IPs are undecodable
    (then decoding the whole value says why)."""
    if parts is None or tails is None:
        return None
    tail = tails.get(parts[1])
    if tail is None:
        return None
    try:
        return localv1.IPSet.FromString(parts[0]), tail
    except DecodeError:
        return None


def _too_many_ips(ipset: localv1.IPSet, owner: str, skips: Skips) -> bool:
    """Whether the endpoint has more addresses than one may (skipped if so)."""
    addresses = len(ipset.V4) + len(ipset.V6)
    if addresses <= MAX_ENDPOINT_IPS:
        return False
    skips.skip(SkipReason.LIMIT, owner,
               f"{addresses} addresses; an endpoint has at most {MAX_ENDPOINT_IPS} "
               "(Kubernetes' EndpointSlice limit); its previous version, if any, stays in "
               "force (the brain must send one endpoint per pod)")
    return True


# The tag of IPSet.V4 (field 1, length-delimited).
_V4_TAG = 0x0A
_MAYBE_REFUSED_V4 = _MAYBE_REFUSED[4]


def _ordinary_v4(ipset: bytes) -> bytes | None:
    """The addresses of an IPSet's bytes that hold short V4 entries only,
    each an ordinary IPv4 address in the form inet_pton reads, packed
    (`packed_address`): what decoding it and `parse_ips` would return,
    without a skip. None for anything else (another field, a V6 address, a
    long or non-ASCII entry, an address that is not ordinary, none at all),
    which the full decode handles and reports."""
    addresses = b""
    at, end = 0, len(ipset)
    while at < end:
        if ipset[at] != _V4_TAG or at + 1 == end:
            return None
        # A length of two varint bytes (0x80 and up) would run past the
        # short IPSet: refused as any entry longer than what is left.
        start, at = at + 2, at + 2 + ipset[at + 1]
        if at > end:
            return None
        address = _ordinary_v4_entry(ipset[start:at])
        if address is None:
            return None
        addresses += address
    # At most 14 addresses fit in the short IPs field _split_at_ips reads:
    # never over MAX_ENDPOINT_IPS.
    return addresses or None


def _ordinary_v4_entry(text: bytes) -> bytes | None:
    """One V4 entry's bytes, packed (`packed_address`) when they are an
    ordinary IPv4 address in the form inet_pton reads; else None."""
    try:
        packed = socket.inet_pton(socket.AF_INET, text.decode("ascii"))
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return None if packed[0] in _MAYBE_REFUSED_V4 else packed_v4_address(packed)


def _decode_tail(ep: localv1.Endpoint, owner: str, skips: Skips) -> tuple[EndpointTail, bool]:
    """The endpoint's values but its IPs, and whether they needed no skip."""
    overrides: list[tuple[str, int]] = []
    clean = True
    for override in ep.PortOverrides:
        name, port = override.Name, override.Port
        if not 0 < port <= MAX_PORT:
            skips.skip(SkipReason.BAD_PORT, owner,
                       f"port override {name!r}={port} is outside 1..{MAX_PORT}")
            clean = False
            continue
        overrides.append((name, port))
    if ep.HasField("Scopes"):
        scopes = ep.Scopes
        pair: tuple[bool, bool] | None = _SCOPES[scopes.Internal][scopes.External]
    else:
        pair = None
    return EndpointTail(tuple(overrides), ep.Local, pair), clean


def _ips_only_first(tail: bytes) -> bool:
    """Whether the bytes after an endpoint's first IPs field hold no more of
    them (a repeated message field is merged: the IPs would not be the first
    field's alone)."""
    try:
        return not localv1.Endpoint.FromString(tail).HasField("IPs")
    except DecodeError:
        return False
