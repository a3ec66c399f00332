"""Hostile brains and bad neighbours against the real datapath: the brain's
stream claims another service's frontend under another spelling, grows a
service past a map's capacity; a neighbour fills a map so that a write
fails. The ops go through the state model (decode and frontend ownership
included) into the real EbpfBackend; a client in the lab's cgroup dials the
ClusterIPs, and the lab's servers say who served it."""

from __future__ import annotations

import errno
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import DatapathConfig, cleanup
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import KeyedFrontend
from backends.ebpf.maps.libbpf import MapFullError
from backends.ebpf.tools.dump import read_dump
from kpng_py.api import localv1 as L
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Frontend, Protocol, ServicePortChanges
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from lab.cgroups import cgroup
from lab.socket_lab import Agent, Lab, backend_ip, target, unique_bpffs_dir
from tests.streams.build import delete, endpoint, port, reset, service, set_endpoint, set_service
from tests.streams.build import sync as sync_op
from tests.support.ebpf import TEST_MAP_SIZES
from tests.support.ebpf_datapath import datapath_of, follower_in, programmed_frontends
from tests.support.state import apply_synced

pytestmark = pytest.mark.kernel


def service_ops(name: str, endpoints: Sequence[int], v4: Sequence[str] = (),
                v6: Sequence[str] = (), ns: str = "default") -> list[L.OpItem]:
    """A service (TCP 80 -> 8080) whose endpoints are the lab's servers of
    these numbers, as the brain sends it."""
    return [set_service(service(name, v4=v4, v6=v6, ns=ns, ports=[port("http", 80, target=8080)]))
            ] + [set_endpoint(ns, name, f"ep{i}", endpoint([str(backend_ip(i))],
                                                           [str(backend_ip(i, 6))], local=True))
                 for i in endpoints]


def deleted_ops(name: str, endpoints: Sequence[int], ns: str = "default") -> list[L.OpItem]:
    return [delete(L.EndpointsSet, f"{ns}/{name}/ep{i}") for i in endpoints] + [
        delete(L.ServicesSet, f"{ns}/{name}")]


class Brain:
    """Change sets from ops, through the state model, into a backend."""

    def __init__(self, backend: EbpfBackend, metrics: Metrics) -> None:
        self.backend = backend
        self.metrics = metrics
        self.state = NodeState(Skips(metrics))

    def send(self, *ops: L.OpItem) -> ServicePortChanges:
        changes = apply_synced(self.state, [*ops, sync_op()])
        self.backend.apply(changes)
        return changes

    def skipped(self, reason: str | None = None) -> float:
        return sum(s.value for m in self.metrics.registry.collect() if m.name == "kpng_py_skipped"
                   for s in m.samples if s.name == "kpng_py_skipped_total"
                   and reason in (None, s.labels["reason"]))

    def written(self) -> float:
        return sum(self.metrics.registry.get_sample_value(
            "kpng_py_map_writes_total", {"map": pin}) or 0
            for pin in (maps.SERVICES.pin, maps.ENDPOINTS.pin))

    def entries(self, pin: str) -> float | None:
        return self.metrics.registry.get_sample_value("kpng_py_map_entries", {"map": pin})


def served(agent: Agent, host: str, family: int, times: int = 40) -> set:
    """Who served `times` connects to host:80 (or the errno of failed ones)."""
    replies = [agent.call("tcp", host=host, port=80, family=family) for _ in range(times)]
    return {r["served_by"] if r["ok"] else errno.errorcode[r["errno"]] for r in replies}


def at(index: int, family: int = 4) -> str:
    ip = backend_ip(index, family)
    return f"{ip}:8080" if family == 4 else f"[{ip}]:8080"


# keep (default/keep, endpoint 1) is programmed first; then an intruder in
# another namespace (endpoint 2) claims the same map key: (keep's ClusterIPs,
# the intruder's, the skip the intruder gets, what dials of keep's VIP must
# reach, dials that nobody may serve).
CONFLICTS = [
    pytest.param({"v4": ["10.96.0.10"]}, {"v6": ["::ffff:10.96.0.10"]}, "bad-ip",
                 [("10.96.0.10", 4, at(1)), ("::ffff:10.96.0.10", 6, at(1))], [],
                 id="v4-mapped"),
    pytest.param({"v4": ["10.96.0.10"], "v6": ["fd00::1%a"]}, {"v6": ["fd00::1%b"]}, "bad-ip",
                 [("10.96.0.10", 4, at(1))], [("fd00::1", 6)], id="scope-ids"),
    pytest.param({"v6": ["fd00::1"]}, {"v6": ["fd00::1%b"]}, "bad-ip",
                 [("fd00::1", 6, at(1, 6))], [], id="scope-id-of-a-plain-vip"),
    pytest.param({"v4": ["10.96.0.10"]}, {"v4": ["10.96.0.10"]}, "frontend-conflict",
                 [("10.96.0.10", 4, at(1))], [], id="same-vip"),
]


@pytest.fixture
def brain(backend: EbpfBackend, metrics: Metrics) -> Iterator[Brain]:
    yield Brain(backend, metrics)
    backend.apply(ServicePortChanges(full=True))  # nothing left for the next case


def assert_keep_is_served(agent: Agent, dials: list, unserved: list) -> None:
    for host, family, by in dials:
        assert served(agent, host, family) == {by}, host
    for host, family in unserved:
        assert served(agent, host, family, times=1) == {"ENETUNREACH"}, host


@pytest.mark.parametrize("keep_ips, intruder_ips, reason, dials, unserved", CONFLICTS)
def test_an_intruder_never_takes_a_frontend_and_its_removal_breaks_nothing(
        the_lab: Lab, agent: Agent, brain: Brain, keep_ips: dict, intruder_ips: dict,
        reason: str, dials: list, unserved: list) -> None:
    brain.send(reset(), *service_ops("keep", [1], **keep_ips))
    assert_keep_is_served(agent, dials, unserved)
    before = brain.skipped()

    brain.send(*service_ops("intruder", [2], ns="other", **intruder_ips))
    assert brain.skipped() - before == 1 and brain.skipped(reason) >= 1
    assert_keep_is_served(agent, dials, unserved)

    brain.send(*deleted_ops("intruder", [2], ns="other"))
    assert_keep_is_served(agent, dials, unserved)

    # A reconnect with only good state: nothing broke, so nothing is written.
    dump, written = read_dump(the_lab.bpffs_dir)["services"], brain.written()
    brain.send(reset(), *service_ops("keep", [1], **keep_ips))
    assert brain.written() == written
    assert read_dump(the_lab.bpffs_dir)["services"] == dump
    assert brain.skipped() - before == 1
    assert_keep_is_served(agent, dials, unserved)


def test_the_waiting_claimant_takes_over_when_the_owner_goes(agent: Agent,
                                                            brain: Brain) -> None:
    brain.send(reset(), *service_ops("keep", [1], v4=["10.96.0.10"]))
    brain.send(*service_ops("intruder", [2], ns="other", v4=["10.96.0.10"]))
    assert served(agent, "10.96.0.10", 4) == {at(1)}
    brain.send(*deleted_ops("keep", [1]))
    assert served(agent, "10.96.0.10", 4) == {at(2)}


@contextmanager
def own_backend(the_lab: Lab, **sizes: int) -> Iterator[tuple[Brain, Agent]]:
    """A backend with maps of these sizes, attached to a cgroup of its own
    with a client in it (the module's backend serves the lab's cgroup)."""
    metrics = Metrics()
    with cgroup() as group:
        config = DatapathConfig(unique_bpffs_dir(), group.path, {**TEST_MAP_SIZES, **sizes})
        ebpf = EbpfBackend(config, metrics, Skips(metrics), follower=follower_in(the_lab))
        try:
            ebpf.setup()
            ebpf.apply(ServicePortChanges(full=True))
            client = Agent(the_lab.node, group)
            try:
                yield Brain(ebpf, metrics), client
            finally:
                client.close()
        finally:
            ebpf.close()
            cleanup(config.bpffs_dir, group.path)


def looped(agent: Agent, host: str, during) -> dict:
    """A connect loop to host:80 while `during()` runs (and a little after)."""
    agent.call("loop_start", targets=[target("tcp", host, 80)])
    try:
        time.sleep(0.3)
        during()
        time.sleep(0.3)
    finally:
        result = agent.call("loop_stop")
    assert result["errors"] == {} and result["wrong_peer"] == 0, result
    assert result["connects"] > 0, result
    return result


def test_a_service_that_outgrows_the_map_keeps_being_served(the_lab: Lab) -> None:
    # grow (1 + 2 entries) and filler (1 + 3) take 7 of 8 services entries.
    with own_backend(the_lab, services=8) as (brain, client):
        brain.send(reset(), *service_ops("grow", [1, 2], v4=["10.96.42.1"]),
                   *service_ops("filler", [1, 2, 3], v4=["10.96.42.2"]))

        def grow_past_the_map() -> None:
            brain.send(*service_ops("grow", [1, 2, 3, 4], v4=["10.96.42.1"]))  # 9 of 8
            time.sleep(0.3)
            # An unrelated change: grow is retried, still does not fit.
            brain.send(*deleted_ops("filler", [3]), *service_ops("filler", [1, 2, 4],
                                                                  v4=["10.96.42.2"]))
            time.sleep(0.3)

        during = looped(client, "10.96.42.1", grow_past_the_map)
        assert set(during["served"]) == {at(1), at(2)}, during
        assert brain.skipped("capacity") == 1
        assert brain.entries(maps.SERVICES.pin) == 7

        after = looped(client, "10.96.42.1",
                       lambda: brain.send(*deleted_ops("filler", [1, 2, 4])))  # frees 4
        assert brain.entries(maps.SERVICES.pin) == 5
        assert set(after["served"]) >= {at(3), at(4)}, after
        assert served(client, "10.96.42.1", 4) == {at(1), at(2), at(3), at(4)}
    assert brain.skipped("capacity") == 1


def test_a_failed_map_write_is_counted_right_and_the_next_full_change_set_repairs_it(
        the_lab: Lab) -> None:
    with own_backend(the_lab, services=8) as (brain, client):
        brain.send(reset(), *service_ops("keep", [1, 2], v4=["10.96.43.1"]))  # 3 entries
        # A bad neighbour writes into our map: slots of a frontend that has
        # no master (no connect() reaches them) fill it to its 8 entries.
        stray = KeyedFrontend(Frontend(backend_ip(99), 80, Protocol.TCP))
        services = datapath_of(brain.backend).maps[maps.SERVICES.pin]
        services.put_many([stray.key(slot) for slot in range(1, 6)],
                          [maps.ServiceValue(id=4242)] * 5)

        with pytest.raises(MapFullError):  # the programmer counts 3 + 2 of 8: the kernel says no
            brain.send(*service_ops("more", [3], v4=["10.96.43.2"]))
        assert brain.entries(maps.SERVICES.pin) == len(services) == 8
        assert served(client, "10.96.43.1", 4) == {at(1), at(2)}

        brain.backend.apply(brain.state.full_changeset())  # what the applier does next
        assert brain.entries(maps.SERVICES.pin) == len(services) == 5
        assert brain.entries(maps.ENDPOINTS.pin) == 3
        assert programmed_frontends(read_dump(datapath_of(brain.backend).config.bpffs_dir)) == {
            ("10.96.43.1", 80, "TCP"): ([at(1), at(2)], 0, "ClusterIP"),
            ("10.96.43.2", 80, "TCP"): ([at(3)], 0, "ClusterIP")}
        assert served(client, "10.96.43.1", 4) == {at(1), at(2)}
        assert served(client, "10.96.43.2", 4) == {at(3)}
