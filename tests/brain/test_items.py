"""A state file's services as items (kpng_py/brain/items.py): found in YAML
and in JSON of any layout, and where a JSON layout only looks like items,
the file read whole, with the strict reader's outcome."""

from __future__ import annotations

import json

import pytest

from kpng_py.brain.items import split_services
from kpng_py.brain.statefile import StateFileError, StateReader, parse_state, read_strict
from tests.brain.helpers import DNS, NODES, W1, W2, state, web

DOCUMENT = state(web(W1, W2), DNS, nodes=NODES)


def _read_fast(text: str) -> object:
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
    json.dumps({"services": DOCUMENT["services"]})[:-3] + ",]}",  # a comma after the last
], ids=["no-services", "empty", "trailing-comma"])
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


@pytest.mark.parametrize("text", [
    'nodes: [{name: "x\nservices:\n- service: {namespace: b, name: a}\n"}]\n',
    '{"nodes": [{"name": \'x "services": [{"service": {"namespace": "b", "name": "a"}}]\'}]}',
], ids=["yaml-items", "json"])
def test_a_services_key_inside_a_quoted_scalar_is_no_key(text) -> None:
    """A node's name that holds what looks like the services' key and an
    entry: the text before it does not parse alone (an open quoted scalar),
    so no items; read whole, one node and no service."""
    assert split_services(text) == (text, [])
    assert _read_fast(text) == read_strict(text, "state.yaml")
    assert _read_fast(text).services == ()


@pytest.mark.parametrize("space", ["\x0c", "\xa0", "\u3000"])
def test_json_entries_apart_by_other_white_space_are_not_items(space) -> None:
    """White space that libyaml does not skip between two entries (no
    reader reads the text between items): not YAML, the strict reader's
    error."""
    entries = [json.dumps(entry) for entry in DOCUMENT["services"]]
    text = '{"services": [' + f"{space}, ".join(entries) + "]}"
    assert split_services(text) == (text, [])
    assert _read_fast(text) is None
    with pytest.raises(StateFileError, match="not valid YAML"):
        read_strict(text, "state.json")
