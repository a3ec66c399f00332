"""A throwaway node for the netfilter table's kernel tests: traffic from
outside the node to node ports, ExternalIPs and LB IPs.

    ext netns (the "outside")          node netns (the table)        pod netns
    192.0.2.10, .20/24   ---veth---    192.0.2.1, .2/24
    fd00:192::10, ::20/64              fd00:192::1, ::2/64
    routes to the ExternalIP/LB        10.244.1.1/24   ---veth---   10.244.1.{2,3}/24
    networks via the node only         fd00:244:1::1/64             fd00:244:1::{2,3}/64
                                       forwarding on                peer_server.py on each

No namespace has a route anywhere else: a packet the table does not
translate dies in the node (no route), so nothing leaves the lab. The
servers tell who they saw (the client, or the node when masqueraded).
Everything is removed on exit, also when a test fails.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

from kpng_py.model import IPAddress
from lab.names import unique_name
from lab.netns import NetNS, netns
from lab.netns_worker import NetnsWorker
from lab.probe import ask_once
from lab.procs import in_namespace, start_ready

ip = ipaddress.ip_address

CLIENTS = {4: (ip("192.0.2.10"), ip("192.0.2.20")), 6: (ip("fd00:192::10"), ip("fd00:192::20"))}
NODE_OUTSIDE = {4: ip("192.0.2.1"), 6: ip("fd00:192::1")}
# A second node address on the outside link (for --nodeport-addresses).
NODE_OUTSIDE_2 = {4: ip("192.0.2.2"), 6: ip("fd00:192::2")}
NODE_POD_SIDE = {4: ip("10.244.1.1"), 6: ip("fd00:244:1::1")}
PODS = {4: (ip("10.244.1.2"), ip("10.244.1.3")), 6: (ip("fd00:244:1::2"), ip("fd00:244:1::3"))}
# Addresses no interface has: ExternalIPs and LB IPs, routed to the node by the outside.
VIRTUAL_NETS = {4: "198.51.100.0/24", 6: "fd00:198::/64"}
PREFIX = {4: 24, 6: 64}
# Every pod address serves these (protocol, port).
SERVED = (("tcp", 8080), ("udp", 8080), ("udp", 5353))


def virtual_ip(index: int, family: int = 4) -> IPAddress:
    return ip(f"198.51.100.{index}") if family == 4 else ip(f"fd00:198::{index}")


@dataclass
class NodePortLab:
    ext: NetNS
    node: NetNS
    pod: NetNS
    outside: NetnsWorker  # runs client sockets in ext
    on_node: NetnsWorker  # runs the table (libnftables, conntrack) in node


def _veth(left: NetNS, right: NetNS) -> tuple[str, str]:
    a, b = unique_name("vn"), unique_name("vp")
    left.ip("link", "add", a, "type", "veth", "peer", "name", b, "netns", right.name)
    left.ip("link", "set", a, "up")
    right.ip("link", "set", b, "up")
    return a, b


def _address(ns: NetNS, link: str, address: IPAddress) -> None:
    # nodad: an IPv6 address usable at once, not after duplicate detection.
    extra = ["nodad"] if address.version == 6 else []
    ns.ip("addr", "add", f"{address}/{PREFIX[address.version]}", "dev", link, *extra)


def _wire(ext: NetNS, node: NetNS, pod: NetNS) -> None:
    ext_link, node_outside = _veth(ext, node)
    node_pods, pod_link = _veth(node, pod)
    for family in (4, 6):
        for client in CLIENTS[family]:
            _address(ext, ext_link, client)
        _address(node, node_outside, NODE_OUTSIDE[family])
        _address(node, node_outside, NODE_OUTSIDE_2[family])
        _address(node, node_pods, NODE_POD_SIDE[family])
        for address in PODS[family]:
            _address(pod, pod_link, address)
        flag = ["-6"] if family == 6 else []
        ext.ip(*flag, "route", "add", VIRTUAL_NETS[family], "via", str(NODE_OUTSIDE[family]))
        pod.ip(*flag, "route", "add", "default", "via", str(NODE_POD_SIDE[family]))
    node.run("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")


@contextmanager
def nodeport_lab() -> Iterator[NodePortLab]:
    with ExitStack() as stack:
        ext, node, pod = (stack.enter_context(netns("kpnf")) for _ in range(3))
        _wire(ext, node, pod)
        specs = [f"{proto}:[{a}]:{port}" for family in (4, 6) for a in PODS[family]
                 for proto, port in SERVED]
        server = start_ready(in_namespace(pod.name, [sys.executable, "-m", "lab.peer_server",
                                                     *specs]), "the pods' peer_server")
        stack.callback(server.wait, 10)
        stack.callback(server.kill)
        outside = NetnsWorker(ext.name)
        stack.callback(outside.close)
        on_node = NetnsWorker(node.name)
        stack.callback(on_node.close)
        yield NodePortLab(ext, node, pod, outside, on_node)


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
