"""Slot assignment of the map programmer (pure Python): which endpoint id
each slot of a frontend names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backends.ebpf.programmer.slots import assign_slots

ids = st.lists(st.integers(1, 40), unique=True, max_size=20)


@given(previous=ids, wanted=ids)
def test_slots_hold_exactly_the_wanted_endpoints(previous: list[int], wanted: list[int]) -> None:
    slots = assign_slots(previous, wanted)
    assert sorted(slots) == sorted(wanted)


@given(previous=ids, wanted=ids)
def test_an_endpoint_that_stays_keeps_its_slot_unless_the_slot_goes(
        previous: list[int], wanted: list[int]) -> None:
    slots = assign_slots(previous, wanted)
    for slot, endpoint in enumerate(previous):
        if endpoint in wanted and slot < len(wanted):
            assert slots[slot] == endpoint


def test_removed_endpoints_are_replaced_in_place_and_the_tail_fills_holes() -> None:
    assert assign_slots([1, 2, 3, 4], [1, 3, 4, 5]) == [1, 5, 3, 4]
    assert assign_slots([1, 2, 3, 4], [1, 3, 4]) == [1, 4, 3]
    assert assign_slots([1, 2, 3, 4], [4]) == [4]
    assert assign_slots([], [7, 8]) == [7, 8]
    # Recovered slots that were missing (0) are refilled.
    assert assign_slots([0, 2], [2, 9]) == [9, 2]
