"""Which UDP conntrack entries go when a service port changes (N17): the
flows a change set leaves stale, and the entries each of them matches."""

from __future__ import annotations

import dataclasses

from backends.ebpf.netfilter.conntrack import StaleFlows, stale_udp_flows
from kpng_py.model import Endpoint, IPFamily, Protocol, ServicePort, ServicePortName
from tests.ebpf.netfilter.helpers import ep, ip, web


def udp(*endpoints: Endpoint) -> ServicePort:
    return dataclasses.replace(web(*endpoints, external_ips=(ip("192.0.2.7"),)),
                               name=ServicePortName("ns", "dns", "", Protocol.UDP))


def test_stale_udp_flows_are_those_of_endpoints_that_went_and_untranslated_ones_at_first() -> None:
    endpoint = (ip("10.244.0.2"), 8080)
    frontends = frozenset({(ip("192.0.2.7"), 80)})
    assert stale_udp_flows(udp(ep(2), ep(3)), udp(ep(3))) == [
        StaleFlows(IPFamily.V4, endpoint, 30080, frontends)]
    assert stale_udp_flows(udp(ep(2)), None) == [
        StaleFlows(IPFamily.V4, endpoint, 30080, frontends)]
    assert stale_udp_flows(None, udp(ep(2))) == stale_udp_flows(udp(), udp(ep(2))) == [
        StaleFlows(IPFamily.V4, None, 30080, frontends)]
    assert stale_udp_flows(udp(ep(2)), udp(ep(2), ep(3))) == []
    assert stale_udp_flows(web(ep(2)), None) == []  # TCP has no such flows
