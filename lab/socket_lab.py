"""A throwaway node for kernel tests of a socket-level balancer (the eBPF
backend): a client namespace whose processes run in a cgroup of the test's,
and a pods namespace with servers on every backend address.

    client netns (in the test cgroup)          pods netns
    10.244.0.1/24  fd00:244::1/64  ---veth---  10.244.0.{2..}  fd00:244::{2..}
    no default route: a VIP that escapes        peer_server.py on every
    translation fails with ENETUNREACH          backend address

The client netns has no route out, so traffic to an untranslated ClusterIP
never leaves it (and shows up as a failed connect). Every name is unique per
process and everything is removed on exit, also when a test fails.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from kpng_py.model import IPAddress
from lab.cgroups import Cgroup, cgroup
from lab.names import BPFFS_ROOT, unique_name
from lab.netns import NetNS, netns
from lab.procs import start_ready

HERE = Path(__file__).parent
# Removes what the balancer under test pinned in a bpffs directory and attached
# to a cgroup (backends.ebpf.datapath.loader.cleanup).
DataplaneCleanup = Callable[[Path, Path], object]
V4_NET, V6_NET = "10.244.0.", "fd00:244::"
BACKEND_COUNT = 4
# Every backend address serves these.
SERVED = (("tcp", 8080), ("udp", 8080), ("tcp", 9090), ("udp", 5353))


def backend_ip(index: int, family: int = 4) -> IPAddress:
    """Backend number `index` (1-based) of a family."""
    return ipaddress.ip_address(f"{V4_NET if family == 4 else V6_NET}{index + 1}")


def target(proto: str, host: str, port: int) -> dict:
    """One target of an agent's loop: a TCP connect or a UDP query to host:port."""
    return {"proto": proto, "host": host, "port": port,
            "family": ipaddress.ip_address(host).version}


class Agent:
    """A client process in the client netns and the test cgroup."""

    def __init__(self, node: NetNS, group: Cgroup) -> None:
        self._proc = subprocess.Popen(
            node.exec_args(sys.executable, str(HERE / "agent.py"), "--in-cgroup",
                           "--timeout", "2"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None  # piped
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        # `ip netns exec` remounts /sys, so the agent cannot see the cgroup
        # tree; its pid stays the same through exec, so we move it.
        group.add(self._proc.pid)
        hello = self.call_raw("")
        if not hello["cgroup"].endswith(f"/{group.path.name}"):
            self.close()
            raise RuntimeError(f"the agent is in cgroup {hello['cgroup']}, not in "
                               f"{group.path}: its sockets would escape the test's programs")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def call(self, op: str, **args) -> dict:
        return self.call_raw(json.dumps({"op": op, **args}))

    def call_raw(self, line: str) -> dict:
        self._stdin.write(line + "\n")
        self._stdin.flush()
        return json.loads(self._stdout.readline())

    def close(self) -> None:
        self._stdin.close()
        self._proc.wait(timeout=10)


@dataclass
class Lab:
    node: NetNS
    pods: NetNS
    group: Cgroup
    bpffs_dir: Path
    _stack: ExitStack = field(default_factory=ExitStack)

    def agent(self) -> Agent:
        agent = Agent(self.node, self.group)
        self._stack.callback(agent.close)
        return agent


def _wire(node: NetNS, pods: NetNS) -> None:
    outer, inner = unique_name("vn"), unique_name("vp")
    subprocess.run(["ip", "link", "add", outer, "netns", node.name, "type", "veth", "peer",
                    "name", inner, "netns", pods.name], check=True)
    node.ip("addr", "add", f"{V4_NET}1/24", "dev", outer)
    node.ip("addr", "add", f"{V6_NET}1/64", "dev", outer, "nodad")
    node.ip("link", "set", outer, "up")
    for index in range(1, BACKEND_COUNT + 1):
        pods.ip("addr", "add", f"{backend_ip(index, 4)}/24", "dev", inner)
        pods.ip("addr", "add", f"{backend_ip(index, 6)}/64", "dev", inner, "nodad")
    pods.ip("link", "set", inner, "up")
    # Static neighbours: the first IPv6 neighbour solicitation on a veth that
    # just came up goes unanswered, which would cost a 1 s SYN retransmit.
    pods_mac, node_mac = _mac(pods, inner), _mac(node, outer)
    for index in range(1, BACKEND_COUNT + 1):
        for family in (4, 6):
            node.ip("neigh", "replace", str(backend_ip(index, family)), "lladdr", pods_mac,
                    "dev", outer, "nud", "permanent")
    for address in (f"{V4_NET}1", f"{V6_NET}1"):
        pods.ip("neigh", "replace", address, "lladdr", node_mac, "dev", inner, "nud",
                "permanent")


def _mac(ns: NetNS, link: str) -> str:
    return json.loads(ns.ip("-j", "link", "show", link).stdout)[0]["address"]


def _start_servers(pods: NetNS) -> subprocess.Popen:
    specs = [f"{proto}:[{backend_ip(i, family)}]:{port}"
             for i in range(1, BACKEND_COUNT + 1) for family in (4, 6)
             for proto, port in SERVED]
    return start_ready(pods.exec_args(sys.executable, str(HERE / "peer_server.py"), *specs),
                       "peer_server.py")


@contextmanager
def lab(dataplane_cleanup: DataplaneCleanup) -> Iterator[Lab]:
    """Namespaces, servers, a cgroup and a bpffs directory; cleaned up after,
    the dataplane a test installed there included (`dataplane_cleanup(bpffs
    directory, cgroup)`, before the cgroup goes)."""
    with ExitStack() as stack:
        node = stack.enter_context(netns("kpc"))
        pods = stack.enter_context(netns("kpp"))
        group = stack.enter_context(cgroup())
        bpffs_dir = unique_bpffs_dir()
        stack.callback(dataplane_cleanup, bpffs_dir, group.path)
        _wire(node, pods)
        servers = _start_servers(pods)
        stack.callback(servers.wait)
        stack.callback(servers.kill)
        the_lab = Lab(node, pods, group, bpffs_dir)
        with the_lab._stack:
            yield the_lab


def unique_bpffs_dir() -> Path:
    return BPFFS_ROOT / unique_name("kpng-py-test-")
