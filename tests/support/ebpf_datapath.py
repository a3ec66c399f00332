"""Helpers of the eBPF kernel tests: a loaded datapath, a programmer, the
model objects and brain ops the tests feed it, and a check of what it
programmed. The node itself (namespaces, cgroup, servers, the agent) is the
lab's: lab/socket_lab.py.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import Datapath, DatapathConfig, cleanup
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.node_addresses import FollowerFactory
from backends.ebpf.programmer.service_programmer import Capacity, ServiceProgrammer
from kpng_py.api import localv1
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import (
    Endpoint,
    Endpoints,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
)
from kpng_py.node.netns import in_netns
from kpng_py.node.nodeport_addresses import LocalAddressFollower, LocalAddressSet
from kpng_py.state.skips import Skips
from lab.cgroups import cgroup
from lab.socket_lab import Lab, backend_ip, unique_bpffs_dir
from tests.support.kernel import require_root_bpf

K = TypeVar("K")
V = TypeVar("V")


@contextmanager
def loaded(bpffs_dir: Path | None = None, /, **sizes: int) -> Iterator[Datapath]:
    """A loaded (not attached) datapath in a bpffs directory and a cgroup of its
    own; both are removed afterwards. `sizes`: entries by pin name."""
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


def datapath_of(backend: EbpfBackend) -> Datapath:
    """The datapath of a backend that is set up."""
    assert backend._datapath is not None, "the backend is not set up"
    return backend._datapath


class FollowerIn:
    """The real LocalAddressFollower, started (and so following) in another
    network namespace: a backend in the test process follows the lab's node
    (its client netns), never the machine's own addresses."""

    def __init__(self, netns: Path, on_change: Callable[[LocalAddressSet], None]) -> None:
        self._netns = netns
        self._follower = LocalAddressFollower(on_change)

    def start(self) -> LocalAddressSet:
        return in_netns(self._netns, self._follower.start)

    def stop(self) -> None:
        self._follower.stop()


def follower_in(lab: Lab) -> FollowerFactory:
    return lambda on_change: FollowerIn(Path("/run/netns") / lab.node.name, on_change)


def held(bpf_map: MapAccess[K, V], key: K | int) -> V:
    """The value at a key the test knows the map holds."""
    value = bpf_map.get(key)
    assert value is not None, f"map {bpf_map.name} holds no {key}"
    return value


def programmer(datapath: Datapath, metrics: Metrics | None = None,
               skips: Skips | None = None) -> ServiceProgrammer:
    """A programmer as a fresh process would make one: recovering from the maps."""
    services = datapath.maps[maps.SERVICES.pin]
    endpoints = datapath.maps[maps.ENDPOINTS.pin]
    return ServiceProgrammer(services, endpoints, Capacity(
        services.info().max_entries, endpoints.info().max_entries),
        skips or Skips(metrics or Metrics()))


def service_port(name: str, vips: Sequence[str], port: int, endpoints: Sequence[int] = (),
                 protocol: str = "TCP", target_port: int = 8080, affinity: int = 0,
                 port_name: str = "", families: Sequence[int] = (4, 6),
                 local_only: Sequence[int] | None = None, node_port: int = 0,
                 external_ips: Sequence[str] = (), lb_ips: Sequence[str] = ()) -> ServicePort:
    """A service port whose endpoints are the lab's servers of these numbers
    (lab.socket_lab.backend_ip, in each family of `families`). With
    local_only, only those endpoints have Scopes.Internal
    (internalTrafficPolicy Local as the brain computes it). It is a
    ClusterIP service, a NodePort one with `node_port` (in the families of
    its ClusterIPs, as decode sets them), a LoadBalancer one with `lb_ips`."""
    cluster_ips = tuple(ipaddress.ip_address(v) for v in vips)
    return ServicePort(
        name=ServicePortName("default", name, port_name, Protocol(protocol)),
        type="LoadBalancer" if lb_ips else "NodePort" if node_port else "ClusterIP",
        cluster_ips=cluster_ips, port=port, target_port=target_port,
        affinity_timeout_seconds=affinity, internal_traffic_local=local_only is not None,
        endpoints=Endpoints.of(
            Endpoint(backend_ip(i, family), target_port,
                     local=local_only is None or i in local_only,
                     internal=local_only is None or i in local_only)
            for i in endpoints for family in families),
        node_port=node_port,
        external_ips=tuple(ipaddress.ip_address(v) for v in external_ips),
        load_balancer_ips=tuple(ipaddress.ip_address(v) for v in lb_ips),
        node_port_families=tuple(dict.fromkeys(IPFamily(ip.version) for ip in cluster_ips))
        if node_port else ())


def _check_affinity_groups(services: list[dict]) -> None:
    """With affinity, a frontend's group is the service id of a frontend of
    its family (the first of its service port), and the frontends of one
    named service port and family share it; without affinity, no group
    (lb_maps.h)."""
    by_id = {svc["serviceId"]: svc for svc in services}
    by_port: dict[tuple, set[int]] = {}
    for svc in services:
        group, family = svc["affinityGroup"], ipaddress.ip_address(svc["vip"]).version
        if not svc["affinityTimeoutSeconds"]:
            assert group == 0, f"{svc['vip']} has an affinity group without affinity"
            continue
        leader = by_id.get(group)
        assert leader is not None and ipaddress.ip_address(leader["vip"]).version == family, (
            f"{svc['vip']}: affinity group {group} is no frontend of its family")
        if svc["servicePort"] is not None:
            by_port.setdefault((svc["servicePort"], svc["protocol"], family), set()).add(group)
    several = {port: groups for port, groups in by_port.items() if len(groups) > 1}
    assert not several, f"service ports whose frontends are in several affinity groups: {several}"


def added(*ports: ServicePort, full: bool = False) -> ServicePortChanges:
    return ServicePortChanges(added=ports, full=full)


def updated(old: ServicePort, new: ServicePort) -> ServicePortChanges:
    return ServicePortChanges(updated=((old, new),))


def removed(*ports: ServicePort) -> ServicePortChanges:
    return ServicePortChanges(removed=ports)


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
    """(vip, port, protocol) -> (endpoint addresses, affinity timeout, kind),
    from an `ebpf dump`, after checking that every map entry belongs to a frontend:
    slots 1..count, each naming its own endpoint entry of that service, and
    nothing else in either map. (The dump keeps its historical names:
    `backends`, `backendId`.)"""
    frontends = {}
    endpoint_ids: Counter[int] = Counter()
    for svc in dump["services"]:
        for slot in svc["backends"]:
            assert slot["address"] is not None, f"{svc['vip']} slot {slot} names no endpoint"
            assert slot["serviceId"] == svc["serviceId"], f"{slot} belongs to another service"
            endpoint_ids[slot["backendId"]] += 1
        frontends[(svc["vip"], svc["port"], svc["protocol"])] = (
            sorted(slot["address"] for slot in svc["backends"]),
            svc["affinityTimeoutSeconds"], svc["kind"])
    assert not [e for e, n in endpoint_ids.items() if n > 1], "an endpoint entry in two slots"
    _check_affinity_groups(dump["services"])
    assert len({svc["serviceId"] for svc in dump["services"]}) == len(dump["services"])
    entries = {pin: counts["entries"] for pin, counts in dump["maps"].items()}
    assert entries[maps.SERVICES.pin] == sum(1 + svc["count"] for svc in dump["services"]), (
        "services entries that no master explains")
    assert entries[maps.ENDPOINTS.pin] == len(endpoint_ids), "endpoint entries no slot names"
    return frontends
