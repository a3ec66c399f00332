"""Kubernetes API objects mapped to the brain's values
(kpng_py/brain/apiobjects.py), each function on the objects it is given:
what a Service, an EndpointSlice and a Node become, what kube-proxy leaves
out, and the ObjectError that names what cannot be mapped."""

from __future__ import annotations

from typing import Any

import pytest

from kpng_py.api import localv1
from kpng_py.brain.apiobjects import (
    LeftOut,
    ObjectError,
    left_out_service,
    left_out_slice,
    node_of,
    service_of,
    slice_endpoints,
    slice_service,
    with_endpoints,
)
from kpng_py.brain.statefile import Node
from tests.support.kube_objects import api_node, api_service, api_slice


def _service(obj: dict[str, Any]) -> localv1.Service:
    return localv1.Service.FromString(service_of(obj).service)


def test_a_load_balancer_service_keeps_what_a_proxy_programs() -> None:
    obj = api_service("web", "10.96.0.1", target="http", type="LoadBalancer",
                      clusterIPs=["10.96.0.1", "fd00:96::0001"], externalIPs=["192.0.2.1"],
                      sessionAffinity="ClientIP", externalTrafficPolicy="Local",
                      healthCheckNodePort=30100, loadBalancerSourceRanges=[" 10.0.0.0/8 "])
    obj["status"]["loadBalancer"]["ingress"] = [
        {"ip": "198.51.100.1"}, {"ip": "198.51.100.2", "ipMode": "Proxy"}, {"hostname": "lb"}]
    entry = service_of(obj)
    assert (entry.path, entry.external_traffic_local, entry.internal_traffic_local) == (
        "default/web", True, False)
    service = localv1.Service.FromString(entry.service)
    assert (list(service.IPs.ClusterIPs.V4), list(service.IPs.ClusterIPs.V6)) == (
        ["10.96.0.1"], ["fd00:96::1"])  # as the state file's reader writes addresses
    assert list(service.IPs.ExternalIPs.V4) == ["192.0.2.1"]
    assert list(service.IPs.LoadBalancerIPs.V4) == ["198.51.100.1"]  # not the proxying one
    assert list(service.IPFilters) == [localv1.IPFilter(
        TargetIPs=localv1.IPSet(V4=["198.51.100.1"]), SourceRanges=["10.0.0.0/8"])]
    assert list(service.Ports) == [localv1.PortMapping(
        Name="http", Protocol=localv1.TCP, Port=80, TargetPortName="http")]
    assert service.ClientIP.TimeoutSeconds == 10800  # the API's default
    assert service.HealthCheckNodePort == 30100


def test_a_numeric_target_port_given_as_text_is_a_number() -> None:
    assert _service(api_service("web", "10.96.0.1", target="8080")).Ports[0].TargetPort == 8080


@pytest.mark.parametrize("change, why", [
    ({"metadata": {"name": "web", "labels": {"service.kubernetes.io/service-proxy-name": "x"}}},
     LeftOut.OTHER_PROXY),
    ({"metadata": {"name": "web", "labels": {"service.kubernetes.io/headless": ""}}},
     LeftOut.HEADLESS_LABEL),
    ({"spec": {"clusterIP": "None"}}, LeftOut.HEADLESS),
    ({"spec": {"type": "ExternalName", "clusterIP": "10.96.0.1"}}, LeftOut.EXTERNAL_NAME),
    ({}, None),
])
def test_what_kube_proxy_does_not_program_is_left_out(change: dict[str, Any],
                                                       why: LeftOut | None) -> None:
    assert left_out_service({**api_service("web", "10.96.0.1"), **change}) is why


def test_a_slice_is_left_out_by_its_labels_only() -> None:
    obj = api_slice("web-1", "web", ["10.1.0.1"])
    assert left_out_slice(obj) is None
    obj["metadata"]["labels"]["service.kubernetes.io/service-proxy-name"] = "x"
    assert left_out_slice(obj) is LeftOut.OTHER_PROXY


def test_a_slice_is_of_the_service_its_label_names_unless_it_lists_names() -> None:
    obj = api_slice("web-1", "web", ["10.1.0.1"], namespace="shop")
    assert slice_service(obj) == ("shop", "web")
    assert slice_service({**obj, "addressType": "FQDN"}) is None
    assert slice_service({**obj, "metadata": {"name": "web-1"}}) is None


def _endpoint(info: Any) -> localv1.Endpoint:
    return localv1.Endpoint.FromString(info.endpoint)


def test_an_endpoint_keeps_its_pod_ports_conditions_node_and_hints() -> None:
    obj = api_slice("web-1", "web", ["10.1.0.1"], node="node-b")
    obj["endpoints"][0].update(conditions={"ready": False, "terminating": True}, zone="z1",
                               hints={"forZones": [{"name": "z1"}],
                                      "forNodes": [{"name": "node-b"}]})
    (listing,) = slice_endpoints(obj)
    (info,) = with_endpoints(service_of(api_service("web", "10.96.0.1")), [(listing,)]).endpoints
    assert (info.key, info.ready, info.serving, info.terminating) == (
        "web-1-0", False, True, True)  # an unknown serving counts as true
    assert (info.node, info.zone, info.hint_zones, info.hint_nodes) == (
        "node-b", "z1", ("z1",), ("node-b",))
    assert _endpoint(info) == localv1.Endpoint(
        IPs=localv1.IPSet(V4=["10.1.0.1"]), PortOverrides=[localv1.PortName(Name="http",
                                                                             Port=8080)])


def test_a_pod_in_an_ipv4_and_an_ipv6_slice_is_one_endpoint_of_both_families() -> None:
    v4 = slice_endpoints(api_slice("web-4", "web", ["10.1.0.1"]))
    v6 = slice_endpoints(api_slice("web-6", "web", ["fd00:1::1"], address_type="IPv6",
                                   port=8443, ready=False))
    pod = "shared"
    both = [tuple(listing._replace(pod=pod) for listing in listings) for listings in (v6, v4)]
    (info,) = with_endpoints(service_of(api_service("web", "10.96.0.1")), both).endpoints
    assert (info.key, info.ready) == (pod, False)  # ready only if every slice says so
    assert _endpoint(info) == localv1.Endpoint(
        IPs=localv1.IPSet(V4=["10.1.0.1"], V6=["fd00:1::1"]),
        PortOverrides=[localv1.PortName(Name="http", Port=8080)])  # the last listing's


def test_an_endpoint_without_a_pod_is_keyed_by_its_address() -> None:
    obj = api_slice("web-1", "web", ["10.1.0.1", "10.1.0.2"])
    for item in obj["endpoints"]:
        del item["targetRef"]
    infos = with_endpoints(service_of(api_service("web", "10.96.0.1")),
                           [slice_endpoints(obj)]).endpoints
    assert [_endpoint(i).IPs.V4 for i in infos] == [["10.1.0.1"], ["10.1.0.2"]]
    assert infos[0].key != infos[1].key


def test_a_node_gives_its_name_and_zone() -> None:
    assert node_of(api_node("node-a", zone="z1")) == Node("node-a", "z1")
    assert node_of(api_node("node-b")) == Node("node-b", "")


def _slice_with(**endpoint: Any) -> dict[str, Any]:
    obj = api_slice("web-1", "web", ["10.1.0.1"])
    obj["endpoints"][0].update(endpoint)
    return obj


@pytest.mark.parametrize("map_it, message", [
    (lambda: service_of({"spec": {"clusterIP": "10.96.0.1"}}),
     "a Service without metadata.name"),
    (lambda: service_of(api_service("web", "10.96.0.1", protocol="ICMP")),
     "Service default/web port 80: protocol 'ICMP' is not one of TCP, UDP, SCTP"),
    (lambda: service_of(api_service("web", "10.96.0.1", port=1 << 40)),
     "Service default/web port: 1099511627776 is not a number the API allows"),
    (lambda: service_of(api_service("web", "10.96.0.1", externalIPs=["nowhere"])),
     "Service default/web externalIPs: 'nowhere' is not an IP address"),
    (lambda: service_of({**api_service("web", "10.96.0.1"), "spec": [1]}),
     "Service default/web spec: expected a mapping, found [1]"),
    (lambda: slice_endpoints(api_slice("web-1", "web", ["fd00::1"])),
     "EndpointSlice default/web-1: fd00::1 is not an IPv4 address, the slice's addressType"),
    (lambda: slice_endpoints(_slice_with(nodeName=7)),
     "EndpointSlice default/web-1 endpoint web-1-0 nodeName: expected a string, found 7"),
    (lambda: slice_endpoints(_slice_with(hints={"forZones": [{}]})),
     "EndpointSlice default/web-1 endpoint web-1-0 hints.forZones: each entry needs a name"),
    (lambda: node_of({"metadata": {}}), "a Node without metadata.name"),
])
def test_what_cannot_be_mapped_is_an_error_naming_the_object(map_it: Any, message: str) -> None:
    with pytest.raises(ObjectError) as caught:
        map_it()
    assert str(caught.value).startswith(message), str(caught.value)
