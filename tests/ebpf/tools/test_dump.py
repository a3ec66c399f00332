"""`kpng-py ebpf dump`'s views of the state of tests/support/ebpf_maps.py in
fake maps (no root): connections per endpoint unknown unless counted, and
filters that match nothing. tests/kernel/ebpf/tools/test_dump.py prints the
same from the kernel's maps."""

from __future__ import annotations

import ipaddress
import json
import re

import pytest

from backends.ebpf.maps.contents import read_contents
from backends.ebpf.tools.dump import ByIds, dump_json, format_text, matching, services_of
from kpng_py.dataplane.contract import NothingMatched
from tests.support.ebpf_maps import fake_maps

BPFFS_DIR = "/sys/fs/bpf/kpng-py-test"
NAMES = {7: "default/web:http", 14: "default/web"}  # as test_dump.write_names


def dump_of(endpoint_counts: dict[int, int] | None) -> dict:
    """A dump as read_dump makes it, of the maps' services only."""
    return {"bpffsDir": BPFFS_DIR, "endpointCounters": endpoint_counts is not None,
            "services": services_of(read_contents(*fake_maps()),
                                    ByIds(names=NAMES, endpoint_counts=endpoint_counts)),
            "nodeAddresses": ["10.0.0.5"], "maps": {}, "links": []}


def slot_connections(dump: dict) -> set[object]:
    return {slot["connections"] for svc in dump["services"] for slot in svc["backends"]}


def test_connections_per_endpoint_not_counted_are_unknown_not_zero() -> None:
    dump = dump_of(None)
    assert slot_connections(json.loads(dump_json(dump))) == {None}
    text = format_text(dump).splitlines()
    assert text[1] == ("connections per backend: n/a (not counted: run to-ebpf with "
                       "--endpoint-counters)")
    assert "    slot 1: backend 101 10.244.0.2:8080" in text


def test_connections_per_endpoint_counted_are_shown_zero_included() -> None:
    dump = dump_of({101: 3})
    assert slot_connections(dump) == {0, 3}
    text = format_text(dump).splitlines()
    assert not any(line.startswith("connections per backend") for line in text)
    assert "    slot 1: backend 101 10.244.0.2:8080, 3 connections" in text


@pytest.mark.parametrize("service, vip, given", [
    ("shop/nope", None, "--service shop/nope"),
    (None, (ipaddress.ip_address("10.96.0.10"), 81), "--vip 10.96.0.10:81"),
    (None, (ipaddress.ip_address("fd00::99"), None), "--vip fd00::99"),
    ("default/web", (ipaddress.ip_address("fd00::10"), 53),
     "--service default/web --vip [fd00::10]:53"),
])
def test_filters_that_match_nothing_say_so(service, vip, given: str) -> None:
    with pytest.raises(NothingMatched, match=(
            f"^not found: no frontend of the datapath under {BPFFS_DIR} matches "
            f"{re.escape(given)}$")):
        matching(dump_of(None), service, vip)


def test_filters_keep_what_they_match() -> None:
    dump = dump_of(None)
    assert matching(dump) == dump
    shown = matching(dump, "default/web", (ipaddress.ip_address("10.96.0.10"), 80))
    assert [(svc["vip"], svc["protocol"]) for svc in shown["services"]] == [("10.96.0.10", "TCP")]
