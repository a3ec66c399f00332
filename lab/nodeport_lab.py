"""The netfilter table's kernel-test lab: the NodePort topology
(lab/multinode.py) with one node, two pods and the external client, and a
worker in the client's and in the node's namespace, so that a test runs the
table (libnftables, conntrack) in the node and its client sockets outside,
in process.

    ext (the "outside")     -- network bridge --  node1 (the table)  -- pods n1-a, n1-b
    172.18.0.100, .101                            172.18.0.11, .21      10.244.1.x
    fd00:172:18::100, ::101                       fd00:172:18::11, ::21 fd00:10:244:1::x
    the VIP range via node1                       prohibit VIP range    peer_server.py

No namespace has a route out of the lab (multinode.py): a packet the table
does not translate dies in the node. The servers tell who they saw (the
client, or the node when masqueraded). Everything is removed on exit, also
when a test fails.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from kpng_py.model import IPAddress
from lab import teardown
from lab.cluster import Family, ip_batch, nodad
from lab.multinode import EXTERNAL, NETWORK, MultiNodeCluster, external_ip, node_ip, node_plan, vip
from lab.names import RunNames
from lab.netns_worker import NetnsWorker
from lab.probe import ask_once
from lab.procs import start_ready
from lab.servers import PEER_SERVER

ip = ipaddress.ip_address
FAMILIES = (Family.IPV4, Family.IPV6)
POD_NAMES = ("n1-a", "n1-b")
# Every pod address serves these (protocol, port).
SERVED = (("tcp", 8080), ("udp", 8080), ("udp", 5353))
# The lab's node, and the number a second address of it on the network
# would have as a node (for --nodeport-addresses; there is no such node).
_NODE = 1
_SECOND_ADDRESS_AS_NODE = 11


CLIENTS = {f.version: (external_ip(f), external_ip(f, second=True)) for f in FAMILIES}
NODE_OUTSIDE = {f.version: node_ip(f, _NODE) for f in FAMILIES}
NODE_OUTSIDE_2 = {f.version: node_ip(f, _SECOND_ADDRESS_AS_NODE) for f in FAMILIES}
NODE_POD_SIDE = {f.version: node_plan(f, _NODE).gateway for f in FAMILIES}
PODS = {f.version: tuple(node_plan(f, _NODE).pod_ip(i) for i in range(len(POD_NAMES)))
        for f in FAMILIES}


def virtual_ip(index: int, family: int = 4) -> IPAddress:
    """An address no interface has (an ExternalIP or LB IP), routed to the
    node by the outside."""
    return vip(Family.IPV4 if family == 4 else Family.IPV6, index)


@dataclass
class NodePortLab:
    node_netns: str
    pod_netns: str  # the first pod's (PODS[f][0])
    outside: NetnsWorker  # runs client sockets in ext
    on_node: NetnsWorker  # runs the table (libnftables, conntrack) in the node


@contextmanager
def nodeport_lab() -> Iterator[NodePortLab]:
    names = RunNames.for_this_process()
    cluster = MultiNodeCluster(names, FAMILIES, names.make_workdir())
    workers: list[NetnsWorker] = []
    servers: list[subprocess.Popen[str]] = []
    try:
        cluster.build([POD_NAMES])
        node = cluster.nodes[0]
        ip_batch(node.netns, [f"addr add {NODE_OUTSIDE_2[f.version]}/{NETWORK[f].prefixlen} "
                              f"dev eth0{nodad(f)}" for f in FAMILIES])
        for pod in cluster.pods.values():
            specs = [f"{proto}:[{pod.ip(f)}]:{port}" for f in FAMILIES for proto, port in SERVED]
            servers.append(start_ready(pod.command([sys.executable, PEER_SERVER, *specs]),
                                       f"{pod.name}'s peer_server"))
        workers.append(NetnsWorker(cluster.names.netns(EXTERNAL)))
        workers.append(NetnsWorker(node.netns))
        yield NodePortLab(node.netns, cluster.pods[POD_NAMES[0]].netns, *workers)
    finally:
        for worker in workers:
            worker.close()
        for server in servers:
            server.kill()
            server.wait(10)
        problems = teardown.remove_run(names)
        if problems:
            raise RuntimeError(f"the netfilter lab left {', '.join(problems)}")


@dataclass(frozen=True)
class Answer:
    """What a probe got: lab/peer_server.py's line (the `served` address,
    the peer it saw), or an `error` (ECONNREFUSED, timeout, EHOSTUNREACH, ...)."""

    served: str = ""
    peer_ip: IPAddress | None = None
    error: str = ""

    @classmethod
    def of(cls, result: dict) -> Answer:
        """From probe.ask_once's result."""
        if not result["ok"]:
            return cls(error=result["errno"])
        return cls(result["pod"], ip(result["seen_as"][0]))


def tcp_probe(dst: IPAddress, port: int, src: IPAddress | None = None,
              timeout: float = 2.0) -> Answer:
    """Connect, read the server's line, close. Run it in the ext worker."""
    return Answer.of(ask_once(str(dst), port, udp=False, connected=False,
                              source=None if src is None else str(src), timeout=timeout))


def udp_probe(dst: IPAddress, port: int, src: IPAddress | None = None, sport: int = 0,
              timeout: float = 2.0) -> Answer:
    """One datagram from a connected socket (so that an ICMP error shows as
    ECONNREFUSED) and its answer. Run it in the ext worker."""
    return Answer.of(ask_once(str(dst), port, udp=True, connected=True,
                              source=None if src is None else str(src), timeout=timeout,
                              source_port=sport))


class Connection:
    """A TCP connection kept open across calls (N18). Make and use it in the
    ext worker."""

    def __init__(self, dst: IPAddress, port: int, timeout: float = 2.0) -> None:
        self._sock = socket.create_connection((str(dst), port), timeout)
        self._file = self._sock.makefile("rb")
        self._file.readline()  # peer_server's line comes first

    def echo(self, text: str) -> str:
        self._sock.sendall(text.encode() + b"\n")
        return self._file.readline().decode().strip()

    def close(self) -> None:
        self._file.close()
        self._sock.close()
