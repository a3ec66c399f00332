"""The datapath reader (backends/ebpf/maps/contents.py) on the state of
tests/kernel/ebpf/tools/test_dump.py, in fake maps: what the programmer adopts from it and what
it deletes as strays (no root)."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import (
    TARGET_SIZE,
    KeyedFrontend,
    Programmed,
    packed_slot_ids,
    read_contents,
)
from backends.ebpf.programmer.service_programmer import Capacity, ServiceProgrammer
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Endpoint, Endpoints, Frontend, IPAddress, Protocol, ServicePortChanges
from kpng_py.state.skips import Skips
from tests.support.ebpf_datapath import held
from tests.support.ebpf_maps import ENDPOINTS, SERVICES, SIZES, fake_maps

CAPACITY = Capacity(SIZES[maps.SERVICES.pin], SIZES[maps.ENDPOINTS.pin])


def frontend(vip: str, port: int, protocol: Protocol) -> KeyedFrontend:
    return KeyedFrontend(Frontend(ipaddress.ip_address(vip), port, protocol))


def target(ip: str, port: int) -> bytes:
    return maps.packed_l4addr(ipaddress.ip_address(ip), port)


def slot_of(key: maps.ServiceKey) -> tuple[str, int, int, int]:
    return str(key.vip.ip), key.vip.host_port, key.proto, key.slot


def test_a_master_is_adopted_with_its_slots_and_everything_else_is_a_stray() -> None:
    recovered = read_contents(*fake_maps()).recovered()
    assert recovered.frontends == {
        frontend("10.96.0.10", 80, Protocol.TCP): Programmed(
            7, packed_slot_ids((101, 102)),
            target("10.244.0.2", 8080) + target("10.244.0.3", 8080), 0),
        frontend("10.96.0.10", 80, Protocol.UDP): Programmed(
            11, packed_slot_ids((111,)), target("10.244.0.2", 5353), 0),
        frontend("10.96.0.11", 443, Protocol.TCP): Programmed(9, b"", b"", 0),  # no affinity flag
        # Slot 2 is missing, slot 3 names no endpoint: both to be rewritten.
        frontend("fd00::10", 53, Protocol.UDP): Programmed(
            8, packed_slot_ids((201, 0, 0)),
            target("fd00:244::2", 5353) + bytes(2 * TARGET_SIZE), 30),
        # Each kind keeps its flag. Flags no programmer writes are adopted as
        # they are: the next change set with the frontend rewrites its master
        # (the kind is part of it), a full one without it deletes it.
        frontend("203.0.113.7", 80, Protocol.TCP): Programmed(
            12, b"", b"", 0, maps.SVC_F_EXTERNAL_IP),
        frontend("198.51.100.7", 80, Protocol.TCP): Programmed(
            13, b"", b"", 0, maps.SVC_F_LOAD_BALANCER_IP),
        frontend("0.0.0.0", 30080, Protocol.TCP): Programmed(
            14, b"", b"", 0, maps.SVC_F_NODE_PORT),
        frontend("::", 30080, Protocol.TCP): Programmed(15, b"", b"", 0, maps.SVC_F_NODE_PORT),
        frontend("10.96.0.15", 80, Protocol.TCP): Programmed(
            16, b"", b"", 0, maps.SVC_F_NODE_PORT | maps.SVC_F_EXTERNAL_IP),
        frontend("10.96.0.16", 80, Protocol.TCP): Programmed(
            17, b"", b"", 0, maps.SVC_F_NODE_PORT),
        frontend("::", 30081, Protocol.UDP): Programmed(18, b"", b"", 0),
    }
    assert sorted(set(recovered.adopted_endpoint_ids())) == [101, 102, 111, 201]
    assert recovered.stray_endpoints == (300,)
    assert sorted(map(slot_of, recovered.stray_keys)) == sorted([
        ("10.96.0.10", 80, 6, 5),  # above the count
        ("10.96.0.12", 80, 132, 0), ("10.96.0.12", 80, 132, 1),  # SCTP
        ("10.96.0.13", 80, 17, 0),  # service id 0
        ("10.96.0.14", 80, 6, 0), ("10.96.0.14", 80, 6, 1),  # service id 7 again
        ("10.96.0.99", 80, 6, 1),  # no master
    ])


def test_the_programmer_counts_what_it_recovered_and_a_full_sync_deletes_it_all() -> None:
    services, endpoints = fake_maps()
    p = ServiceProgrammer(services, endpoints, CAPACITY, Skips(Metrics()))
    # Counted with the missing slot 2 of fd00::10, which the next change set
    # that keeps the frontend writes: room for it is kept.
    assert (p.service_entries, p.endpoint_entries) == (len(SERVICES) + 1, len(ENDPOINTS))
    p.apply(ServicePortChanges(full=True))
    assert (len(services), len(endpoints)) == (0, 0) == (p.service_entries, p.endpoint_entries)


def test_an_endpoint_of_an_adopted_service_that_no_slot_names_is_adopted_with_it() -> None:
    """What a write that failed between steps 1 and 5 leaves: the next change
    set that programs the frontend reuses the endpoint or deletes it."""
    services, endpoints = fake_maps()
    endpoints.put_many([400], [maps.EndpointValue(
        addr=maps.L4Addr.of(ipaddress.ip_address("10.244.0.7"), 8080), frontend_id=11)])
    recovered = read_contents(services, endpoints).recovered()
    assert recovered.unnamed == {frontend("10.96.0.10", 80, Protocol.UDP): {400: bytes(
        held(endpoints, 400))}}
    assert 400 in recovered.adopted_endpoint_ids() and recovered.stray_endpoints == (300,)
    p = ServiceProgrammer(services, endpoints, CAPACITY, Skips(Metrics()))
    p.apply(ServicePortChanges(full=True))
    assert (len(services), len(endpoints)) == (0, 0) == (p.service_entries, p.endpoint_entries)


def test_a_slot_naming_an_endpoint_of_another_affinity_group_is_missing() -> None:
    """What a write that failed between a group's new endpoints and its master
    leaves: the slot is rewritten, the endpoint is reused or deleted by the
    value it holds."""
    services, endpoints = fake_maps()
    endpoints.put_many([101], [maps.EndpointValue(
        addr=maps.L4Addr.of(ipaddress.ip_address("10.244.0.2"), 8080), frontend_id=7,
        affinity_group=7)])
    recovered = read_contents(services, endpoints).recovered()
    tcp = frontend("10.96.0.10", 80, Protocol.TCP)
    assert recovered.frontends[tcp].slots == (0, 102)
    assert list(recovered.unnamed[tcp]) == [101] and len(recovered.unnamed) == 1
    p = ServiceProgrammer(services, endpoints, CAPACITY, Skips(Metrics()))
    assert 101 in p.endpoint_ids() and p.endpoint_targets()[101][0] == 7


def _not_v4_mapped(ip: IPAddress) -> bool:
    return isinstance(ip, ipaddress.IPv4Address) or ip.ipv4_mapped is None


_ORDINARY_IPS = st.ip_addresses(v=4) | st.ip_addresses(v=6).filter(_not_v4_mapped)


@settings(max_examples=200, deadline=None)
@given(_ORDINARY_IPS, st.integers(0, 65535))
def test_a_packed_target_reads_back_as_its_address_and_port(ip: IPAddress, port: int) -> None:
    """The lb_l4addr bytes the programmer packs are the struct's fields:
    the address as the maps hold it (IPv4 mapped), the port in network
    order, no padding; a state model's packed endpoint is its target."""
    addr = maps.L4Addr.from_buffer_copy(maps.packed_l4addr(ip, port))
    assert (addr.ip, addr.host_port, addr.pad) == (ip, port, 0)
    assert bytes(addr.addr) == maps.packed_address(ip)
    target, = Endpoints.of([Endpoint(ip, port)]).targets(ip.version)
    assert target + maps.L4ADDR_PAD == maps.packed_l4addr(ip, port)
