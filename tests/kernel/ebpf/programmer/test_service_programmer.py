"""Map programming against the real kernel maps (no traffic): no-gap writes,
no stale entries, stable ids across restarts, full maps, a frontend given to
two service ports refused."""

from __future__ import annotations

import ctypes as ct
import ipaddress
import logging
from typing import Iterator

import pytest

from backends.ebpf.datapath.loader import Datapath
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import KeyedFrontend
from backends.ebpf.maps.layout import ServiceValue
from backends.ebpf.maps.libbpf import BpfMap
from backends.ebpf.programmer.service_programmer import FrontendClaimedTwice
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Frontend, Protocol, ServicePortChanges, format_host_port
from lab.socket_lab import backend_ip
from tests.support.ebpf_datapath import added, loaded, programmer, removed, service_port, updated

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def datapath() -> Iterator[Datapath]:
    with loaded(services=4096, backends=4096, reverse_nat=1024, affinity=1024) as created:
        yield created


class RecordingMap(BpfMap):
    """The real map, remembering which keys each write touched."""

    def __init__(self, inner: BpfMap) -> None:
        super().__init__(inner.fd, inner.key_type, inner.value_type, inner.name)
        self.touched: list = []

    def put_packed(self, keys, values) -> None:
        self._touch(keys)
        super().put_packed(keys, values)

    def delete_packed(self, keys) -> None:
        self._touch(keys)
        super().delete_packed(keys)

    def _touch(self, keys) -> None:
        size = ct.sizeof(self.key_type)
        self.touched += [self.key_type.from_buffer_copy(keys, offset)
                         for offset in range(0, len(keys), size)]


def frontend_entries(datapath: Datapath, vip: str, port: int,
                     protocol: Protocol = Protocol.TCP) -> dict[int, tuple]:
    """slot -> (id, count, timeout, flags) of one frontend, as the map holds it."""
    frontend = KeyedFrontend(Frontend(ipaddress.ip_address(vip), port, protocol))
    result = {}
    for key, value in datapath.maps[maps.SERVICES.pin].items():
        if bytes(key) == bytes(frontend.key(key.slot)):
            result[key.slot] = (value.id, value.count, value.affinity_timeout, value.flags)
    return result


def skipped(metrics: Metrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": reason})


def endpoints_of(datapath: Datapath, frontend_id: int) -> dict[int, str]:
    return {int(eid): str(e.addr) for eid, e in datapath.maps[maps.ENDPOINTS.pin].items()
            if e.frontend_id == frontend_id}


def test_shrinking_and_removing_leave_no_stale_entries(datapath: Datapath) -> None:
    p = programmer(datapath)
    big = service_port("shrink", ["10.96.1.1", "fd00:96::1:1"], 80, endpoints=[1, 2, 3, 4])
    p.apply(added(big))
    master = frontend_entries(datapath, "10.96.1.1", 80)[0]
    assert master[1] == 4
    assert sorted(endpoints_of(datapath, master[0]).values()) == [
        "10.244.0.2:8080", "10.244.0.3:8080", "10.244.0.4:8080", "10.244.0.5:8080"]

    small = service_port("shrink", ["10.96.1.1", "fd00:96::1:1"], 80, endpoints=[3])
    p.apply(updated(big, small))
    for vip, address in (("10.96.1.1", "10.244.0.4:8080"), ("fd00:96::1:1", "[fd00:244::4]:8080")):
        entries = frontend_entries(datapath, vip, 80)
        assert sorted(entries) == [0, 1] and entries[0][1] == 1
        assert list(endpoints_of(datapath, entries[0][0]).values()) == [address]

    p.apply(removed(small))
    assert frontend_entries(datapath, "10.96.1.1", 80) == {}
    assert frontend_entries(datapath, "fd00:96::1:1", 80) == {}
    assert endpoints_of(datapath, master[0]) == {}


def test_services_sharing_endpoints_never_share_endpoint_entries(datapath: Datapath) -> None:
    p = programmer(datapath)
    a = service_port("share-a", ["10.96.2.1"], 80, endpoints=[1, 2], families=(4,))
    b = service_port("share-b", ["10.96.2.2"], 80, endpoints=[1, 2], families=(4,))
    p.apply(added(a, b))
    id_a = frontend_entries(datapath, "10.96.2.1", 80)[0][0]
    id_b = frontend_entries(datapath, "10.96.2.2", 80)[0][0]
    assert id_a != id_b
    endpoints_b = endpoints_of(datapath, id_b)
    assert set(endpoints_b).isdisjoint(endpoints_of(datapath, id_a))
    before = frontend_entries(datapath, "10.96.2.2", 80)

    p.apply(removed(a))
    assert frontend_entries(datapath, "10.96.2.2", 80) == before
    assert endpoints_of(datapath, id_b) == endpoints_b
    p.apply(removed(b))


def test_ids_survive_a_restart_and_a_full_sync_removes_the_rest(datapath: Datapath) -> None:
    keep = service_port("keep", ["10.96.3.1"], 80, endpoints=[1, 2], families=(4,))
    drop = service_port("drop", ["10.96.3.2"], 80, endpoints=[3], families=(4,))
    programmer(datapath).apply(added(keep, drop))
    master = frontend_entries(datapath, "10.96.3.1", 80)
    kept = endpoints_of(datapath, master[0][0])

    restarted = programmer(datapath)
    restarted.apply(ServicePortChanges(added=(keep,), full=True))
    assert frontend_entries(datapath, "10.96.3.1", 80) == master
    assert endpoints_of(datapath, master[0][0]) == kept
    assert frontend_entries(datapath, "10.96.3.2", 80) == {}
    # A new service gets an id no earlier one used.
    more = service_port("more", ["10.96.3.3"], 80, endpoints=[1], families=(4,))
    restarted.apply(added(more))
    assert frontend_entries(datapath, "10.96.3.3", 80)[0][0] > master[0][0]
    restarted.apply(ServicePortChanges(full=True))
    assert len(datapath.maps[maps.SERVICES.pin]) == 0
    assert len(datapath.maps[maps.ENDPOINTS.pin]) == 0


def test_a_full_sync_removes_entries_no_frontend_explains(datapath: Datapath) -> None:
    svc = service_port("stray", ["10.96.4.1"], 80, endpoints=[1], families=(4,))
    programmer(datapath).apply(added(svc))
    frontend = KeyedFrontend(Frontend(svc.cluster_ips[0], 80, Protocol.TCP))
    services, endpoints = datapath.maps[maps.SERVICES.pin], datapath.maps[maps.ENDPOINTS.pin]
    # What a crash between two write steps can leave: slots above the count,
    # an endpoint no slot names.
    services.put_many([frontend.key(2), frontend.key(5)], [ServiceValue(id=4242)] * 2)
    endpoints.put_many([4242], [maps.EndpointValue(addr=maps.L4Addr.of(svc.cluster_ips[0], 1))])

    grown = service_port("stray", ["10.96.4.1"], 80, endpoints=[1, 2], families=(4,))
    programmer(datapath).apply(ServicePortChanges(added=(grown,), full=True))
    entries = frontend_entries(datapath, "10.96.4.1", 80)
    assert sorted(entries) == [0, 1, 2]
    assert sorted(endpoints_of(datapath, entries[0][0])) == sorted(
        entries[slot][0] for slot in (1, 2))
    assert endpoints.get(4242) is None
    programmer(datapath).apply(ServicePortChanges(full=True))


def test_an_incremental_change_writes_only_what_changed(datapath: Datapath) -> None:
    ports = [service_port(f"many-{i}", [f"10.96.5.{i}"], 80, endpoints=[1, 2], families=(4,))
             for i in range(1, 51)]
    p = programmer(datapath)
    p.apply(ServicePortChanges(added=tuple(ports), full=True))
    recording = {pin: RecordingMap(datapath.maps[pin]) for pin in (maps.SERVICES.pin,
                                                                     maps.ENDPOINTS.pin)}
    p._services, p._endpoints_map = recording[maps.SERVICES.pin], recording[maps.ENDPOINTS.pin]
    grown = service_port("many-7", ["10.96.5.7"], 80, endpoints=[1, 2, 3], families=(4,))
    p.apply(updated(ports[6], grown))
    # One new endpoint, its slot, and the master with the new count.
    assert len(recording[maps.ENDPOINTS.pin].touched) == 1
    assert sorted(k.slot for k in recording[maps.SERVICES.pin].touched) == [0, 3]
    p.apply(ServicePortChanges(full=True))


@pytest.mark.parametrize("owned, intruding", [
    ("10.96.6.1", "10.96.6.1"),
    ("10.96.6.4", "::ffff:10.96.6.4"),
    ("fd00:96::6:5", "fd00:96::6:5%b"),
    ("fd00:96::6:6%a", "fd00:96::6:6%b"),
])
def test_a_frontend_given_to_a_second_service_port_is_refused_however_it_is_spelt(
        datapath: Datapath, owned: str, intruding: str) -> None:
    """Two spellings of one 16-byte key are one frontend. The state gives
    each frontend one owner (and refuses the other spellings): a change set
    that gives an owned frontend to another service port raises, naming
    both, and writes nothing; the owner's entries stay. Once the owner lets
    go, the other takes it."""
    owner = service_port("spelt-owner", [owned], 80, endpoints=[1])
    intruder = service_port("spelt-intruder", [intruding], 80, endpoints=[2])
    p = programmer(datapath)
    p.apply(added(owner))
    canonical = ipaddress.ip_address(owned.split("%")[0])
    before = frontend_entries(datapath, str(canonical), 80)
    endpoints = endpoints_of(datapath, before[0][0])
    pins = (maps.SERVICES.pin, maps.ENDPOINTS.pin)
    recording = [RecordingMap(datapath.maps[pin]) for pin in pins]
    p._services, p._endpoints_map = recording
    with pytest.raises(FrontendClaimedTwice,
                       match="default/spelt-intruder while service port default/spelt-owner"):
        p.apply(added(intruder))
    assert [written.touched for written in recording] == [[], []]
    assert frontend_entries(datapath, str(canonical), 80) == before
    assert endpoints_of(datapath, before[0][0]) == endpoints
    p._services, p._endpoints_map = (datapath.maps[pin] for pin in pins)
    p.apply(removed(owner))
    p.apply(added(intruder))
    after = frontend_entries(datapath, str(canonical), 80)
    assert list(endpoints_of(datapath, after[0][0]).values()) == [
        format_host_port(backend_ip(2, ipaddress.ip_address(intruding.split("%")[0]).version),
                         8080)]
    p.apply(ServicePortChanges(full=True))


def test_a_full_map_skips_that_service_port_only_and_retries_it_later(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    # Each port below needs 4 services entries (master + 3 slots).
    with loaded(services=8, backends=64, reverse_nat=16, affinity=16) as small:
        p = programmer(small, metrics)
        a, b, c = (service_port(name, [vip], 80, endpoints=[1, 2, 3], families=(4,))
                   for name, vip in (("a", "10.96.7.1"), ("b", "10.96.7.2"), ("c", "10.96.7.3")))
        with caplog.at_level(logging.WARNING):
            p.apply(ServicePortChanges(added=(a, b, c), full=True))
        assert frontend_entries(small, "10.96.7.1", 80) and frontend_entries(
            small, "10.96.7.2", 80)
        assert frontend_entries(small, "10.96.7.3", 80) == {}
        assert skipped(metrics, "capacity") == 1
        assert "map services is full" in caplog.text and "--map-size-services" in caplog.text

        p.apply(removed(a))  # frees room: c is programmed by the same apply
        assert sorted(frontend_entries(small, "10.96.7.3", 80)) == [0, 1, 2, 3]
        assert skipped(metrics, "capacity") == 1


def test_a_port_that_outgrows_the_maps_keeps_what_it_had() -> None:
    """Its new version waits (counted once, retried with every change set)
    while the old one serves on untouched; a frontend the new version drops
    is deleted all the same; once a later change set frees room, the new
    version is programmed."""
    metrics = Metrics()
    with loaded(services=12, backends=64, reverse_nat=16, affinity=16) as small:
        def entries_match_the_maps() -> bool:
            return (p.service_entries, p.endpoint_entries) == (
                len(small.maps[maps.SERVICES.pin]), len(small.maps[maps.ENDPOINTS.pin]))

        p = programmer(small, metrics)
        grow = service_port("grow", ["10.96.8.1", "fd00:96::8:1"], 80, endpoints=[1, 2])
        filler = service_port("filler", ["10.96.8.2"], 80, endpoints=[1, 2, 3], families=(4,))
        p.apply(added(grow, filler))  # 3 + 3 + 4 = 10 of 12 entries
        v4 = frontend_entries(small, "10.96.8.1", 80)
        v4_endpoints = endpoints_of(small, v4[0][0])

        # v4 only, 8 endpoints: the v6 frontend goes (7 entries left), and
        # the 6 more slots would make 13.
        grown = service_port("grow", ["10.96.8.1"], 80, endpoints=range(1, 9), families=(4,))
        recording = RecordingMap(small.maps[maps.SERVICES.pin])
        p._services = recording
        p.apply(updated(grow, grown))
        assert frontend_entries(small, "fd00:96::8:1", 80) == {}
        assert {bytes(key)[:20] for key in recording.touched} == {
            bytes(maps.L4Addr.of(ipaddress.ip_address("fd00:96::8:1"), 80))}
        assert frontend_entries(small, "10.96.8.1", 80) == v4
        assert endpoints_of(small, v4[0][0]) == v4_endpoints
        assert skipped(metrics, "capacity") == 1
        assert entries_match_the_maps()

        other = service_port("other", ["10.96.8.3"], 80, endpoints=[1], families=(4,))
        p.apply(added(other))  # an unrelated change: grown is retried, still too big
        assert frontend_entries(small, "10.96.8.1", 80) == v4
        assert skipped(metrics, "capacity") == 1
        assert entries_match_the_maps()

        p.apply(removed(filler))  # frees room: grown is programmed by the same apply
        programmed = frontend_entries(small, "10.96.8.1", 80)
        assert programmed[0][:2] == (v4[0][0], 8)
        assert sorted(endpoints_of(small, v4[0][0]).values()) == [
            f"10.244.0.{i + 1}:8080" for i in range(1, 9)]
        assert skipped(metrics, "capacity") == 1
        assert entries_match_the_maps()
