"""Listener state outside the data path: affinity expiry, who may connect
(no root needed: loopback sockets)."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from typing import Iterator

import pytest

from backends.userspace.backend import ServicePortListeners
from backends.userspace.context import (
    Housekeeping,
    NodeAddresses,
    ProxyConfig,
    ProxyContext,
    ProxyStats,
    Tally,
)
from backends.userspace.listener import Listener
from backends.userspace.picker import FrontendPickers, PortAffinity
from backends.userspace.tcp import TcpListener
from backends.userspace.udp import UdpListener
from kpng_py.dataplane.print_backend import service_port_json
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Endpoint, Endpoints, Protocol, ServicePort, ServicePortName
from kpng_py.node.nodeport_addresses import LocalAddressSet
from kpng_py.state.skips import Skips

EP = (Endpoint(ipaddress.ip_address("10.244.1.1"), 8080),)
CLIENT = ipaddress.ip_address("10.244.0.2")
LOOPBACK = ipaddress.ip_address("127.0.0.1")
NODE = ipaddress.ip_address("10.1.0.1")
VIP = ipaddress.ip_address("10.96.0.1")
NAME = ServicePortName("ns", "web", "", Protocol.TCP)


@pytest.fixture
def ctx() -> Iterator[ProxyContext]:
    loop = asyncio.new_event_loop()
    config = ProxyConfig()
    yield ProxyContext(loop, config, ProxyStats(Metrics()), Housekeeping(loop, 1.0),
                       NodeAddresses(config.nodeport_addresses))
    loop.close()


def test_a_closed_service_port_has_no_affinity_left_to_expire(ctx):
    listeners = ServicePortListeners(ctx, NAME, Skips(Metrics()))
    listeners.update(ServicePort(NAME, "ClusterIP", (VIP,), 80, affinity_timeout_seconds=100),
                     lambda ip: True)
    listeners.affinity.remember(CLIENT, EP[0], now=0)
    assert listeners.affinity.expire(now=1)
    # Its affinity can serve no new flow: housekeeping may drop it at once.
    listeners.close()
    assert not listeners.affinity.expire(now=1)


def _listener(ctx: ProxyContext, kind: type[Listener], external: tuple[Endpoint, ...] | None,
              ranges: tuple[str, ...] | None = None) -> Listener:
    ctx.node_addresses.set(LocalAddressSet(frozenset({NODE, LOOPBACK})))
    pickers = FrontendPickers("test", EP, external, PortAffinity(lambda item: None),
                              ctx.node_addresses.is_internal)
    networks = None if ranges is None else tuple(ipaddress.ip_network(r) for r in ranges)
    return kind(ctx, "test", LOOPBACK, 0, pickers, Tally(), networks)


def _admitted(listener: Listener, *clients: str) -> list[bool]:
    return [listener.picker_for(ipaddress.ip_address(c)) is not None for c in clients]


@pytest.mark.parametrize("kind", [TcpListener, UdpListener])
def test_source_ranges_admit_only_their_sources_and_the_node_when_a_range_holds_it(ctx, kind):
    listener = _listener(ctx, kind, EP, ("192.0.2.0/24",))
    listener.start()
    try:
        assert _admitted(listener, "192.0.2.7", "198.51.100.1", str(NODE)) == [True, False, False]
        listener.update(EP, EP, (ipaddress.ip_network("192.0.2.0/24"),
                                 ipaddress.ip_network(f"{NODE}/32")))
        # The node's addresses, the listener's own and loopback: kube-proxy's
        # "allow from the node" when a range holds one of its addresses.
        assert _admitted(listener, "192.0.2.7", "198.51.100.1", str(NODE), "127.0.0.5") == [
            True, False, True, True]
        listener.update(EP, EP, None)
        assert _admitted(listener, "198.51.100.1") == [True]
    finally:
        listener.close()


def test_only_bad_or_other_family_ranges_admit_no_one(ctx):
    listener = _listener(ctx, TcpListener, EP, ("fd00::/8",))
    listener.start()
    try:
        assert listener.allowed_sources() == []
        assert _admitted(listener, "192.0.2.7", str(NODE)) == [False, False]
    finally:
        listener.close()


def test_no_local_endpoint_and_source_ranges_admit_the_node_only_if_a_range_does(ctx):
    """eTP=Local without a local endpoint (N8) keeps outside clients out
    whatever the ranges; the node passes only when the ranges let it."""
    listener = _listener(ctx, TcpListener, (), ("192.0.2.0/24",))
    listener.start()
    try:
        assert _admitted(listener, "192.0.2.7", str(NODE)) == [False, False]
        listener.update(EP, (), (ipaddress.ip_network("192.0.2.0/24"),
                                 ipaddress.ip_network("10.0.0.0/8")))
        assert _admitted(listener, "192.0.2.7", str(NODE), "127.0.0.1") == [False, True, True]
        listener.update(EP, (), None)
        assert _admitted(listener, "192.0.2.7", str(NODE)) == [False, True]
    finally:
        listener.close()


def test_pods_of_the_cluster_cidr_are_served_as_from_the_node():
    """--cluster-cidr (N9): a pod dialling a node port with eTP=Local gets
    the cluster endpoints, and the no-local-endpoint filter lets it in."""
    loop = asyncio.new_event_loop()
    try:
        addresses = NodeAddresses(ProxyConfig().nodeport_addresses,
                                  (ipaddress.ip_network("10.244.0.0/16"),))
        ctx = ProxyContext(loop, ProxyConfig(), ProxyStats(Metrics()), Housekeeping(loop, 1.0),
                           addresses)
        listener = _listener(ctx, TcpListener, ())
        pod, outside = ipaddress.ip_address("10.244.3.4"), ipaddress.ip_address("192.0.2.7")
        assert addresses.is_internal(pod) and not addresses.is_internal(outside)
        assert listener.pickers.for_client(pod) is listener.pickers.inside
        assert listener.pickers.for_client(outside) is listener.pickers.outside
        listener.start()
        try:
            assert _admitted(listener, str(pod), str(outside), str(NODE)) == [True, False, True]
        finally:
            listener.close()
    finally:
        loop.close()


def test_a_bad_source_range_is_reported_once_and_admits_no_one(ctx):
    """Parsed once per value the ranges take, not again by each update (a
    node address change updates every port)."""
    metrics = Metrics()
    listeners = ServicePortListeners(ctx, NAME, Skips(metrics))
    port = ServicePort(NAME, "LoadBalancer", (VIP,), 80, load_balancer_ips=(LOOPBACK,),
                       load_balancer_source_ranges=("not-a-cidr",))

    def skipped() -> float:
        return metrics.registry.get_sample_value("kpng_py_skipped_total",
                                                 {"reason": "bad-ip"}) or 0

    assert [w.source_ranges for w in listeners._wanted(port)] == []  # no endpoints yet
    port = dataclasses.replace(port, endpoints=Endpoints.of(EP))
    wanted = {w.address: w.source_ranges for w in listeners._wanted(port)}
    listeners._wanted(port)
    assert wanted == {VIP: None, LOOPBACK: ()} and skipped() == 1
    changed = dataclasses.replace(port, load_balancer_source_ranges=("192.0.2.0/24", "bad"))
    assert {w.address: w.source_ranges for w in listeners._wanted(changed)}[LOOPBACK] == (
        ipaddress.ip_network("192.0.2.0/24"),)
    assert skipped() == 2


def test_outside_clients_of_etp_local_reach_the_endpoints_to_print_shows(ctx):
    """A remote endpoint that a brain left in the External scope serves no
    client from outside with eTP=Local (as in the eBPF backend's netfilter
    table): the LB IP's listener has `to-print`'s externalEndpoints."""
    here = Endpoint(ipaddress.ip_address("10.244.0.5"), 8080, local=True)
    elsewhere = Endpoint(ipaddress.ip_address("10.244.1.5"), 8080)
    port = ServicePort(NAME, "LoadBalancer", (VIP,), 80, load_balancer_ips=(LOOPBACK,),
                       external_traffic_local=True, endpoints=Endpoints.of([here, elsewhere]))
    listeners = ServicePortListeners(ctx, NAME, Skips(Metrics()))
    assert {w.address: w.external for w in listeners._wanted(port)} == {
        VIP: None, LOOPBACK: (here,)}
    assert service_port_json(port)["externalEndpoints"] == [str(here)]
