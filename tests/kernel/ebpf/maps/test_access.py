"""The fake maps of the programmer tests (tests/support/fake_maps.py) behave as
the kernel's for every operation the programmer uses: the same generated
sequences of batch writes and deletes, with keys that come back, keys that
are missing and writes that find the map full, go to a real pinned map and to
a fake of its size, and after each step both raised the same (MapFullError
or nothing) and hold the same entries. And each of the two keeps what
backends/ebpf/maps/access.py promises of a full map."""

from __future__ import annotations

import ctypes as ct
import ipaddress
from typing import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.ebpf.datapath.loader import Datapath
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapAccess, MapFullError
from backends.ebpf.maps.libbpf import BpfMap
from tests.support.ebpf_datapath import loaded
from tests.support.fake_maps import FakeMap

pytestmark = pytest.mark.kernel

SIZE = 6  # entries of each map: small, so that sequences fill it often


@pytest.fixture(scope="module")
def datapath() -> Iterator[Datapath]:
    with loaded(services=SIZE, backends=SIZE, reverse_nat=8, affinity=8) as created:
        yield created


def service_key(index: int) -> maps.ServiceKey:
    vip = maps.L4Addr.of(ipaddress.ip_address(f"10.96.0.{index % 3 + 1}"), 80)
    return maps.ServiceKey.at_slot(maps.ServiceKey.frontend_prefix(vip, 6), index // 3)


def service_value(n: int) -> maps.ServiceValue:
    return maps.ServiceValue(id=n, count=n % 4, affinity_timeout=n * 7, flags=n % 2)


def endpoint_value(n: int) -> maps.EndpointValue:
    return maps.EndpointValue(addr=maps.L4Addr.of(ipaddress.ip_address(f"10.244.0.{n % 250}"),
                                                  8000 + n), frontend_id=n)


# Per map: how an index becomes a key and a number a value.
LAYOUTS = {
    maps.SERVICES.pin: (service_key, service_value),
    maps.ENDPOINTS.pin: (lambda index: index + 1, endpoint_value),
}

# Twice as many keys as the map holds: writes find it full, deletes miss.
indexes = st.integers(0, 2 * SIZE - 1)
operations = st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(indexes, st.integers(1, 1000)), max_size=8)),
    st.tuples(st.just("delete"), st.lists(indexes, max_size=8)),
), min_size=1, max_size=12)


def contents(bpf_map: MapAccess) -> dict[bytes, bytes]:
    return {bytes(ct.c_uint32(key)) if isinstance(key, int) else bytes(key): bytes(value)
            for key, value in bpf_map.items()}


def packed_contents(bpf_map: BpfMap | FakeMap) -> dict[bytes, bytes]:
    """`contents`, from the map read back packed."""
    keys, values = bpf_map.read_packed()
    key_size, value_size = ct.sizeof(bpf_map.key_type), ct.sizeof(bpf_map.value_type)
    assert len(keys) // key_size == len(values) // value_size
    return {keys[i:i + key_size]: values[j:j + value_size]
            for i, j in zip(range(0, len(keys), key_size), range(0, len(values), value_size))}


def outcome(bpf_map: MapAccess, operation: tuple) -> str:
    """What one operation raised: nothing or a MapFullError."""
    kind, args = operation
    try:
        if kind == "put":
            bpf_map.put_many([key for key, _ in args], [value for _, value in args])
        else:
            bpf_map.delete_many(args)
    except MapFullError:
        return "full"
    return "ok"


def fake_of(pin: str) -> FakeMap[maps.ServiceKey, maps.ServiceValue] | FakeMap[
        int, maps.EndpointValue]:
    if pin == maps.SERVICES.pin:
        return FakeMap(maps.SERVICES.key, maps.SERVICES.value, SIZE, pin)
    return FakeMap(maps.ENDPOINTS.key, maps.ENDPOINTS.value, SIZE, pin)


@pytest.mark.parametrize("pin", sorted(LAYOUTS))
def test_the_fake_maps_do_what_the_kernel_maps_do(datapath: Datapath, pin: str) -> None:
    real = datapath.maps[pin]
    key_of, value_of = LAYOUTS[pin]

    @settings(max_examples=150, deadline=None)
    @given(operations)
    def run(sequence: list[tuple]) -> None:
        real.delete_many([key for key, _ in real.items()])
        fake = fake_of(pin)
        for kind, args in sequence:
            operation = (kind, [(key_of(i), value_of(n)) for i, n in args] if kind == "put"
                         else [key_of(i) for i in args])
            assert outcome(real, operation) == outcome(fake, operation), operation
            assert contents(real) == contents(fake) == packed_contents(real) == packed_contents(
                fake), operation
            assert len(contents(fake)) == len(fake) <= SIZE

    run()


@pytest.mark.parametrize("kind", ["kernel", "fake"])
def test_a_full_map_takes_replacements_and_stops_at_the_first_new_key(
        datapath: Datapath, kind: str) -> None:
    """What backends/ebpf/maps/access.py promises, on each of its two
    implementations: updating a held key needs no room, a batch write stops
    with MapFullError at the first new key without room (the entries before
    it written, none after), and a batch delete skips keys not held."""
    bpf_map: MapAccess[int, maps.EndpointValue] = (
        datapath.maps[maps.ENDPOINTS.pin] if kind == "kernel"
        else FakeMap(ct.c_uint32, maps.EndpointValue, SIZE, maps.ENDPOINTS.pin))
    bpf_map.delete_many([key for key, _ in bpf_map.items()])
    held = list(range(1, SIZE + 1))
    bpf_map.put_many(held, [endpoint_value(key) for key in held])
    with pytest.raises(MapFullError):
        bpf_map.put_many([1, SIZE + 1, 2], [endpoint_value(n) for n in (101, 102, 103)])
    frontend_ids = {key: value.frontend_id for key, value in bpf_map.items()}
    assert frontend_ids == {**{key: key for key in held}, 1: 101}
    bpf_map.delete_many([SIZE + 1, 3, SIZE + 2])
    assert sorted(key for key, _ in bpf_map.items()) == [key for key in held if key != 3]
