"""Property: whatever the brain sends, the BPF maps hold exactly what `to-print`
shows for the same stream, and no map entry outlives its service.

Hypothesis drives generated streams (services over both families, TCP and UDP
ports, affinity, endpoints coming and going with their scopes, bad values,
reconnects with deletes missed while disconnected, backend restarts) through
the state model and the real eBPF programmer into real maps (a dedicated bpffs
directory; no program is attached). Services draw their ClusterIPs from one
small pool, with other spellings of the same map keys (IPv4-mapped, scope
ids), so that they collide: which service port owns a frontend is part of
what the maps and `to-print` must agree on. After every change set the maps
are read back with the `ebpf dump` code and compared with the last line
`to-print` wrote for the same ops. Profiles: "ci" (about a minute) and "long"
(HYPOTHESIS_PROFILE=long).
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
from typing import Iterator

import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import initialize, rule, run_state_machine_as_test

from backends.ebpf import maps
from backends.ebpf.dump import read_dump
from backends.ebpf.loader import Datapath
from kpng_py.api import localv1 as L
from kpng_py.metrics import Metrics
from kpng_py.model import ChangeSet, ServicePort
from kpng_py.print_backend import PrintBackend
from kpng_py.skips import Skips
from kpng_py.state import NodeState
from tests.ebpf.lab import loaded, programmed_frontends, programmer
from tests.streams.build import endpoint, port, service, sync
from tests.test_state_properties import KEYS, SERVICES, StreamMachine

pytestmark = pytest.mark.kernel

# No "explain" phase: its tracing makes a failing run take minutes. 30 steps
# in "ci" (about a minute): enough for owners to come, go and be taken over.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
PROFILES = {
    "ci": settings(max_examples=1000, stateful_step_count=30, deadline=None, phases=_PHASES,
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

service_ports = st.lists(
    st.tuples(st.sampled_from(sorted(PORT_NUMBERS)), st.sampled_from([L.TCP, L.UDP]),
              st.sampled_from([0, 9000]), st.sampled_from(["", "web"])),
    unique_by=lambda p: p[:2], min_size=1, max_size=3)
services = st.builds(
    lambda name, v4, v6, ports, itl, affinity: service(
        name, v4=v4, v6=v6,
        ports=[port(n, PORT_NUMBERS[n], proto, target, target_name)
               for n, proto, target, target_name in ports],
        InternalTrafficToLocal=itl, **affinity),
    st.sampled_from(SERVICES), st.lists(st.sampled_from(V4_CLUSTER_IPS), max_size=1),
    st.lists(st.sampled_from(V6_CLUSTER_IPS), max_size=1), service_ports, st.booleans(),
    st.sampled_from([{}, {"ClientIP": L.ClientIPAffinity(TimeoutSeconds=30)}]))

# Mostly endpoints that ClusterIP traffic may use, so that slots come and go.
endpoints = st.builds(
    lambda v4, v6, local, internal, overrides: endpoint(v4, v6, local, internal, overrides),
    st.lists(st.sampled_from(["10.244.0.1", "10.244.0.2", "10.244.0.3"]), max_size=2),
    st.lists(st.sampled_from(["fd00:244::1", "fd00:244::2"]), max_size=2),
    st.booleans(), st.sampled_from([True, True, True, False]),
    st.lists(st.tuples(st.sampled_from(sorted(PORT_NUMBERS) + ["web"]),
                       st.sampled_from([8080, 9090])), max_size=2))


def _family(address: str) -> int:
    return 6 if address.startswith("[") else 4


def printed_frontends(line: dict) -> dict[tuple, tuple]:
    """(vip, port, protocol) -> (backend addresses, affinity), from `to-print`."""
    return {
        (vip, sp["port"], sp["protocol"]): (
            sorted(ep for ep in sp["endpoints"]
                   if _family(ep) == ipaddress.ip_address(vip).version),
            sp["affinityTimeoutSeconds"])
        for sp in line["servicePorts"] for vip in sp["clusterIPs"]
    }


class MapMachine(StreamMachine):
    """StreamMachine's streams (and its checks of the ChangeSets and of
    frontend ownership), with this module's services, applied to real maps
    as well."""

    def __init__(self, datapath: Datapath) -> None:
        super().__init__()
        self.datapath = datapath
        for pin in (maps.SERVICES.pin, maps.BACKENDS.pin):  # a clean start per example
            bpf_map = datapath.maps[pin]
            bpf_map.delete_many([key for key, _ in bpf_map.items()])
        self.skips = Skips(Metrics())  # one registry: making one costs a millisecond
        self.programmer = programmer(datapath, skips=self.skips)
        self.printed = io.StringIO()
        self.to_print = NodeState(self.skips)
        self.print_backend = PrintBackend(self.printed)
        self._written: dict[str, int] = {}  # entries the last change set wrote, by map

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
        self.print_backend.apply(self.to_print.apply(ops))
        self.check_maps()

    @rule()
    def restart(self) -> None:
        """A new process (and a new `to-print` beside it): it recovers the
        maps and gets the brain's full state. When nothing changed meanwhile
        and no frontend is contested, that first change set writes nothing:
        ids and entries stay as they were. (A contested frontend goes to the
        claimant first in name order: a new process knows no history.)"""
        unchanged = not self.pending and not _contested(self.claiming)
        before = read_dump(self.datapath.config.bpffs_dir)["services"] if unchanged else None
        super().restart()
        self.programmer = programmer(self.datapath, skips=self.skips)
        self.to_print = NodeState(self.skips)
        self.sync()
        if unchanged:
            assert self._written == {maps.SERVICES.pin: 0, maps.BACKENDS.pin: 0}
            assert read_dump(self.datapath.config.bpffs_dir)["services"] == before

    def _program(self, changes: ChangeSet) -> None:
        super()._program(changes)
        self._written = self.programmer.apply(changes).entries_written()

    def check_maps(self) -> None:
        line = json.loads(self.printed.getvalue().splitlines()[-1])
        assert programmed_frontends(read_dump(self.datapath.config.bpffs_dir)) == (
            printed_frontends(line))


def _contested(claiming: list[ServicePort]) -> bool:
    """Whether two service ports claim one frontend."""
    frontends = [f for p in claiming for f in p.frontends()]
    return len(frontends) != len(set(frontends))


@pytest.fixture(scope="module")
def datapath() -> Iterator[Datapath]:
    with loaded(services=4096, backends=4096, reverse_nat=64, affinity=64) as created:
        yield created


def test_maps_hold_what_to_print_shows(datapath: Datapath) -> None:
    run_state_machine_as_test(lambda: MapMachine(datapath),
                              settings=PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")])
