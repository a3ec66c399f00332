"""The per-node view: ready filter, zone hints, Local, Scopes, and endpoints
with no scope left out, as KPNG's brain computes them."""

from __future__ import annotations

import yaml

from kpng_py.api import localv1
from kpng_py.brain.statefile import ClusterState, parse_state
from kpng_py.brain.view import endpoint_for_node, node_view
from tests.brain.helpers import endpoint, port, service, state


def _state(document: dict) -> ClusterState:
    return parse_state(yaml.safe_dump(document).encode(), "state.yaml")


def _endpoints(cluster: ClusterState, node: str) -> dict[str, tuple[bool, bool, bool]]:
    """endpoint key -> (Local, Scopes.Internal, Scopes.External) in the node's view."""
    found = {}
    for (ref_set, path), data in node_view(cluster, node).items():
        if ref_set == localv1.EndpointsSet:
            ep = localv1.Endpoint.FromString(data)
            found[path.rsplit("/", 1)[1]] = (ep.Local, ep.Scopes.Internal, ep.Scopes.External)
    return found


def test_every_service_is_in_every_view_with_the_same_bytes() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()]),
                           service("b", ("10.96.0.2",), [port()], namespace="ns")))
    for node in ("n1", "n2", ""):
        services = {path: data for (ref_set, path), data in node_view(cluster, node).items()
                    if ref_set == localv1.ServicesSet}
        assert services == {s.path: s.service for s in cluster.services}
    assert sorted(services) == ["default/a", "ns/b"]


def test_local_is_where_the_endpoint_runs_and_paths_use_the_key() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", node="n1", pod="a-1"),
        endpoint("10.1.0.2", node="n2", pod="a-2"),
    ])))
    view = node_view(cluster, "n1")
    assert sorted(path for _, path in view) == ["default/a", "default/a/a-1", "default/a/a-2"]
    assert _endpoints(cluster, "n1") == {"a-1": (True, True, True), "a-2": (False, True, True)}
    assert _endpoints(cluster, "n3") == {"a-1": (False, True, True), "a-2": (False, True, True)}


def test_endpoints_that_are_not_ready_are_not_sent() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", pod="ready"),
        endpoint("10.1.0.2", pod="not-ready", conditions={"ready": False}),
    ])))
    assert set(_endpoints(cluster, "n1")) == {"ready"}


def test_zone_hints_keep_endpoints_for_the_nodes_of_those_zones() -> None:
    cluster = _state(state(
        service("a", ("10.96.0.1",), [port()], [
            endpoint("10.1.0.1", pod="for-z1", hints={"zones": ["z1"]}),
            endpoint("10.1.0.2", pod="for-z1-z2", hints={"zones": ["z1", "z2"]}),
            endpoint("10.1.0.3", pod="no-hints", hints={"zones": []}),
        ]),
        nodes=[{"name": "n1", "topology": {"zone": "z1"}},
               {"name": "n2", "topology": {"zone": "z2"}}]))
    assert set(_endpoints(cluster, "n1")) == {"for-z1", "for-z1-z2", "no-hints"}
    assert set(_endpoints(cluster, "n2")) == {"for-z1-z2", "no-hints"}
    # An unknown node is in zone "": only endpoints without hints are for it.
    assert set(_endpoints(cluster, "unknown")) == {"no-hints"}


def test_internal_traffic_local_scopes_remote_endpoints_to_external_traffic() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", node="n1", pod="on-n1"),
        endpoint("10.1.0.2", node="n2", pod="on-n2"),
    ], internaltraffictolocal=True)))
    assert _endpoints(cluster, "n1") == {"on-n1": (True, True, True),
                                         "on-n2": (False, False, True)}


def test_endpoints_with_no_scope_are_left_out() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", node="n1", pod="on-n1"),
        endpoint("10.1.0.2", node="n2", pod="on-n2"),
    ], internaltraffictolocal=True, externaltraffictolocal=True)))
    assert _endpoints(cluster, "n1") == {"on-n1": (True, True, True)}
    assert _endpoints(cluster, "n3") == {}


def test_external_traffic_local_scopes_remote_endpoints_to_internal_traffic() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.2", node="n2", pod="on-n2"),
    ], externaltraffictolocal=True)))
    assert _endpoints(cluster, "n1") == {"on-n2": (False, True, False)}


def test_the_endpoint_keeps_everything_else_the_file_says() -> None:
    cluster = _state(state(service("a", ("10.96.0.1", "fd00::1"), [port("http")], [
        endpoint("10.1.0.1", "fd00:1::1", pod="p", overrides={"http": 8080},
                 node="n1"),
    ])))
    cluster_view = node_view(cluster, "n1")
    ep = localv1.Endpoint.FromString(cluster_view[(localv1.EndpointsSet, "default/a/p")])
    assert ep == localv1.Endpoint(
        IPs=localv1.IPSet(V4=["10.1.0.1"], V6=["fd00:1::1"]), Local=True,
        PortOverrides=[localv1.PortName(Name="http", Port=8080)],
        Scopes=localv1.EndpointScopes(Internal=True, External=True))


def _named(info: dict, hostname: str) -> dict:
    info["endpoint"]["hostname"] = hostname
    return info


def test_the_spliced_bytes_are_protobufs_serialization() -> None:
    """Local and Scopes are spliced into the endpoint's bytes; the result is
    what setting them and serializing deterministically writes."""
    cluster = _state(state(
        service("a", ("10.96.0.1",), [port("http"), port("dns", number=53)], [
            _named(endpoint("10.1.0.1", "fd00:1::1", node="n1", pod="a-1",
                            overrides={"http": 8080, "dns": 5353}), "a-1.example"),
            endpoint("10.1.0.2", node="n2", pod="a-2"),
            endpoint("fd00:1::3", pod="a-3", overrides={"http": 8081})],
            internaltraffictolocal=True),
        service("b", ("10.96.0.2",), [port()], [
            _named(endpoint(node="n1", pod="b-1"), "only-a-name"),
            endpoint("10.1.0.4", node="n2", pod="b-2")], externaltraffictolocal=True)))
    for node in ("n1", "n2"):
        for service_entry in cluster.services:
            for info in service_entry.endpoints:
                spliced = endpoint_for_node(service_entry, info, node, "")
                if spliced is None:
                    continue
                expected = localv1.Endpoint.FromString(info.endpoint)
                expected.Local = info.node == node
                expected.Scopes.Internal = expected.Local or not \
                    service_entry.internal_traffic_local
                expected.Scopes.External = expected.Local or not \
                    service_entry.external_traffic_local
                assert spliced == expected.SerializeToString(deterministic=True)


def test_a_service_labelled_for_another_proxy_is_in_no_view() -> None:
    """service.kubernetes.io/service-proxy-name, as kube-proxy: left alone,
    endpoints included; other labels change nothing."""
    other = service("other", ("10.96.0.3",), [port()], [endpoint("10.1.0.3", pod="o-1")])
    other["service"]["labels"] = {"service.kubernetes.io/service-proxy-name": "another"}
    plain = service("plain", ("10.96.0.4",), [port()])
    plain["service"]["labels"] = {"app": "plain"}
    cluster = _state(state(other, plain))
    assert sorted(path for _, path in node_view(cluster, "n1")) == ["default/plain"]
