"""Which endpoint id each slot of a frontend holds after an update."""

from __future__ import annotations

from typing import Sequence

# Slots are 16 bits wide (lb_service_key.slot), slot 0 is the master.
MAX_SLOTS = 0xFFFF


def assign_slots(previous: Sequence[int], wanted: Sequence[int]) -> list[int]:
    """Endpoint ids in slot order for an update from `previous` to the set
    `wanted`: ids that stay keep their slot, new ids fill the slots of removed
    ones, and the tail moves into holes that are left, so an update rewrites
    few slots and unconnected UDP sockets mostly keep their endpoint."""
    wanted_set, kept = set(wanted), set()
    if len(wanted_set) == len(wanted) and list(previous) == list(wanted):
        return list(wanted)  # nothing moves (the common case of a full sync)
    slots: list[int | None] = []
    for endpoint_id in previous:
        keep = endpoint_id in wanted_set and endpoint_id not in kept
        slots.append(endpoint_id if keep else None)
        if keep:
            kept.add(endpoint_id)
    fresh = iter([b for b in wanted if b not in kept])
    slots = [next(fresh, None) if b is None else b for b in slots]
    slots.extend(fresh)
    i = 0
    while i < len(slots):
        if slots[i] is None:
            last = slots.pop()
            if i < len(slots):
                slots[i] = last
            continue
        i += 1
    return [b for b in slots if b is not None]
