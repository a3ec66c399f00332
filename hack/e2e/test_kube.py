"""`-c kube` without a cluster: the checks' states as API objects (and what
`kpng-py kube` makes of them: what the state file says), the calls an apply
makes, and how the harness tells that a node applied them. Run from hack/
as test_harness.py is (tests/test_e2e_harness.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import checks, nodeport_checks
from e2e.checks import ALT, DNS_TCP, DNS_UDP, HTTP, base_state
from e2e.kube import (
    MANAGED_BY,
    ApiObjects,
    ApiWriter,
    NotExpressible,
    ServedVersions,
    plan,
    service_object,
    slice_objects,
)
from e2e.proxy import BACKENDS, service_ports_of
from e2e.run import Options
from e2e.statefile import (
    LOCAL_NODE,
    OTHER_ZONE,
    OTHER_ZONE_NODE,
    REMOTE_NODE,
    ZONE,
    ClusterState,
    EndpointRef,
    ServiceSpec,
)
from e2e.test_harness import _multinode, _pods
from kpng_py.brain.convert import convert, dump
from kpng_py.brain.statefile import parse_state
from lab.cluster import Family, families_of_mode
from lab.kube_control_plane import ControlPlaneError, node_object
from lab.multinode import vip
from lab.procs import JsonLog


def _checks_states(mode: str) -> ClusterState:
    """The service topology's first state and services like its checks'."""
    families = families_of_mode(mode)
    srv = _pods(families)
    state = base_state(families, srv)
    terminating = EndpointRef(srv[0], ready=False, terminating=True, serving=True)
    hinted = [EndpointRef(p, node, hint_zones=(zone,), hint_nodes=(node,))
              for p, node, zone in ((srv[0], LOCAL_NODE, ZONE), (srv[1], REMOTE_NODE, ZONE),
                                    (srv[2], OTHER_ZONE_NODE, OTHER_ZONE))]
    more = [
        ServiceSpec("multi", 3, (HTTP, ALT)).with_endpoints(*srv),
        ServiceSpec("sticky", 6, (HTTP,), affinity_timeout=2).with_endpoints(*srv),
        ServiceSpec("local", 8, (HTTP,), internal_traffic_local=True).with_endpoints(
            srv[0], EndpointRef(srv[1], REMOTE_NODE)),
        ServiceSpec("headless", 9, (HTTP,), headless=True).with_endpoints(*srv),
        ServiceSpec("rolling", 17, (HTTP,)).with_endpoints(
            terminating, EndpointRef(srv[1], ready=False)),
        ServiceSpec("near-node", 18, (HTTP,), traffic_distribution="PreferSameNode")
        .with_endpoints(*hinted),
        ServiceSpec("near-zone", 19, (HTTP,), traffic_distribution="PreferSameZone")
        .with_endpoints(*(dataclasses.replace(e, hint_nodes=()) for e in hinted)),
    ]
    if len(families) == 2:
        more.append(ServiceSpec("v6only", 14, (HTTP,), only_family=Family.IPV6)
                    .with_endpoints(*srv))
    for service in more:
        state = state.with_service(service)
    return state


def _kubectl_list(state: ClusterState) -> str:
    """What `kubectl get nodes,svc,endpointslices -o yaml` prints of the
    objects the harness writes for `state`."""
    objects = ApiObjects.of(state)
    items: list[dict[str, Any]] = [node_object(name, [], zone) for name, zone in state.nodes]
    items += [{**service, "status": objects.statuses[name]}
              for name, service in objects.services.items()]
    items += objects.slices.values()
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})


def _by_name(ports: tuple) -> dict[str, Any]:
    return {str(port.name): port for port in ports}


@pytest.mark.parametrize("mode", ["ipv4", "ipv6", "dual"])
@pytest.mark.parametrize("topology", ["service", "nodeport"])
def test_kpng_py_kube_serves_the_objects_as_the_state_file_says_them(mode: str,
                                                                     topology: str) -> None:
    """Every node's service ports from the API objects (mapped by `kpng-py
    kube`'s mapping, that of `file convert`) are those of the state file
    the file brain reads for the same state."""
    if topology == "service":
        state = _checks_states(mode)
    else:
        state = nodeport_checks.base_state(_multinode(mode))
    through_api = parse_state(dump(convert(_kubectl_list(state))).encode(), "converted")
    through_file = parse_state(state.to_yaml().encode(), "state.yaml")
    for node, _ in state.nodes:
        want = _by_name(service_ports_of(through_file, node))
        assert want and _by_name(service_ports_of(through_api, node)) == want


def test_a_service_and_its_status_say_what_the_spec_says() -> None:
    families = families_of_mode("dual")
    cluster = _multinode("dual")
    local = next(s for s in nodeport_checks.base_state(cluster).services if s.name == "local")
    ranged = dataclasses.replace(local, name="ranged", source_ranges=("172.18.0.100/32",),
                                 external_ips=(vip(Family.IPV4, 8),), labels=(("a", "b"),))
    service = service_object(ranged, families)
    assert service["metadata"] == {"name": "ranged", "namespace": "default",
                                   "labels": {"a": "b"}}
    assert service["spec"] == {
        "type": "LoadBalancer", "clusterIP": "10.96.0.12",
        "clusterIPs": ["10.96.0.12", "fd00:10:96::c"], "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "who-tcp", "protocol": "TCP", "port": 7100, "targetPort": 7100,
                   "nodePort": 30200},
                  {"name": "who-udp", "protocol": "UDP", "port": 7100, "targetPort": 7100,
                   "nodePort": 30200}],
        "externalIPs": ["172.19.0.18"], "externalTrafficPolicy": "Local",
        "healthCheckNodePort": 31200, "loadBalancerSourceRanges": ["172.18.0.100/32"],
        "allocateLoadBalancerNodePorts": True}
    assert ApiObjects.of(dataclasses.replace(
            nodeport_checks.base_state(cluster), services=(ranged,))).statuses["ranged"] == {
        "loadBalancer": {"ingress": [{"ip": "172.19.0.11"}, {"ip": "fd00:172:19::b"}]}}
    sticky = service_object(ServiceSpec("sticky", 6, (HTTP,), affinity_timeout=2,
                                        only_family=Family.IPV6), families)["spec"]
    assert (sticky["clusterIPs"], sticky["ipFamilies"], sticky["ipFamilyPolicy"]) == (
        ["fd00:10:96::10"], ["IPv6"], "SingleStack")
    assert sticky["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 2}}
    assert service_object(ServiceSpec("h", 9, (HTTP,), headless=True), families)["spec"][
        "clusterIP"] == "None"


def test_slices_are_per_family_and_resolved_ports_with_each_endpoints_conditions() -> None:
    families = families_of_mode("dual")
    srv = _pods(families)
    multi = ServiceSpec("multi", 3, (HTTP, ALT)).with_endpoints(*srv)
    assert sorted(slice_objects(multi, families, lambda node: ZONE)) == [
        f"multi-{family}-{8080 + i}-{9080 + i}" for family in ("ipv4", "ipv6") for i in range(3)]
    dns = ServiceSpec("dns", 1, (DNS_UDP, DNS_TCP)).with_endpoints(
        EndpointRef(srv[0], ready=False, terminating=True, serving=True),
        EndpointRef(srv[1], OTHER_ZONE_NODE, hint_zones=(OTHER_ZONE,),
                    hint_nodes=(OTHER_ZONE_NODE,)))
    zones = {LOCAL_NODE: ZONE, OTHER_ZONE_NODE: OTHER_ZONE}
    (v4, v6) = slice_objects(dns, families, zones.__getitem__).values()
    assert v4["metadata"]["labels"] == {"kubernetes.io/service-name": "dns",
                                        "endpointslice.kubernetes.io/managed-by": MANAGED_BY}
    assert (v4["addressType"], v6["addressType"]) == ("IPv4", "IPv6")
    assert v4["ports"] == [{"name": "dns", "protocol": "UDP", "port": 53},
                           {"name": "dns-tcp", "protocol": "TCP", "port": 53}]
    assert v4["endpoints"] == [
        {"addresses": ["10.244.0.10"],
         "conditions": {"ready": False, "serving": True, "terminating": True},
         "nodeName": "node-a", "zone": "zone-a",
         "targetRef": {"kind": "Pod", "namespace": "default", "name": "srv-0"}},
        {"addresses": ["10.244.0.11"],
         "conditions": {"ready": True, "serving": True, "terminating": False},
         "nodeName": "node-c", "zone": "zone-b",
         "targetRef": {"kind": "Pod", "namespace": "default", "name": "srv-1"},
         "hints": {"forZones": [{"name": "zone-b"}], "forNodes": [{"name": "node-c"}]}}]


def test_what_the_api_refuses_is_named_and_its_checks_say_they_cannot_run() -> None:
    families = families_of_mode("ipv4")
    for spec, why in (
            (ServiceSpec("extname", 10, (HTTP,), type="ExternalName"), "ExternalName"),
            (ServiceSpec("headless", 13, (HTTP,), type="NodePort", headless=True),
             "headless NodePort"),
            (ServiceSpec("lb", 2, (HTTP,), lb_ips=(vip(Family.IPV4, 1),)), "ingress on a "
                                                                             "ClusterIP")):
        with pytest.raises(NotExpressible, match=why):
            ApiObjects.of(ClusterState(families, (spec,)))
    tcp, udp = nodeport_checks.who(30400)
    with pytest.raises(NotExpressible, match="node port 30400 to one Service only"):
        ApiObjects.of(ClusterState(families, (ServiceSpec("t", 3, (tcp,), type="NodePort"),
                                              ServiceSpec("u", 4, (udp,), type="NodePort"))))
    cannot = [c.name for c in checks.CHECKS + nodeport_checks.NODEPORT_CHECKS if c.kube_cannot]
    assert cannot == ["S11/headless-and-externalname-ignored", "N4/same-nodeport-tcp-and-udp",
                      "N19/not-programmed"]
    s11 = next(c for c in checks.CHECKS if c.name.startswith("S11/"))
    kind = next(iter(BACKENDS.values()))
    assert s11.why_not(kind, "file") is None
    assert (s11.why_not(kind, "kube") or "").startswith("the Kubernetes API cannot say it: ")


def _calls(writes) -> list[str]:
    return [f"{w.method} {w.path.rsplit('/', 1)[-1] if w.method != 'POST' else w.body['kind']}"
            + ("/status" if w.path.endswith("/status") else "") for w in writes]


def test_an_apply_writes_the_difference_in_an_order_the_brain_can_follow() -> None:
    families = families_of_mode("ipv4")
    srv = _pods(families)
    state = base_state(families, srv)
    first = ApiObjects.of(state)
    assert _calls(plan(ApiObjects(), first)) == (
        ["POST Service"] * 3 + ["POST EndpointSlice"] * 5)  # web: 3 ports; dns, echo: 1
    web = state.services[0]
    fewer = ApiObjects.of(state.with_service(web.with_endpoints(*srv[:2])))
    removed = plan(first, fewer)
    assert _calls(removed) == ["PUT web-ipv4-8082", "DELETE web-ipv4-8082"]
    assert removed[0].body is not None and removed[0].body["endpoints"] == []
    assert removed[0].tracked == "endpointslices"
    assert removed[1].tracked is None  # a delete's answer is a Status: no version
    gone = plan(first, ApiObjects.of(state.without_service("web")))
    assert _calls(gone) == [f"DELETE web-ipv4-{8080 + i}" for i in range(3)] + ["DELETE web"]
    assert [w.tracked for w in gone] == [None, None, None, "services"]
    one_port = plan(first, ApiObjects.of(state.with_service(
        state.services[1].with_ports(DNS_UDP))))
    assert _calls(one_port) == ["PUT dns", "POST EndpointSlice", "PUT dns-ipv4-53-53",
                                "DELETE dns-ipv4-53-53"]


def test_a_new_address_is_a_new_service_and_ingress_is_its_status() -> None:
    families = families_of_mode("dual")
    srv = _pods(families)
    web = ServiceSpec("web", 0, (HTTP,)).with_endpoints(srv[0])
    before = ApiObjects.of(ClusterState(families, (web,)))
    v6only = dataclasses.replace(web, only_family=Family.IPV6)
    assert _calls(plan(before, ApiObjects.of(ClusterState(families, (v6only,))))) == [
        "DELETE web-ipv4-8080", "DELETE web-ipv6-8080", "DELETE web", "POST Service",
        "POST EndpointSlice"]
    lb = dataclasses.replace(web, type="LoadBalancer", lb_ips=(vip(Family.IPV4, 1),))
    assert _calls(plan(ApiObjects(), ApiObjects.of(ClusterState(families, (lb,))))) == [
        "POST Service", "PATCH status/status", "POST EndpointSlice", "POST EndpointSlice"]
    moved = dataclasses.replace(lb, lb_ips=(vip(Family.IPV4, 2),))
    assert _calls(plan(ApiObjects.of(ClusterState(families, (lb,))),
                       ApiObjects.of(ClusterState(families, (moved,))))) == [
        "PATCH status/status"]


class _FakeApi:
    """Answers each call with the next resourceVersion (a slice's delete with
    a Status, as the API server does); fails the call numbered `fail_at`."""

    def __init__(self) -> None:
        self.version = 100
        self.calls: list[str] = []
        self.fail_at = 0

    def request(self, method: str, path: str, body: Any, content_type: str) -> dict:
        if len(self.calls) + 1 == self.fail_at:
            raise ControlPlaneError(f"{method} {path}: 500 refused")
        self.calls.append(f"{method} {path}")
        self.version += 1
        if method == "DELETE" and "endpointslices" in path:
            return {"kind": "Status", "status": "Success"}
        return {"metadata": {"resourceVersion": str(self.version)}}


def test_the_writer_returns_the_versions_to_wait_for_and_resumes_after_a_failure() -> None:
    families = families_of_mode("ipv4")
    srv = _pods(families)
    state = base_state(families, srv)
    api = _FakeApi()
    writer = ApiWriter(api)  # type: ignore[arg-type]
    # Three Services (101-103), then five slices (104-108).
    assert writer.apply(state) == {"services": 103, "endpointslices": 108}
    assert writer.apply(state) == {}
    smaller = state.with_service(state.services[0].with_endpoints(srv[0])) \
        .without_service("echo")
    api.fail_at = len(api.calls) + 2  # the second call of the next apply
    with pytest.raises(ControlPlaneError):
        writer.apply(smaller)
    api.fail_at, done = 0, len(api.calls)
    # web-ipv4-8081 was emptied (109), not deleted: emptied again (a version
    # to wait for) and deleted, then the rest.
    assert writer.apply(smaller) == {"endpointslices": 112, "services": 115}
    assert api.calls[done:] == [
        f"{method} /apis/discovery.k8s.io/v1/namespaces/default/endpointslices/{name}"
        for method, name in (("PUT", "web-ipv4-8081"), ("DELETE", "web-ipv4-8081"),
                             ("PUT", "web-ipv4-8082"), ("DELETE", "web-ipv4-8082"),
                             ("DELETE", "echo-ipv4-7001-7000"))] + [
        "DELETE /api/v1/namespaces/default/services/echo"]


def _log(tmp_path: Path, *records: dict) -> JsonLog:
    path = tmp_path / "backend.log"
    with open(path, "a") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return JsonLog(path)


def _state(message: str, version: int, services: int, slices: int) -> dict:
    return {"msg": f"state from the API server {message}", "version": version,
            "services_resource_version": str(services),
            "endpointslices_resource_version": str(slices), "nodes_resource_version": "5"}


def test_a_write_is_served_once_the_node_applied_a_state_made_from_it(tmp_path: Path) -> None:
    log = _log(tmp_path, _state("published", 1, 10, 10),
               {"msg": "node view answered", "node": "node-a", "version": 1, "ops": 4})
    served = ServedVersions(log, "node-a")
    assert not served.served({"services": 10})  # answered, not applied yet
    _log(tmp_path, {"msg": "sync applied"})
    assert served.served({"services": 10, "nodes": 5})
    assert not served.served({"services": 12})
    _log(tmp_path, _state("published", 2, 12, 10),
         {"msg": "node view answered", "node": "node-b", "version": 2, "ops": 1},
         {"msg": "node view answered", "node": "node-a", "version": 2, "ops": 3})
    assert not served.served({"services": 12})
    _log(tmp_path, {"msg": "sync applied"})
    assert served.served({"services": 12})
    # A write that changed nothing the brain maps: served as the state it was.
    _log(tmp_path, _state("unchanged", 2, 12, 15))
    assert served.served({"endpointslices": 15})
    _log(tmp_path, _state("published", 3, 12, 16),
         {"msg": "node view answered", "node": "node-a", "version": 3, "ops": 0})
    assert served.served({"endpointslices": 16})  # no op for this node: nothing to apply
    assert "node node-a applied version 3" in served.describe({"endpointslices": 17})


def test_kube_runs_have_names_of_their_own() -> None:
    options = Options("dual", "ebpf", False, False, Path("logs"), "nodeport", "kube")
    assert (options.run_name, options.suite) == ("kube-nodeport-ebpf-dual",
                                                 "e2e-kube-nodeport-ebpf-dual")
    assert Options("ipv4", "ebpf", False, False, Path("logs")).run_name == "ebpf-ipv4"
