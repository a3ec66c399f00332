"""The fast parsers' plain values, and what they decline: whatever YAML 1.1
(libyaml, the strict reader's) and YAML 1.2 (yaml-rs) or JSON may read apart."""

from __future__ import annotations

import pytest

from kpng_py.api import localv1
from kpng_py.brain.plainload import Unchecked, plain_document
from kpng_py.brain.statefile import StateFileError, StateReader, parse_state


@pytest.mark.parametrize("text", [
    "a: [1, x, ~, true, 10.1.0.10, fd00::01, pod-01, 0, '010']\n",
    '{"a": [1, "x", null, true, "10.1.0.10", "fd00::01", "pod-01", 0, "010"]}',
    '{"a": [1, x, ~, true, 10.1.0.10, fd00::01, pod-01, 0, "010"]}',  # flow YAML, not JSON
])
def test_json_and_yaml_read_into_plain_values(text: str) -> None:
    assert plain_document(text) == {
        "a": [1, "x", None, True, "10.1.0.10", "fd00::01", "pod-01", 0, "010"]}


@pytest.mark.parametrize("text", [
    "a: x\u2028 y\n",  # a line break in YAML 1.1 (folded), text in YAML 1.2
    "a: x\x85y\n",
    "\ufeffa: 1\n",
    "a: &x 5\nb: *x\n",  # aliases: the strict reader counts their expansion
    "a: !foo 5\n",  # tags type the value
    "%YAML 1.1\n---\na: 1\n",
    "a: 010\n",  # 8 in YAML 1.1, 10 in YAML 1.2
    "a: [-0o10]\n",
    "a: {b: 0_10}\n",
    '{"a"\n: 1}',  # JSON, but not YAML to libyaml
    '{"a": "\\ud83d\\ude00"}',
    "a: [1\n",
    "a: 1\na: 2\n",
    '{"a": 1, "a": 2}',
    "a: {{x: [1]}: 2}\n",  # a key Python cannot hold: no dict key
])
def test_what_yaml_1_1_may_read_otherwise_is_declined(text: str) -> None:
    with pytest.raises(Unchecked):
        plain_document(text)


@pytest.mark.parametrize(("name", "port", "read"), [
    ("web", "010", ("web", 8)),  # 10 to YAML 1.2
    ("web\u2028 x", "80", ("web\u2028x", 80)),  # a line break folded (text to YAML 1.2)
])
def test_a_file_yaml_1_2_reads_otherwise_gets_the_strict_reading(
        name: str, port: str, read: tuple[str, int]) -> None:
    text = f"services:\n- service: {{name: {name}, ports: [{{protocol: 1, port: {port}}}]}}\n"
    assert StateReader("state.yaml").read_plain(text) is None
    (web,) = parse_state(text.encode(), "state.yaml").services
    service = localv1.Service.FromString(web.service)
    assert (service.Name, service.Ports[0].Port) == read


def test_aliases_past_the_strict_budget_are_refused_whatever_yaml_rs_allows() -> None:
    """200 endpoints aliasing one list of 1000 IPs: within yaml-rs's own
    limit on aliases, past the strict reader's budget (reader.py)."""
    listed = ", ".join(f"10.1.{i // 250}.{i % 250 + 1}" for i in range(1000))
    text = ("services:\n- service: {name: web, ports: [{protocol: 1, port: 80}]}\n"
            f"  endpoints:\n  - {{podname: p0, endpoint: {{ips: &ips {{v4: [{listed}]}}}}}}\n"
            + "".join(f"  - {{podname: p{i}, endpoint: {{ips: *ips}}}}\n" for i in range(1, 200)))
    assert StateReader("state.yaml").read_plain(text) is None
    with pytest.raises(StateFileError, match=r"the alias \*ips takes the document past"):
        parse_state(text.encode(), "state.yaml")


@pytest.mark.parametrize("text", [
    "services:\n- service: {name: a, namespace: b}\n  endpoints: [{{x: [1]}: 2}]\n",
    "services: [{service: {name: a}, endpoints: [{{x: [1]}: 2}]}]\n",
    "services:\n- {? {a: [1]} : 1}\n",
])
def test_a_key_that_is_a_collection_gets_the_strict_error(text: str) -> None:
    """yaml-rs cannot give a mapping as a dict key: the strict reader
    names it (it is no key of the format) at the mapping that holds it."""
    with pytest.raises(StateFileError, match=r"\]: unknown key a non-scalar key"):
        parse_state(text.encode(), "state.yaml")
