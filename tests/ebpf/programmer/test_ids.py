"""The id pools of the map programmer (pure Python)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backends.ebpf.programmer.ids import MAX_ID, IdAllocator


def test_ids_increase_and_skip_those_in_use() -> None:
    pool = IdAllocator([1, 2, 5])
    assert [pool.allocate() for _ in range(3)] == [6, 7, 8]


def test_a_released_id_is_not_reused_before_settle_and_ids_wrap() -> None:
    pool = IdAllocator([MAX_ID - 1])
    assert pool.allocate() == MAX_ID
    pool.release(MAX_ID - 1)
    assert pool.allocate() == 1  # wrapped; MAX_ID - 1 is still settling
    pool.settle()
    assert pool.allocate() == 2


class _ReferencePool:
    """What IdAllocator does, as a set: the next free id after the last one
    handed out, wrapping at the limit; released ids free at settle."""

    def __init__(self, in_use: set[int], limit: int) -> None:
        self.in_use, self.limit = set(in_use), limit
        self.cursor = max(in_use, default=0)
        self.released: list[int] = []

    def allocate_many(self, count: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < count:
            self.cursor = self.cursor % self.limit + 1
            if self.cursor not in self.in_use:
                self.in_use.add(self.cursor)
                ids.append(self.cursor)
        return ids

    def settle(self) -> None:
        self.in_use.difference_update(self.released)
        self.released.clear()


# Limits and counts that cross the bit chunks of the pool and wrap around.
_pool_steps = st.lists(st.one_of(
    st.tuples(st.just("allocate"), st.integers(1, 600)),
    st.tuples(st.just("release"), st.integers(0, 10_000)),
    st.just(("settle", 0))), max_size=30)


@given(limit=st.integers(1, 1300), in_use=st.sets(st.integers(1, 1300), max_size=200),
       steps=_pool_steps)
def test_the_pool_hands_out_what_a_set_of_ids_would(limit: int, in_use: set[int],
                                                    steps: list[tuple[str, int]]) -> None:
    in_use = {value for value in in_use if value <= limit}
    pool, reference = IdAllocator(in_use, limit), _ReferencePool(in_use, limit)
    for action, value in steps:
        if action == "allocate":
            count = min(value, pool.available())
            assert count == min(value, limit - len(reference.in_use))
            assert pool.allocate_many(count) == reference.allocate_many(count)
        elif action == "release" and reference.in_use:
            released = sorted(reference.in_use)[value % len(reference.in_use)]
            pool.release(released)
            reference.released.append(released)
        elif action == "settle":
            pool.settle()
            reference.settle()
    assert pool.available() == limit - len(reference.in_use)
