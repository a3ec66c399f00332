"""`to-print`'s line for one service port: everything that decides what a
backend programs for it (issue 31), each field on a port that has it, and
absent from a port that has none (tests/streams/load-balancer.jsonl shows the
same through the real client)."""

from __future__ import annotations

import dataclasses
import io
import ipaddress

import pytest

from kpng_py.dataplane.print_backend import PrintBackend, service_port_json
from kpng_py.model import (
    Endpoint,
    Endpoints,
    IPFamily,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
    sorted_endpoints,
)

ip = ipaddress.ip_address
NAME = ServicePortName("shop", "web", "https", Protocol.TCP)
BOTH = (IPFamily.V4, IPFamily.V6)
# What the brain sends node-a for eTP=Local: the pods elsewhere are not External.
HERE = Endpoint(ip("10.244.0.5"), 8443, local=True)
ELSEWHERE = Endpoint(ip("10.244.1.5"), 8443, external=False)
ELSEWHERE_V6 = Endpoint(ip("fd00:10:244:1::5"), 8443, external=False)
OUTSIDE_FIELDS = ("externalEndpoints", "externalNoEndpoints", "loadBalancerSourceRanges")


def load_balancer(*endpoints: Endpoint, **fields) -> ServicePort:
    """A dual-stack LoadBalancer port with eTP=Local, a health-check node
    port and source ranges (one with spaces, one bad, none of IPv6)."""
    return dataclasses.replace(ServicePort(
        NAME, "LoadBalancer", (ip("10.96.0.5"), ip("fd00:10:96::5")), 443, target_port=8443,
        node_port=30443, node_port_families=BOTH,
        load_balancer_ips=(ip("2001:db8::5"), ip("198.51.100.5")),
        load_balancer_source_ranges=("203.0.113.0/24", " 192.0.2.0/24 ", "not-a-cidr"),
        health_check_node_port=32100, external_traffic_local=True,
        endpoints=sorted_endpoints(endpoints)), **fields)


def test_a_load_balancer_with_etp_local_shows_what_each_client_reaches() -> None:
    assert service_port_json(load_balancer(ELSEWHERE_V6, ELSEWHERE, HERE)) == {
        "name": "shop/web:https", "protocol": "TCP", "type": "LoadBalancer",
        "clusterIPs": ["10.96.0.5", "fd00:10:96::5"], "port": 443,
        # a client on the node, through any frontend
        "endpoints": ["10.244.0.5:8443", "10.244.1.5:8443", "[fd00:10:244:1::5]:8443"],
        "affinityTimeoutSeconds": 0, "internalTrafficLocal": False,
        "localEndpoints": ["10.244.0.5:8443"],
        "loadBalancerIPs": ["198.51.100.5", "2001:db8::5"],
        "nodePort": 30443, "nodePortFamilies": ["IPv4", "IPv6"],
        "externalTrafficLocal": True, "healthCheckNodePort": 32100,
        # a client outside the node: this node's endpoint, and in IPv6,
        # where only other nodes have one, nothing (dropped)
        "externalEndpoints": ["10.244.0.5:8443"],
        "externalNoEndpoints": {"IPv6": "drop"},
        # the ranges that parse; none of IPv6: its LB IP admits no one
        "loadBalancerSourceRanges": ["192.0.2.0/24", "203.0.113.0/24"],
    }


@pytest.mark.parametrize(("endpoints", "expected"), [
    ((ELSEWHERE,), {"IPv4": "drop", "IPv6": "reject"}),
    ((ELSEWHERE, ELSEWHERE_V6), {"IPv4": "drop", "IPv6": "drop"}),
    ((), {"IPv4": "reject", "IPv6": "reject"}),
])
def test_without_an_external_endpoint_a_family_drops_while_others_have_one_else_rejects(
        endpoints: tuple[Endpoint, ...], expected: dict[str, str]) -> None:
    printed = service_port_json(load_balancer(*endpoints))
    assert printed["externalEndpoints"] == [] and "localEndpoints" not in printed
    assert printed["externalNoEndpoints"] == expected


def test_a_remote_endpoint_a_brain_left_external_does_not_serve_etp_local() -> None:
    """As the netfilter table and the userspace listeners: checked again."""
    leaky = dataclasses.replace(ELSEWHERE, external=True)
    printed = service_port_json(load_balancer(leaky))
    assert printed["externalEndpoints"] == []
    assert printed["externalNoEndpoints"] == {"IPv4": "drop", "IPv6": "reject"}


def test_etp_cluster_serves_outside_from_every_external_endpoint_and_has_no_health_check(
        ) -> None:
    """iTP=Local, eTP=Cluster: the pod elsewhere serves only clients from
    outside; no server answers on the health-check node port."""
    elsewhere = dataclasses.replace(ELSEWHERE, internal=False, external=True)
    printed = service_port_json(load_balancer(elsewhere, external_traffic_local=False,
                                              internal_traffic_local=True))
    assert printed["endpoints"] == []
    assert printed["externalEndpoints"] == ["10.244.1.5:8443"]
    assert printed["externalNoEndpoints"] == {"IPv6": "reject"}
    assert "healthCheckNodePort" not in printed and "externalTrafficLocal" not in printed


def test_a_health_check_node_port_is_shown_only_where_a_server_answers_on_it() -> None:
    node_port = dataclasses.replace(load_balancer(HERE), type="NodePort", load_balancer_ips=())
    assert "healthCheckNodePort" not in service_port_json(node_port)
    unset = load_balancer(HERE, health_check_node_port=0)
    assert "healthCheckNodePort" not in service_port_json(unset)


def test_source_ranges_are_shown_with_lb_ips_only_and_only_bad_ones_admit_no_one() -> None:
    without_lb_ips = service_port_json(load_balancer(HERE, load_balancer_ips=()))
    assert "loadBalancerSourceRanges" not in without_lb_ips
    all_bad = service_port_json(load_balancer(HERE, load_balancer_source_ranges=("bad",)))
    assert all_bad["loadBalancerSourceRanges"] == []
    anyone = service_port_json(load_balancer(HERE, load_balancer_source_ranges=()))
    assert "loadBalancerSourceRanges" not in anyone


def test_an_external_ip_is_served_from_outside_on_a_cluster_ip_port() -> None:
    port = ServicePort(NAME, "ClusterIP", (ip("10.96.0.5"),), 443,
                       external_ips=(ip("192.0.2.9"),), endpoints=Endpoints.of([ELSEWHERE_V6]))
    printed = service_port_json(port)
    assert printed["externalEndpoints"] == [] and printed["externalNoEndpoints"] == {
        "IPv4": "reject"}


def test_a_port_with_cluster_ips_only_has_no_outside_fields() -> None:
    port = ServicePort(NAME, "ClusterIP", (ip("10.96.0.5"),), 443, endpoints=Endpoints.of([HERE]),
                       load_balancer_source_ranges=("192.0.2.0/24",))
    printed = service_port_json(port)
    assert printed["type"] == "ClusterIP" and printed["localEndpoints"] == ["10.244.0.5:8443"]
    assert not set(OUTSIDE_FIELDS) & printed.keys()


def test_a_line_is_the_same_whatever_order_its_lists_came_in() -> None:
    """So that a diff of two lines shows what changed, and only that."""
    out = io.StringIO()
    backend = PrintBackend(out)
    port = load_balancer(HERE, ELSEWHERE, ELSEWHERE_V6)
    backend.apply(ServicePortChanges(added=(port,), full=True))
    backend.apply(ServicePortChanges(added=(dataclasses.replace(
        port, load_balancer_ips=port.load_balancer_ips[::-1],
        load_balancer_source_ranges=port.load_balancer_source_ranges[::-1]),), full=True))
    first, second = out.getvalue().splitlines()
    assert first.replace('"sync": 1,', '"sync": 2,') == second
