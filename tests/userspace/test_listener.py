"""Listener state outside the data path: who may connect (no root needed:
loopback sockets)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

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
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Endpoint
from kpng_py.node.nodeport_addresses import LocalAddressSet

EP = (Endpoint(ipaddress.ip_address("10.244.1.1"), 8080),)
LOOPBACK = ipaddress.ip_address("127.0.0.1")
NODE = ipaddress.ip_address("10.1.0.1")


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
