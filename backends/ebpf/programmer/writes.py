"""One change set's writes to `services` and `backends`, planned by step
of the no-gap order and packed as the batch calls take them."""

from __future__ import annotations

import ctypes as ct
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.contents import HostPort
from backends.ebpf.maps.layout import ServiceKey
from kpng_py.model import ServicePortName

# Packed values, in the maps' native byte order: a u32 (an endpoint id, the
# key of `backends`; a frontend id) and a slot (lb_service_value, id only).
U32 = struct.Struct("=I")
SLOT_VALUE = struct.Struct("=IIIII")
_ENDPOINT_KEY_SIZE = U32.size
SERVICE_KEY_SIZE = ct.sizeof(ServiceKey)


class RoundWrites(NamedTuple):
    """One round's packed writes, by step (MapWrites' buffers), and their entries."""

    gone_masters: bytearray
    gone_slots: bytearray
    gone_endpoints: bytearray
    new_endpoint_keys: bytearray
    new_endpoint_values: bytearray
    slot_keys: bytearray
    slot_values: bytearray
    master_keys: bytearray
    master_values: bytearray
    stale_slots: bytearray
    orphan_endpoints: bytearray
    counts: dict[str, int]


_ROUND_BUFFERS = RoundWrites._fields[:-1]


@dataclass
class MapWrites:
    """One change set's writes, by step, packed as the batch calls take them
    (`services` keys and values, `backends` keys (u32) and values)."""

    gone_masters: bytearray = field(default_factory=bytearray)
    gone_slots: bytearray = field(default_factory=bytearray)  # and strays
    gone_endpoints: bytearray = field(default_factory=bytearray)
    new_endpoint_keys: bytearray = field(default_factory=bytearray)
    new_endpoint_values: bytearray = field(default_factory=bytearray)
    slot_keys: bytearray = field(default_factory=bytearray)
    slot_values: bytearray = field(default_factory=bytearray)
    master_keys: bytearray = field(default_factory=bytearray)
    master_values: bytearray = field(default_factory=bytearray)
    stale_slots: bytearray = field(default_factory=bytearray)
    orphan_endpoints: bytearray = field(default_factory=bytearray)
    # (frontend id, endpoint) pairs of UDP frontends that are gone: connected
    # sockets still pointing there must be terminated (S9).
    removed_udp: set[tuple[int, HostPort]] = field(default_factory=set)
    # Frontend ids of the frontends that are gone: their counters and names go too.
    released_frontend_ids: list[int] = field(default_factory=list)
    # Endpoint ids released (their counters go too).
    released_endpoint_ids: list[int] = field(default_factory=list)
    # Frontend ids whose frontend got a new owner (new frontends among them):
    # the name the service_names map is to hold.
    named_frontend_ids: list[tuple[int, ServicePortName]] = field(default_factory=list)
    # Entries of each step in the rounds already written (buffers emptied).
    written: Counter[str] = field(default_factory=Counter)

    def steps(self) -> Counter[str]:
        """Entries of each step, written and pending."""
        return self.written + Counter(self.pending())

    def pending(self) -> dict[str, int]:
        """Entries of each step in the buffers."""
        key_size = SERVICE_KEY_SIZE
        return {
            "gone": (len(self.gone_masters) + len(self.gone_slots)) // key_size,
            "gone_endpoints": len(self.gone_endpoints) // _ENDPOINT_KEY_SIZE,
            "new_endpoints": len(self.new_endpoint_keys) // _ENDPOINT_KEY_SIZE,
            "slots": len(self.slot_keys) // key_size,
            "masters": len(self.master_keys) // key_size,
            "stale_slots": len(self.stale_slots) // key_size,
            "orphan_endpoints": len(self.orphan_endpoints) // _ENDPOINT_KEY_SIZE,
        }

    def take_round(self) -> RoundWrites:
        """The buffers' entries, counted as written, in new buffers of their
        own: these are emptied for the next round, planned while they are
        written."""
        counts = self.pending()
        self.written.update(counts)
        planned = RoundWrites._make([*(getattr(self, name) for name in _ROUND_BUFFERS), counts])
        for name in _ROUND_BUFFERS:
            setattr(self, name, bytearray())
        return planned

    def entries_written(self) -> dict[str, int]:
        """Entries created, updated or deleted, by map."""
        steps = self.steps()
        return {
            maps.SERVICES.pin: steps["gone"] + steps["slots"] + steps["masters"]
            + steps["stale_slots"],
            maps.ENDPOINTS.pin: steps["gone_endpoints"] + steps["new_endpoints"]
            + steps["orphan_endpoints"],
        }
