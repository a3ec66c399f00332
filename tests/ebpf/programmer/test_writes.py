"""One change set's writes to `services` and `backends`, by step: what each
step counts from its packed buffers, a round taken while the next one is
planned, and the entries written per map (no maps: the buffers alone)."""

from __future__ import annotations

import ipaddress

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import KeyedFrontend
from backends.ebpf.programmer.writes import SLOT_VALUE, U32, MapWrites, RoundWrites
from kpng_py.model import Frontend, Protocol

WEB = KeyedFrontend(Frontend(ipaddress.ip_address("10.96.0.10"), 80, Protocol.TCP))


def planned(writes: MapWrites, slots: int = 2, endpoints: tuple[int, ...] = (7, 8)) -> None:
    """Plan a frontend as the programmer does: its endpoints, then `slots`
    slots and its master; one gone frontend (master and a slot) and one gone
    endpoint before them."""
    writes.gone_masters += WEB.packed_key(0)
    writes.gone_slots += WEB.packed_key(9)
    writes.gone_endpoints += U32.pack(3)
    for endpoint_id in endpoints:
        writes.new_endpoint_keys += U32.pack(endpoint_id)
        writes.new_endpoint_values += bytes(maps.EndpointValue())
    for slot in range(1, slots + 1):
        writes.slot_keys += WEB.packed_key(slot)
        writes.slot_values += SLOT_VALUE.pack(endpoints[slot - 1], 0, 0, 0, 0)
    writes.master_keys += WEB.packed_key(0)
    writes.master_values += bytes(maps.ServiceValue())


def test_each_step_counts_the_entries_in_its_buffers() -> None:
    writes = MapWrites()
    planned(writes)
    writes.stale_slots += WEB.packed_key(3)
    writes.orphan_endpoints += U32.pack(4) + U32.pack(5)
    assert writes.pending() == {"gone": 2, "gone_endpoints": 1, "new_endpoints": 2, "slots": 2,
                                "masters": 1, "stale_slots": 1, "orphan_endpoints": 2}
    assert writes.entries_written() == {maps.SERVICES.pin: 6, maps.ENDPOINTS.pin: 5}


def test_a_taken_round_keeps_its_buffers_while_the_next_one_is_planned() -> None:
    writes = MapWrites()
    planned(writes)
    first: RoundWrites = writes.take_round()
    assert first.slot_keys == WEB.packed_key(1) + WEB.packed_key(2)
    assert first.counts == {"gone": 2, "gone_endpoints": 1, "new_endpoints": 2, "slots": 2,
                            "masters": 1, "stale_slots": 0, "orphan_endpoints": 0}
    assert set(writes.pending().values()) == {0}
    planned(writes, slots=1, endpoints=(9,))
    # The next round's planning writes into new buffers, never the taken ones.
    assert first.slot_keys == WEB.packed_key(1) + WEB.packed_key(2)
    assert first.new_endpoint_keys == U32.pack(7) + U32.pack(8)
    assert writes.take_round().new_endpoint_keys == U32.pack(9)


def test_the_steps_and_the_entries_per_map_add_the_rounds_written_to_those_pending() -> None:
    writes = MapWrites()
    planned(writes)
    writes.take_round()
    planned(writes, slots=1, endpoints=(9,))
    assert writes.written["slots"] == 2 and writes.pending()["slots"] == 1
    assert writes.steps()["slots"] == 3 and writes.steps()["new_endpoints"] == 3
    # The round written, then the one pending.
    assert writes.entries_written() == {maps.SERVICES.pin: 5 + 4, maps.ENDPOINTS.pin: 3 + 2}
