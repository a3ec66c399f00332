"""The e2e harness's own logic that stays in hack/e2e (the state file it
writes from its checks' services, its report formats). Run from hack/, as the
harness itself is: tests/test_e2e_harness.py runs this file in a pytest of its
own there, so that nothing under tests/ imports the harness."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from e2e.checks import ALT, DNS_TCP, DNS_UDP, HTTP, base_state
from e2e.report import Report, Result
from e2e.statefile import REMOTE_NODE, ClusterState, EndpointRef, ServiceSpec
from lab.cluster import ADDRESSING, Family, Pod, families_of_mode


def _pods(families: tuple[Family, ...]) -> tuple[Pod, ...]:
    return tuple(Pod(f"srv-{i}", i, f"ns-{i}", Path(f"/cg/{i}"),
                     tuple(ADDRESSING[f].pod_ip(i) for f in families)) for i in range(3))


def _service(state: ClusterState, name: str) -> dict:
    body = yaml.safe_load(state.to_yaml())
    return next(s for s in body["services"] if s["service"]["name"] == name)


def test_state_file_uses_kpng_keys_and_integer_enums():
    families = families_of_mode("dual")
    state = base_state(families, _pods(families))
    body = yaml.safe_load(state.to_yaml())
    assert [n["name"] for n in body["nodes"]] == ["node-a", "node-b"]
    web = _service(state, "web")
    assert web["service"]["ips"] == {"clusterips": {"v4": ["10.96.0.10"],
                                                    "v6": ["fd00:10:96::a"]}}
    assert web["service"]["ports"] == [
        {"name": "http", "protocol": 1, "port": 80, "targetportname": "http"}]
    first = web["endpoints"][0]
    assert first == {
        "podname": "srv-0",
        "endpoint": {"ips": {"v4": ["10.244.0.10"], "v6": ["fd00:10:244::a"]},
                     "portoverrides": [{"name": "http", "port": 8080}]},
        "topology": {"node": "node-a", "zone": "zone-a"},
        "conditions": {"ready": True},
    }


def test_named_ports_resolve_per_pod_and_numeric_ports_carry_no_override():
    families = families_of_mode("ipv4")
    pods = _pods(families)
    state = ClusterState(families, (
        ServiceSpec("multi", 3, (HTTP, ALT)).with_endpoints(*pods),
        ServiceSpec("dns", 1, (DNS_UDP, DNS_TCP)).with_endpoints(*pods)))
    multi = _service(state, "multi")
    assert [e["endpoint"]["portoverrides"] for e in multi["endpoints"]] == [
        [{"name": "http", "port": 8080 + i}, {"name": "alt", "port": 9080 + i}] for i in range(3)]
    dns = _service(state, "dns")
    assert [p["protocol"] for p in dns["service"]["ports"]] == [2, 1]
    assert all(p["targetport"] == 53 for p in dns["service"]["ports"])
    assert all("portoverrides" not in e["endpoint"] for e in dns["endpoints"])
    assert dns["endpoints"][0]["endpoint"]["ips"] == {"v4": ["10.244.0.10"]}


def test_service_options_affinity_local_headless_externalname_single_stack():
    families = families_of_mode("dual")
    pod = _pods(families)[0]
    state = ClusterState(families, (
        ServiceSpec("sticky", 6, (HTTP,), affinity_timeout=2),
        ServiceSpec("local", 8, (HTTP,), internal_traffic_local=True).with_endpoints(
            EndpointRef(pod, REMOTE_NODE, ready=False)),
        ServiceSpec("headless", 9, (HTTP,), headless=True),
        ServiceSpec("extname", 10, (HTTP,), type="ExternalName"),
        ServiceSpec("v6only", 14, (HTTP,), only_family=Family.IPV6).with_endpoints(pod)))
    assert _service(state, "sticky")["service"]["sessionaffinity"] == {
        "clientip": {"timeoutseconds": 2}}
    local = _service(state, "local")
    assert local["service"]["internaltraffictolocal"] is True
    assert local["endpoints"][0]["topology"]["node"] == "node-b"
    assert local["endpoints"][0]["conditions"] == {"ready": False}
    assert _service(state, "headless")["service"]["ips"] == {"headless": True}
    assert _service(state, "extname")["service"]["type"] == "ExternalName"
    v6only = _service(state, "v6only")
    assert v6only["service"]["ips"] == {"clusterips": {"v6": ["fd00:10:96::18"]}}
    assert v6only["endpoints"][0]["endpoint"]["ips"] == {"v6": ["fd00:10:244::a"]}


def test_state_changes_are_new_values():
    families = families_of_mode("ipv4")
    pods = _pods(families)
    state = base_state(families, pods)
    web = state.services[0]
    smaller = state.with_service(web.with_endpoints(*pods[:2]))
    assert len(_service(state, "web")["endpoints"]) == 3
    assert len(_service(smaller, "web")["endpoints"]) == 2
    assert [s.name for s in smaller.without_service("web").services] == ["dns", "echo"]


def test_report_lines_summary_and_junit(tmp_path, capsys):
    report = Report("e2e-ebpf-dual", sys.stdout)  # capsys's, at this point
    report.add(Result("S1/basic-endpoint/ipv4", None, 1.5))
    report.add(Result("S6/no-endpoints-rejected/ipv6", "step: refused\nafter 2 s", 0.5))
    assert capsys.readouterr().out.splitlines() == [
        "PASS S1/basic-endpoint/ipv4",
        "FAIL S6/no-endpoints-rejected/ipv6: step: refused | after 2 s"]
    assert report.summary() == "1 passed, 1 failed"
    report.junit(tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == (
        "e2e-ebpf-dual", "2", "1")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["S1/basic-endpoint/ipv4",
                                              "S6/no-endpoints-rejected/ipv6"]
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "step: refused"

