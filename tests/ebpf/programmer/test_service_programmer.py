"""The map programmer on dict fakes of its maps (tests/support/fake_maps.py,
checked against the kernel's by tests/kernel/ebpf/maps/test_access.py): no
root, no BPF.

The property machine of map_machine.py (maps == `to-print`, ownership,
restarts adopting the maps), with writes that fail part-way; and on maps
too small for the streams (a port that does not fit keeps its old
version). Then the cases a stream cannot reach: ids running out, and
change sets that break the state's contract (a frontend given to two
service ports).
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import Packed
from backends.ebpf.maps.contents import KeyedFrontend
from backends.ebpf.programmer.service_programmer import (
    ROUND_PORTS,
    Capacity,
    FrontendClaimedTwice,
    ServiceProgrammer,
)
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Frontend, Protocol, ServicePort, ServicePortChanges
from kpng_py.state.skips import Skips
from lab.socket_lab import backend_ip
from tests.support.ebpf_datapath import added, held, removed, service_port, updated
from tests.support.fake_maps import FakeMap
from tests.support.map_machine import PROFILES, MapMachine, MapPair

# The streams, not the maps, cost the time of an example: the kernel
# machine's profiles (200 examples in "ci", about 15 s per test).
FAKE_PROFILE = PROFILES[os.environ.get("HYPOTHESIS_PROFILE", "ci")]


FakePair = MapPair[FakeMap[maps.ServiceKey, maps.ServiceValue],
                   FakeMap[int, maps.EndpointValue]]


def fake_pair(services: int, endpoints: int, max_id: int | None = None) -> FakePair:
    return MapPair(FakeMap(maps.SERVICES.key, maps.SERVICES.value, services, maps.SERVICES.pin),
                   FakeMap(maps.ENDPOINTS.key, maps.ENDPOINTS.value, endpoints, maps.ENDPOINTS.pin),
                   Capacity(services, endpoints, *(() if max_id is None else (max_id,))))


class FakeMapMachine(MapMachine):
    # A round per service port: writes fail between rounds too.
    round_ports = 1
    # Entries of the services and endpoints maps.
    sizes = (4096, 4096)

    def __init__(self) -> None:
        super().__init__(fake_pair(*self.sizes))

    @rule(pin=st.sampled_from([maps.SERVICES.pin, maps.ENDPOINTS.pin]),
          after=st.integers(0, 12))
    def fail_a_write(self, pin: str, after: int) -> None:
        """The next write to a map but `after` entries fails (EIO)."""
        bpf_map = self.maps.services if pin == maps.SERVICES.pin else self.maps.endpoints
        bpf_map.fail_after(after)


class CrampedMapMachine(FakeMapMachine):
    """Full maps, with writes that fail part-way: the repair reuses what a
    failed write already put (recovery adopts the endpoints it wrote), so a
    port admitted before the failure is not left half-way by one that takes
    its room in the repair."""

    roomy = False
    sizes = (10, 5)


def test_fake_maps_hold_what_to_print_shows() -> None:
    run_state_machine_as_test(FakeMapMachine, settings=FAKE_PROFILE)


def test_a_port_that_does_not_fit_keeps_its_old_version() -> None:
    run_state_machine_as_test(CrampedMapMachine, settings=FAKE_PROFILE)


def skipped(metrics: Metrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": reason})


def programmed(pair: FakePair, vip: str, port: int = 80) -> dict[int, int]:
    """slot -> id (service id of the master, endpoint id of a slot) of vip:port/TCP."""
    frontend = KeyedFrontend(Frontend(ipaddress.ip_address(vip), port, Protocol.TCP))
    return {key.slot: value.id for key, value in pair.services.items()
            if bytes(key) == bytes(frontend.key(key.slot))}


@pytest.mark.parametrize("max_id, endpoints", [(2, [1]), (4, [1, 2])],
                         ids=["service-ids", "endpoint-ids"])
def test_running_out_of_ids_skips_that_port_once_and_programs_the_rest(
        max_id: int, endpoints: list[int]) -> None:
    """Two ports fit the id space, the third is a `capacity` skip, counted
    once however many change sets retry it; the ids its neighbour frees are
    free from the change set after the one that frees them."""
    metrics = Metrics()
    pair = fake_pair(100, 100, max_id=max_id)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(metrics))
    a, b, c = (service_port(name, [f"10.96.9.{i}"], 80, endpoints=endpoints, families=(4,))
               for i, name in enumerate("abc", start=1))
    for _ in range(2):  # a reconnect: the same full change set again
        p.apply(added(a, b, c, full=True))
        assert programmed(pair, "10.96.9.1") and programmed(pair, "10.96.9.2")
        assert programmed(pair, "10.96.9.3") == {}
        assert skipped(metrics, "capacity") == 1
    p.apply(removed(a))
    assert programmed(pair, "10.96.9.1") == programmed(pair, "10.96.9.3") == {}
    p.apply(ServicePortChanges())  # any later change set retries c
    assert sorted(programmed(pair, "10.96.9.3")) == [0, *range(1, len(endpoints) + 1)]
    assert skipped(metrics, "capacity") == 1
    assert (p.service_entries, p.endpoint_entries) == (len(pair.services), len(pair.endpoints))


def test_a_full_sync_is_written_in_rounds_of_service_ports() -> None:
    """Each round's steps are written before the next round's: no batch
    holds more than a round's entries, and the maps end up holding every
    port, as one write would have left them."""
    ports = [service_port(f"p{i}", [f"10.96.{i // 200}.{i % 200 + 1}"], 80,
                          endpoints=[1, 2], families=(4,)) for i in range(ROUND_PORTS * 2 + 1)]
    pair = fake_pair(10000, 10000)
    services, endpoints = pair.services, pair.endpoints
    p = ServiceProgrammer(services, endpoints, pair.capacity, Skips(Metrics()))
    writes = p.apply(added(*ports, full=True))
    service_batches, endpoint_batches = ([w.entries for w in m.writes]
                                         for m in (services, endpoints))
    # Per round: slots, then masters (services); new endpoints (the endpoints map).
    assert max(service_batches) == 2 * ROUND_PORTS and max(endpoint_batches) == 2 * ROUND_PORTS
    assert sorted(b for b in endpoint_batches if b) == [2, 2 * ROUND_PORTS, 2 * ROUND_PORTS]
    assert writes.entries_written() == {maps.SERVICES.pin: 3 * len(ports),
                                        maps.ENDPOINTS.pin: 2 * len(ports)}
    assert (len(services), len(endpoints)) == (3 * len(ports), 2 * len(ports))
    assert (p.service_entries, p.endpoint_entries) == (len(services), len(endpoints))
    # The port planned first in the second round (p1024 is 10.96.5.25) took
    # the first service id and endpoint ids of that round.
    assert programmed(pair, "10.96.5.25") == {0: 1025, 1: 2049, 2: 2050}


def rounds_of_ports(count: int) -> list[ServicePort]:
    return [service_port(f"p{i}", [f"10.96.9.{i + 1}"], 80, endpoints=[1], families=(4,))
            for i in range(count)]


def test_the_rounds_before_the_last_are_written_beside_the_planning() -> None:
    """Three rounds: the first two are written by the writer thread (while
    the next is planned), the last by the caller; a change set of one round
    never leaves the caller's thread."""
    pair = fake_pair(100, 100)
    services = pair.services
    p = ServiceProgrammer(services, pair.endpoints, pair.capacity, Skips(Metrics()),
                          round_ports=2)
    ports = rounds_of_ports(5)
    p.apply(added(*ports, full=True))
    caller = threading.current_thread().name
    # Per round: slots, then masters.
    assert [w.thread == caller for w in services.writes] == [False] * 4 + [True] * 2
    assert len(services) == 2 * len(ports)
    services.writes.clear()
    p.apply(added(service_port("p0", ["10.96.9.1"], 80, endpoints=[2], families=(4,))))
    assert services.writes and {w.thread for w in services.writes} == {caller}


def test_a_round_that_fails_in_the_writer_thread_fails_the_apply_and_is_repaired() -> None:
    """The first round's endpoints cannot be written: apply raises once the
    second round is planned, nothing after the failed write is written, the
    mirror is what the maps hold, and the next full change set writes it all."""
    pair = fake_pair(100, 100)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(Metrics()),
                          round_ports=2)
    ports = rounds_of_ports(5)
    pair.endpoints.fail_after(1)
    with pytest.raises(OSError):
        p.apply(added(*ports, full=True))
    assert (len(pair.services), len(pair.endpoints)) == (0, 1)
    assert (p.service_entries, p.endpoint_entries) == (0, 1)
    p.apply(added(*ports, full=True))
    assert (len(pair.services), len(pair.endpoints)) == (2 * len(ports), len(ports))
    assert (p.service_entries, p.endpoint_entries) == (len(pair.services), len(pair.endpoints))


def test_last_stages_name_the_plan_and_the_write_of_the_last_apply() -> None:
    pair = fake_pair(100, 100)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(Metrics()))
    assert dict(p.last_stages) == {"plan_ms": 0.0, "write_ms": 0.0}
    p.apply(added(service_port("a", ["10.96.9.1"], 80, endpoints=[1], families=(4,))))
    assert set(p.last_stages) == {"plan_ms", "write_ms"}
    assert all(ms > 0 for ms in p.last_stages.values())
    with pytest.raises(TypeError):
        p.last_stages["plan_ms"] = 0.0  # type: ignore[index]


def test_a_failed_round_keeps_what_later_rounds_had_reported() -> None:
    """A port that waits for room is reported once per version; a write
    that fails in a round before the one that retries it does not make the
    repair report it again."""
    metrics = Metrics()
    pair = fake_pair(4, 100)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(metrics),
                          round_ports=1)
    a, c = (service_port(name, [f"10.96.9.{i}"], 80, endpoints=[1], families=(4,))
            for i, name in ((1, "a"), (3, "c")))
    big = service_port("b", ["10.96.9.2"], 80, endpoints=[1, 2, 3], families=(4,))
    p.apply(added(a, c, full=True))
    p.apply(added(big))  # does not fit: waits
    assert skipped(metrics, "capacity") == 1
    moved = service_port("a", ["10.96.9.1"], 80, endpoints=[2], families=(4,))
    pair.endpoints.fail_after(0)  # a's new endpoint: the first round fails
    with pytest.raises(OSError):
        p.apply(updated(a, moved))
    p.apply(added(moved, big, c, full=True))  # the repair; b still does not fit
    assert skipped(metrics, "capacity") == 1
    assert programmed(pair, "10.96.9.2") == {}
    assert (p.service_entries, p.endpoint_entries) == (len(pair.services), len(pair.endpoints))


def test_the_repair_of_a_failed_write_reuses_the_endpoints_it_wrote() -> None:
    """p's update is admitted before a, which waits; its write fails after
    p's first slot names a new endpoint. The repair (a full change set, in
    name order: a first) must not give a the room p was admitted for: p's
    written endpoints are adopted, so p is repaired to its new version, not
    left half-way (found by the cramped property machine)."""
    metrics = Metrics()
    pair = fake_pair(10, 5)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(metrics))

    def port(name: str, octet: int, endpoints: list[int]) -> ServicePort:
        return service_port(name, [f"10.96.9.{octet}"], 80, endpoints=endpoints, families=(4,))

    a1, a2 = port("a", 1, [1]), port("a", 1, [1, 2, 3, 4])
    p1, p2 = port("p", 2, [1]), port("p", 2, [2, 3])
    r = port("r", 3, [1])
    p.apply(added(a1, p1, r, full=True))
    p.apply(updated(a1, a2))  # 3 more endpoints: no room, a keeps its old version
    assert skipped(metrics, "capacity") == 1
    # r goes (2 services deletes), p's first slot is written, then the write fails.
    pair.services.fail_after(3)
    with pytest.raises(OSError):
        p.apply(ServicePortChanges(updated=((p1, p2),), removed=(r,)))
    p.apply(added(a2, p2, full=True))
    slots = programmed(pair, "10.96.9.2")
    assert sorted(held(pair.endpoints, slots[slot]).addr.ip for slot in (1, 2)) == [
        backend_ip(2), backend_ip(3)]
    assert len(slots) == 3
    assert sorted(programmed(pair, "10.96.9.1")) == [0, 1]  # a still waits, as it was
    assert (p.service_entries, p.endpoint_entries) == (len(pair.services), len(pair.endpoints))


def test_a_frontend_that_changes_kind_keeps_its_id_and_gets_its_master_rewritten() -> None:
    """10.96.9.1 moves from the ClusterIPs to the ExternalIPs of one port: one
    key, so the same service id and slots, and the master's kind flag."""
    pair = fake_pair(100, 100)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(Metrics()))
    cluster_ip = service_port("k", ["10.96.9.1"], 80, endpoints=[1], families=(4,))
    external_ip = service_port("k", ["10.96.9.2"], 80, endpoints=[1], families=(4,),
                               external_ips=["10.96.9.1"])
    p.apply(added(cluster_ip))
    key = KeyedFrontend(Frontend(ipaddress.ip_address("10.96.9.1"), 80, Protocol.TCP)).key(0)
    before = held(pair.services, key)
    assert before.flags == 0
    writes = p.apply(updated(cluster_ip, external_ip))
    after = held(pair.services, key)
    assert (after.id, after.count, after.flags) == (before.id, 1, maps.SVC_F_EXTERNAL_IP)
    assert writes.steps()["slots"] == 1  # the new ClusterIP's only: 10.96.9.1 kept its slot


def test_service_ids_are_named_when_their_frontend_gets_an_owner_and_released_when_it_goes(
        ) -> None:
    """What the backend writes to service_names and deletes from it and from
    counters: a new frontend's id with its port, once; none for a change of
    endpoints; after a restart, every recovered frontend the full change
    set claims; the ids of the frontends a change set removes."""
    pair = fake_pair(100, 100)
    web = service_port("web", ["10.96.9.1", "fd00:96::9:1"], 80, endpoints=[1], port_name="http")
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(Metrics()))
    first = p.apply(added(web, full=True))
    ids = {service_id for service_id, _ in first.named_frontend_ids}
    assert [name for _, name in first.named_frontend_ids] == [web.name, web.name]
    assert p.service_port_of_ids() == {service_id: web.name for service_id in ids}
    moved = service_port("web", ["10.96.9.1", "fd00:96::9:1"], 80, endpoints=[2],
                         port_name="http")
    assert p.apply(updated(web, moved)).named_frontend_ids == []
    restarted = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(Metrics()))
    assert restarted.service_port_of_ids() == {service_id: None for service_id in ids}
    claimed = restarted.apply(added(moved, full=True))
    assert {service_id for service_id, _ in claimed.named_frontend_ids} == ids
    gone = restarted.apply(removed(moved))
    assert sorted(gone.released_frontend_ids) == sorted(ids)
    assert restarted.service_port_of_ids() == {}


def test_a_kept_frontend_whose_affinity_leader_is_gone_is_removed() -> None:
    """A port with affinity moves its ClusterIP and its new version does not
    fit: the old ClusterIP (its group's leader) goes, its id is free again,
    so the node port is not kept with that group (a frontend that got the id
    would share its affinity); the port waits for room."""
    pair = fake_pair(6, 100)
    metrics = Metrics()
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(metrics))
    before = service_port("web", ["10.96.9.1"], 80, endpoints=[1, 2], affinity=30,
                          families=(4,), node_port=30080)
    p.apply(added(before, full=True))
    assert programmed(pair, "10.96.9.1") and programmed(pair, "0.0.0.0", 30080)
    after = service_port("web", ["10.96.9.2"], 80, endpoints=[1, 2, 3], affinity=30,
                         families=(4,), node_port=30080)
    p.apply(updated(before, after))
    assert skipped(metrics, "capacity") == 1
    assert not programmed(pair, "10.96.9.1") and not programmed(pair, "0.0.0.0", 30080)
    assert (len(pair.services), len(pair.endpoints)) == (0, 0)


def test_a_frontend_given_to_a_second_service_port_is_a_broken_contract() -> None:
    """The state gives each frontend one owner: a change set that gives an
    owned frontend to another service port raises, naming both, writes
    nothing of it and leaves it waiting for nothing; the owner keeps its
    entries. Once the owner lets go, the other takes it (as the state hands
    it over)."""
    pair = fake_pair(100, 100)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(Metrics()))
    owner = service_port("owner", ["10.96.9.1"], 80, endpoints=[1], families=(4,))
    claimant = service_port("claimant", ["10.96.9.1"], 80, endpoints=[2], families=(4,))
    p.apply(added(owner))
    before = pair.snapshot()
    with pytest.raises(FrontendClaimedTwice,
                       match="10.96.9.1:80/TCP .* default/claimant .* default/owner owns"):
        p.apply(added(claimant))
    assert pair.snapshot() == before
    assert p.not_programmed() == {}
    assert (p.service_entries, p.endpoint_entries) == (len(pair.services), len(pair.endpoints))
    p.apply(removed(owner))
    p.apply(added(claimant))
    slots = programmed(pair, "10.96.9.1")
    assert [held(pair.endpoints, slots[1]).addr.ip] == [backend_ip(2)]
    assert p.service_port_of_ids() == {slots[0]: claimant.name}


@pytest.mark.parametrize("names", [("a-claimant", "b-owner"), ("b-claimant", "a-owner")])
def test_a_full_change_set_with_two_claimants_of_a_frontend_is_refused(
        names: tuple[str, str]) -> None:
    """A reconnect's full state that lists the owner and another claimant
    of its frontend (before or after it) raises; the maps and the mirror
    stay as they were."""
    pair = fake_pair(100, 100)
    p = ServiceProgrammer(pair.services, pair.endpoints, pair.capacity, Skips(Metrics()))
    claimant, owner = (service_port(name, ["10.96.9.1"], 80, endpoints=[i], families=(4,))
                       for i, name in enumerate(names, start=1))
    p.apply(added(owner, full=True))
    before = pair.snapshot()
    with pytest.raises(FrontendClaimedTwice, match=f"default/{names[0]}"):
        p.apply(added(*sorted((claimant, owner), key=lambda sp: sp.name.sort_key()),
                      full=True))
    assert pair.snapshot() == before
    assert (p.service_entries, p.endpoint_entries) == (len(pair.services), len(pair.endpoints))
    assert p.apply(added(owner, full=True)).entries_written() == {
        maps.SERVICES.pin: 0, maps.ENDPOINTS.pin: 0}


class SlowWrites(FakeMap[maps.ServiceKey, maps.ServiceValue]):
    """A fake services map whose batched writes take a while."""

    def put_packed(self, keys: Packed, values: Packed) -> None:
        time.sleep(0.1)
        super().put_packed(keys, values)


def test_a_refused_change_set_rereads_the_maps_after_the_round_being_written() -> None:
    """Rounds of one port: the first round (a new port) is being written by
    the writer thread when the second (a claimant of an owned frontend) is
    planned and refused; the maps are re-read once that write has ended, so
    the mirror counts what they hold."""
    services = SlowWrites(maps.SERVICES.key, maps.SERVICES.value, 100, maps.SERVICES.pin)
    endpoints = FakeMap(maps.ENDPOINTS.key, maps.ENDPOINTS.value, 100, maps.ENDPOINTS.pin)
    p = ServiceProgrammer(services, endpoints, Capacity(100, 100), Skips(Metrics()),
                          round_ports=1)
    p.apply(added(service_port("owner", ["10.96.9.9"], 80, endpoints=[1], families=(4,))))
    first = service_port("first", ["10.96.9.1"], 80, endpoints=[1], families=(4,))
    claimant = service_port("second", ["10.96.9.9"], 80, endpoints=[2], families=(4,))
    with pytest.raises(FrontendClaimedTwice):
        p.apply(added(first, claimant))
    assert (p.service_entries, p.endpoint_entries) == (len(services), len(endpoints)) == (4, 2)
    assert sorted(programmed(MapPair(services, endpoints, Capacity(100, 100)), "10.96.9.1")) == [
        0, 1]
