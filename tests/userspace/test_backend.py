"""The backend's service ports: which listeners a port wants, and what its
listeners keep once it is closed (no root needed)."""

from __future__ import annotations

import dataclasses
import ipaddress

from backends.userspace.backend import ServicePortListeners
from kpng_py.dataplane.print_backend import service_port_json
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Endpoint, Endpoints, Protocol, ServicePort, ServicePortName
from kpng_py.state.skips import Skips

EP = (Endpoint(ipaddress.ip_address("10.244.1.1"), 8080),)
CLIENT = ipaddress.ip_address("10.244.0.2")
LOOPBACK = ipaddress.ip_address("127.0.0.1")
VIP = ipaddress.ip_address("10.96.0.1")
NAME = ServicePortName("ns", "web", "", Protocol.TCP)


def test_a_closed_service_port_has_no_affinity_left_to_expire(ctx):
    listeners = ServicePortListeners(ctx, NAME, Skips(Metrics()))
    listeners.update(ServicePort(NAME, "ClusterIP", (VIP,), 80, affinity_timeout_seconds=100),
                     lambda ip: True)
    listeners.affinity.remember(CLIENT, EP[0], now=0)
    assert listeners.affinity.expire(now=1)
    # Its affinity can serve no new flow: housekeeping may drop it at once.
    listeners.close()
    assert not listeners.affinity.expire(now=1)


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
