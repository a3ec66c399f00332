"""What the proxy's listeners share (backends/userspace/context.py): the
tally of a service port, the node's addresses as the listeners see them,
and the housekeeping that expires per-client state."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from backends.userspace.context import Housekeeping, NodeAddresses, ProxyStats, Tally
from kpng_py.metrics.metrics import Metrics
from kpng_py.metrics.service_counters import ServiceCounts
from kpng_py.model import Endpoint, IPAddress, IPFamily
from kpng_py.node.nodeport_addresses import LocalAddressSet, NodePortAddresses
from tests.support.userspace import sample


def _ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


A, B = Endpoint(_ip("10.244.1.1"), 8080), Endpoint(_ip("fd00::1"), 8080)


def test_a_tally_counts_per_endpoint_only_when_asked_and_forgets_gone_ones() -> None:
    plain, per_endpoint = Tally(), Tally(per_endpoint=True)
    for tally in (plain, per_endpoint):
        tally.sent_to(A)
        tally.sent_to(A)
        tally.sent_to(B)
        tally.rejected += 1
        assert tally.counts() == ServiceCounts(3, 1)
    assert plain.endpoints is None
    assert per_endpoint.endpoints == {"10.244.1.1:8080": 2, "[fd00::1]:8080": 1}
    per_endpoint.keep_only([B])
    assert per_endpoint.endpoints == {"[fd00::1]:8080": 1}
    assert per_endpoint.counts() == ServiceCounts(3, 1)  # the port's own counts stay


NODE4, NODE6, OTHER = _ip("10.1.0.1"), _ip("fd00:1::1"), _ip("192.168.9.9")


def test_node_ports_listen_on_the_allowed_node_addresses_of_their_family() -> None:
    addresses = NodeAddresses(NodePortAddresses(cidrs=(ipaddress.ip_network("10.0.0.0/8"),
                                                       ipaddress.ip_network("fd00::/8"))))
    assert addresses.node_port_addresses(IPFamily.V4) == []  # no addresses known yet
    addresses.set(LocalAddressSet(frozenset({NODE4, _ip("10.1.0.2"), NODE6, OTHER})))
    assert addresses.node_port_addresses(IPFamily.V4) == [NODE4, _ip("10.1.0.2")]
    assert addresses.node_port_addresses(IPFamily.V6) == [NODE6]
    assert addresses.local == {NODE4, _ip("10.1.0.2"), NODE6, OTHER}


@pytest.mark.parametrize("client, internal", [
    ("127.0.0.1", True), ("::1", True), ("10.1.0.1", True),  # the node's own
    ("10.96.0.1", True),  # a service address on the backend's interface
    ("10.244.3.4", True),  # a pod of --cluster-cidr
    ("10.245.0.1", False), ("192.0.2.7", False),
])
def test_clients_on_the_node_and_pods_of_the_cluster_cidr_are_internal(
        client: str, internal: bool) -> None:
    addresses = NodeAddresses(NodePortAddresses(), (ipaddress.ip_network("10.244.0.0/16"),))
    addresses.set(LocalAddressSet(frozenset({NODE4})))
    addresses.service_addresses = frozenset({_ip("10.96.0.1")})
    assert addresses.is_internal(_ip(client)) is internal


class Expiry:
    """State that lasts `rounds` expiry rounds."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.asked = 0

    def expire(self, now: float) -> bool:
        self.asked += 1
        return self.asked < self.rounds


def test_housekeeping_expires_each_item_until_it_has_nothing_left() -> None:
    loop = asyncio.new_event_loop()
    try:
        housekeeping = Housekeeping(loop, 0.01)
        short, long = Expiry(1), Expiry(5)
        housekeeping.watch(short)
        housekeeping.watch(long)
        housekeeping.start()
        loop.run_until_complete(asyncio.sleep(0.2))
        housekeeping.stop()
        loop.run_until_complete(asyncio.sleep(0))  # the cancellation runs
    finally:
        loop.close()
    assert (short.asked, long.asked) == (1, 5)  # dropped once empty


def test_proxy_stats_count_errors_by_kind() -> None:
    metrics = Metrics()
    stats = ProxyStats(metrics)
    stats.error("address")
    stats.error("address")
    stats.udp_sessions.inc()
    assert sample(metrics, "kpng_py_dataplane_errors_total", kind="address") == 2
    assert sample(metrics, "kpng_py_map_entries", map="userspace_udp_sessions") == 1
