"""The `node_addresses` map: the node addresses at which the socket programs
translate node ports (they look up a node port's wildcard key only for a
dialled address this map holds).

It is kept equal to `--nodeport-addresses` applied to the node's local
addresses, which `LocalAddressFollower` reports as they change; each change
writes only the difference. The map is pinned: a restarted backend reads
what it holds and starts from there.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Protocol

from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.layout import (
    NodeAddressKey,
    NodeAddressValue,
    packed_address,
    unpacked_address,
)
from kpng_py.model import IPAddress
from kpng_py.node.nodeport_addresses import LocalAddressSet
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)


class AddressFollower(Protocol):
    """What the backend needs of `LocalAddressFollower`."""

    def start(self) -> LocalAddressSet:
        """The addresses now; changes go to the callback from then on."""

    def stop(self) -> None:
        """No callback after this returns."""


# How the backend makes its follower: LocalAddressFollower, or (in tests) one
# that follows another network namespace.
FollowerFactory = Callable[[Callable[[LocalAddressSet], None]], AddressFollower]


class NodeAddressMap:
    """Writes `node_addresses` (not thread-safe: the caller serializes)."""

    def __init__(self, node_addresses: MapAccess[NodeAddressKey, NodeAddressValue]) -> None:
        self._map = node_addresses
        self._held = self._read()

    def _read(self) -> set[bytes]:
        # Packed keys: ::ffff:a.b.c.d and a.b.c.d are one entry, as in the map.
        return {bytes(key) for key, _ in self._map.items()}

    def __len__(self) -> int:
        return len(self._held)

    def set_to(self, allowed: Iterable[IPAddress]) -> int:
        """Make the map hold exactly `allowed`; returns the entries written.
        New addresses are written before gone ones are deleted. On an
        OSError (MapFullError included) what the map holds is read back and
        the error raised."""
        wanted = {packed_address(ip) for ip in allowed}
        new, gone = sorted(wanted - self._held), sorted(self._held - wanted)
        try:
            self._map.put_many([NodeAddressKey.from_buffer_copy(raw) for raw in new],
                               [NodeAddressValue() for _ in new])
            self._map.delete_many([NodeAddressKey.from_buffer_copy(raw) for raw in gone])
        except OSError:
            self._held = self._read()
            raise
        self._held = wanted
        if new or gone:
            log.info("node-port addresses written", extra=fields(
                added=[str(unpacked_address(raw)) for raw in new],
                removed=[str(unpacked_address(raw)) for raw in gone],
                addresses=len(wanted)))
        return len(new) + len(gone)
