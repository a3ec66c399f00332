"""A BPF hash map as a dict, for running the programmer without root or BPF.

It keeps what backends/ebpf/mapaccess.py promises, as the kernel does it
(tests/ebpf/test_fake_maps.py runs the same operations on real maps and on
this and compares): keys and values are copied as bytes, a batch update
writes in order and stops with MapFullError (E2BIG) at the first new key
that finds the map full (replacing a key needs no room), a batch delete
skips keys the map does not hold, and iteration follows no order the
writes chose. `fail_after` makes a later write fail part-way, as a write
the kernel refuses for another reason would (EIO here).
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from typing import Generic, Iterator, Sequence, TypeVar

from backends.ebpf.mapaccess import MapFullError

K = TypeVar("K")
V = TypeVar("V", bound=ct.Structure)


class FakeMap(Generic[K, V]):
    def __init__(self, key_type: type[K], value_type: type[V], max_entries: int,
                 name: str) -> None:
        self.key_type = key_type
        self.value_type = value_type
        self.max_entries = max_entries
        self.name = name
        self._entries: dict[bytes, bytes] = {}
        self._writes_left: int | None = None

    def fail_after(self, entries: int) -> None:
        """Let `entries` more entries be written or deleted, then fail the
        next one with EIO (once)."""
        self._writes_left = entries

    def get(self, key: K | int) -> V | None:
        raw = self._entries.get(self._raw_keys([key])[0])
        return None if raw is None else self.value_type.from_buffer_copy(raw)

    def put_many(self, keys: Sequence[K | int], values: Sequence[V]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"write to map {self.name}: {len(keys)} keys but {len(values)} "
                             f"values; pass one value per key")
        raw_values = _chunks(bytes((self.value_type * len(values))(*values)),
                             ct.sizeof(self.value_type))
        for written, (key, value) in enumerate(zip(self._raw_keys(keys), raw_values)):
            self._count_write(f"write {len(keys)} entries to map {self.name}", written)
            if key not in self._entries and len(self._entries) >= self.max_entries:
                raise MapFullError(errno.E2BIG, f"write {len(keys)} entries to map {self.name}: "
                                                f"{os.strerror(errno.E2BIG)} after {written}")
            self._entries[key] = value

    def delete_many(self, keys: Sequence[K | int]) -> None:
        for deleted, key in enumerate(self._raw_keys(keys)):
            self._count_write(f"delete from map {self.name}", deleted)
            self._entries.pop(key, None)

    def items(self) -> Iterator[tuple[K | int, V]]:
        """In the order of the key bytes: neither insertion order nor the
        kernel's, so nothing may rely on either."""
        for key in sorted(self._entries):
            yield self._key_of(key), self.value_type.from_buffer_copy(self._entries[key])

    def __len__(self) -> int:
        return len(self._entries)

    def _raw_keys(self, keys: Sequence[K | int]) -> list[bytes]:
        return _chunks(bytes((self.key_type * len(keys))(*keys)), ct.sizeof(self.key_type))

    def _key_of(self, raw: bytes) -> K | int:
        key = self.key_type.from_buffer_copy(raw)
        return key.value if isinstance(key, ct._SimpleCData) else key

    def _count_write(self, what: str, done: int) -> None:
        if self._writes_left is None:
            return
        if self._writes_left == 0:
            self._writes_left = None
            raise OSError(errno.EIO, f"{what}: {os.strerror(errno.EIO)} after {done}")
        self._writes_left -= 1


def _chunks(raw: bytes, size: int) -> list[bytes]:
    return [raw[i:i + size] for i in range(0, len(raw), size)]
