"""The per-node view as kube-proxy decides it: ready endpoints, else serving
terminating ones (per scope), zone and node hints with their fallbacks,
Local, Scopes, and endpoints with no scope left out."""

from __future__ import annotations

import yaml

from kpng_py.api import localv1
from kpng_py.brain.statefile import ClusterState, parse_state
from kpng_py.brain.view import NodeChoice, endpoint_for_node, node_view
from tests.support.state_files import endpoint, port, service, state


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


# Two nodes in two zones, and one in none.
_ZONED: list[dict] = [{"name": "n1", "topology": {"zone": "z1"}},
                      {"name": "n2", "topology": {"zone": "z2"}}, {"name": "n3"}]
_TERMINATING = {"ready": False, "serving": True, "terminating": True}


def test_zone_hints_narrow_a_nodes_view_to_its_zone_when_every_ready_endpoint_has_some() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", pod="for-z1", hints={"zones": ["z1"]}),
        endpoint("10.1.0.2", pod="for-z1-z2", hints={"zones": ["z1", "z2"]}),
        endpoint("10.1.0.3", pod="for-z3", hints={"zones": ["z3"]}),
        endpoint("10.1.0.4", pod="not-ready", conditions={"ready": False}),
    ]), nodes=_ZONED))
    assert set(_endpoints(cluster, "n1")) == {"for-z1", "for-z1-z2"}
    assert set(_endpoints(cluster, "n2")) == {"for-z1-z2"}


def test_a_node_whose_zone_no_hint_names_gets_every_ready_endpoint() -> None:
    """As kube-proxy falls back: a node without a zone, one the state does not
    list (zone ""), and one in a zone no hint names. KPNG's brain gave them
    none at all, and their connections were refused."""
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", pod="for-z1", hints={"zones": ["z1"]}),
        endpoint("10.1.0.2", pod="for-z2", hints={"zones": ["z2"]}),
    ]), nodes=[*_ZONED, {"name": "n4", "topology": {"zone": "z4"}}]))
    for node in ("n3", "unknown", "n4"):
        assert set(_endpoints(cluster, node)) == {"for-z1", "for-z2"}, node


def test_zone_hints_are_ignored_unless_every_ready_endpoint_has_some() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", pod="for-z1", hints={"zones": ["z1"]}),
        endpoint("10.1.0.2", pod="for-z2", hints={"zones": ["z2"]}),
        endpoint("10.1.0.3", pod="no-hints", hints={"zones": []}),
    ]), nodes=_ZONED))
    for node in ("n1", "n2"):
        assert set(_endpoints(cluster, node)) == {"for-z1", "for-z2", "no-hints"}


def test_node_hints_narrow_to_the_nodes_endpoints_and_fall_back_to_zone_hints() -> None:
    """trafficDistribution PreferSameNode: the EndpointSlice controller
    hints each endpoint for its node and its zone."""
    def pod(ip: str, node: str, zone: str) -> dict:
        return endpoint(ip, node=node, pod=f"on-{node}", hints={"nodes": [node], "zones": [zone]})
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        pod("10.1.0.1", "n1", "z1"), pod("10.1.0.2", "n1b", "z1"), pod("10.1.0.3", "n2", "z2"),
    ]), nodes=[*_ZONED, {"name": "n1b", "topology": {"zone": "z1"}},
               {"name": "n1c", "topology": {"zone": "z1"}}]))
    assert _endpoints(cluster, "n1") == {"on-n1": (True, True, True)}
    # No endpoint on n1c: its zone's endpoints; none in its zone: all of them.
    assert set(_endpoints(cluster, "n1c")) == {"on-n1", "on-n1b"}
    assert set(_endpoints(cluster, "n3")) == {"on-n1", "on-n1b", "on-n2"}


def test_node_hints_are_ignored_unless_every_ready_endpoint_has_some() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", node="n1", pod="on-n1", hints={"nodes": ["n1"]}),
        endpoint("10.1.0.2", node="n2", pod="on-n2"),
        endpoint("10.1.0.3", node="n2", pod="not-ready", hints={"nodes": ["n2"]},
                 conditions={"ready": False}),
    ]), nodes=_ZONED))
    assert set(_endpoints(cluster, "n1")) == {"on-n1", "on-n2"}


def test_serving_terminating_endpoints_are_used_when_no_endpoint_is_ready() -> None:
    """KEP-1669, as kube-proxy: a rolling update's last pods keep serving."""
    old = [endpoint("10.1.0.1", node="n1", pod="terminating", conditions=_TERMINATING),
           endpoint("10.1.0.2", node="n2", pod="not-serving",
                    conditions={"ready": False, "serving": False, "terminating": True}),
           endpoint("10.1.0.3", node="n2", pod="starting", conditions={"ready": False})]
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], old)))
    assert _endpoints(cluster, "n2") == {"terminating": (False, True, True)}
    ready = endpoint("10.1.0.4", node="n2", pod="ready")
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [*old, ready])))
    assert set(_endpoints(cluster, "n1")) == {"ready"}


def test_a_serving_terminating_endpoint_is_used_however_its_hints_read() -> None:
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", pod="terminating", conditions=_TERMINATING,
                 hints={"zones": ["z2"], "nodes": ["n2"]}),
    ]), nodes=_ZONED))
    assert set(_endpoints(cluster, "n1")) == {"terminating"}


def test_the_node_local_scope_falls_back_to_the_nodes_terminating_endpoints() -> None:
    """internalTrafficPolicy Local: a node whose own endpoints are all
    terminating keeps using them, though other nodes have ready ones; the
    cluster scope (external traffic here) uses only ready ones."""
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", node="n1", pod="n1-terminating", conditions=_TERMINATING),
        endpoint("10.1.0.2", node="n2", pod="n2-ready"),
        endpoint("10.1.0.3", node="n2", pod="n2-terminating", conditions=_TERMINATING),
    ], internaltraffictolocal=True)))
    assert _endpoints(cluster, "n1") == {"n1-terminating": (True, True, False),
                                         "n2-ready": (False, False, True)}
    assert _endpoints(cluster, "n2") == {"n2-ready": (True, True, True)}


def test_external_traffic_local_uses_only_the_nodes_ready_endpoints() -> None:
    """kube-proxy would serve it with n1's terminating endpoint while the
    health-check node port answers 503; localv1 cannot say both, and the
    health check (N11) is kept right: n1 has nothing for external traffic."""
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", node="n1", pod="n1-terminating", conditions=_TERMINATING),
        endpoint("10.1.0.2", node="n2", pod="n2-ready"),
    ], externaltraffictolocal=True)))
    assert _endpoints(cluster, "n1") == {"n2-ready": (False, True, False)}
    assert _endpoints(cluster, "n2") == {"n2-ready": (True, True, True)}


def test_hints_do_not_narrow_the_node_local_scope() -> None:
    """externalTrafficPolicy Local: the node's own endpoint serves its
    external traffic though its hints are for another zone."""
    cluster = _state(state(service("a", ("10.96.0.1",), [port()], [
        endpoint("10.1.0.1", node="n1", pod="on-n1", hints={"zones": ["z2"]}),
        endpoint("10.1.0.2", node="n2", pod="on-n2", hints={"zones": ["z1"]}),
    ], externaltraffictolocal=True), nodes=_ZONED))
    assert _endpoints(cluster, "n1") == {"on-n1": (True, False, True),
                                         "on-n2": (False, True, False)}


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
    what setting them and serializing deterministically writes, with the
    scopes the node's choice gives (its shortcut for ready endpoints too)."""
    cluster = _state(state(
        service("a", ("10.96.0.1",), [port("http"), port("dns", number=53)], [
            _named(endpoint("10.1.0.1", "fd00:1::1", node="n1", pod="a-1",
                            overrides={"http": 8080, "dns": 5353}), "a-1.example"),
            endpoint("10.1.0.2", node="n2", pod="a-2"),
            endpoint("10.1.0.5", node="n1", pod="a-5", conditions=_TERMINATING),
            endpoint("fd00:1::3", pod="a-3", overrides={"http": 8081})],
            internaltraffictolocal=True),
        service("b", ("10.96.0.2",), [port()], [
            _named(endpoint(node="n1", pod="b-1"), "only-a-name"),
            endpoint("10.1.0.4", node="n2", pod="b-2")], externaltraffictolocal=True),
        service("c", ("10.96.0.3",), [port()], [
            endpoint("10.1.0.6", node="n1", pod="c-1", hints={"zones": ["z1"]}),
            endpoint("10.1.0.7", node="n2", pod="c-2", hints={"zones": ["z2"]})],
            externaltraffictolocal=True),
        nodes=_ZONED))
    scopes = set()
    for node in ("n1", "n2"):
        for service_entry in cluster.services:
            choice = NodeChoice.of(service_entry.ready_endpoints, node, cluster.zone_of(node))
            for info in service_entry.endpoints:
                spliced = endpoint_for_node(service_entry, info, choice)
                cluster_scope, local_scope = (choice.in_cluster_scope(info),
                                              choice.in_local_scope(info))
                expected = localv1.Endpoint.FromString(info.endpoint)
                expected.Local = info.node == node
                expected.Scopes.Internal = (local_scope if service_entry.internal_traffic_local
                                            else cluster_scope)
                expected.Scopes.External = (local_scope and info.ready
                                            if service_entry.external_traffic_local
                                            else cluster_scope)
                scope = (expected.Scopes.Internal, expected.Scopes.External)
                scopes.add(scope)
                assert spliced == (expected.SerializeToString(deterministic=True)
                                   if any(scope) else None)
    assert scopes == {(False, False), (False, True), (True, False), (True, True)}


def test_a_service_labelled_for_another_proxy_is_in_no_view() -> None:
    """service.kubernetes.io/service-proxy-name, as kube-proxy: left alone,
    endpoints included; other labels change nothing."""
    other = service("other", ("10.96.0.3",), [port()], [endpoint("10.1.0.3", pod="o-1")])
    other["service"]["labels"] = {"service.kubernetes.io/service-proxy-name": "another"}
    plain = service("plain", ("10.96.0.4",), [port()])
    plain["service"]["labels"] = {"app": "plain"}
    cluster = _state(state(other, plain))
    assert sorted(path for _, path in node_view(cluster, "n1")) == ["default/plain"]
