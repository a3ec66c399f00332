"""What the map programmer and the datapath reader need of a BPF map, and
nothing more: lookup, batched writes and deletes, and reading every entry.

`libbpf.BpfMap` is the real one (batched bpf() syscalls on a pinned map);
tests/support/fake_maps.py has a dict with the same semantics, so the
programmer runs on any machine, without root or BPF.

The `*_packed` operations take and give entries as the kernel does: keys
(and values) laid end to end in one buffer, each of the map's key (value)
size. The programmer packs its writes straight into such buffers and reads
the maps back as two of them, with no object per entry.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence, TypeVar, Union

K = TypeVar("K")
V = TypeVar("V")

# Entries laid end to end, as a BPF_MAP_*_BATCH call takes them.
Packed = Union[bytes, bytearray, memoryview]


class MapFullError(OSError):
    """A map has no room for another entry (E2BIG from the kernel)."""


class MapAccess(Protocol[K, V]):
    """A map with ctypes keys (an int for maps with integer keys) and values."""

    name: str

    def get(self, key: K | int) -> V | None:
        """The value at key, or None when the map does not hold it."""

    def put_many(self, keys: Sequence[K | int], values: Sequence[V]) -> None:
        """Create or update entries in order. When the map has no room for a
        new key, the entries before it are written and MapFullError raised;
        updating a key the map holds needs no room."""

    def delete_many(self, keys: Sequence[K | int]) -> None:
        """Delete entries in order; keys the map does not hold are skipped."""

    def items(self) -> Iterator[tuple[K, V]]:
        """Every entry, in no particular order (K is int for integer keys)."""

    def put_packed(self, keys: Packed, values: Packed) -> None:
        """`put_many` of packed keys and values."""

    def delete_packed(self, keys: Packed) -> None:
        """`delete_many` of packed keys."""

    def read_packed(self) -> tuple[bytes, bytes]:
        """Every entry as packed keys and packed values (entry i of each
        belongs together), in no particular order."""
