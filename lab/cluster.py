"""The cluster: one node namespace with a bridge and no uplink, pods on veths.

    pod netns (eth0) --veth-- node netns: bridge (pod gateway), no uplink
                                   routes: service CIDRs `unreachable`

Pods route everything through the node; the node has routes only to the pod
subnet, and the service CIDRs end in an `unreachable` route there, so a packet
to a ClusterIP that escapes translation dies in the node namespace (with an
ICMP error, so clients fail fast) and is counted by an nftables counter.
Nothing in the cluster can reach the machine's own networks.
"""

from __future__ import annotations

import enum
import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

from lab.names import RunNames
from lab.procs import Proc, in_namespace, run, spawn, sysctl

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

# First host index of pods in the node's pod subnet and of ClusterIPs in the
# service CIDR (low addresses stay free, as in a real cluster).
_FIRST_POD_HOST = 10
_FIRST_SERVICE_HOST = 10
_ESCAPES_TABLE = "kpe2e_escapes"


class Family(str, enum.Enum):
    IPV4 = "ipv4"
    IPV6 = "ipv6"

    @property
    def version(self) -> int:
        return 4 if self is Family.IPV4 else 6


def families_of_mode(mode: str) -> tuple[Family, ...]:
    """`-i ipv4|ipv6|dual`."""
    return {"ipv4": (Family.IPV4,), "ipv6": (Family.IPV6,),
            "dual": (Family.IPV4, Family.IPV6)}[mode]


@dataclass(frozen=True)
class Addressing:
    """One family's address plan (kind's defaults)."""

    family: Family
    cluster_pod_cidr: IPNetwork
    node_pod_cidr: IPNetwork
    service_cidr: IPNetwork

    @property
    def gateway(self) -> IPAddress:
        return self.node_pod_cidr[1]

    def pod_ip(self, index: int) -> IPAddress:
        return self.node_pod_cidr[_FIRST_POD_HOST + index]

    def service_ip(self, index: int) -> IPAddress:
        return self.service_cidr[_FIRST_SERVICE_HOST + index]


ADDRESSING = {
    Family.IPV4: Addressing(Family.IPV4, ipaddress.ip_network("10.244.0.0/16"),
                            ipaddress.ip_network("10.244.0.0/24"),
                            ipaddress.ip_network("10.96.0.0/16")),
    Family.IPV6: Addressing(Family.IPV6, ipaddress.ip_network("fd00:10:244::/56"),
                            ipaddress.ip_network("fd00:10:244::/64"),
                            ipaddress.ip_network("fd00:10:96::/112")),
}


def ip_family(ip: IPAddress) -> Family:
    return Family.IPV4 if ip.version == 4 else Family.IPV6


@dataclass(frozen=True)
class Pod:
    """A pod: its own network namespace and cgroup, one address per family."""

    name: str
    index: int
    netns: str
    cgroup: Path
    ips: tuple[IPAddress, ...]

    def ip(self, family: Family) -> IPAddress:
        return next(ip for ip in self.ips if ip_family(ip) == family)

    def command(self, argv: Sequence[str]) -> list[str]:
        return in_namespace(self.netns, argv, self.cgroup)


@dataclass
class Cluster:
    """Builds the namespaces, links and cgroups of one run. Removing them is
    `teardown.remove_run`'s job, shared with the clean-up of stale runs."""

    names: RunNames
    families: tuple[Family, ...]
    workdir: Path
    pods: dict[str, Pod] = field(default_factory=dict)

    @property
    def node_netns(self) -> str:
        return self.names.netns("node")

    def build(self, pod_names: Sequence[str]) -> None:
        self.names.cgroup.mkdir()
        self._build_node()
        for index, name in enumerate(pod_names):
            self.pods[name] = self._add_pod(name, index)

    def spawn_on_node(self, name: str, argv: Sequence[str]) -> Proc:
        """A node process (brain, backend: hostNetwork, outside the pods' cgroup)."""
        return spawn(name, in_namespace(self.node_netns, argv), self.workdir / f"{name}.log")

    def spawn_in_pod(self, pod: Pod, name: str, argv: Sequence[str]) -> Proc:
        return spawn(f"{pod.name}/{name}", pod.command(argv),
                     self.workdir / f"{pod.name}-{name}.log")

    def escaped_packets(self, family: Family) -> int:
        """Packets to the family's service CIDR that reached the node (i.e.
        left a pod untranslated) since the cluster was built."""
        return escape_count(self.node_netns, family)

    def _build_node(self) -> None:
        build_node_netns(self.node_netns, self.names.bridge,
                         [ADDRESSING[f] for f in self.families])

    def _add_pod(self, name: str, index: int) -> Pod:
        pod = Pod(name=name, index=index, netns=self.names.netns(name),
                  cgroup=self.names.cgroup / name,
                  ips=tuple(ADDRESSING[f].pod_ip(index) for f in self.families))
        add_pod_netns(pod, self.node_netns, self.names.bridge, self.names.veth(index),
                      [ADDRESSING[f] for f in self.families])
        return pod


def build_node_netns(ns: str, bridge: str, plans: Sequence[Addressing],
                     escape_rules: Sequence[str] = ()) -> None:
    """A node's namespace: forwarding on, a bridge that is its pods' gateway
    (one address per plan), `prohibit` routes for the service CIDRs and the
    escape counters (plus `escape_rules`, see escape_counter_ruleset)."""
    run(["ip", "netns", "add", ns])
    # No rate limit on ICMP errors: every escaped packet gets its error at
    # once, so a client that should not have been sent there fails fast.
    sysctl(ns, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
           "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0", *NO_DAD)
    commands = [
        "link set lo up",
        # No STP and no multicast snooping: ports forward at once and IPv6
        # neighbour discovery works without an MLD querier.
        f"link add {bridge} type bridge stp_state 0 forward_delay 0 mcast_snooping 0",
        f"link set {bridge} up",
    ]
    for plan in plans:
        commands.append(f"addr add {plan.gateway}/{plan.node_pod_cidr.prefixlen} "
                        f"dev {bridge}{nodad(plan.family)}")
        commands.append(f"route add prohibit {plan.service_cidr}")
    ip_batch(ns, commands)
    run(in_namespace(ns, ["nft", "-f", "-"]), stdin=escape_counter_ruleset(escape_rules))


def add_pod_netns(pod: Pod, node_netns: str, bridge: str, veth: str,
                  plans: Sequence[Addressing]) -> None:
    """The pod's cgroup and namespace, on a veth (`veth` on the node's side)
    to the node's bridge, one address per plan, the default route via the node."""
    pod.cgroup.mkdir()
    run(["ip", "netns", "add", pod.netns])
    sysctl(pod.netns, *NO_DAD)
    ip_batch(node_netns, [
        f"link add {veth} type veth peer name eth0 netns {pod.netns}",
        f"link set {veth} master {bridge} up",
        # As kubelet's hairpin-veth mode: a pod's packet that the node sends
        # back to it (a NodePort or LB IP hairpin, N16) may leave by the port
        # it came in by, also when br_netfilter NATs it on the bridge.
        f"link set {veth} type bridge_slave hairpin on",
    ])
    commands = ["link set lo up", "link set eth0 up"]
    for plan in plans:
        commands.append(f"addr add {pod.ip(plan.family)}/{plan.node_pod_cidr.prefixlen} "
                        f"dev eth0{nodad(plan.family)}")
        commands.append(f"route add default via {plan.gateway}")
    ip_batch(pod.netns, commands)


# Duplicate address detection would hold new IPv6 addresses back for a second.
NO_DAD = ("net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")


def nodad(family: Family) -> str:
    return " nodad" if family is Family.IPV6 else ""


def ip_batch(netns: str, commands: Sequence[str]) -> None:
    run(["ip", "-n", netns, "-batch", "-"], stdin="\n".join(commands) + "\n")


def escape_count(netns: str, family: Family) -> int:
    """The packets the escape counter of `family` in `netns` has counted (the
    table `escape_counter_ruleset` made there)."""
    counter = ["nft", "-j", "list", "counter", "inet", _ESCAPES_TABLE, escape_counter(family)]
    out = run(in_namespace(netns, counter)).stdout
    counters = [item["counter"] for item in json.loads(out)["nftables"] if "counter" in item]
    return int(counters[0]["packets"])


def escape_counter(family: Family) -> str:
    return f"to_service_cidr_{family.value}"


def escape_counter_ruleset(extra_rules: Sequence[str] = ()) -> str:
    """The node's table of escape counters: packets to the service CIDRs, and
    whatever else `extra_rules` count (rules naming `escape_counter(family)`)."""
    v4, v6 = (escape_counter(f) for f in (Family.IPV4, Family.IPV6))
    rules = "".join(f"    {rule}\n" for rule in extra_rules)
    return f"""
table inet {_ESCAPES_TABLE} {{
  counter {v4} {{ }}
  counter {v6} {{ }}
  chain prerouting {{
    type filter hook prerouting priority raw; policy accept;
    ip daddr {ADDRESSING[Family.IPV4].service_cidr} counter name {v4}
    ip6 daddr {ADDRESSING[Family.IPV6].service_cidr} counter name {v6}
{rules}  }}
}}
"""
