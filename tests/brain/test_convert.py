"""`kpng-py file convert`: kubectl's output becomes a state file the brain
serves as KPNG's kube watcher would."""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from kpng_py.api import localv1
from kpng_py.brain.apiobjects import ObjectError
from kpng_py.brain.convert import ConvertError, convert, dump
from kpng_py.brain.statefile import ClusterState, ServiceEntry, parse_state
from kpng_py.brain.view import node_view
from kpng_py.cmd.cli import main

KUBECTL_OUTPUT = Path(__file__).parent / "data" / "kubectl-get.yaml"


def converted(text: str) -> ClusterState:
    """The brain's reading of the converted file (its strict parser)."""
    return parse_state(dump(convert(text)).encode(), "converted.yaml")


def service_named(state: ClusterState, path: str) -> ServiceEntry:
    return next(s for s in state.services if s.path == path)


def test_a_dual_stack_load_balancer_service_keeps_everything_a_proxy_programs() -> None:
    web = service_named(converted(KUBECTL_OUTPUT.read_text()), "shop/web")
    service = localv1.Service.FromString(web.service)
    assert (service.Type, list(service.IPs.ClusterIPs.V4), list(service.IPs.ClusterIPs.V6)) == (
        "LoadBalancer", ["10.96.0.10"], ["fd00:10:96::a"])
    assert list(service.IPs.ExternalIPs.V4) == ["192.0.2.7"]
    # Not 203.0.113.6, of a proxying load balancer (ipMode: Proxy): kube-proxy
    # programs the LB IPs of ipMode VIP only (unset: VIP).
    assert list(service.IPs.LoadBalancerIPs.V4) == ["203.0.113.5", "203.0.113.7"]
    assert [(f.TargetIPs.V4, f.SourceRanges) for f in service.IPFilters] == [
        (["203.0.113.5", "203.0.113.7"], ["198.51.100.0/24"])]
    http, dns = service.Ports
    assert (http.Name, http.Protocol, http.Port, http.NodePort, http.TargetPortName) == (
        "http", localv1.TCP, 80, 30080, "http")
    assert (dns.Protocol, dns.TargetPort) == (localv1.UDP, 5353)
    assert service.ClientIP.TimeoutSeconds == 600
    assert service.ExternalTrafficToLocal and not service.InternalTrafficToLocal
    assert service.HealthCheckNodePort == 31999


def test_endpoints_are_one_per_pod_across_the_families_of_its_slices() -> None:
    web = service_named(converted(KUBECTL_OUTPUT.read_text()), "shop/web")
    by_pod = {e.key: e for e in web.endpoints}
    assert set(by_pod) == {"web-0", "web-1"}
    web0 = localv1.Endpoint.FromString(by_pod["web-0"].endpoint)
    assert (list(web0.IPs.V4), list(web0.IPs.V6)) == (["10.244.0.5"], ["fd00:10:244::5"])
    assert {(o.Name, o.Port) for o in web0.PortOverrides} == {("http", 8080), ("dns", 5353)}
    assert (by_pod["web-0"].ready, by_pod["web-0"].node, by_pod["web-0"].hint_zones) == (
        True, "node-a", ("z1",))
    assert not by_pod["web-1"].ready and by_pod["web-1"].node == "node-b"


def test_what_kube_proxy_does_not_program_is_left_out_and_counted() -> None:
    """As kube-proxy 1.35: another proxy's Service and slices and the slices
    labelled headless are not watched; headless and ExternalName Services
    are skipped."""
    conversion = convert(KUBECTL_OUTPUT.read_text())
    state = converted(KUBECTL_OUTPUT.read_text())
    assert [s.path for s in state.services] == ["shop/web"]
    assert [(n.name, n.zone) for n in state.nodes] == [("node-a", "z1")]
    assert conversion.skipped == {
        "ConfigMap": 1,
        "Service without a ClusterIP (headless)": 1,
        "EndpointSlice labelled service.kubernetes.io/headless": 1,
        "Service of type ExternalName": 1,
        "Service labelled service.kubernetes.io/service-proxy-name (another proxy's)": 1,
        "EndpointSlice labelled service.kubernetes.io/service-proxy-name (another proxy's)": 1}


def test_a_slice_whose_labels_or_address_type_are_not_the_apis_is_no_services() -> None:
    text = _WEB + _SLICE.replace("addressType: IPv4", "addressType: [IPv4]") + "---\n" + \
        _SLICE.replace("{kubernetes.io/service-name: web}", "[web]")
    assert convert(text).skipped == {
        "EndpointSlice without a service or of addressType FQDN": 2}


def test_a_slice_of_a_service_left_out_is_counted_as_such() -> None:
    """A slice the headless label does not put out (made by hand) of a
    Service left out: skipped with it, not as of a Service not in the input."""
    text = ("kind: Service\nmetadata: {name: web}\nspec: {type: ExternalName}\n---\n" + _SLICE)
    assert convert(text).skipped == {"Service of type ExternalName": 1,
                                     "EndpointSlice of a Service left out": 1}


_S = "kind: Service\nmetadata: {name: s}\nspec: "
_SLICE = ("kind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: web}}\n"
          "addressType: IPv4\nendpoints:\n- addresses: [10.0.0.1]\n")


_WEB = ("kind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.10, "
        "ports: [{port: 80}]}\n---\n")


def _slice(address_type: str, address: str, port: int) -> str:
    return ("kind: EndpointSlice\nmetadata: {name: web-1, labels: "
            "{kubernetes.io/service-name: web}}\n"
            f"addressType: {address_type}\nports: [{{name: http, port: {port}}}]\n"
            f"endpoints: [{{addresses: ['{address}']}}]\n")


@pytest.mark.parametrize("text, message", [
    ("kind: Service\nmetadata: {name: s}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 1, "
     "protocol: QUIC}]}\n",
     "Service default/s port 1: protocol 'QUIC' is not one of TCP, UDP, SCTP"),
    ("kind: Service\nmetadata: {name: s}\nspec: {clusterIP: 10.96.0.300, "
     "clusterIPs: [10.96.0.300]}\n",
     "Service default/s clusterIPs: '10.96.0.300' is not an IP address"),
    ("kind: Service\nspec: {clusterIP: 10.96.0.1}\n", "a Service without metadata.name"),
    # The state file reader's checks, on the mapped Service.
    (_S + "{clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 70000}]}\n",
     "Service default/s ports[0].nodeport: port (0: none) 70000 is outside 0..65535"),
    (_S + "{clusterIP: 10.96.0.1, loadBalancerSourceRanges: [10.0.0.0/33]}\n",
     "Service default/s ipfilters[0].sourceranges: '10.0.0.0/33' is not a CIDR"),
    (_S + "{clusterIP: 10.96.0.1, sessionAffinity: ClientIP, sessionAffinityConfig: "
     "{clientIP: {timeoutSeconds: 100000}}}\n",
     "Service default/s clientip.timeoutseconds: timeout (0: the default 10800 s) 100000 is "
     "outside 0..86400"),
    # What is not of the API's types, named (not a crash).
    (_S + "[1]\n", "Service default/s spec: expected a mapping, found [1]"),
    (_S + "{clusterIP: 10.96.0.1, ports: [{port: 80, protocol: [TCP]}]}\n",
     "Service default/s port 80: protocol ['TCP'] is not one of TCP, UDP, SCTP"),
    (_S + "{clusterIP: 10.96.0.1, externalIPs: [5]}\n",
     "Service default/s externalIPs: 5 is not an IP address"),
    ("kind: Service\nmetadata: [s]\nspec: {clusterIP: 10.96.0.1}\n",
     "a Service without metadata.name"),
    (_S + "{clusterIP: 10.96.0.1, ports: [{port: 99999999999}]}\n",
     "Service default/s port: 99999999999 is not a number the API allows"),
    (_S + "{clusterIP: 10.96.0.1, ports: [{port: 80, targetPort: [1]}]}\n",
     "Service default/s targetPort: [1] is not a number the API allows"),
    (_WEB + _SLICE + "  hints: {forNodes: [{}]}\n",
     "EndpointSlice default/s endpoint 10.0.0.1 hints.forNodes: each entry needs a name"),
    (_WEB + _SLICE + "  hints: {forZones: z1}\n",
     "EndpointSlice default/s endpoint 10.0.0.1 hints.forZones: expected a list, found 'z1'"),
    (_WEB + _SLICE + "  conditions: [ready]\n",
     "EndpointSlice default/s endpoint 10.0.0.1 conditions: expected a mapping"),
    ("[1, 2]\n", "not a Kubernetes object or List"),
    ("services: []\n", "not a Kubernetes object or List (`kubectl get ... -o yaml`): it has "
     "no kind; it is a KPNG state file already: give it to `kpng-py file -i` as it is"),
    ("a: [\n", "not YAML"),
    (_WEB + _slice("IPv4", "fd00::5", 8080), "EndpointSlice default/web-1: fd00::5 is not an "
     "IPv4 address, the slice's addressType"),
    (_WEB + _slice("IPv6", "10.1.0.5", 8080), "EndpointSlice default/web-1: 10.1.0.5 is not an "
     "IPv6 address, the slice's addressType"),
    (_WEB + _slice("IPv4", "10.1.0.5", 70000), "EndpointSlice default/web-1 port 'http': port "
     "70000; set port to a number in 1..65535"),
])
def test_what_cannot_be_mapped_names_the_object(text: str, message: str) -> None:
    with pytest.raises((ConvertError, ObjectError), match="^" + re.escape(message)):
        convert(text)


def test_the_file_read_back_is_the_very_state_converted() -> None:
    conversion = convert(KUBECTL_OUTPUT.read_text())
    assert parse_state(dump(conversion).encode(), "converted.yaml") == conversion.state
    assert [len(s.endpoints) for s in conversion.state.services] == [2]


def test_the_command_writes_the_file_and_counts_what_it_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "state.yaml"
    assert main(["file", "convert", "-i", str(KUBECTL_OUTPUT), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "kpng-py: skipped 1 object(s): ConfigMap\n" in err
    assert "kpng-py: skipped 1 object(s): Service of type ExternalName\n" in err
    assert [s.path for s in parse_state(out.read_bytes(), str(out)).services] == ["shop/web"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("[1]\n")
    assert main(["file", "convert", "-i", str(bad)]) == 2
    assert f"{bad}: not a Kubernetes object or List" in capsys.readouterr().err


def converted_paths(path: Path) -> list[str]:
    return [s.path for s in parse_state(path.read_bytes(), str(path)).services]


def test_file_i_gives_convert_its_input(tmp_path: Path) -> None:
    out = tmp_path / "state.yaml"
    assert main(["file", "-i", str(KUBECTL_OUTPUT), "convert", "-o", str(out)]) == 0
    assert converted_paths(out) == ["shop/web"]


@pytest.mark.parametrize("argv, message", [
    (["file", "convert"], "file convert needs -i FILE: kubectl's YAML output (- for standard "
                          "input)"),
    (["file", "-i", "/a.yaml", "convert", "-i", "/b.yaml"],
     "file -i /a.yaml and convert -i /b.yaml: give one -i (after file or after convert)"),
])
def test_convert_takes_one_input(capsys: pytest.CaptureFixture, argv: list[str],
                                 message: str) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err == f"kpng-py: error: {message}\n"


@pytest.mark.parametrize("argv", [["file", "convert", "-i", "-"], ["file", "-i", "-", "convert"]])
def test_convert_reads_standard_input_for_dash(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str]) -> None:
    monkeypatch.chdir(tmp_path)  # where a file named "-" would be looked for
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(KUBECTL_OUTPUT.read_bytes())))
    out = tmp_path / "state.yaml"
    assert main([*argv, "-o", str(out)]) == 0
    assert converted_paths(out) == ["shop/web"]


def test_convert_keeps_a_file_that_is_not_empty_unless_forced(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "state.yaml"
    out.write_text("nodes: []\n")
    assert main(["file", "convert", "-i", str(KUBECTL_OUTPUT), "-o", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"kpng-py: error: -o {out}: exists and is not empty (10 bytes); give --force to "
        "overwrite it, or another file\n")
    assert out.read_text() == "nodes: []\n"
    assert main(["file", "convert", "-i", str(KUBECTL_OUTPUT), "-o", str(out), "--force"]) == 0
    assert converted_paths(out) == ["shop/web"]


def _slice_item(name: str, endpoints: str, address_type: str = "IPv4") -> str:
    """An EndpointSlice of shop/web, as an item of `_cluster`'s List."""
    return textwrap.dedent(f"""\
        - kind: EndpointSlice
          metadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}
          addressType: {address_type}
          ports: [{{name: http, port: 8080, protocol: TCP}}]
          endpoints:
        """) + textwrap.indent(textwrap.dedent(endpoints), "  ")


def _cluster(*slices: str) -> str:
    return ("kind: List\nitems:\n- kind: Service\n  metadata: {name: web, namespace: shop}\n"
            "  spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}\n"
            + "".join(slices))


def test_conditions_are_kept_as_kube_proxy_reads_them() -> None:
    """A terminating pod that still serves is kept (KPNG's converter dropped
    it as not ready); an unknown serving counts as serving, as kube-proxy
    reads it."""
    text = _cluster(_slice_item("web-1", """\
        - addresses: [10.244.0.5]
          conditions: {ready: false, serving: true, terminating: true}
          targetRef: {name: web-0}
        - addresses: [10.244.0.6]
          conditions: {ready: false, terminating: true}
          targetRef: {name: web-1}
        - addresses: [10.244.0.7]
          conditions: {ready: false, serving: false, terminating: true}
          targetRef: {name: web-2}
        - addresses: [10.244.0.8]
          targetRef: {name: web-3}
        """))
    endpoints = service_named(converted(text), "shop/web").endpoints
    assert {e.key: (e.ready, e.serving, e.terminating) for e in endpoints} == {
        "web-0": (False, True, True), "web-1": (False, True, True),
        "web-2": (False, False, True), "web-3": (True, True, False)}


def test_node_hints_are_kept_beside_zone_hints() -> None:
    text = _cluster(_slice_item("web-1", """\
        - addresses: [10.244.0.5]
          nodeName: node-a
          zone: z1
          hints: {forZones: [{name: z1}], forNodes: [{name: node-a}]}
          targetRef: {name: web-0}
        """))
    (web0,) = service_named(converted(text), "shop/web").endpoints
    assert (web0.node, web0.hint_zones, web0.hint_nodes) == ("node-a", ("z1",), ("node-a",))


def test_a_pod_in_two_slices_is_one_endpoint_terminating_if_one_slice_says_so() -> None:
    """A pod moving between slices is listed twice for a while: its address
    once, ready only if both listings say so."""
    text = _cluster(_slice_item("web-1", """\
        - addresses: [10.244.0.5]
          conditions: {ready: true, serving: true, terminating: false}
          targetRef: {name: web-0}
        """), _slice_item("web-2", """\
        - addresses: [10.244.0.5]
          conditions: {ready: false, serving: true, terminating: true}
          targetRef: {name: web-0}
        """))
    (web0,) = service_named(converted(text), "shop/web").endpoints
    assert list(localv1.Endpoint.FromString(web0.endpoint).IPs.V4) == ["10.244.0.5"]
    assert (web0.ready, web0.serving, web0.terminating) == (False, True, True)


def test_a_cluster_without_terminating_endpoints_converts_to_upstreams_format() -> None:
    """`serving`, `terminating` and node hints are written only where they
    say something: upstream KPNG reads the rest."""
    endpoints = [e for entry in yaml.safe_load(dump(convert(KUBECTL_OUTPUT.read_text())))[
        "services"] for e in entry["endpoints"]]
    assert [(list(e["conditions"]), list(e.get("hints", {}))) for e in endpoints] == [
        (["ready"], ["zones"]), (["ready"], [])]


def test_a_services_last_terminating_pods_are_in_every_nodes_view() -> None:
    text = _cluster(_slice_item("web-1", """\
        - addresses: [10.244.0.5]
          conditions: {ready: false, serving: true, terminating: true}
          nodeName: node-a
          targetRef: {name: web-0}
        """))
    assert sorted(path for _, path in node_view(converted(text), "node-b")) == [
        "shop/web", "shop/web/web-0"]


def test_a_slice_of_a_service_not_in_the_input_is_counted_as_skipped():
    conversion = convert(_SLICE)
    assert conversion.state.services == ()
    assert conversion.skipped == {"EndpointSlice of a Service not in the input": 1}
