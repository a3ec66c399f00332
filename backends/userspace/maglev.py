"""Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable
Software Network Load Balancer", NSDI 2016, section 3.4).

Each backend gets a permutation of the M table slots from two hashes of its
name (`offset`, `skip`); backends take turns claiming their next free
preferred slot until the table is full. Every backend ends up with M/N slots
(+-1), and adding or removing one backend moves about 1/N of the slots.

A client maps to `table[hash(client) % M]`. M is prime so that every `skip`
walks all slots, and well above 100 x N so that the imbalance stays under
about 1% (the paper's guidance).
"""

from __future__ import annotations

import bisect
import hashlib
from typing import Generic, Iterator, Sequence, TypeVar

T = TypeVar("T")

# Primes just below powers of two. A table keeps its size while it is still
# big enough (see `table_size`), so a size change, which reshuffles every
# slot, happens only when the backend count has roughly doubled or shrunk 4x.
TABLE_SIZES = (
    251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071, 262139, 524287, 1048573,
)
# The paper's bound: M > 100 x N keeps each backend within ~1% of its share.
MIN_SLOTS_PER_BACKEND = 100
# A new size leaves room to grow to twice as many backends before the next one.
NEW_SLOTS_PER_BACKEND = 2 * MIN_SLOTS_PER_BACKEND
# An oversized table is kept until it is this many slots per backend.
MAX_SLOTS_PER_BACKEND = 1000


def table_size(backends: int, current: int = 0) -> int:
    """The table size for `backends` backends: `current` while it is between
    100 and 1000 slots per backend, otherwise the smallest listed prime above
    200 slots per backend."""
    if backends < 1:
        raise ValueError(f"a Maglev table needs at least one backend, got {backends}")
    if MIN_SLOTS_PER_BACKEND * backends < current <= MAX_SLOTS_PER_BACKEND * backends:
        return current
    wanted = NEW_SLOTS_PER_BACKEND * backends
    index = bisect.bisect_right(TABLE_SIZES, wanted)
    if index == len(TABLE_SIZES):
        raise ValueError(f"{backends} backends need a Maglev table above the largest "
                         f"supported size {TABLE_SIZES[-1]}")
    return TABLE_SIZES[index]


def _hash64(data: bytes, person: bytes) -> int:
    """A stable 64-bit hash (the same in every process, unlike `hash()`);
    distinct `person` strings give independent hash functions."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=person).digest(), "little")


def backend_hashes(name: str, size: int) -> tuple[int, int]:
    """(offset, skip) of a backend's permutation of a `size`-slot table."""
    raw = name.encode()
    offset = _hash64(raw, b"maglev-offset") % size
    skip = _hash64(raw, b"maglev-skip") % (size - 1) + 1
    return offset, skip


def client_hash(key: bytes) -> int:
    return _hash64(key, b"maglev-client")


def populate(names: Sequence[str], size: int) -> list[int]:
    """The lookup table: for each slot, the index in `names` of its backend."""
    if not names:
        raise ValueError("a Maglev table needs at least one backend")
    hashes = [backend_hashes(name, size) for name in names]
    # Each backend's next candidate slot: permutation[i][j] = offset + j*skip
    # (mod size), walked one step at a time.
    candidate = [offset for offset, _ in hashes]
    skips = [skip for _, skip in hashes]
    table = [-1] * size
    filled = 0
    while True:
        for i, skip in enumerate(skips):
            slot = candidate[i]
            while table[slot] >= 0:
                slot += skip
                if slot >= size:
                    slot -= size
            table[slot] = i
            slot += skip
            candidate[i] = slot - size if slot >= size else slot
            filled += 1
            if filled == size:
                return table


class MaglevTable(Generic[T]):
    """A Maglev lookup table over `backends`, identified by `str(backend)`."""

    def __init__(self, backends: Sequence[T], size: int) -> None:
        self.backends = tuple(backends)
        self.size = size
        self._slots = populate([str(b) for b in self.backends], size)

    def lookup(self, key: bytes) -> T:
        return self.backends[self._slots[client_hash(key) % self.size]]

    def preference(self, key: bytes) -> Iterator[T]:
        """Distinct backends for `key`, best first: its own slot's backend,
        then those of the following slots. Retries walk this order, so clients
        that hash to the same slot fail over to the same next backend."""
        start = client_hash(key) % self.size
        seen: set[int] = set()
        for step in range(self.size):
            index = self._slots[(start + step) % self.size]
            if index not in seen:
                seen.add(index)
                yield self.backends[index]
                if len(seen) == len(self.backends):
                    return

    def slot_counts(self) -> list[int]:
        """Slots per backend, in backend order."""
        counts = [0] * len(self.backends)
        for index in self._slots:
            counts[index] += 1
        return counts
