"""What kpng-py's netfilter table holds, as values: the fixed skeleton, the
objects of each service port, and the commands that turn one set of objects
into another (one nftables transaction).

The table (`inet kpng-py`) serves packets that arrive from outside the node;
the socket hooks already serve clients on the node. Its shape follows
kube-proxy's nftables mode:

    filter-prerouting (filter, prerouting, dstnat-10): new connections only
        jump firewall-check          LB IP . proto . port -> fw chain (source ranges)
        no-endpoint-services{4,6}    ExternalIP/LB IP . proto . port -> reject | drop
        no-endpoint-nodeports{4,6}   (node address) proto . port -> reject | drop
    nat-prerouting (nat, prerouting, dstnat) -> services
        service-ips{4,6}             ExternalIP/LB IP . proto . port -> svc chain
        service-nodeports{4,6}       (node address) proto . port -> svc chain
    svc chain      [mark for masquerade (eTP=Cluster)] [affinity] numgen -> ep chain
    ep chain       [hairpin mark] [affinity update] dnat to the endpoint
    nat-postrouting (nat, postrouting, srcnat) -> masquerading (marked packets)

Everything per family: a dual-stack service port has a v4 and a v6 chain,
each with the endpoints of its family.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from backends.ebpf.netfilter import expr as nx
from kpng_py.model import Endpoint, IPAddress, IPFamily, ServicePort, family_of

TABLE = "kpng-py"
TABLE_FAMILY = "inet"
# kube-proxy's masquerade bit: kpng-py replaces kube-proxy on a node.
MASQUERADE_MARK = 0x4000
FAMILIES = (IPFamily.V4, IPFamily.V6)

REJECT_CHAIN = "reject-chain"
FIREWALL_CHAIN = "firewall-check"
SERVICES_CHAIN = "services"
MASQUERADING_CHAIN = "masquerading"
MARK_CHAIN = "mark-for-masquerade"


# Maps and sets, one of each per family (`per_family`).
SERVICE_IPS = "service-ips"                      # ExternalIP/LB IP . proto . port -> svc chain
SERVICE_NODEPORTS = "service-nodeports"          # proto . node port -> svc chain
NO_ENDPOINT_SERVICES = "no-endpoint-services"    # ExternalIP/LB IP . proto . port -> reject/drop
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"  # proto . node port -> reject/drop
FIREWALL_IPS = "firewall-ips"                    # LB IP . proto . port -> fw chain
NODEPORT_IPS = "nodeport-ips"                    # allowed node addresses (NodePortMatch.only)


def per_family(base: str, family: IPFamily) -> str:
    """`service-ips4`, `nodeport-ips6`, ..."""
    return f"{base}{family.value}"


@dataclass(frozen=True)
class NodePortMatch:
    """How the table matches the node addresses node ports answer on (from
    kube-proxy's `--nodeport-addresses`, kpng_py/node/nodeport_addresses.py):
    every local address (`ips` None: `fib daddr type local`), or exactly
    `ips`, kept up to date by the caller (`NetfilterTable.set_node_addresses`).
    Loopback never: packets from outside never reach 127.0.0.0/8."""

    ips: frozenset[IPAddress] | None = None

    @classmethod
    def every_local(cls) -> NodePortMatch:
        return cls(None)

    @classmethod
    def only(cls, ips: Iterable[IPAddress]) -> NodePortMatch:
        return cls(frozenset(ips))


@dataclass(frozen=True)
class Hook:
    type: str
    hook: str
    priority: int


@dataclass(frozen=True)
class Chain:
    """A chain and its rules (each the JSON text of its expression list, the
    builders' key order being fixed: chains compare and hash as values, and
    a transaction is written without encoding them again)."""

    name: str
    rules: tuple[str, ...] = ()
    hook: Hook | None = None

    @classmethod
    def of(cls, name: str, rules: Iterable[list[nx.Json]], hook: Hook | None = None) -> Chain:
        return cls(name, tuple(json.dumps(rule) for rule in rules), hook)


@dataclass(frozen=True)
class NamedSet:
    """A set of addresses; with `timeout`, a dynamic set whose members expire
    (ClientIP affinity)."""

    name: str
    family: IPFamily
    timeout: int = 0


@dataclass(frozen=True)
class VerdictMap:
    name: str
    key_types: tuple[str, ...]


@dataclass(frozen=True)
class Element:
    """One element of a verdict map: key -> `kind` (`goto` a chain, `drop`)."""

    map: str
    key: tuple[str | int, ...]
    kind: str
    target: str = ""


@dataclass(frozen=True)
class PortObjects:
    """What one service port owns in the table."""

    chains: tuple[Chain, ...] = ()
    sets: tuple[NamedSet, ...] = ()
    elements: frozenset[Element] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.chains or self.sets or self.elements)


_NOTHING = PortObjects()
_FILTER_PREROUTING = Hook("filter", "prerouting", -110)  # dstnat - 10: before DNAT
_NAT_PREROUTING = Hook("nat", "prerouting", -100)        # dstnat
_NAT_POSTROUTING = Hook("nat", "postrouting", 100)       # srcnat


def _node_address(family: IPFamily, addresses: NodePortMatch) -> list[nx.Json]:
    """The match of a node-port address of `family`."""
    not_loopback = nx.match(nx.addr(family, "daddr"), nx.prefix(nx.LOOPBACK[family]), op="!=")
    if addresses.ips is None:
        return [nx.fib_local(), not_loopback]
    return [nx.match(nx.addr(family, "daddr"), f"@{per_family(NODEPORT_IPS, family)}")]


def skeleton(addresses: NodePortMatch) -> tuple[list[VerdictMap], list[NamedSet],
                                                    list[Chain]]:
    """The maps, sets and chains every table has, whatever the services."""
    maps: list[VerdictMap] = []
    sets: list[NamedSet] = []
    filter_rules: list[list[nx.Json]] = [[nx.ct_new(), nx.jump(FIREWALL_CHAIN)]]
    firewall_rules: list[list[nx.Json]] = []
    service_rules: list[list[nx.Json]] = []
    for family in FAMILIES:
        frontend = (nx.ADDR_TYPE[family], "inet_proto", "inet_service")
        port = ("inet_proto", "inet_service")
        maps += [VerdictMap(per_family(SERVICE_IPS, family), frontend),
                 VerdictMap(per_family(SERVICE_NODEPORTS, family), port),
                 VerdictMap(per_family(NO_ENDPOINT_SERVICES, family), frontend),
                 VerdictMap(per_family(NO_ENDPOINT_NODEPORTS, family), port),
                 VerdictMap(per_family(FIREWALL_IPS, family), frontend)]
        if addresses.ips is not None:
            sets.append(NamedSet(per_family(NODEPORT_IPS, family), family))
        node = _node_address(family, addresses)

        def lookup(key: nx.Json, base: str) -> nx.Json:
            return nx.vmap(key, f"@{per_family(base, family)}")
        filter_rules += [
            [nx.ct_new(), lookup(nx.frontend_key(family), NO_ENDPOINT_SERVICES)],
            [nx.ct_new(), *node, lookup(nx.port_key(), NO_ENDPOINT_NODEPORTS)]]
        firewall_rules.append([lookup(nx.frontend_key(family), FIREWALL_IPS)])
        service_rules += [
            [lookup(nx.frontend_key(family), SERVICE_IPS)],
            [*node, lookup(nx.port_key(), SERVICE_NODEPORTS)]]
    chains = [
        Chain.of("filter-prerouting", filter_rules, _FILTER_PREROUTING),
        Chain.of(FIREWALL_CHAIN, firewall_rules),
        Chain.of(REJECT_CHAIN, [nx.reject_tcp_reset(), nx.reject_port_unreachable()]),
        Chain.of("nat-prerouting", [[nx.jump(SERVICES_CHAIN)]], _NAT_PREROUTING),
        Chain.of(SERVICES_CHAIN, service_rules),
        Chain.of("nat-postrouting", [[nx.jump(MASQUERADING_CHAIN)]], _NAT_POSTROUTING),
        Chain.of(MASQUERADING_CHAIN, [
            [nx.mark_unset(MASQUERADE_MARK), nx.verdict("return")],
            [nx.mark_xor(MASQUERADE_MARK)],
            [nx.masquerade()]]),
        Chain.of(MARK_CHAIN, [[nx.mark_or(MASQUERADE_MARK)]]),
    ]
    return maps, sets, chains


# What a part of a readable name may be: Kubernetes names and port names are
# DNS labels, which are valid in an unquoted nft name; and short enough that
# the longest name made of them (an affinity set's) stays under nft's 256.
_NAME_PART = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
_PORT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,14}")


def _port_id(port: ServicePort, family: IPFamily) -> str:
    """`4-ns/name/portname/tcp`: readable, unique per service port and family,
    and a valid unquoted nft name. A name the brain sent that is no DNS
    label (hostile or broken input) would make nftables refuse the whole
    transaction: such a port gets `4-h<hash>/tcp` instead."""
    name = port.name
    proto = nx.l4proto(port.protocol)
    if all(_NAME_PART.fullmatch(part) for part in (name.namespace, name.name)) and (
            not name.port or _PORT_NAME.fullmatch(name.port)):
        return f"{family.value}-{name.namespace}/{name.name}/{name.port or '_'}/{proto}"
    digest = hashlib.sha256("\0".join((name.namespace, name.name, name.port)).encode())
    return f"{family.value}-h{digest.hexdigest()[:24]}/{proto}"


def _endpoint_id(endpoint: Endpoint) -> str:
    # `:` is not allowed in an unquoted nft name: fd00::1 -> fd00..1.
    return f"{str(endpoint.ip).replace(':', '.')}/{endpoint.port}"


@dataclass(frozen=True)
class Frontends:
    """A service port's frontends from outside, in one family."""

    external_ips: tuple[IPAddress, ...]
    load_balancer_ips: tuple[IPAddress, ...]
    node_port: int

    def __bool__(self) -> bool:
        return bool(self.external_ips or self.load_balancer_ips or self.node_port)


def frontends(port: ServicePort, family: IPFamily) -> Frontends:
    def of_family(ips: tuple[IPAddress, ...]) -> tuple[IPAddress, ...]:
        return tuple(ip for ip in ips if family_of(ip) == family)
    return Frontends(of_family(port.external_ips), of_family(port.load_balancer_ips),
                     node_port_of(port, family))


def node_port_of(port: ServicePort, family: IPFamily) -> int:
    """The node port `port` owns in `family`, or 0 (the state model leaves
    out a node port another service port owns)."""
    return port.node_port if family in port.node_port_families else 0


def port_objects(port: ServicePort, on_bad_range: Callable[[str], None]) -> PortObjects:
    """Everything `port` needs in the table (nothing for a port with no
    frontend from outside)."""
    if not (port.node_port_families or port.external_ips or port.load_balancer_ips):
        return _NOTHING  # most ports (ClusterIP): a full sync of many asks first
    chains: list[Chain] = []
    sets: list[NamedSet] = []
    elements: set[Element] = set()
    ranges = port.source_ranges(on_bad_range)
    for family in port.outside_families():
        ends = frontends(port, family)
        if not ends:
            continue
        objects = _family_objects(port, family, ends, None if ranges is None else
                                  tuple(r for r in ranges if r.version == family.value))
        chains += objects.chains
        sets += objects.sets
        elements |= objects.elements
    return PortObjects(tuple(chains), tuple(sets), frozenset(elements))


def _family_objects(port: ServicePort, family: IPFamily, ends: Frontends,
                    ranges: tuple[nx.Network, ...] | None) -> PortObjects:
    pid = _port_id(port, family)
    proto = nx.l4proto(port.protocol)
    ip_keys = [(str(ip), proto, port.port) for ip in ends.external_ips + ends.load_balancer_ips]
    port_keys = [(proto, ends.node_port)] if ends.node_port else []
    chains: list[Chain] = []
    sets: list[NamedSet] = []
    elements: set[Element] = set()

    def to(base: str, keys: Sequence[tuple[str | int, ...]], kind: str, target: str) -> None:
        elements.update(Element(per_family(base, family), k, kind, target) for k in keys)
    endpoints = port.external_endpoints(family)
    if endpoints:
        chain = f"svc{pid}"
        svc, eps, affinity = _service_chains(port, family, chain, endpoints)
        chains += [svc, *eps]
        sets += affinity
        to(SERVICE_IPS, ip_keys, "goto", chain)
        to(SERVICE_NODEPORTS, port_keys, "goto", chain)
    else:
        # Endpoints elsewhere but none here (eTP=Local): drop; no endpoint
        # at all: refuse at once (ServicePort.drops_outside).
        kind, target = ("drop", "") if port.drops_outside(family) else ("goto", REJECT_CHAIN)
        to(NO_ENDPOINT_SERVICES, ip_keys, kind, target)
        to(NO_ENDPOINT_NODEPORTS, port_keys, kind, target)
    if ends.load_balancer_ips and ranges is not None:
        fw = f"fw{pid}"
        allow = [[nx.match(nx.addr(family, "saddr"),
                           nx.anonymous_set([nx.prefix(r) for r in ranges])),
                  nx.verdict("return")]] if ranges else []
        chains.append(Chain.of(fw, [*allow, [nx.verdict("drop")]]))
        to(FIREWALL_IPS, [(str(ip), proto, port.port) for ip in ends.load_balancer_ips],
           "goto", fw)
    return PortObjects(tuple(chains), tuple(sets), frozenset(elements))


def _service_chains(port: ServicePort, family: IPFamily, chain: str,
                    endpoints: tuple[Endpoint, ...]
                    ) -> tuple[Chain, list[Chain], list[NamedSet]]:
    """The service chain, one chain per endpoint, and the affinity sets."""
    timeout = port.affinity_timeout_seconds
    ep_chains: list[Chain] = []
    affinity: list[NamedSet] = []
    svc_rules: list[list[nx.Json]] = []
    if not port.external_traffic_local:
        # eTP=Cluster: the endpoint may be on another node, whose reply must
        # come back through this one (kube-proxy masquerades even local ones).
        svc_rules.append([nx.jump(MARK_CHAIN)])
    for endpoint in endpoints:
        ep_chain = f"ep{chain[3:]}/{_endpoint_id(endpoint)}"
        rules: list[list[nx.Json]] = [
            # Hairpin: a pod reaching itself must see the node as the source.
            [nx.match(nx.addr(family, "saddr"), str(endpoint.ip)), nx.jump(MARK_CHAIN)]]
        if timeout:
            # The timeout is in the name: a changed timeout is a new set.
            aff = NamedSet(f"aff{family.value}-{timeout}s{ep_chain[3:]}", family, timeout)
            affinity.append(aff)
            svc_rules.append([nx.match(nx.addr(family, "saddr"), f"@{aff.name}"),
                              nx.goto(ep_chain)])
            rules.append([nx.set_update(family, aff.name)])
        rules.append([nx.match(nx.meta("l4proto"), nx.l4proto(port.protocol)),
                      nx.dnat(endpoint.ip, endpoint.port)])
        ep_chains.append(Chain.of(ep_chain, rules))
    svc_rules.append([nx.vmap(nx.numgen_random(len(endpoints)), nx.anonymous_set(
        [[i, nx.goto(c.name)] for i, c in enumerate(ep_chains)]))])
    return Chain.of(chain, svc_rules), ep_chains, affinity
