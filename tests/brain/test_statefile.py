"""The state file format: upstream's keys and defaults, and strict errors that
name the file, the line, the place and the problem."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from kpng_py.api import localv1
from kpng_py.brain.statefile import (
    ClusterState,
    StateFileError,
    StateReader,
    endpoint_hash,
    parse_state,
    read_strict,
)
from tests.support.state_files import endpoint, port, service, state

# The example of docs/spec/state-file.md.
SPEC_EXAMPLE = """\
nodes:
- name: node-a
  topology: {node: node-a, zone: z1}
services:
- service:
    namespace: default
    name: web
    type: ClusterIP
    ips:
      clusterips: {v4: [10.96.0.10], v6: ["fd00:10:96::a"]}
    ports:
    - {name: http, protocol: 1, port: 80, targetportname: http}
    - {name: dns, protocol: 2, port: 53, targetport: 5353}
  endpoints:
  - podname: web-0
    endpoint:
      ips: {v4: [10.244.0.5], v6: ["fd00:10:244::5"]}
      portoverrides: [{name: http, port: 8080}]
    topology: {node: node-a}
  - endpoint:
      ips: {v4: [10.244.1.7]}
      portoverrides: [{name: http, port: 8081}]
    topology: {node: node-b}
    conditions: {ready: true}
"""


def parse(text: str) -> ClusterState:
    return parse_state(textwrap.dedent(text).encode(), "state.yaml")


def test_the_spec_example_reads_into_localv1_objects() -> None:
    state = parse(SPEC_EXAMPLE)

    assert [(n.name, n.zone) for n in state.nodes] == [("node-a", "z1")]
    (web,) = state.services
    assert (web.path, web.internal_traffic_local, web.external_traffic_local) == (
        "default/web", False, False)
    service = localv1.Service.FromString(web.service)
    assert service == localv1.Service(
        Namespace="default", Name="web", Type="ClusterIP",
        IPs=localv1.ServiceIPs(ClusterIPs=localv1.IPSet(V4=["10.96.0.10"],
                                                        V6=["fd00:10:96::a"])),
        Ports=[localv1.PortMapping(Name="http", Protocol=localv1.TCP, Port=80,
                                   TargetPortName="http"),
               localv1.PortMapping(Name="dns", Protocol=localv1.UDP, Port=53,
                                   TargetPort=5353)])
    pod, hashed = web.endpoints
    assert (pod.key, pod.ready, pod.node, pod.hint_zones) == ("web-0", True, "node-a", ())
    assert localv1.Endpoint.FromString(pod.endpoint) == localv1.Endpoint(
        IPs=localv1.IPSet(V4=["10.244.0.5"], V6=["fd00:10:244::5"]),
        PortOverrides=[localv1.PortName(Name="http", Port=8080)])
    assert re.fullmatch(r"[0-9a-f]{16}", hashed.key)
    assert hashed.key == endpoint_hash(hashed.endpoint)
    assert (hashed.ready, hashed.node) == (True, "node-b")


def test_defaults_are_upstreams() -> None:
    state = parse("""\
        services:
        - service:
            name: web
            ports: [{protocol: 1, port: 80}]
          endpoints:
          - endpoint: {ips: {v4: [10.1.0.1]}}
          - endpoint: {ips: {v4: [10.1.0.2]}}
            conditions: {ready: false}
          - endpoint: {ips: {v4: [10.1.0.3]}}
            conditions: {}
          - endpoint: {ips: {v4: [10.1.0.4]}}
            namespace: elsewhere
            servicename: other
    """)
    (web,) = state.services
    assert localv1.Service.FromString(web.service).Namespace == "default"
    assert web.path == "default/web"
    # No conditions: ready. Conditions without `ready`: not ready (as upstream).
    assert [e.ready for e in web.endpoints] == [True, False, False, True]
    assert state.nodes == ()


def test_hash_keys_are_stable_and_ignore_per_node_fields() -> None:
    """Local and Scopes are the brain's to compute (KPNG's own dumps carry
    them): they are dropped, so they change neither the bytes nor the key."""
    plain = parse("""\
        services:
        - service: {name: a, ports: [{protocol: 1, port: 80}]}
          endpoints: [{endpoint: {ips: {v4: [10.1.0.1]}}}]
    """)
    with_flags = parse("""\
        services:
        - service: {name: a, ports: [{protocol: 1, port: 80}]}
          endpoints:
          - endpoint:
              ips: {v4: [10.1.0.1]}
              local: true
              scopes: {internal: true, external: false}
    """)
    assert plain == with_flags
    assert re.fullmatch(r"[0-9a-f]{16}", plain.services[0].endpoints[0].key)
    assert parse_state(b"services: []", "x") == ClusterState()


def test_every_service_field_reads_by_its_lower_cased_name() -> None:
    state = parse("""\
        services:
        - service:
            namespace: shop
            name: cart
            type: LoadBalancer
            labels: {app: cart, tier: "1"}
            annotations: {note: yes}
            ips:
              clusterips: {v4: [10.96.0.20]}
              externalips: {v4: [192.0.2.10]}
              loadbalancerips: {v6: ["2001:db8::10"]}
            ipfilters:
            - {targetips: {v4: [192.0.2.10]}, sourceranges: [198.51.100.0/24]}
            mapip: false
            ports:
            - {name: https, protocol: 1, port: 443, nodeport: 30443, targetport: 8443}
            externaltraffictolocal: true
            internaltraffictolocal: true
            healthchecknodeport: 32000
            sessionaffinity: {clientip: {timeoutseconds: 600}}
    """)
    (cart,) = state.services
    service = localv1.Service.FromString(cart.service)
    assert (cart.internal_traffic_local, cart.external_traffic_local) == (True, True)
    assert dict(service.Labels) == {"app": "cart", "tier": "1"}
    assert dict(service.Annotations) == {"note": "yes"}  # a string field takes the text
    assert list(service.IPs.LoadBalancerIPs.V6) == ["2001:db8::10"]
    assert list(service.IPFilters[0].SourceRanges) == ["198.51.100.0/24"]
    assert service.Ports[0].NodePort == 30443
    assert service.HealthCheckNodePort == 32000
    assert service.WhichOneof("SessionAffinity") == "ClientIP"
    assert service.ClientIP.TimeoutSeconds == 600


def test_zone_hints_and_topology_are_read() -> None:
    state = parse("""\
        nodes:
        - {name: n1, labels: {a: b}, annotations: {}, topology: {zone: z1}}
        - {name: n2}
        services:
        - service: {name: a, ports: [{protocol: 1, port: 80}]}
          endpoints:
          - endpoint: {ips: {v4: [10.1.0.1]}}
            topology: {node: n1, zone: z1}
            hints: {zones: [z1, z2]}
    """)
    assert state.zone_of("n1") == "z1"
    assert state.zone_of("n2") == ""
    assert state.zone_of("unknown") == ""
    assert state.services[0].endpoints[0].hint_zones == ("z1", "z2")


def test_conditions_say_serving_and_terminating_and_hints_name_nodes() -> None:
    """kpng-py's extension: the EndpointSlice conditions and node hints.
    Without `serving`, serving; without `terminating`, not terminating (as
    kube-proxy reads a slice); `ready` as upstream."""
    state = parse("""\
        services:
        - service: {name: a, ports: [{protocol: 1, port: 80}]}
          endpoints:
          - endpoint: {ips: {v4: [10.1.0.1]}}
          - endpoint: {ips: {v4: [10.1.0.2]}}
            conditions: {ready: false, serving: true, terminating: true}
          - endpoint: {ips: {v4: [10.1.0.3]}}
            conditions: {ready: false, serving: false, terminating: true}
          - endpoint: {ips: {v4: [10.1.0.4]}}
            conditions: {ready: false, terminating: true}
          - endpoint: {ips: {v4: [10.1.0.5]}}
            conditions: {}
            hints: {zones: [z1], nodes: [n1, n2]}
    """)
    endpoints = state.services[0].endpoints
    assert [(e.ready, e.serving, e.terminating) for e in endpoints] == [
        (True, True, False), (False, True, True), (False, False, True), (False, True, True),
        (False, True, False)]
    assert [(e.hint_zones, e.hint_nodes) for e in endpoints][-2:] == [
        ((), ()), (("z1",), ("n1", "n2"))]


def test_the_fast_reader_reads_the_extension_as_the_strict_one() -> None:
    """The plain reader reads serving, terminating and node hints as the
    strict reader does, or declines: never reads them otherwise."""
    text = yaml.safe_dump(state(service("a", ("10.96.0.1",), [port("http")], [
        endpoint("10.1.0.1", node="n1", pod="a-1", overrides={"http": 8080},
                 conditions={"ready": False, "serving": True, "terminating": True}),
        endpoint("10.1.0.2", node="n2", pod="a-2", overrides={"http": 8080},
                 hints={"zones": ["z2"], "nodes": ["n2"]}),
        endpoint("10.1.0.3", node="n2", pod="a-3", overrides={"http": 8080})])))
    read = read_strict(text, "state.yaml")
    assert StateReader("state.yaml").read_plain(text, text.encode()) in (None, read)
    assert [(e.terminating, e.hint_nodes) for e in read.services[0].endpoints] == [
        (True, ()), (False, ("n2",)), (False, ())]


_BASE = """\
services:
- service:
    name: web
    ips: {clusterips: {v4: [10.96.0.10]}}
    ports:
    - {name: http, protocol: 1, port: 80}
  endpoints:
  - podname: web-0
    endpoint: {ips: {v4: [10.1.0.1]}}
"""


@pytest.mark.parametrize("style", ["flow", "block"])
def test_protocols_may_be_given_by_name_as_well_as_number(style: str) -> None:
    """`protocol: TCP` reads as `protocol: 1` (KPNG's files carry numbers;
    people write names), in the strict reader (flow style) and in the block
    reader that goes first."""
    def state(tcp: str, udp: str) -> str:
        if style == "flow":
            ports = (f"    - {{name: http, protocol: {tcp}, port: 80}}\n"
                     f"    - {{name: dns, protocol: {udp}, port: 53}}\n")
        else:
            ports = (f"    - name: http\n      protocol: {tcp}\n      port: 80\n"
                     f"    - name: dns\n      protocol: {udp}\n      port: 53\n")
        return ("services:\n- service:\n    name: web\n    ips:\n      clusterips:\n"
                "        v4:\n        - 10.96.0.10\n    ports:\n" + ports)

    by_name = parse_state(state("TCP", "UDP").encode(), "state.yaml")
    assert by_name == parse_state(state("1", "2").encode(), "state.yaml")
    service = localv1.Service.FromString(by_name.services[0].service)
    assert [p.Protocol for p in service.Ports] == [localv1.TCP, localv1.UDP]


@pytest.mark.parametrize("old, new, message", [
    ("name: web", "name: web\n    colour: blue",
     "state.yaml:4: services[0].service.colour: unknown key 'colour'; expected one of: "
     "namespace, name, type, ips, mapip, ports, externaltraffictolocal, labels, "),
    ("podname: web-0", "podnam: web-0",
     "state.yaml:8: services[0].endpoints[0].podnam: unknown key 'podnam'"),
    ("ports:\n    - {name: http, protocol: 1, port: 80}", "ports: 80",
     "state.yaml:5: services[0].service.ports: expected a list, found '80'"),
    ("port: 80}", "port: eighty}",
     "state.yaml:6: services[0].service.ports[0].port: expected a whole number, "
     "found 'eighty'"),
    ("port: 80}", "port: 80, nodeport: 70000}",
     "state.yaml:6: services[0].service.ports[0].nodeport: port (0: none) 70000 is outside"),
    ("protocol: 1", "protocol: 7",
     "state.yaml:6: services[0].service.ports[0]: protocol 7; set protocol to 1 (TCP), "
     "2 (UDP), 3 (SCTP)"),
    ("protocol: 1, ", "",
     "state.yaml:6: services[0].service.ports[0]: no protocol; set protocol to 1 (TCP)"),
    ("protocol: 1", "protocol: tcp",
     "state.yaml:6: services[0].service.ports[0].protocol: 'tcp' is not one of "
     "UnknownProtocol (0), TCP (1), UDP (2), SCTP (3)"),
    ("protocol: 1", "protocol: [TCP]",
     "state.yaml:6: services[0].service.ports[0].protocol: expected a whole number or a name, "
     "found a list"),
    ("protocol: 1, port: 80", "protocol: 1",
     "state.yaml:6: services[0].service.ports[0]: no port; set port to a number in 1..65535"),
    ("endpoint: {ips: {v4: [10.1.0.1]}}",
     "endpoint: {ips: {v4: [10.1.0.1]}, portoverrides: [{name: http}]}",
     "state.yaml:9: services[0].endpoints[0].endpoint.portoverrides[0]: no port; set port to a "
     "number in 1..65535"),
    ("v4: [10.1.0.1]", "v4: [10.1.0.300]",
     "state.yaml:9: services[0].endpoints[0].endpoint.ips.v4[0]: '10.1.0.300' is not an "
     "IP address"),
    ("v4: [10.96.0.10]", "v4: ['fd00::10']",
     "state.yaml:4: services[0].service.ips.clusterips.v4[0]: fd00::10 is not an IPv4 "
     "address; list it under v6"),
    ("name: web", "name: web\n    ipfilters: [{sourceranges: [10.0.0.0/33]}]",
     "state.yaml:4: services[0].service.ipfilters[0].sourceranges[0]: '10.0.0.0/33' is not "
     "a CIDR"),
    ("name: web", "name: web\n    mapip: maybe",
     "state.yaml:4: services[0].service.mapip: expected true or false, found 'maybe'"),
    ("name: web", "name: web\n    name: web2",
     "state.yaml:4: services[0].service.name: repeats the key 'name' (first on line 3)"),
    ("name: web", "name: a/b",
     "state.yaml:3: services[0].service: the service name 'a/b' must be non-empty"),
    ("name: web", "namespace: x",
     "state.yaml:3: services[0].service: the service name '' must be non-empty"),
    ("  - podname: web-0", "  - hash: -1\n    podname: web-0",
     "state.yaml:8: services[0].endpoints[0].hash: -1 is outside 0..18446744073709551615"),
    ("  - podname: web-0\n    endpoint: {ips: {v4: [10.1.0.1]}}",
     "  - podname: web-0\n    endpoint: {ips: {v4: [10.1.0.1]}}\n"
     "  - podname: web-0\n    endpoint: {ips: {v4: [10.1.0.2]}}",
     "state.yaml:10: services[0].endpoints[1]: endpoint 'web-0' is already defined at "
     "services[0].endpoints[0] (line 8); remove one"),
    ("  - podname: web-0\n    endpoint: {ips: {v4: [10.1.0.1]}}", "  - podname: web-0",
     "state.yaml:8: services[0].endpoints[0]: an endpoint needs `endpoint`"),
    ("    - {name: http, protocol: 1, port: 80}",
     "    - {name: http, protocol: 1, port: 80}\n    - [oops",
     "state.yaml:8: not valid YAML: "),
    ("services:", "services:\n- service: {name: web, ports: []}",
     "state.yaml:3: services[1]: service 'default/web' is already defined at services[0] "
     "(line 2); remove one"),
    ("services:", "nodes: [{labels: {}}]\nservices:",
     "state.yaml:1: nodes[0]: a node needs a name"),
    ("services:", "nodes: {}\nservices:", "state.yaml:1: nodes: expected a list, found a mapping"),
    ("endpoint: {ips: {v4: [10.1.0.1]}}",
     "endpoint: {ips: {v4: [10.1.0.1]}}\n    conditions: {ready: false, serving: maybe}",
     "state.yaml:10: services[0].endpoints[0].conditions.serving: expected true or false, "
     "found 'maybe'"),
    ("endpoint: {ips: {v4: [10.1.0.1]}}",
     "endpoint: {ips: {v4: [10.1.0.1]}}\n    conditions: {terminated: true}",
     "state.yaml:10: services[0].endpoints[0].conditions.terminated: unknown key 'terminated'; "
     "expected one of: ready, serving, terminating"),
    ("endpoint: {ips: {v4: [10.1.0.1]}}",
     "endpoint: {ips: {v4: [10.1.0.1]}}\n    hints: {nodes: n1}",
     "state.yaml:10: services[0].endpoints[0].hints.nodes: expected a list, found 'n1'"),
    ("services:", "services:\n- endpoints: []",
     "state.yaml:2: services[0]: each entry of services needs a `service`"),
    ("name: web", "name: web\n    sessionaffinity: {clientip: {timeoutseconds: 90000}}",
     "state.yaml:4: services[0].service.sessionaffinity.clientip.timeoutseconds: timeout "
     "(0: the default 10800 s) 90000 is outside 0..86400"),
])
def test_a_bad_file_is_an_error_naming_file_line_place_and_problem(
        old: str, new: str, message: str) -> None:
    assert old in _BASE
    parse_state(_BASE.encode(), "state.yaml")  # the base itself is good
    with pytest.raises(StateFileError) as caught:
        parse_state(_BASE.replace(old, new, 1).encode(), "state.yaml")
    assert str(caught.value).startswith(message), str(caught.value)


def test_text_that_is_not_utf8_is_an_error() -> None:
    with pytest.raises(StateFileError, match=r"^state.yaml: not UTF-8 text \(byte 11\)"):
        parse_state(b"services: [\xff]", "state.yaml")


def test_a_top_level_that_is_not_a_mapping_is_an_error() -> None:
    with pytest.raises(StateFileError, match=r"^state.yaml:1: expected a mapping, found a list"):
        parse_state(b"- a\n- b\n", "state.yaml")


@pytest.mark.parametrize("text", [
    (Path(__file__).parent / "data" / "kubectl-get.yaml").read_text(),  # a List
    "kind: Service\napiVersion: v1\nmetadata: {name: web}\n",  # one object
])
def test_kubernetes_objects_are_refused_with_the_command_that_converts_them(text: str) -> None:
    with pytest.raises(StateFileError, match=re.escape(
            "the file holds Kubernetes objects (`kubectl get ... -o yaml`), not a KPNG state: "
            "run `kpng-py file convert -i k.yaml -o state.yaml` first and give state.yaml "
            "to -i")):
        parse_state(text.encode(), "k.yaml")


def test_an_empty_file_is_an_empty_state() -> None:
    assert parse_state(b"", "state.yaml") == ClusterState()
    assert parse_state(b"# nothing yet\n", "state.yaml") == ClusterState()
