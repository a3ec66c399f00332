"""The `node_addresses` map's writer (backends/ebpf/maps/node_addresses.py) on
a fake map (no root): it starts from what the pinned map holds, writes only
the difference, keeps IPv4 and its IPv6-mapped form as one entry, and after
a failed write knows what the map holds. The programs' use of the map:
tests/kernel/ebpf/test_node_ports.py."""

from __future__ import annotations

import errno
import ipaddress
import logging

import pytest

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapFullError
from backends.ebpf.maps.node_addresses import NodeAddressMap
from kpng_py.model import IPAddress
from kpng_py.runtime.logs import record_fields
from tests.support.fake_maps import FakeMap

NODE = ipaddress.ip_address("192.168.1.10")
SECOND = ipaddress.ip_address("10.0.0.10")
V6 = ipaddress.ip_address("fd00::10")

NodeAddresses = FakeMap[maps.NodeAddressKey, maps.NodeAddressValue]


def node_addresses(*held: IPAddress, size: int = 8) -> NodeAddresses:
    bpf_map = FakeMap(maps.NodeAddressKey, maps.NodeAddressValue, size, maps.NODE_ADDRESSES.pin)
    bpf_map.put_many([maps.NodeAddressKey.of(ip) for ip in held],
                     [maps.NodeAddressValue() for _ in held])
    return bpf_map


def addresses_in(bpf_map: NodeAddresses) -> set[IPAddress]:
    return {key.ip for key, _ in bpf_map.items()}


def test_only_the_difference_is_written() -> None:
    bpf_map = node_addresses()
    writer = NodeAddressMap(bpf_map)
    assert writer.set_to([NODE, V6]) == 2
    assert writer.set_to([NODE, SECOND]) == 2  # SECOND added, V6 deleted
    assert addresses_in(bpf_map) == {NODE, SECOND}
    assert writer.set_to([SECOND, NODE]) == 0
    assert len(writer) == 2


def test_a_restarted_writer_starts_from_what_the_pinned_map_holds() -> None:
    bpf_map = node_addresses(NODE, V6)
    writer = NodeAddressMap(bpf_map)
    assert len(writer) == 2
    assert writer.set_to([NODE]) == 1
    assert addresses_in(bpf_map) == {NODE}


def test_an_ipv4_address_and_its_mapped_form_are_one_entry() -> None:
    bpf_map = node_addresses(NODE)
    writer = NodeAddressMap(bpf_map)
    assert writer.set_to([NODE, ipaddress.ip_address(f"::ffff:{NODE}")]) == 0
    assert len(bpf_map) == 1


def test_after_a_full_map_the_writer_knows_what_was_written() -> None:
    """The write stops at the first address without room: those before it
    are in the map, and the next change does not write them again."""
    bpf_map = node_addresses(NODE, size=2)
    writer = NodeAddressMap(bpf_map)
    with pytest.raises(MapFullError):
        writer.set_to([NODE, SECOND, V6])
    held = addresses_in(bpf_map)
    assert len(held) == 2 and NODE in held
    assert len(writer) == 2
    assert writer.set_to(held) == 0


def test_after_a_failed_delete_the_writer_knows_what_is_left() -> None:
    bpf_map = node_addresses(NODE, SECOND, V6)
    writer = NodeAddressMap(bpf_map)
    bpf_map.fail_after(1)
    with pytest.raises(OSError) as failed:
        writer.set_to([])
    assert failed.value.errno == errno.EIO
    assert len(writer) == len(bpf_map) == 2
    assert writer.set_to([]) == 2
    assert len(bpf_map) == 0


def test_a_change_is_logged_with_the_addresses_added_and_removed(
        caplog: pytest.LogCaptureFixture) -> None:
    writer = NodeAddressMap(node_addresses(NODE))
    with caplog.at_level(logging.INFO, logger="backends.ebpf.maps.node_addresses"):
        writer.set_to([NODE])
        writer.set_to([V6])
    (record,) = caplog.records
    assert record_fields(record) == {"added": [str(V6)], "removed": [str(NODE)], "addresses": 1}
