"""The ids the programmer hands out: a frontend id per frontend, an endpoint
id per (frontend, endpoint) pair; both are keys of pinned maps."""

from __future__ import annotations

from typing import Iterable

MAX_ID = 0xFFFFFFFF


class IdsExhausted(Exception):
    """No id is free: the caller checks `IdAllocator.available` first."""


# Ids in use are kept as bits, CHUNK_BITS ids per Python int: a full sync
# allocates its ids in a row, so a few hundred ints hold hundreds of thousands
# of ids, where a set would hold an object each (about 80 bytes).
CHUNK_BITS = 256


class IdAllocator:
    """Ids 1..limit (MAX_ID), handed out in increasing order so that a freed
    id is reused as late as possible (affinity and reverse-NAT entries name
    ids). Released ids stay taken until `settle`, after the change set that
    freed them is written, so one change set never deletes an id it reuses."""

    def __init__(self, in_use: Iterable[int] = (), limit: int = MAX_ID) -> None:
        # chunk index -> the bits of its ids in use (no chunk without one)
        chunks: dict[int, int] = {}
        count = cursor = 0
        for value in in_use:  # each once, however often it comes
            index, bit = value // CHUNK_BITS, 1 << value % CHUNK_BITS
            chunk = chunks.get(index, 0)
            if not chunk & bit:
                chunks[index] = chunk | bit
                count += 1
                if value > cursor:
                    cursor = value
        self._chunks, self._count, self._cursor = chunks, count, cursor
        self._limit = limit
        self._released: list[int] = []

    @property
    def limit(self) -> int:
        return self._limit

    def in_use(self) -> int:
        """How many ids are taken (released ones until `settle`)."""
        return self._count

    def available(self) -> int:
        """How many ids `allocate` can hand out before the next `settle`."""
        return max(0, self._limit - self._count)

    def allocate(self) -> int:
        return self.allocate_many(1)[0]

    def allocate_many(self, count: int) -> list[int]:
        """`count` ids, those `allocate` would hand out one after the other."""
        if count > self.available():
            raise IdsExhausted(f"{count} ids wanted, {self.available()} of {self._limit} "
                               "are free")
        ids: list[int] = []
        cursor, chunks = self._cursor, self._chunks
        while len(ids) < count:
            first = cursor % self._limit + 1
            index, bit = divmod(first, CHUNK_BITS)
            # This chunk's ids from `first` on (up to the limit): which are taken.
            width = min(CHUNK_BITS - bit, self._limit - first + 1)
            chunk = chunks.get(index, 0)
            taken, wanted = chunk >> bit, count - len(ids)
            if not taken and width <= wanted:  # all free, all wanted: in one go
                new, cursor = (1 << width) - 1, first + width - 1
                ids.extend(range(first, first + width))
            else:
                new = 0
                for offset in range(width):
                    if not taken >> offset & 1:
                        new |= 1 << offset
                        ids.append(first + offset)
                        if len(ids) == count:
                            break
                cursor = first + offset
            chunks[index] = chunk | new << bit
        self._count += count
        self._cursor = cursor
        return ids

    def release(self, value: int) -> None:
        self._released.append(value)

    def settle(self) -> None:
        chunks = self._chunks
        for value in self._released:
            index, bit = divmod(value, CHUNK_BITS)
            chunk = chunks.get(index, 0)
            if chunk >> bit & 1:
                self._count -= 1
                chunk &= ~(1 << bit)
                if chunk:
                    chunks[index] = chunk
                else:
                    del chunks[index]
        self._released.clear()
