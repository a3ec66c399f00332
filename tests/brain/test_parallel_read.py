"""A big state file's items read by two processes: the same state as one
process reads, the same declines, and a child that fails costs nothing but
time."""

from __future__ import annotations

import functools
import os

import pytest
import yaml

from kpng_py.brain.parallel_read import MIN_ITEMS, read_items
from kpng_py.brain.statefile import StateReader, read_strict
from tests.brain.helpers import endpoint, port, service, state

if len(os.sched_getaffinity(0)) < 2:  # CI machines have two
    pytest.skip("the file is read in two processes only with two CPUs",
                allow_module_level=True)


@functools.cache
def _generated() -> str:
    """MIN_ITEMS services as generators write them."""
    services = [service(f"s{i}", (f"10.96.{i // 250}.{i % 250 + 1}",), [port("http")],
                        [endpoint(f"10.1.{i // 250}.{i % 250 + 1}", pod=f"p{i}"),
                         endpoint(f"10.2.{i // 250}.{i % 250 + 1}", pod=f"q{i}")])
                for i in range(MIN_ITEMS)]
    return yaml.safe_dump(state(*services))


def _big_file(bad_at: int | None = None) -> str:
    """The generated file; `bad_at`: that service's name with an anchor,
    which the fast path leaves to the strict reader."""
    text = _generated()
    if bad_at is not None:
        text = text.replace(f"    name: s{bad_at}\n", f"    name: &name s{bad_at}\n")
    return text


def test_two_processes_read_the_state_one_reads(forks: list[int]) -> None:
    text = _big_file()
    state = StateReader("state.yaml").read_fast(text)
    assert len(forks) == 1
    assert state is not None and state == read_strict(text, "state.yaml")
    assert [s.name for s in state.services] == [f"s{i}" for i in range(MIN_ITEMS)]


@pytest.mark.parametrize("bad_at", [3, MIN_ITEMS - 3])
def test_an_item_either_half_declines_leaves_the_file_to_the_strict_reader(
        forks: list[int], bad_at: int) -> None:
    text = _big_file(bad_at)
    assert StateReader("state.yaml").read_fast(text) is None  # YAML, but not one it vouches for
    assert len(forks) == 1


def test_a_child_that_fails_has_its_half_read_again(forks: list[int]) -> None:
    parent = os.getpid()

    def read(items: list[str]) -> list[str] | None:
        if os.getpid() != parent:
            os._exit(3)  # as a child killed or out of memory would end
        return [item.upper() for item in items]

    items = [f"item {i}" for i in range(MIN_ITEMS)]
    assert read_items(items, read, lambda e: (e,), lambda t: t[0]) == [i.upper() for i in items]
    assert len(forks) == 1


def test_few_items_are_read_in_one_process(forks: list[int]) -> None:
    items = [f"item {i}" for i in range(MIN_ITEMS - 1)]
    assert read_items(items, list, lambda e: (e,), lambda t: t[0]) == items
    assert forks == []
