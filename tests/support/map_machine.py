"""The property machine of the map programmer, on any pair of maps: the real
pinned ones (test_map_properties.py, root and BPF) or the dict fakes
(tests/ebpf/programmer/test_service_programmer.py, anywhere).

Hypothesis drives generated streams (services over both families, TCP and UDP
ports, affinity, ExternalIPs, load-balancer IPs and node ports, endpoints
coming and going with their scopes, bad values,
reconnects with deletes missed while disconnected, backend restarts) through
the state model and the eBPF programmer into the maps. Services draw their
ClusterIPs from one small pool, with other spellings of the same map keys
(IPv4-mapped, scope ids), so that they collide: which service port owns a
frontend is part of what the maps and `to-print` must agree on. After every
change set the maps are read back with the datapath reader
(backends/ebpf/maps/contents.py) and compared with the last line `to-print`
wrote for the same ops.

Maps too small for everything (`roomy=False`): each frontend holds what
`to-print` shows or what it held before (a port that does not fit keeps its
old version), never a frontend `to-print` no longer shows. With fakes, a
write can fail part-way: then the maps hold no gap a connect() could reach,
the entry counts are what the maps hold, and the full change set that
follows (what the applier does) makes them what `to-print` shows.
"""

from __future__ import annotations

import io
import ipaddress
import json
from dataclasses import dataclass
from typing import Generic, Protocol, Sized, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.contents import read_contents
from backends.ebpf.programmer.service_programmer import ROUND_PORTS, Capacity, ServiceProgrammer
from backends.ebpf.tools.dump import services_of
from kpng_py.api import localv1 as L
from kpng_py.dataplane.print_backend import PrintBackend
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePort, ServicePortChanges
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from tests.streams.build import endpoint, port, service, sync
from tests.support.ebpf_datapath import programmed_frontends
from tests.support.state import apply_synced
from tests.support.stream_machine import KEYS, SERVICES, StreamMachine

# No "explain" phase: its tracing makes a failing run take minutes. 30 steps
# in "ci": enough for owners to come, go and be taken over; 200 examples
# against the kernel's maps (about 15 s alone, three times that in the loaded
# suite, whose budget is 20 minutes): the same machine runs on the dict fakes
# too (tests/ebpf/programmer/test_service_programmer.py), and the fakes are
# checked against the kernel's maps op for op
# (tests/kernel/ebpf/maps/test_access.py); "long" for more.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
PROFILES = {
    "ci": settings(max_examples=200, stateful_step_count=30, deadline=None, phases=_PHASES,
                   suppress_health_check=[HealthCheck.too_slow]),
    "long": settings(max_examples=10000, stateful_step_count=100, deadline=None, phases=_PHASES,
                     suppress_health_check=[HealthCheck.too_slow]),
}

# One pool for every service, so that they claim each other's frontends;
# every port name has one number. Beside the canonical addresses: spellings
# of the same 16-byte keys (::ffff:10.96.0.1 is 10.96.0.1, fd00::1%a is
# fd00::1) and an address that is none.
V4_CLUSTER_IPS = ["10.96.0.1", "10.96.0.2", "10.96.0.999"]
V6_CLUSTER_IPS = ["fd00::1", "fd00::2", "::ffff:10.96.0.1", "fd00::1%a", "fd00::1%b"]
PORT_NUMBERS = {"": 80, "http": 8080, "dns": 53}
# ExternalIPs and LB IPs from pools that overlap each other and the ClusterIPs;
# node ports shared by two port names (TCP and UDP on one node port too).
EXTERNAL_IPS = ["192.0.2.10", "10.96.0.1"]
LB_IPS = ["198.51.100.1", "2001:db8::1", "192.0.2.10"]
NODE_PORTS = {"": 30080, "http": 30081, "dns": 30080}
TYPES = ["ClusterIP", "NodePort", "LoadBalancer"]
# The address of a node-port frontend in the maps, by to-print's family.
NODE_PORT_VIPS = {"IPv4": "0.0.0.0", "IPv6": "::"}


def with_node_port(mapping: L.PortMapping, name: str) -> L.PortMapping:
    mapping.NodePort = NODE_PORTS[name]
    return mapping


def typed_service(name: str, v4: list[str], v6: list[str], ports: list[tuple], itl: bool,
                  affinity: dict, kind: str, external_ips: list[str],
                  lb_ips: list[str]) -> L.Service:
    svc = service(name, v4=v4, v6=v6, Type=kind,
                  ports=[with_node_port(port(n, PORT_NUMBERS[n], proto, target, target_name), n)
                         if kind != "ClusterIP" else port(n, PORT_NUMBERS[n], proto, target,
                                                          target_name)
                         for n, proto, target, target_name in ports],
                  InternalTrafficToLocal=itl, **affinity)
    for ip in external_ips:
        (svc.IPs.ExternalIPs.V6 if ":" in ip else svc.IPs.ExternalIPs.V4).append(ip)
    for ip in lb_ips if kind == "LoadBalancer" else ():
        (svc.IPs.LoadBalancerIPs.V6 if ":" in ip else svc.IPs.LoadBalancerIPs.V4).append(ip)
    return svc


service_ports = st.lists(
    st.tuples(st.sampled_from(sorted(PORT_NUMBERS)), st.sampled_from([L.TCP, L.UDP]),
              st.sampled_from([0, 9000]), st.sampled_from(["", "web"])),
    unique_by=lambda p: p[:2], min_size=1, max_size=3)
services = st.builds(
    typed_service,
    st.sampled_from(SERVICES), st.lists(st.sampled_from(V4_CLUSTER_IPS), max_size=1),
    st.lists(st.sampled_from(V6_CLUSTER_IPS), max_size=1), service_ports, st.booleans(),
    st.sampled_from([{}, {"ClientIP": L.ClientIPAffinity(TimeoutSeconds=30)}]),
    st.sampled_from(TYPES), st.lists(st.sampled_from(EXTERNAL_IPS), max_size=1),
    st.lists(st.sampled_from(LB_IPS), max_size=2))

# Mostly endpoints that ClusterIP traffic may use, so that slots come and go.
endpoints = st.builds(
    lambda v4, v6, local, internal, overrides: endpoint(v4, v6, local, internal, overrides),
    st.lists(st.sampled_from(["10.244.0.1", "10.244.0.2", "10.244.0.3"]), max_size=2),
    st.lists(st.sampled_from(["fd00:244::1", "fd00:244::2"]), max_size=2),
    st.booleans(), st.sampled_from([True, True, True, False]),
    st.lists(st.tuples(st.sampled_from(sorted(PORT_NUMBERS) + ["web"]),
                       st.sampled_from([8080, 9090])), max_size=2))


K = TypeVar("K")
V = TypeVar("V")


class SizedMap(MapAccess[K, V], Sized, Protocol[K, V]):
    """A map the machine can also count."""


# The kind of map of each: real pinned ones or fakes.
ServicesMap = TypeVar("ServicesMap", bound=SizedMap[maps.ServiceKey, maps.ServiceValue])
EndpointsMap = TypeVar("EndpointsMap", bound=SizedMap[int, maps.EndpointValue])


@dataclass(frozen=True)
class MapPair(Generic[ServicesMap, EndpointsMap]):
    services: ServicesMap
    endpoints: EndpointsMap
    capacity: Capacity

    def clear(self) -> None:
        _clear(self.services)
        _clear(self.endpoints)

    def dump(self) -> dict:
        """The parts of an `ebpf dump` that `lab.programmed_frontends` reads
        (no counters: only programs count)."""
        return {"services": services_of(read_contents(self.services, self.endpoints)),
                "maps": {maps.SERVICES.pin: {"entries": len(self.services)},
                         maps.ENDPOINTS.pin: {"entries": len(self.endpoints)}}}

    def snapshot(self) -> tuple[frozenset[tuple[bytes, bytes]], frozenset[tuple[bytes, bytes]]]:
        """Every entry of both maps, as bytes."""
        return (frozenset((bytes(key), bytes(value)) for key, value in self.services.items()),
                frozenset((key.to_bytes(4, "little"), bytes(value))
                          for key, value in self.endpoints.items()))


def _clear(bpf_map: MapAccess[K, V]) -> None:
    bpf_map.delete_many([key for key, _ in bpf_map.items()])


def _family(address: str) -> int:
    return 6 if address.startswith("[") else 4


def _printed_frontends(sp: dict) -> dict[tuple, str]:
    """(vip, port, protocol) -> kind of each frontend of a printed service
    port (the first list an address is in, as ServicePort.frontend_kind)."""
    frontends: dict[tuple, str] = {}
    for field, kind in (("clusterIPs", "ClusterIP"), ("externalIPs", "ExternalIP"),
                        ("loadBalancerIPs", "LoadBalancerIP")):
        for vip in sp.get(field, ()):
            frontends.setdefault((vip, sp["port"], sp["protocol"]), kind)
    for family in sp.get("nodePortFamilies", ()):
        frontends[(NODE_PORT_VIPS[family], sp["nodePort"], sp["protocol"])] = "NodePort"
    return frontends


def printed_frontends(line: dict) -> dict[tuple, tuple]:
    """(vip, port, protocol) -> (backend addresses, affinity, kind), from
    `to-print`."""
    return {
        frontend: (sorted(ep for ep in sp["endpoints"]
                          if _family(ep) == ipaddress.ip_address(frontend[0]).version),
                   sp["affinityTimeoutSeconds"], kind)
        for sp in line["servicePorts"] for frontend, kind in _printed_frontends(sp).items()
    }


def printed_owners(line: dict) -> dict[tuple, str]:
    """(vip, port, protocol) -> the service port `to-print` shows it for."""
    return {frontend: sp["name"]
            for sp in line["servicePorts"] for frontend in _printed_frontends(sp)}


class MapMachine(StreamMachine):
    """StreamMachine's streams (and its checks of the ServicePortChanges and of
    frontend ownership), with this module's services, applied to maps as
    well. `roomy`: the maps hold every state the streams can make."""

    roomy = True
    # Service ports per round of writes (the programmer's default: every
    # change set of these streams is one round).
    round_ports = ROUND_PORTS

    def __init__(self, pair: MapPair) -> None:
        super().__init__()
        self.maps = pair
        pair.clear()  # a clean start per example
        self.metrics = Metrics()  # one registry: making one costs a millisecond
        self.skips = Skips(self.metrics)
        self.programmer = self._new_programmer()
        self.printed = io.StringIO()
        self.to_print = NodeState(self.skips)
        self.print_backend = PrintBackend(self.printed)
        self._written: dict[str, int] | None = {}  # entries the last apply wrote, by map
        # The maps' frontends and to-print's owners of them after the last sync.
        self._before: dict[tuple, tuple] = {}
        self._owners_before: dict[tuple, str] = {}
        self._leaders_before: dict[tuple, tuple] = {}

    def _new_programmer(self) -> ServiceProgrammer:
        """A programmer as a fresh process makes one: recovering from the maps."""
        return ServiceProgrammer(self.maps.services, self.maps.endpoints, self.maps.capacity,
                                 self.skips, self.round_ports)

    @initialize(svcs=st.lists(services, max_size=3),
                eps=st.lists(st.tuples(st.sampled_from(SERVICES), st.sampled_from(KEYS),
                                       endpoints), max_size=6))
    def populate(self, svcs: list[L.Service], eps: list[tuple[str, str, L.Endpoint]]) -> None:
        """Start from a few services with endpoints, then change them."""
        for svc in svcs:
            self.set_service(svc)
        for svc_name, key, ep in eps:
            self.set_endpoint(svc_name, key, ep)
        self.sync()

    # StreamMachine's rules, drawing from this module's strategies.
    @rule(svc=services)
    def set_service(self, svc: L.Service) -> None:
        super().set_service(svc)

    @rule(svc=st.sampled_from(SERVICES), key=st.sampled_from(KEYS), ep=endpoints)
    def set_endpoint(self, svc: str, key: str, ep: L.Endpoint) -> None:
        super().set_endpoint(svc, key, ep)

    @rule()
    def sync(self) -> None:
        ops = self.pending + [sync()]
        super().sync()
        self.print_backend.apply(apply_synced(self.to_print, ops))
        self.check_maps()

    @rule()
    def restart(self) -> None:
        """A new process (and a new `to-print` beside it): it recovers the
        maps and gets the brain's full state. When nothing changed meanwhile
        and no frontend is contested, that first change set writes nothing:
        ids and entries stay as they were. (A contested frontend goes to the
        claimant first in name order: a new process knows no history.)"""
        unchanged = self.roomy and not self.pending and not _contested(self.claiming)
        before = self.maps.snapshot()
        super().restart()
        self.programmer = self._new_programmer()
        self.to_print = NodeState(self.skips)
        self.sync()
        if unchanged:
            assert self._written == {maps.SERVICES.pin: 0, maps.ENDPOINTS.pin: 0}
            assert self.maps.snapshot() == before

    def _program(self, changes: ServicePortChanges) -> None:
        super()._program(changes)
        self._apply(changes)

    def _apply(self, changes: ServicePortChanges) -> None:
        try:
            self._written = self.programmer.apply(changes).entries_written()
        except OSError:
            self.check_failed_write()
            # What the applier does next: the whole state, as a full change set
            # (again if that fails too: each armed failure fails one write).
            self._apply(self.state.full_changeset())

    def check_failed_write(self) -> None:
        """A write stopped part-way: no connect() finds a gap, and the
        programmer counts what the maps hold."""
        for svc in self.maps.dump()["services"]:
            for slot in svc["backends"]:
                assert slot["address"] is not None, f"{svc} slot {slot} names no endpoint"
                assert slot["serviceId"] == svc["serviceId"], f"{slot} of another service"
        self.check_entry_counts()

    def check_entry_counts(self) -> None:
        counted = (self.programmer.service_entries, self.programmer.endpoint_entries)
        assert counted == (len(self.maps.services), len(self.maps.endpoints))
        capacity = self.maps.capacity
        assert counted[0] <= capacity.services and counted[1] <= capacity.endpoints

    def check_maps(self) -> None:
        line = json.loads(self.printed.getvalue().splitlines()[-1])
        printed, owners = printed_frontends(line), printed_owners(line)
        dump = self.maps.dump()
        programmed = programmed_frontends(dump)
        self.check_entry_counts()
        if self.roomy:
            assert programmed == printed
        else:
            self.check_cramped(programmed, printed, owners)
        self._before, self._owners_before = programmed, owners
        self._leaders_before = _affinity_leaders(dump["services"])

    def check_cramped(self, programmed: dict[tuple, tuple], printed: dict[tuple, tuple],
                      owners: dict[tuple, str]) -> None:
        """Each frontend holds what `to-print` shows or what it held before,
        and keeps it while its service port stays (a new version that does
        not fit waits) unless the frontend that led its affinity group is
        gone (its service id is free: no frontend may keep it as a group);
        a frontend `to-print` no longer shows is gone."""
        for frontend, held in programmed.items():
            assert frontend in printed, f"{frontend} outlived its service port"
            assert held in (printed[frontend], self._before.get(frontend)), frontend
        for frontend in self._before:
            leader = self._leaders_before.get(frontend, frontend)
            if owners.get(frontend) == self._owners_before.get(frontend) and (
                    leader in programmed):
                assert frontend in programmed, f"{frontend} lost what it held"
        if programmed != printed:
            assert self.metrics.registry.get_sample_value(
                "kpng_py_skipped_total", {"reason": "capacity"})

def _affinity_leaders(services: list[dict]) -> dict[tuple, tuple]:
    """(vip, port, protocol) of each frontend with affinity -> that of the
    frontend whose service id is its group (itself, for the leader)."""
    by_id = {svc["serviceId"]: (svc["vip"], svc["port"], svc["protocol"]) for svc in services}
    return {(svc["vip"], svc["port"], svc["protocol"]): by_id[svc["affinityGroup"]]
            for svc in services if svc["affinityGroup"] in by_id}


def _contested(claiming: list[ServicePort]) -> bool:
    """Whether two service ports claim one frontend."""
    frontends = [f for p in claiming for f in p.frontends()]
    return len(frontends) != len(set(frontends))
