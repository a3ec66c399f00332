"""A state file's services as items (kpng_py/brain/items.py): found in YAML
and in JSON written one value a line, and where the JSON layout only looks
like items, read whole and the same."""

from __future__ import annotations

import json
import re

import pytest

from kpng_py.brain.items import split_services
from kpng_py.brain.statefile import StateReader, read_strict
from tests.brain.helpers import DNS, NODES, W1, W2, state, web

DOCUMENT = state(web(W1, W2), DNS, nodes=NODES)


def _read_fast(text: str) -> object:
    return StateReader("state.json").read_plain(text)


@pytest.mark.parametrize("indent", [1, 2, 4, "\t"])
def test_indented_json_has_one_item_a_service(indent) -> None:
    text = json.dumps(DOCUMENT, indent=indent)
    skeleton, items = split_services(text)
    assert [json.loads(item)[0] for item in items] == DOCUMENT["services"]
    assert json.loads(skeleton) == {**DOCUMENT, "services": []}
    assert _read_fast(text) == read_strict(text, "state.json")


@pytest.mark.parametrize("text", [
    json.dumps(DOCUMENT),  # one line
    json.dumps(DOCUMENT, indent=2).replace("\n", "\r\n"),
    json.dumps({"services": [], "nodes": NODES}, indent=2),
    json.dumps({"nodes": [{"name": "n", "services": DOCUMENT["services"]}]}, indent=2),
], ids=["compact", "crlf", "no-services", "services-not-top-level"])
def test_json_without_such_items_is_read_whole(text) -> None:
    assert split_services(text) == (text, [])


def test_a_comma_after_the_last_item_is_no_items() -> None:
    text = json.dumps(DOCUMENT, indent=1)
    end = text.rindex("\n  }\n ]") + len("\n  }")
    trailing = text[:end] + "," + text[end:]
    assert split_services(trailing) == (trailing, [])


def test_a_cut_inside_an_item_fails_to_read_and_the_file_is_read_whole() -> None:
    """An object inside an item written at the items' indentation, after a
    comma, looks like an item of its own: the pieces cut there are not
    values, the fast path declines, and the strict reader reads the file."""
    text = json.dumps(DOCUMENT, indent=1)
    between = re.compile(r"\n( +)\},\n\1\{").search(text, text.index('"endpoints": ['))
    assert between is not None  # the first service's two endpoints
    second = between.end() - 1
    nested = text[:second - len(between[1])] + "  " + text[second:]  # at the items' indentation
    assert json.loads(nested) == DOCUMENT
    assert len(split_services(nested)[1]) == len(DOCUMENT["services"]) + 1
    assert _read_fast(nested) is None
    assert StateReader("state.json").read(nested.encode()) == read_strict(text, "state.json")


def test_yaml_items_are_column_0_entries_under_services() -> None:
    text = "nodes: []\nservices:\n- service: {name: a}\n- service: {name: b}\n"
    assert split_services(text) == ("nodes: []\nservices:\n",
                                    ["- service: {name: a}\n", "- service: {name: b}\n"])
