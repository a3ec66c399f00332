"""The e2e harness's own logic that stays in hack/e2e (the state file it
writes from its checks' services, its report formats). Run from hack/, as the
harness itself is: tests/test_e2e_harness.py runs this file in a pytest of its
own there, so that nothing under tests/ imports the harness."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from e2e import nodeport_checks
from e2e.checks import ALT, DNS_TCP, DNS_UDP, HTTP, base_state
from e2e.cli import _SUMMARY, _run_side_by_side
from e2e.proxy import BACKENDS, changed_nodes
from e2e.report import Report, Result
from e2e.statefile import REMOTE_NODE, ClusterState, EndpointRef, ServiceSpec
from e2e.topology import nodeport_places, pod_names
from lab.cluster import ADDRESSING, Family, Pod, families_of_mode
from lab.multinode import MultiNodeCluster, node_names, vip
from lab.names import RunNames, owner_pid


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
    assert [(n["name"], n["topology"]["zone"]) for n in body["nodes"]] == [
        ("node-a", "zone-a"), ("node-b", "zone-a"), ("node-c", "zone-b")]
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
    report.note("control plane: kube (Kubernetes v1.37.2, etcd Version: 3.6.16)")
    report.add(Result("S1/basic-endpoint/ipv4", None, 1.5))
    report.add(Result("S6/no-endpoints-rejected/ipv6", "step: refused\nafter 2 s", 0.5))
    assert capsys.readouterr().out.splitlines() == [
        "control plane: kube (Kubernetes v1.37.2, etcd Version: 3.6.16)",
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
    assert [(p.get("name"), p.get("value")) for p in suite.iter("property")] == [
        ("control plane", "kube (Kubernetes v1.37.2, etcd Version: 3.6.16)")]



def test_not_applicable_is_neither_a_pass_nor_a_failure(tmp_path, capsys):
    report = Report("e2e-nodeport-userspace-ipv4", sys.stdout)
    report.add(Result("N1/nodeport-from-outside/ipv4", None, 1.0))
    report.add(Result("N7/external-local-keeps-source/ipv4", None, 0.0,
                      "userspace proxies do not keep the client's address"))
    assert capsys.readouterr().out.splitlines()[1] == (
        "N/A  N7/external-local-keeps-source/ipv4: userspace proxies do not keep the "
        "client's address")
    assert (report.passed, report.failed, report.not_applicable) == (1, 0, 1)
    assert report.summary() == "1 passed, 0 failed, 1 n/a"
    assert _SUMMARY.match(report.summary()) and _SUMMARY.match("3 passed, 1 failed")
    report.junit(tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("skipped") == "1" and suite.get("failures") == "0"
    skipped = suite.findall("testcase")[1].find("skipped")
    assert skipped is not None and skipped.get("message", "").startswith("n/a: userspace")


def _multinode(mode: str) -> MultiNodeCluster:
    """A NodePort cluster's plan as build() lays it out, without a kernel."""
    names = RunNames(4194304)
    cluster = MultiNodeCluster(names, families_of_mode(mode), Path("/nonexistent"))
    cluster.nodes = tuple(node_names(names, i, cluster.families) for i in (1, 2))
    index = 0
    for node in cluster.nodes:
        for name in pod_names(node.index):
            cluster.pods[name] = Pod(name, index, names.netns(name), node.cgroup / name,
                                     tuple(node.plan(f).pod_ip(index) for f in cluster.families))
            cluster.node_of[name] = node
            index += 1
    return cluster


def test_multinode_addressing_names_and_places():
    cluster = _multinode("dual")
    node1, node2 = cluster.nodes
    assert str(node1.plan(Family.IPV4).node_pod_cidr) == "10.244.1.0/24"
    assert str(node2.plan(Family.IPV6).node_pod_cidr) == "fd00:10:244:2::/64"
    assert str(node1.ip(Family.IPV4)) == "172.18.0.11" and str(node2.ip(Family.IPV6)) == (
        "fd00:172:18::c")
    for family in Family:
        # Both of `family` (typed as either family: subnet_of wants its own).
        assert node1.plan(family).node_pod_cidr.subnet_of(
            ADDRESSING[family].cluster_pod_cidr)  # type: ignore[arg-type]
        assert not node1.plan(family).node_pod_cidr.overlaps(node2.plan(family).node_pod_cidr)
        assert vip(family, 13) not in ADDRESSING[family].service_cidr
    assert max(len(n) for n in (node1.bridge, node1.service_interface)) <= 15
    assert all(owner_pid(p.name) == 4194304 for p in (node1.cgroup, node1.bpffs_dir))
    assert all(owner_pid(ns) == 4194304 for ns in (node1.netns, cluster.pods["n2-srv1"].netns))
    assert node1.host.cgroup.parent == node1.cgroup  # the host client is seen by node1's hooks
    # A dead run's clean-up knows only the names (not the families' pod CIDRs).
    assert nodeport_places(RunNames(4194304)) == [
        dataclasses.replace(n.places, pod_cidrs=()) for n in (node1, node2)]
    assert node1.places.pod_cidrs == ("10.244.0.0/16", "fd00:10:244::/56")


def test_nodeport_state_carries_node_ports_vips_and_policies():
    cluster = _multinode("dual")
    state = nodeport_checks.base_state(cluster)
    body = yaml.safe_load(state.to_yaml())
    assert [n["name"] for n in body["nodes"]] == ["node1", "node2"]
    local = _service(state, "local")["service"]
    assert local["type"] == "LoadBalancer" and local["externaltraffictolocal"] is True
    assert local["healthchecknodeport"] == 31200
    assert local["ips"]["loadbalancerips"] == {"v4": ["172.19.0.11"], "v6": ["fd00:172:19::b"]}
    assert "externalips" not in local["ips"]
    assert [p["nodeport"] for p in local["ports"]] == [30200, 30200]
    nodes = {e["podname"]: e["topology"]["node"] for e in _service(state, "local")["endpoints"]}
    assert nodes == {"n1-srv0": "node1", "n1-srv1": "node1", "n2-srv0": "node2"}
    ranged = ServiceSpec("ranged", 8, nodeport_checks.who(30800), type="LoadBalancer",
                         external_ips=nodeport_checks.vips(8), lb_ips=nodeport_checks.vips(9),
                         source_ranges=("172.18.0.100/32",),
                         labels=(("service.kubernetes.io/service-proxy-name", "other"),))
    v4_only = yaml.safe_load(ClusterState(families_of_mode("ipv4"), (ranged,)).to_yaml())
    service = v4_only["services"][0]["service"]
    assert service["ips"] == {"clusterips": {"v4": ["10.96.0.18"]},
                              "externalips": {"v4": ["172.19.0.18"]},
                              "loadbalancerips": {"v4": ["172.19.0.19"]}}
    assert service["ipfilters"] == [{"targetips": {"v4": ["172.19.0.19"]},
                                     "sourceranges": ["172.18.0.100/32"]}]
    assert service["labels"] == {"service.kubernetes.io/service-proxy-name": "other"}


def test_the_brain_reads_the_nodeport_state(tmp_path):
    """The built-in brain takes the file the NodePort checks write (strict:
    an unknown key or a wrong type would refuse it)."""
    path = tmp_path / "state.yaml"
    path.write_text(nodeport_checks.base_state(_multinode("dual")).to_yaml())
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kpng-py")), "file", "-i", str(path), "to-local",
         "--node-name", "node2", "--exit-after", "1", "--healthz-bind-address", "",
         "--metrics-bind-address", "", "to-print"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    synced = json.loads(done.stdout.splitlines()[0])
    assert sorted(p["name"] for p in synced["servicePorts"]) == [
        "default/local:who-tcp", "default/local:who-udp", "default/np:who-tcp",
        "default/np:who-udp", "default/web:echo-tcp", "default/web:http"]


def test_not_applicable_declarations():
    userspace = BACKENDS.get("userspace")
    ebpf = BACKENDS.get("ebpf")
    if userspace is not None:
        assert nodeport_checks.keeps_client_address(userspace) is not None
    if ebpf is not None:
        assert nodeport_checks.keeps_client_address(ebpf) is None
    n7 = next(c for c in nodeport_checks.NODEPORT_CHECKS if c.name.startswith("N7/"))
    assert n7.not_applicable is nodeport_checks.keeps_client_address
    assert all(c.name.split("/")[0] != "N12" for c in nodeport_checks.NODEPORT_CHECKS)


def test_runs_side_by_side_print_whole_and_count(tmp_path, capsys):
    def run(name: str, lines: list[str], code: int) -> tuple[str, list[str]]:
        script = ("import sys, time\n"
                  f"for line in {lines!r}:\n"
                  "    print(line, flush=True)\n    time.sleep(0.05)\n"
                  f"sys.exit({code})\n")
        return name, [sys.executable, "-c", script]

    outcomes = _run_side_by_side([
        run("a", ["a1", "a2", "3 passed, 0 failed"], 0),
        run("b", ["b1", "b2", "1 passed, 2 failed, 1 n/a"], 1),
        run("c", ["c1 set-up failed"], 2),
    ], jobs=2, workdir=tmp_path)
    assert {(o.label, o.code, o.passed, o.failed) for o in outcomes} == {
        ("a", 0, 3, 0), ("b", 1, 1, 2), ("c", 2, 0, 1)}
    out = capsys.readouterr().out
    for name, body in (("a", "a1\na2\n3 passed, 0 failed\n"),
                       ("b", "b1\nb2\n1 passed, 2 failed, 1 n/a\n"), ("c", "c1 set-up failed\n")):
        assert f"== e2e {name}\n{body}== e2e {name}: " in out
    assert list(tmp_path.iterdir()) == []  # the kept output is gone with the run


def test_the_file_plane_waits_only_for_nodes_whose_view_changed():
    """A change no node's view shows gets no change set, so no sync to wait
    for: an only endpoint that turns serving-terminating is still used."""
    families = families_of_mode("ipv4")
    srv = _pods(families)
    rolling = ServiceSpec("rolling", 17, (HTTP,))
    before = ClusterState(families, (rolling.with_endpoints(srv[0]),))
    terminating = before.with_service(rolling.with_endpoints(
        EndpointRef(srv[0], ready=False, terminating=True, serving=True),
        EndpointRef(srv[1], ready=False)))
    assert changed_nodes(before, terminating, ["node-a", "node-b"]) == set()
    remote = before.with_service(rolling.with_endpoints(EndpointRef(srv[0], REMOTE_NODE)))
    assert changed_nodes(before, remote, ["node-a", "node-b"]) == {"node-a", "node-b"}
