"""A state of the eBPF maps written entry by entry, bypassing the programmer,
so that it holds what a crash or a neighbour can leave (the cases:
tests/kernel/ebpf/tools/test_dump.py); into the kernel's maps or into dict
fakes (no root)."""

from __future__ import annotations

import ipaddress

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapAccess
from tests.support.fake_maps import FakeMap

SIZES = {"services": 64, "backends": 32, "reverse_nat": 16, "affinity": 8, "node_addresses": 4,
         "counters": 8, "backend_counters": 8, "service_names": 8}
TCP, UDP, SCTP = 6, 17, 132
# Written in this order (the dump sorts by address, port and protocol).
SERVICES = [
    # (vip, port, proto, slot, id, count, affinity timeout, flags)
    ("fd00::10", 53, UDP, 0, 8, 3, 30, maps.SVC_F_AFFINITY),
    ("fd00::10", 53, UDP, 1, 201, 0, 0, 0),
    ("fd00::10", 53, UDP, 3, 203, 0, 0, 0),  # slot 2 is missing; endpoint 203 too
    ("10.96.0.10", 80, TCP, 0, 7, 2, 0, 0),
    ("10.96.0.10", 80, TCP, 1, 101, 0, 0, 0),
    ("10.96.0.10", 80, TCP, 2, 102, 0, 0, 0),
    ("10.96.0.10", 80, TCP, 5, 999, 0, 0, 0),  # above the count
    ("10.96.0.10", 80, UDP, 0, 11, 1, 0, 0),
    ("10.96.0.10", 80, UDP, 1, 111, 0, 0, 0),
    ("10.96.0.11", 443, TCP, 0, 9, 0, 60, 0),  # rejects; a timeout without the flag
    ("10.96.0.12", 80, SCTP, 0, 10, 1, 0, 0),
    ("10.96.0.12", 80, SCTP, 1, 101, 0, 0, 0),  # another service's endpoint
    ("10.96.0.13", 80, UDP, 0, 0, 0, 0, 0),
    ("10.96.0.14", 80, TCP, 0, 7, 1, 0, 0),  # service id 7 twice
    ("10.96.0.14", 80, TCP, 1, 102, 0, 0, 0),
    ("10.96.0.99", 80, TCP, 1, 101, 0, 0, 0),  # no master
    ("203.0.113.7", 80, TCP, 0, 12, 0, 0, maps.SVC_F_EXTERNAL_IP),
    ("198.51.100.7", 80, TCP, 0, 13, 0, 0, maps.SVC_F_LOAD_BALANCER_IP),
    ("0.0.0.0", 30080, TCP, 0, 14, 0, 0, maps.SVC_F_NODE_PORT),
    ("::", 30080, TCP, 0, 15, 0, 0, maps.SVC_F_NODE_PORT | maps.SVC_F_AFFINITY),
    ("10.96.0.15", 80, TCP, 0, 16, 0, 0, maps.SVC_F_NODE_PORT | maps.SVC_F_EXTERNAL_IP),
    ("10.96.0.16", 80, TCP, 0, 17, 0, 0, maps.SVC_F_NODE_PORT),  # not at the wildcard
    ("::", 30081, UDP, 0, 18, 0, 0, 0),  # at the wildcard, without the flag
]
ENDPOINTS = [
    # (id, address, port, service id)
    (101, "10.244.0.2", 8080, 7),
    (102, "10.244.0.3", 8080, 7),
    (111, "10.244.0.2", 5353, 11),
    (201, "fd00:244::2", 5353, 8),
    (300, "10.244.0.9", 1, 42),  # no slot names it
]


def write_state(services: MapAccess[maps.ServiceKey, maps.ServiceValue],
                endpoints: MapAccess[int, maps.EndpointValue]) -> None:
    keys, values = [], []
    for vip, port, proto, slot, value_id, count, timeout, flags in SERVICES:
        prefix = maps.ServiceKey.frontend_prefix(
            maps.L4Addr.of(ipaddress.ip_address(vip), port), proto)
        keys.append(maps.ServiceKey.at_slot(prefix, slot))
        values.append(maps.ServiceValue(id=value_id, count=count, affinity_timeout=timeout,
                                        flags=flags))
    services.put_many(keys, values)
    endpoints.put_many([endpoint_id for endpoint_id, *_ in ENDPOINTS], [
        maps.EndpointValue(addr=maps.L4Addr.of(ipaddress.ip_address(ip), port),
                           frontend_id=frontend_id)
        for _, ip, port, frontend_id in ENDPOINTS])


def fake_maps() -> tuple[FakeMap[maps.ServiceKey, maps.ServiceValue],
                        FakeMap[int, maps.EndpointValue]]:
    services = FakeMap(maps.SERVICES.key, maps.SERVICES.value, SIZES[maps.SERVICES.pin],
                       maps.SERVICES.pin)
    endpoints = FakeMap(maps.ENDPOINTS.key, maps.ENDPOINTS.value, SIZES[maps.ENDPOINTS.pin],
                        maps.ENDPOINTS.pin)
    write_state(services, endpoints)
    return services, endpoints
