"""A state file's services as items (kpng_py/brain/items.py): found in YAML
(block items, or one flow sequence) and in JSON of any layout, and where a
layout only looks like items, the file read whole, with the strict reader's
outcome."""

from __future__ import annotations

import json

import pytest
import yaml

from kpng_py.brain.items import split_services
from kpng_py.brain.statefile import (
    ClusterState,
    StateFileError,
    StateReader,
    parse_state,
    read_strict,
)
from tests.support.state_files import DNS, NODES, W1, W2, flow_entry, flow_sequences, state, web

DOCUMENT = state(web(W1, W2), DNS, nodes=NODES)
# Its two entries and its nodes in flow style, one line each.
WEB, DNS_ENTRY = map(flow_entry, DOCUMENT["services"])
NODES_LINE = f"nodes: [{', '.join(map(flow_entry, NODES))}]\n"


def _read_fast(text: str) -> ClusterState | None:
    return StateReader("state.json").read_plain(text)


@pytest.mark.parametrize("text", [
    json.dumps(DOCUMENT, indent=1),
    json.dumps(DOCUMENT, indent=4),
    json.dumps(DOCUMENT, indent="\t"),
    json.dumps(DOCUMENT),
    json.dumps(DOCUMENT, separators=(",", ":")),
    json.dumps(DOCUMENT, indent=2).replace("\n", "\r\n"),
    json.dumps(DOCUMENT, indent=2, sort_keys=True),  # an entry's first key: endpoints
], ids=["indent-1", "indent-4", "tabs", "one-line", "no-spaces", "crlf", "sorted"])
def test_json_has_one_item_a_service(text) -> None:
    skeleton, items = split_services(text)
    assert [json.loads(item)[0] for item in items] == DOCUMENT["services"]
    assert json.loads(skeleton) == {**DOCUMENT, "services": []}
    assert _read_fast(text) == read_strict(text, "state.json")


@pytest.mark.parametrize("text", [
    json.dumps({"nodes": NODES}, indent=2),
    json.dumps({"services": [], "nodes": NODES}),
    "{services: [], nodes: []}\n",
    NODES_LINE + "services: []\n",
], ids=["no-services", "empty", "flow-empty", "yaml-flow-empty"])
def test_json_without_such_items_is_read_whole(text) -> None:
    assert split_services(text) == (text, [])


def test_a_cut_inside_an_entry_fails_to_read_and_the_file_gets_the_strict_error() -> None:
    """An object inside an entry that starts as an entry does (`"service"`
    first, after `},`): the pieces cut there are not values, the fast path
    declines, and the strict reader reads the file whole. (No valid file has
    such an object: no list of objects inside an entry allows that key.)"""
    entry = DOCUMENT["services"][0]
    second = {"service": {}, **entry["endpoints"][1]}  # the first service's second endpoint
    bad_entry = {**entry, "endpoints": [entry["endpoints"][0], second]}
    bad = json.dumps({**DOCUMENT, "services": [bad_entry, *DOCUMENT["services"][1:]]},
                     indent=1)
    assert len(split_services(bad)[1]) > len(DOCUMENT["services"])
    assert _read_fast(bad) is None
    with pytest.raises(StateFileError) as caught:
        parse_state(bad.encode(), "state.json")
    with pytest.raises(StateFileError) as strict:
        read_strict(bad, "state.json")
    assert str(caught.value) == str(strict.value)
    assert "'service'" in str(caught.value)


def test_yaml_items_are_column_0_entries_under_services() -> None:
    text = "nodes: []\nservices:\n- service: {name: a}\n- service: {name: b}\n"
    assert split_services(text) == ("nodes: []\nservices:\n",
                                    ["- service: {name: a}\n", "- service: {name: b}\n"])


def test_yaml_items_may_be_indented_and_end_at_the_next_key() -> None:
    text = ("services:\n  # the web tier\n  - service: {name: a}\n\n  - service:\n"
            "      name: b\n# a comment\nnodes:\n- name: n1\n")
    assert split_services(text) == ("services:\n  # the web tier\nnodes:\n- name: n1\n", [
        "  - service: {name: a}\n\n",
        "  - service:\n      name: b\n# a comment\n"])
    assert _read_fast(text) == read_strict(text, "state.yaml")


def test_a_line_as_indented_as_the_items_but_no_item_ends_them() -> None:
    """Not YAML (a mapping key among a sequence's items): the items end
    there, and the skeleton read fast declines it."""
    text = "services:\n  - service: {name: a}\n  name: b\n"
    assert split_services(text) == ("services:\n  name: b\n", ["  - service: {name: a}\n"])
    assert _read_fast(text) is None


@pytest.mark.parametrize("space", ["\x0c", "\xa0", "\u3000"])
def test_json_entries_apart_by_other_white_space_are_not_items(space) -> None:
    """White space that libyaml does not skip between two entries (no
    reader reads the text between items): not YAML, the strict reader's
    error."""
    entries = [json.dumps(entry) for entry in DOCUMENT["services"]]
    text = '{"services": [' + f"{space}, ".join(entries) + "]}"
    assert _read_fast(text) is None
    with pytest.raises(StateFileError, match="not valid YAML"):
        read_strict(text, "state.json")


def _quoted_first_keys(text: str) -> str:
    """The first entry's first key double-quoted, the second's single-quoted."""
    return text.replace("{endpoints:", '{"endpoints":', 1).replace(
        "\n  {endpoints:", "\n  {'endpoints':", 1)


def _trailing_comma(text: str) -> str:
    """A comma after the services' last entry (the last `]` of the text)."""
    end = text.rindex("]")
    return f"{text[:end].rstrip()},\n  {text[end:]}"


SERVICES_FIRST = {"services": DOCUMENT["services"], "nodes": NODES}
BELOW_THE_KEY = f"services: [\n  {WEB},\n  {DNS_ENTRY}\n]\n{NODES_LINE}"
FLOW_LAYOUTS = {
    # One flow mapping (yaml.dump's flow style throughout), wrapped at 80
    # columns, an entry's first key `endpoints`.
    "flow-document": yaml.safe_dump(DOCUMENT, default_flow_style=True),
    "flow-document-one-line": yaml.safe_dump(DOCUMENT, default_flow_style=True,
                                             sort_keys=False, width=1 << 20),
    "flow-document-services-first": yaml.safe_dump(SERVICES_FIRST, default_flow_style=True,
                                                   sort_keys=False),
    "flow-document-crlf": yaml.safe_dump(DOCUMENT, default_flow_style=True).replace(
        "\n", "\r\n"),
    "json-trailing-comma": _trailing_comma(json.dumps(DOCUMENT, indent=2)),
    # `services: [` at column 0: one entry a line, all on one line, the
    # entries on lines below it, quoted keys, comments, CRLF, a trailing
    # comma.
    "one-per-line": flow_sequences(DOCUMENT),
    "one-line": f"{NODES_LINE}services: [{WEB}, {DNS_ENTRY}]\n",
    "below-the-key": BELOW_THE_KEY,
    "quoted-keys": _quoted_first_keys(flow_sequences(DOCUMENT)),
    "comments": (f"{NODES_LINE}services: [  # the web tier first\n  {WEB},  # web\n"
                 f"  # then dns\n  {DNS_ENTRY}#dns\n  ]  # the end\n# the end of the file"),
    "crlf": flow_sequences(DOCUMENT).replace("\n", "\r\n"),
    "trailing-comma": _trailing_comma(BELOW_THE_KEY[:-len(NODES_LINE)]) + NODES_LINE,
}


@pytest.mark.parametrize("text", FLOW_LAYOUTS.values(), ids=FLOW_LAYOUTS.keys())
def test_a_flow_sequence_has_one_item_an_entry(text) -> None:
    skeleton, items = split_services(text)
    assert [yaml.safe_load(item) for item in items] == [[entry] for entry in DOCUMENT["services"]]
    assert yaml.safe_load(skeleton) == {**DOCUMENT, "services": []}
    assert _read_fast(text) == read_strict(text, "state.yaml")


def test_an_entrys_item_is_its_text_wherever_it_stands() -> None:
    """The same entry's text gives the same item (not read again after an
    edit elsewhere), whatever its column and the entries around it."""
    _, items = split_services(flow_sequences(DOCUMENT))
    assert items == [f"[{WEB}]", f"[{DNS_ENTRY}]"]
    assert split_services(f"services: [{DNS_ENTRY}, {WEB}]\n")[1] == items[::-1]
    assert split_services(BELOW_THE_KEY)[1] == items


# A label whose quoted value holds what looks like the end of one entry and
# the start of two more.
ENTRIES_IN_A_LABEL = [
    '"x}, {service: {name: y}}, {service: {name: z"',
    "'x}, {service: {name: y}}, {service: {name: z'",
    '"x\n    }, {service: {name: y}},\n  {service: {name: z"',
]


@pytest.mark.parametrize("value", ENTRIES_IN_A_LABEL, ids=["double", "single", "multi-line"])
def test_a_cut_inside_a_quoted_scalar_fails_to_read_and_the_file_is_read_whole(value) -> None:
    labelled = f"service: {{labels: {{a: {value}}}, ips:"
    text = flow_sequences(DOCUMENT).replace("service: {ips:", labelled, 1)
    assert len(split_services(text)[1]) == 4
    assert _read_fast(text) is None
    assert [s.name for s in read_strict(text, "state.yaml").services] == ["web", "dns"]


def test_an_entry_in_a_comment_is_no_entry() -> None:
    """Comments between entries are skipped to their line's end, as libyaml
    skips them, whatever they hold."""
    text = (f"services: [{WEB}  # }}, {{service: {{name: y}}}}\n  , "
            f"# }}, {{service: {{name: z}}}}, \n  {DNS_ENTRY}, # the end\n]\n")
    assert [yaml.safe_load(item)[0] for item in split_services(text)[1]] == DOCUMENT["services"]
    assert _read_fast(text) == read_strict(text, "state.yaml")


@pytest.mark.parametrize("text", [
    f"services: [{WEB}, {DNS_ENTRY}]\n".replace(
        "name: web,", "name: web, # }, {service: {name: y}}\n   ", 1),
    f"services: [{WEB}, # y\x85{{service: {{name: y}}}},\n  {DNS_ENTRY}]\n",
], ids=["in-an-entry", "after-a-nel"])
def test_a_cut_inside_a_comment_fails_to_read(text) -> None:
    """A comment inside an entry that holds a cut (the comment takes the
    item's `]`); one between entries that libyaml ends at a NEL, after which
    comes an entry (no gap between two entries then: the cut is later)."""
    assert len(split_services(text)[1]) == 3 - text.count("\x85")
    assert _read_fast(text) is None


def test_a_wrong_end_fails_to_read() -> None:
    """A line at column 0 inside the last entry after a `}]`: taken for
    the sequence's end, the entry cut there fails to read."""
    entry = DNS_ENTRY.replace("}], service:", "}]\n, service:")
    text = f"{NODES_LINE}services: [{entry}]\n"
    assert len(split_services(text)[1]) == 1
    assert _read_fast(text) is None
    assert read_strict(text, "state.yaml").services[0].name == "dns"


@pytest.mark.parametrize("text", [
    'nodes: [{name: "x\nservices:\n- service: {namespace: b, name: a}\n"}]\n',
    '{"nodes": [{"name": \'x "services": [{"service": {"namespace": "b", "name": "a"}}]\'}]}',
    'nodes: [{name: "x\nservices: [{service: {namespace: b, name: a}}]\n"}]\n',
    "{nodes: [{name: 'x, services: [{service: {namespace: b, name: a}}], nodes: '}], "
    "services: []}\n",
], ids=["yaml-items", "json", "yaml-flow", "flow-document"])
def test_a_services_key_inside_a_quoted_scalar_is_no_key(text) -> None:
    """A node's name that holds what looks like the services' key and an
    entry: the text before it does not parse alone (an open quoted scalar),
    so no items; read whole, one node and no service."""
    assert split_services(text) == (text, [])
    read = _read_fast(text)
    assert read == read_strict(text, "state.yaml")
    assert read is not None and read.services == ()


@pytest.mark.parametrize("text", [
    f"nodes: [{{name: a,\nservices: [{WEB}]}}]\n",
    f"{{nodes: [{{name: a, services: [{WEB}]}}], services: []}}\n",
], ids=["yaml-flow", "flow-document"])
def test_a_services_key_inside_a_node_is_no_key(text) -> None:
    """A services key inside a node's flow mapping (at column 0 in YAML):
    the text before it does not parse alone (an open collection): read
    whole, the strict reader's error."""
    assert split_services(text) == (text, [])
    assert _read_fast(text) is None
    with pytest.raises(StateFileError, match="unknown key 'services'"):
        read_strict(text, "state.yaml")


def test_a_second_document_after_the_sequence_is_read_with_the_skeleton() -> None:
    text = f"services: [{WEB}]\n---\nservices: [{DNS_ENTRY}]\n"
    assert split_services(text) == (f"services: []\n---\nservices: [{DNS_ENTRY}]\n", [f"[{WEB}]"])
    assert _read_fast(text) is None
    with pytest.raises(StateFileError, match="another document"):
        read_strict(text, "state.yaml")
