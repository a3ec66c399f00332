"""Two nodes and an outside client on one network: the NodePort e2e
topology (docs/e2e.md, "The NodePort topology").

    netns kpe2e-<pid>-net: a bridge, no address, no route (the wire between machines)
      |-- eth0 of kpe2e-<pid>-node1  172.18.0.11/24  fd00:172:18::11/64
      |-- eth0 of kpe2e-<pid>-node2  172.18.0.12/24  fd00:172:18::12/64
      `-- eth0 of kpe2e-<pid>-ext    172.18.0.100, .101  fd00:172:18::100, ::101
    node N: a bridge for its pods (10.244.N.1/24, fd00:10:244:N::1/64), a
            route to the other node's pod subnet via that node's address,
            `prohibit` routes for the service CIDRs and the VIP range, the
            escape counters (cluster.py) also for pod packets to VIPs and to
            its own NodePorts
    pod:    eth0 on its node's bridge, default route via its node
    ext:    the network itself and the VIP range (ExternalIPs, LB IPs) via
            node1: nothing else (it cannot reach a pod, nor any address
            outside the lab)

No namespace has a default route out of the lab. Each node has a cgroup of its
own (`kpe2e-<pid>-nodeN`): its pods' cgroups and its host client's are
children of it, and the node's backend attaches there.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from lab.backends import LabPlaces
from lab.cluster import (
    ADDRESSING,
    NO_DAD,
    Addressing,
    Family,
    IPAddress,
    IPNetwork,
    Pod,
    add_pod_netns,
    build_node_netns,
    escape_count,
    escape_counter,
    ip_batch,
    nodad,
)
from lab.names import BPFFS_ROOT, CGROUP2_ROOT, RunNames
from lab.procs import Proc, in_namespace, run, spawn, sysctl

NETWORK = {Family.IPV4: ipaddress.ip_network("172.18.0.0/24"),
           Family.IPV6: ipaddress.ip_network("fd00:172:18::/64")}
# ExternalIPs and LoadBalancer IPs: not on any interface, routed to node1 by
# the external client (as a cloud's load balancer would send them).
VIP_RANGE = {Family.IPV4: ipaddress.ip_network("172.19.0.0/24"),
             Family.IPV6: ipaddress.ip_network("fd00:172:19::/112")}
NODE_PORT_RANGE = (30000, 32767)
_FIRST_NODE_HOST = 10
_EXTERNAL_HOSTS = (100, 101)  # the client's address, and a second source
_FIRST_VIP_HOST = 10
EXTERNAL = "ext"


def node_ip(family: Family, index: int) -> IPAddress:
    """Node number `index`'s address on the network (172.18.0.10 + index)."""
    return NETWORK[family][_FIRST_NODE_HOST + index]


def external_ip(family: Family, second: bool = False) -> IPAddress:
    """The external client's address (or its second one) of `family`."""
    return NETWORK[family][_EXTERNAL_HOSTS[1 if second else 0]]


def vip(family: Family, index: int) -> IPAddress:
    """The VIP range's address number 10 + index."""
    return VIP_RANGE[family][_FIRST_VIP_HOST + index]


def node_plan(family: Family, node_index: int) -> Addressing:
    """Node N's pod subnet (10.244.N.0/24, fd00:10:244:N::/64) in the cluster's."""
    cluster = ADDRESSING[family]
    subnet_bits = 24 if family is Family.IPV4 else 64
    subnets: Iterator[IPNetwork] = cluster.cluster_pod_cidr.subnets(new_prefix=subnet_bits)
    subnet = next(s for i, s in enumerate(subnets) if i == node_index)
    return Addressing(family, cluster.cluster_pod_cidr, subnet, cluster.service_cidr)


@dataclass(frozen=True)
class Node:
    name: str          # its --node-name and the endpoints' topology.node
    index: int         # 1, 2, ...
    netns: str
    cgroup: Path       # parent of its pods' cgroups; the backend attaches here
    bpffs_dir: Path
    service_interface: str
    bridge: str
    families: tuple[Family, ...]

    def ip(self, family: Family) -> IPAddress:
        return node_ip(family, self.index)

    def plan(self, family: Family) -> Addressing:
        return node_plan(family, self.index)

    @property
    def places(self) -> LabPlaces:
        return LabPlaces(self.netns, self.cgroup, self.bpffs_dir, self.service_interface,
                         tuple(str(ADDRESSING[f].cluster_pod_cidr) for f in self.families))

    @property
    def host(self) -> Pod:
        """The node's host network namespace as a client (a hostNetwork pod):
        in the node's cgroup, so the node's socket hooks see it."""
        return Pod(f"{self.name}-host", 0, self.netns, self.cgroup / "host",
                   tuple(self.ip(f) for f in self.families))


def node_names(names: RunNames, index: int, families: tuple[Family, ...]) -> Node:
    name = f"node{index}"
    return Node(name, index, names.netns(name), CGROUP2_ROOT / f"{names.tag}-{name}",
                BPFFS_ROOT / f"{names.tag}-{name}", f"kpe{names.pid}n{index}s",
                f"kpe{names.pid}n{index}br", families)


@dataclass
class MultiNodeCluster:
    """Builds the namespaces, links and cgroups of a NodePort run; removing
    them is teardown.remove_run's job (every name is the run's)."""

    names: RunNames
    families: tuple[Family, ...]
    workdir: Path
    nodes: tuple[Node, ...] = ()
    pods: dict[str, Pod] = field(default_factory=dict)
    node_of: dict[str, Node] = field(default_factory=dict)  # by pod name
    external: Pod | None = None

    @property
    def network_netns(self) -> str:
        return self.names.netns("net")

    def build(self, pods_per_node: Sequence[Sequence[str]]) -> None:
        """Nodes 1..N, node i with the pods named in pods_per_node[i-1]
        (pod names are unique in the run), and the external client."""
        run(["ip", "netns", "add", self.network_netns])
        ip_batch(self.network_netns, [
            "link set lo up",
            "link add br0 type bridge stp_state 0 forward_delay 0 mcast_snooping 0",
            "link set br0 up"])
        self.nodes = tuple(node_names(self.names, i, self.families)
                           for i in range(1, len(pods_per_node) + 1))
        index = 0
        for node, pod_names in zip(self.nodes, pods_per_node):
            self._build_node(node)
            for name in pod_names:
                self.pods[name] = self._add_pod(node, name, index)
                self.node_of[name] = node
                index += 1
        self.external = self._build_external()

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def pods_on(self, node: Node) -> list[Pod]:
        return [p for name, p in self.pods.items() if self.node_of[name] == node]

    def external_source(self, family: Family, second: bool = False) -> IPAddress:
        """The external client's address (or its second one) of `family`."""
        return external_ip(family, second)

    def spawn_on(self, node: Node, name: str, argv: Sequence[str]) -> Proc:
        """A process in the node's namespace, outside its pods' cgroups (brain, backend)."""
        return spawn(name, in_namespace(node.netns, argv), self.workdir / f"{name}.log")

    def spawn_in_pod(self, pod: Pod, name: str, argv: Sequence[str]) -> Proc:
        return spawn(f"{pod.name}/{name}", pod.command(argv),
                     self.workdir / f"{pod.name}-{name}.log")

    def escaped_packets(self, family: Family) -> int:
        """Packets of `family` that reached a node untranslated from a pod or
        were sent to a ClusterIP (escape_counter_ruleset), over all nodes."""
        return sum(escape_count(node.netns, family) for node in self.nodes)

    # -- building ---------------------------------------------------------
    def _uplink(self, netns: str, addresses: Sequence[tuple[Family, IPAddress]], port: str) -> None:
        """eth0 of `netns` on the network's bridge (`port` its name there)."""
        sysctl(netns, *NO_DAD)
        ip_batch(self.network_netns, [
            f"link add {port} type veth peer name eth0 netns {netns}",
            f"link set {port} master br0 up"])
        ip_batch(netns, ["link set eth0 up", *(
            f"addr add {ip}/{NETWORK[family].prefixlen} dev eth0{nodad(family)}"
            for family, ip in addresses)])

    def _build_node(self, node: Node) -> None:
        plans = [node.plan(f) for f in self.families]
        build_node_netns(node.netns, node.bridge, plans, self._escape_rules(node))
        node.cgroup.mkdir()
        node.host.cgroup.mkdir()
        self._uplink(node.netns, [(f, node.ip(f)) for f in self.families], f"kpe{node.index}u")
        routes = []
        for family in self.families:
            routes.append(f"route add prohibit {VIP_RANGE[family]}")
            for other in self.nodes:
                if other != node:
                    routes.append(f"route add {other.plan(family).node_pod_cidr} "
                                  f"via {other.ip(family)}")
        ip_batch(node.netns, routes)

    def _escape_rules(self, node: Node) -> list[str]:
        """Pod packets that a socket-level balancer must have translated: to
        a VIP, or to this node's own address on a NodePort."""
        low, high = NODE_PORT_RANGE
        rules = []
        for family in self.families:
            ip = "ip" if family is Family.IPV4 else "ip6"
            counter = escape_counter(family)
            rules.append(f"iifname {node.bridge} {ip} daddr {VIP_RANGE[family]} "
                         f"counter name {counter}")
            rules.append(f"iifname {node.bridge} {ip} daddr {node.ip(family)} "
                         f"meta l4proto {{ tcp, udp }} th dport {low}-{high} "
                         f"counter name {counter}")
        return rules

    def _add_pod(self, node: Node, name: str, index: int) -> Pod:
        plans = [node.plan(f) for f in self.families]
        pod = Pod(name=name, index=index, netns=self.names.netns(name),
                  cgroup=node.cgroup / name, ips=tuple(p.pod_ip(index) for p in plans))
        add_pod_netns(pod, node.netns, node.bridge, f"kpe{self.names.pid}p{index}", plans)
        return pod

    def _build_external(self) -> Pod:
        netns = self.names.netns(EXTERNAL)
        cgroup = CGROUP2_ROOT / f"{self.names.tag}-{EXTERNAL}"
        run(["ip", "netns", "add", netns])
        ip_batch(netns, ["link set lo up"])
        cgroup.mkdir()
        self._uplink(netns, [(f, self.external_source(f)) for f in self.families], "kpeextu")
        # The second address is a source only for a socket bound to it: IPv4
        # makes it secondary; IPv6 would prefer the newer one, unless it is
        # deprecated (preferred_lft 0).
        ip_batch(netns, [f"addr add {self.external_source(f, second=True)}/"
                         f"{NETWORK[f].prefixlen} dev eth0{nodad(f)}"
                         + (" preferred_lft 0" if f is Family.IPV6 else "")
                         for f in self.families])
        ip_batch(netns, [f"route add {VIP_RANGE[f]} via {self.nodes[0].ip(f)}"
                         for f in self.families])
        return Pod(EXTERNAL, 0, netns, cgroup, tuple(self.external_source(f)
                                                      for f in self.families))

