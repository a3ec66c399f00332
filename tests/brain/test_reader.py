"""The strict reader of one YAML document (kpng_py/brain/reader.py): typed
accessors that name the place of what they refuse, protobuf messages read by
lower-cased field names, and the budget on aliases."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import pytest

from kpng_py.api import localv1
from kpng_py.brain.reader import (
    FieldChecks,
    Place,
    Value,
    check_message,
    enum_choices,
    read_document,
)
from kpng_py.brain.statefile import ClusterState, StateFileError, parse_state


def _root(text: str) -> Value:
    return read_document(textwrap.dedent(text), "doc.yaml")


def _refused(read: Any, message: str) -> None:
    with pytest.raises(StateFileError) as caught:
        read()
    assert str(caught.value) == message


def test_a_place_names_file_line_and_path_as_far_as_it_knows_them() -> None:
    assert str(Place("doc.yaml", "services[0].name", 3)) == "doc.yaml:3: services[0].name"
    assert str(Place("doc.yaml", "", 1)) == "doc.yaml:1"
    assert str(Place("doc.yaml", "nodes", None)) == "doc.yaml: nodes"


def test_members_carry_their_path_and_line_and_an_absent_one_reads_null() -> None:
    members = _root("""\
        a:
          b: [x, 7]
        """).mapping(["a", "c"])
    inner = members["a"].mapping(["b"])["b"].sequence()
    assert [item.place for item in inner] == [Place("doc.yaml", "a.b[0]", 2),
                                              Place("doc.yaml", "a.b[1]", 2)]
    assert [item.string() for item in inner] == ["x", "7"]  # any scalar's text
    absent = members["c"]
    assert absent.is_null and absent.place == Place("doc.yaml", "c", 1)
    assert absent.sequence() == [] and absent.integer(0, 9) == 0 and absent.string() == ""
    with pytest.raises(KeyError):
        members["d"]


def test_an_unknown_key_is_refused_with_its_hint_or_the_keys_allowed() -> None:
    root = _root("a: 1\nkind: List\n")
    _refused(lambda: root.mapping(["a"], {"kind": "not a state; convert it"}),
             "doc.yaml:2: kind: unknown key 'kind'; not a state; convert it")
    _refused(lambda: root.mapping(["a", "b"]),
             "doc.yaml:2: kind: unknown key 'kind'; expected one of: a, b")


def test_a_repeated_key_names_the_line_of_the_first() -> None:
    _refused(lambda: _root("a: 1\nb: 2\na: 3\n").mapping(["a", "b"]),
             "doc.yaml:3: a: repeats the key 'a' (first on line 1)")


def test_a_key_that_is_no_scalar_is_blamed_at_the_mapping_that_holds_it() -> None:
    _refused(lambda: _root("a:\n  ? [x]\n  : 1\n").mapping(["a"])["a"].mapping(["b"]),
             "doc.yaml:2: a: unknown key a non-scalar key; expected one of: b")


@pytest.mark.parametrize("text, read, message", [
    ("n: 70000", lambda v: v.integer(0, 65535), "doc.yaml:1: n: 70000 is outside 0..65535"),
    ("n: '80'", lambda v: v.integer(0, 65535), "doc.yaml:1: n: expected a whole number, "
                                               "found '80'"),
    ("n: 1", lambda v: v.boolean(), "doc.yaml:1: n: expected true or false, found '1'"),
    ("n: [1]", lambda v: v.string(), "doc.yaml:1: n: expected a string, found a list"),
    ("n: {a: 1}", lambda v: v.sequence(), "doc.yaml:1: n: expected a list, found a mapping"),
    ("n: x", lambda v: v.string_map(), "doc.yaml:1: n: expected a mapping of strings, "
                                       "found 'x'"),
    ("n: ICMP", lambda v: v.enum(localv1.Protocol.DESCRIPTOR),
     "doc.yaml:1: n: 'ICMP' is not one of UnknownProtocol (0), TCP (1), UDP (2), SCTP (3)"),
])
def test_a_scalar_of_the_wrong_kind_is_refused_at_its_place(
        text: str, read: Any, message: str) -> None:
    value = _root(text).mapping(["n"])["n"]
    _refused(lambda: read(value), message)


def test_an_enum_is_read_by_number_or_by_name() -> None:
    members = _root("a: 2\nb: SCTP\n").mapping(["a", "b"])
    protocol = localv1.Protocol.DESCRIPTOR
    assert (members["a"].enum(protocol), members["b"].enum(protocol)) == (2, 3)
    assert enum_choices(protocol) == "UnknownProtocol (0), TCP (1), UDP (2), SCTP (3)"


def test_a_message_is_read_by_lower_cased_names_with_its_oneof_under_its_own_name() -> None:
    service = _root("""\
        name: web
        ports: [{protocol: TCP, port: 80}]
        labels: {app: web}
        sessionaffinity: {clientip: {timeoutseconds: 60}}
        ips: {clusterips: {v4: [10.96.0.1]}}
        """).message(localv1.Service, {})
    assert service == localv1.Service(
        Name="web", Ports=[localv1.PortMapping(Protocol=localv1.TCP, Port=80)],
        Labels={"app": "web"}, ClientIP=localv1.ClientIPAffinity(TimeoutSeconds=60),
        IPs=localv1.ServiceIPs(ClusterIPs=localv1.IPSet(V4=["10.96.0.1"])))


def _no_port(blame: Any, port: int) -> None:
    if port == 0:
        blame.fail("no port")


CHECKS: FieldChecks = {"localv1.PortMapping.Port": _no_port}


def test_field_checks_blame_the_place_of_the_value_they_refuse() -> None:
    _refused(lambda: _root("ports: [{port: 80}, {port: 0}]\n").message(localv1.Service, CHECKS),
             "doc.yaml:1: ports[1].port: no port")


def test_check_message_applies_the_checks_to_a_message_built_otherwise() -> None:
    blamed: list[str] = []

    class Recorder:
        def __init__(self, path: str) -> None:
            self.path = path

        def fail(self, problem: str) -> Any:
            blamed.append(f"{self.path}: {problem}")

    def unnamed(blame: Any, port: localv1.PortMapping) -> None:
        if not port.Name:
            blame.fail("unnamed")

    def too_high(blame: Any, port: int) -> None:
        if port > 65535:
            blame.fail("too high")

    service = localv1.Service(Ports=[localv1.PortMapping(Port=80),
                                     localv1.PortMapping(Name="x", Port=70000)])
    check_message(service, {"localv1.PortMapping": unnamed,
                            "localv1.PortMapping.Port": too_high}, Recorder)
    assert blamed == ["ports[0]: unnamed", "ports[1].port: too high"]


def test_text_that_is_not_yaml_names_the_line() -> None:
    with pytest.raises(StateFileError, match=r"^doc\.yaml:3: not valid YAML: .*node content"):
        read_document("a: 1\nb: [\n", "doc.yaml")


def _parse(text: str) -> ClusterState:
    return parse_state(textwrap.dedent(text).encode(), "state.yaml")


# -- aliases ---------------------------------------------------------------------

def test_modest_aliasing_reads_as_if_the_values_were_written_out() -> None:
    """KPNG's yaml.v2 reads aliases: a port list or an endpoint shared by
    services is the same as written out twice."""
    aliased = _parse("""\
        services:
        - service: {name: web, ports: &ports [{name: http, protocol: 1, port: 80}]}
          endpoints: [&pod {podname: p0, endpoint: {ips: {v4: [10.1.0.1]}}}]
        - service: {name: api, ports: *ports}
          endpoints: [*pod]
        """)
    written_out = _parse("""\
        services:
        - service: {name: web, ports: [{name: http, protocol: 1, port: 80}]}
          endpoints: [{podname: p0, endpoint: {ips: {v4: [10.1.0.1]}}}]
        - service: {name: api, ports: [{name: http, protocol: 1, port: 80}]}
          endpoints: [{podname: p0, endpoint: {ips: {v4: [10.1.0.1]}}}]
        """)
    assert aliased == written_out


def _many_ips_by_alias(endpoints: int, ips: int) -> str:
    """The attack of issue 12: a list of IPs anchored once and aliased by
    every endpoint, so that a small file makes the reader check
    endpoints x ips addresses."""
    listed = ", ".join(f"10.1.{i // 250}.{i % 250 + 1}" for i in range(ips))
    pods = "".join(f"  - {{podname: p{i}, endpoint: {{ips: *ips}}}}\n"
                   for i in range(1, endpoints))
    return ("services:\n- service: {name: web, ports: [{protocol: 1, port: 80}]}\n"
            f"  endpoints:\n  - {{podname: p0, endpoint: {{ips: &ips {{v4: [{listed}]}}}}}}\n"
            + pods)


def test_aliases_that_expand_without_bound_are_refused_at_the_alias() -> None:
    text = _many_ips_by_alias(endpoints=4000, ips=1000)
    assert len(text) < 300_000  # 4 million IPs to check, as the issue found
    with pytest.raises(StateFileError) as error:
        parse_state(text.encode(), "state.yaml")
    message = str(error.value)
    at = re.match(r"state\.yaml:(\d+): ", message)
    assert at, message
    line = int(at.group(1))
    assert "*ips" in text.splitlines()[line - 1]  # the line of the alias that ran over
    assert "the alias *ips takes the document past" in message
    assert message.endswith("write the aliased values out instead")


def test_a_billion_laughs_is_refused_before_it_is_read() -> None:
    laughs = "".join(f"- &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
    with pytest.raises(StateFileError, match=r"^state\.yaml:\d+: the alias \*l\d takes"):
        parse_state(("nodes:\n- &l0 {name: x}\nservices:\n" + laughs).encode(), "state.yaml")


def test_aliases_within_the_budget_are_read() -> None:
    """Ten endpoints sharing one list of 1000 IPs: 10 times the nodes written
    at most, so it is read (and each IP checked)."""
    state = parse_state(_many_ips_by_alias(endpoints=10, ips=1000).encode(), "state.yaml")
    (web,) = state.services
    assert len(web.endpoints) == 10
    assert len(localv1.Endpoint.FromString(web.endpoints[9].endpoint).IPs.V4) == 1000
