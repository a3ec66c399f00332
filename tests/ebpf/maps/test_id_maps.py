"""The maps keyed by frontend or endpoint id (backends/ebpf/maps/id_maps.py),
on fake maps (no root): released ids forgotten, strays of a full sync
deleted, service port names written and read back, and a name filter that
matches a whole service or exactly one of its ports."""

from __future__ import annotations

import ctypes as ct

import pytest

from backends.ebpf.maps import id_maps
from backends.ebpf.maps import layout as maps
from kpng_py.model import Protocol, ServicePortName
from tests.support.fake_maps import FakeMap


def counters_holding(*ids: int) -> FakeMap[int, maps.EndpointCounters]:
    counters = FakeMap(ct.c_uint32, maps.EndpointCounters, 16, maps.ENDPOINT_COUNTERS.pin)
    counters.put_many(list(ids), [maps.EndpointCounters(translated=i) for i in ids])
    return counters


def held_ids(bpf_map: FakeMap[int, maps.EndpointCounters]) -> list[int]:
    return [key for key, _ in bpf_map.items()]


def service_names() -> FakeMap[int, maps.ServiceName]:
    return FakeMap(ct.c_uint32, maps.ServiceName, 16, maps.SERVICE_NAMES.pin)


def test_forget_deletes_the_ids_given_and_skips_those_without_an_entry() -> None:
    counters = counters_holding(1, 2, 3)
    id_maps.forget(counters, [2, 7])
    assert held_ids(counters) == [1, 3]
    kept = counters.get(3)
    assert kept is not None and kept.translated == 3


def test_keep_only_deletes_every_other_id_and_counts_them() -> None:
    counters = counters_holding(1, 2, 3, 4)
    assert id_maps.keep_only(counters, {2, 4, 9}) == 2
    assert held_ids(counters) == [2, 4]
    assert id_maps.keep_only(counters, {2, 4}) == 0


def test_names_are_written_as_printed_and_read_back_by_id() -> None:
    names = service_names()
    written = id_maps.write_names(names, [
        (5, ServicePortName("default", "web", "http", Protocol.TCP)),
        (9, ServicePortName("kube-system", "dns", "", Protocol.UDP))])
    assert written == 2
    assert id_maps.read_names(names) == {5: "default/web:http", 9: "kube-system/dns"}


def test_a_name_rewritten_for_a_new_owner_of_the_id_replaces_the_old() -> None:
    names = service_names()
    id_maps.write_names(names, [(5, ServicePortName("default", "web", "http", Protocol.TCP))])
    id_maps.write_names(names, [(5, ServicePortName("default", "api", "", Protocol.TCP))])
    assert id_maps.read_names(names) == {5: "default/api"}


def test_undecodable_bytes_of_a_name_are_replaced_not_raised() -> None:
    """What a neighbour or an older build may have written."""
    names = service_names()
    names.put_many([3], [maps.ServiceName(name=b"default/\xffweb")])
    assert id_maps.read_names(names) == {3: "default/\ufffdweb"}


@pytest.mark.parametrize("service_port, service, matches", [
    ("default/web:http", "default/web", True),
    ("default/web", "default/web", True),
    ("default/web:http", "default/web:http", True),
    ("default/web:https", "default/web:http", False),
    ("default/webby:http", "default/web", False),
    ("other/web:http", "default/web", False),
    (None, "default/web", False),
])
def test_a_service_filter_matches_every_port_of_it_or_exactly_one(
        service_port: str | None, service: str, matches: bool) -> None:
    assert id_maps.is_of_service(service_port, service) is matches
