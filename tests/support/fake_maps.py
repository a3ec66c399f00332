"""A BPF hash map as a dict, for running the programmer without root or BPF.

It keeps what backends/ebpf/maps/access.py promises, as the kernel does it
(tests/kernel/ebpf/maps/test_access.py runs the same operations on real maps and on
this and compares): keys and values are copied as bytes, a batch update
writes in order and stops with MapFullError (E2BIG) at the first new key
that finds the map full (replacing a key needs no room), a batch delete
skips keys the map does not hold, and iteration follows no order the
writes chose. `fail_after` makes a later write fail part-way, as a write
the kernel refuses for another reason would (EIO here). `writes` lists every
batched write the map was given: how many entries, from which thread.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import threading
from dataclasses import dataclass
from typing import Generic, Iterator, Sequence, TypeVar, cast, overload

from backends.ebpf.maps.access import MapFullError, Packed

# As in MapAccess: the key as the map's users give and get it (an int for
# maps with integer keys) and the value.
K = TypeVar("K")
V = TypeVar("V", bound=ct.Structure)
S = TypeVar("S", bound=ct.Structure)


@dataclass(frozen=True)
class Write:
    """One batched write: the entries it held and the thread that made it."""

    entries: int
    thread: str


class FakeMap(Generic[K, V]):
    """A `MapAccess[K, V]`: built with a ctypes integer key type, it is a
    FakeMap[int, V]; with a Structure key type S, a FakeMap[S, V]."""

    @overload
    def __init__(self: FakeMap[int, V], key_type: type[ct._SimpleCData[int]],
                 value_type: type[V], max_entries: int, name: str) -> None: ...

    @overload
    def __init__(self: FakeMap[S, V], key_type: type[S], value_type: type[V],
                 max_entries: int, name: str) -> None: ...

    def __init__(self, key_type: type[ct._SimpleCData[int] | ct.Structure],
                 value_type: type[V], max_entries: int, name: str) -> None:
        self.key_type = key_type
        self.value_type = value_type
        self.max_entries = max_entries
        self.name = name
        self._entries: dict[bytes, bytes] = {}
        self._writes_left: int | None = None
        self.writes: list[Write] = []

    def fail_after(self, entries: int) -> None:
        """Let `entries` more entries be written or deleted, then fail the
        next one with EIO (once)."""
        self._writes_left = entries

    def get(self, key: K | int) -> V | None:
        raw = self._entries.get(_packed(self.key_type, [key]))
        return None if raw is None else self.value_type.from_buffer_copy(raw)

    def put_many(self, keys: Sequence[K | int], values: Sequence[V]) -> None:
        self.put_packed(_packed(self.key_type, keys), _packed(self.value_type, values))

    def delete_many(self, keys: Sequence[K | int]) -> None:
        self.delete_packed(_packed(self.key_type, keys))

    def put_packed(self, keys: Packed, values: Packed) -> None:
        raw_keys = _chunks(bytes(keys), ct.sizeof(self.key_type))
        raw_values = _chunks(bytes(values), ct.sizeof(self.value_type))
        self.writes.append(Write(len(raw_keys), threading.current_thread().name))
        if len(raw_keys) != len(raw_values):
            raise ValueError(f"write to map {self.name}: {len(raw_keys)} keys but "
                             f"{len(raw_values)} values; pass one value per key")
        for written, (key, value) in enumerate(zip(raw_keys, raw_values)):
            self._count_write(f"write {len(raw_keys)} entries to map {self.name}", written)
            if key not in self._entries and len(self._entries) >= self.max_entries:
                raise MapFullError(errno.E2BIG, f"write {len(raw_keys)} entries to map "
                                                f"{self.name}: {os.strerror(errno.E2BIG)} "
                                                f"after {written}")
            self._entries[key] = value

    def delete_packed(self, keys: Packed) -> None:
        for deleted, key in enumerate(_chunks(bytes(keys), ct.sizeof(self.key_type))):
            self._count_write(f"delete from map {self.name}", deleted)
            self._entries.pop(key, None)

    def items(self) -> Iterator[tuple[K, V]]:
        """In the order of the key bytes: neither insertion order nor the
        kernel's, so nothing may rely on either."""
        for key in sorted(self._entries):
            yield self._key_of(key), self.value_type.from_buffer_copy(self._entries[key])

    def read_packed(self) -> tuple[bytes, bytes]:
        """In the order of `items`."""
        ordered = sorted(self._entries)
        return b"".join(ordered), b"".join(self._entries[key] for key in ordered)

    def __len__(self) -> int:
        return len(self._entries)

    def _key_of(self, raw: bytes) -> K:
        key = self.key_type.from_buffer_copy(raw)
        # The overloads of __init__ tie K to key_type: int for an integer type.
        return cast(K, key.value if isinstance(key, ct._SimpleCData) else key)

    def _count_write(self, what: str, done: int) -> None:
        if self._writes_left is None:
            return
        if self._writes_left == 0:
            self._writes_left = None
            raise OSError(errno.EIO, f"{what}: {os.strerror(errno.EIO)} after {done}")
        self._writes_left -= 1


def _packed(of: type[ct._SimpleCData[int] | ct.Structure], items: Sequence) -> bytes:
    return bytes((of * len(items))(*items))


def _chunks(raw: bytes, size: int) -> list[bytes]:
    return [raw[i:i + size] for i in range(0, len(raw), size)]
