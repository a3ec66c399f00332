"""Plain ClusterIP services read with one expression (fastservices.py) read
as the other readers read them; the services it cannot vouch for are left to
them."""

from __future__ import annotations

import pytest

from kpng_py.brain.blockyaml import Scalars
from kpng_py.brain.fastendpoints import FastEndpoints
from kpng_py.brain.fastservices import fast_service
from kpng_py.brain.statefile import StateReader, _split_services, read_strict
from tests.brain.test_fastendpoints import assert_read_as_strictly, changed_file, generated_file


def _heads(text: str) -> list[str]:
    fast = FastEndpoints(Scalars())
    splits = [fast.split(item) for item in _split_services(text)[1]]
    assert all(splits)
    return [split[0] for split in splits if split]


@pytest.mark.parametrize("sort_keys", [False, True])
def test_generated_services_are_read_whole_and_read_the_same(sort_keys: bool) -> None:
    text = generated_file(sort_keys)
    assert all(fast_service(head, Scalars()) for head in _heads(text))
    assert StateReader("state.yaml").read_fast(text) == read_strict(text, "state.yaml")


@pytest.mark.parametrize("change", [
    ("name: svc-0\n", "name: a/b\n"),  # a '/' in the name
    ("namespace: bench\n", "namespace: 'bench'\n"),  # quoted
    ("        - 10.96.0.10\n", "        - 10.96.0.300\n"),  # not an address
    ("        - 10.96.0.10\n", "        - fd00::10\n"),  # not IPv4
    ("      protocol: 1\n", "      protocol: 4\n"),  # no such protocol
    ("      protocol: 1\n", "      protocol: TCP\n"),
    ("      port: 80\n", "      port: 0\n"),
    ("      targetport: 8080\n", "      targetport: 70000\n"),
    ("      targetport: 8080\n", "      nodeport: 8080\n"),  # another key
    ("    type: ClusterIP\n", "    type: ClusterIP\n    mapip: true\n"),
    ("    type: ClusterIP\n", "    type: null\n"),
])
def test_what_it_cannot_vouch_for_is_left_to_the_other_readers(change: tuple[str, str]) -> None:
    changed = changed_file(*change)
    assert fast_service(_heads(changed)[0], Scalars()) is None
    assert_read_as_strictly(changed)
