"""A throwaway node for kernel tests of the eBPF backend.

    client netns (in the test cgroup)          pods netns
    10.244.0.1/24  fd00:244::1/64  ---veth---  10.244.0.{2..}  fd00:244::{2..}
    no default route: a VIP that escapes        servers.py on every backend address
    translation fails with ENETUNREACH

The client netns has no route out, so traffic to an untranslated ClusterIP
never leaves it (and shows up as a failed connect). Every name is unique per
process and everything is removed on exit, also when a test fails.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from backends.ebpf import maps
from backends.ebpf.loader import Datapath, DatapathConfig, cleanup
from backends.ebpf.programmer import Capacity, ServiceProgrammer
from kpng_py.api import localv1
from kpng_py.metrics import Metrics
from kpng_py.model import (
    ChangeSet,
    Endpoint,
    IPAddress,
    Protocol,
    ServicePort,
    ServicePortName,
)
from kpng_py.skips import Skips
from tests.support.kernel import Cgroup, NetNS, cgroup, netns, require_root_bpf, unique_name

HERE = Path(__file__).parent
BPFFS = Path("/sys/fs/bpf")
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
        self._proc = subprocess.Popen(node.exec_args(sys.executable, str(HERE / "agent.py")),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        # `ip netns exec` remounts /sys, so the agent cannot see the cgroup
        # tree; its pid stays the same through exec, so we move it.
        group.add(self._proc.pid)
        hello = self.call_raw("")
        assert hello["cgroup"].endswith(f"/{group.path.name}"), hello

    def call(self, op: str, **args) -> dict:
        return self.call_raw(json.dumps({"op": op, **args}))

    def call_raw(self, line: str) -> dict:
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())

    def close(self) -> None:
        self._proc.stdin.close()
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
    proc = subprocess.Popen(pods.exec_args(sys.executable, str(HERE / "servers.py"), *specs),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@contextmanager
def lab() -> Iterator[Lab]:
    """Namespaces, servers, a cgroup and a bpffs directory; cleaned up after."""
    with ExitStack() as stack:
        node = stack.enter_context(netns("kpc"))
        pods = stack.enter_context(netns("kpp"))
        group = stack.enter_context(cgroup())
        bpffs_dir = unique_bpffs_dir()
        stack.callback(cleanup, bpffs_dir, group.path)
        _wire(node, pods)
        servers = _start_servers(pods)
        stack.callback(servers.wait)
        stack.callback(servers.kill)
        the_lab = Lab(node, pods, group, bpffs_dir)
        with the_lab._stack:
            yield the_lab


def unique_bpffs_dir() -> Path:
    return BPFFS / unique_name("kpng-py-test-")


@contextmanager
def loaded(bpffs_dir: Path | None = None, **sizes: int) -> Iterator[Datapath]:
    """A loaded (not attached) datapath in a bpffs directory and a cgroup of its
    own; both are removed afterwards."""
    require_root_bpf()
    bpffs_dir = bpffs_dir or unique_bpffs_dir()
    with cgroup() as group:
        try:
            datapath = Datapath.load(DatapathConfig(bpffs_dir, group.path, sizes))
            try:
                yield datapath
            finally:
                datapath.close()
        finally:
            cleanup(bpffs_dir)


def programmer(datapath: Datapath, metrics: Metrics | None = None,
               skips: Skips | None = None) -> ServiceProgrammer:
    """A programmer as a fresh process would make one: recovering from the maps."""
    services = datapath.maps[maps.SERVICES.pin]
    backends = datapath.maps[maps.BACKENDS.pin]
    return ServiceProgrammer(services, backends, Capacity(
        services.info().max_entries, backends.info().max_entries),
        skips or Skips(metrics or Metrics()))


def service_port(name: str, vips: Sequence[str], port: int, backends: Sequence[int] = (),
                 protocol: str = "TCP", target_port: int = 8080, affinity: int = 0,
                 port_name: str = "", families: Sequence[int] = (4, 6),
                 local_only: Sequence[int] | None = None) -> ServicePort:
    """A ClusterIP service port whose endpoints are backend numbers of the lab
    (in each family of `families`). With local_only, only those backends have
    Scopes.Internal (internalTrafficPolicy Local as the brain computes it)."""
    endpoints = tuple(
        Endpoint(backend_ip(i, family), target_port,
                 local=local_only is None or i in local_only,
                 internal=local_only is None or i in local_only)
        for i in backends for family in families)
    return ServicePort(
        name=ServicePortName("default", name, port_name, Protocol(protocol)),
        type="ClusterIP", cluster_ips=tuple(ipaddress.ip_address(v) for v in vips),
        port=port, target_port=target_port, affinity_timeout_seconds=affinity,
        internal_traffic_local=local_only is not None, endpoints=endpoints)


def added(*ports: ServicePort, full: bool = False) -> ChangeSet:
    return ChangeSet(added=ports, full=full)


def updated(old: ServicePort, new: ServicePort) -> ChangeSet:
    return ChangeSet(updated=((old, new),))


def removed(*ports: ServicePort) -> ChangeSet:
    return ChangeSet(removed=ports)


def set_op(ref_set: int, path: str, message) -> localv1.OpItem:
    return localv1.OpItem(Set=localv1.Value(Ref=localv1.Ref(Set=ref_set, Path=path),
                                            Bytes=message.SerializeToString()))


def brain_ops(service: localv1.Service,
              endpoints: Sequence[localv1.Endpoint]) -> list[localv1.OpItem]:
    """A change set as KPNG's brain sends it: the service, its endpoints, Sync."""
    path = f"{service.Namespace}/{service.Name}"
    return ([set_op(localv1.ServicesSet, path, service)]
            + [set_op(localv1.EndpointsSet, f"{path}/ep{i}", ep) for i, ep in enumerate(endpoints)]
            + [localv1.OpItem(Sync=localv1.EmptyOp())])


def programmed_frontends(dump: dict) -> dict[tuple, tuple]:
    """(vip, port, protocol) -> (backend addresses, affinity timeout), from an
    `ebpf dump`, after checking that every map entry belongs to a frontend:
    slots 1..count, each naming its own backend entry of that service, and
    nothing else in either map."""
    frontends = {}
    backend_ids: Counter[int] = Counter()
    for svc in dump["services"]:
        for slot in svc["backends"]:
            assert slot["address"] is not None, f"{svc['vip']} slot {slot} names no backend"
            assert slot["serviceId"] == svc["serviceId"], f"{slot} belongs to another service"
            backend_ids[slot["backendId"]] += 1
        frontends[(svc["vip"], svc["port"], svc["protocol"])] = (
            sorted(slot["address"] for slot in svc["backends"]),
            svc["affinityTimeoutSeconds"])
    assert not [b for b, n in backend_ids.items() if n > 1], "a backend entry in two slots"
    assert len({svc["serviceId"] for svc in dump["services"]}) == len(dump["services"])
    entries = {pin: counts["entries"] for pin, counts in dump["maps"].items()}
    assert entries[maps.SERVICES.pin] == sum(1 + svc["count"] for svc in dump["services"]), (
        "services entries that no master explains")
    assert entries[maps.BACKENDS.pin] == len(backend_ids), "backends no slot names"
    return frontends
