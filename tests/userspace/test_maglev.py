"""Maglev table properties (no root needed)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.userspace.maglev import (
    MIN_SLOTS_PER_BACKEND,
    TABLE_SIZES,
    MaglevTable,
    populate,
    table_size,
)

# Client keys as the picker builds them: a packed address and port.
KEYS = [random.Random(seed).randbytes(6) for seed in range(50_000)]


def _names(count: int) -> list[str]:
    return [f"10.244.{i // 250}.{i % 250 + 1}:8080" for i in range(count)]


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def test_table_sizes_are_primes_well_above_100_slots_per_backend():
    assert all(_is_prime(size) for size in TABLE_SIZES)
    for backends in (1, 2, 3, 10, 11, 100, 1000):
        size = table_size(backends)
        assert size in TABLE_SIZES
        assert size > MIN_SLOTS_PER_BACKEND * backends


def test_table_size_is_kept_while_it_fits_so_small_changes_do_not_reshuffle():
    size = table_size(10)
    assert table_size(11, size) == size
    assert table_size(9, size) == size
    assert table_size(size // MIN_SLOTS_PER_BACKEND + 1, size) > size  # outgrown
    assert table_size(1, table_size(100)) < table_size(100)  # far too big: shrinks


def test_table_size_refuses_nonsense():
    with pytest.raises(ValueError, match="at least one backend"):
        table_size(0)
    with pytest.raises(ValueError, match="largest supported size"):
        table_size(10**6)


@settings(max_examples=40, deadline=None)
@given(st.sets(st.text(min_size=1, max_size=30), min_size=1, max_size=40))
def test_every_slot_is_filled_and_backends_share_them_evenly(names):
    names = sorted(names)
    size = table_size(len(names))
    table = populate(names, size)
    assert len(table) == size and min(table) >= 0 and max(table) < len(names)
    counts = [table.count(i) for i in range(len(names))]
    # Maglev's round robin gives each backend floor or ceil of size/N slots.
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("backends", [2, 3, 10, 25])
def test_clients_spread_within_a_few_percent(backends):
    table = MaglevTable(_names(backends), table_size(backends))
    hits: dict[str, int] = {}
    for key in KEYS:
        name = table.lookup(key)
        hits[name] = hits.get(name, 0) + 1
    share = len(KEYS) / backends
    assert len(hits) == backends
    assert all(abs(count - share) / share < 0.06 for count in hits.values()), hits


@pytest.mark.parametrize("backends", [5, 10, 30])
def test_removing_or_adding_one_backend_moves_about_one_nth_of_clients(backends):
    names = _names(backends)
    size = table_size(backends)
    before = MaglevTable(names, size)
    removed = names[backends // 2]
    after = MaglevTable([n for n in names if n != removed], table_size(backends - 1, size))
    assert after.size == size
    moved = {k for k in KEYS if before.lookup(k) != after.lookup(k)}
    assert {k for k in KEYS if before.lookup(k) == removed} <= moved
    # Maglev trades a little extra movement for balance: measured 1.05-1.45 x 1/N.
    assert len(moved) / len(KEYS) < 2 / backends, len(moved) / len(KEYS)
    # Adding it back restores exactly the old table: the same clients move back.
    restored = MaglevTable(names, table_size(backends, after.size))
    assert all(restored.lookup(k) == before.lookup(k) for k in KEYS)


def test_the_table_is_the_same_in_every_process():
    code = ("from backends.userspace.maglev import populate; "
            "print(populate(['10.244.0.1:80', '10.244.0.2:80', '[fd00::3]:80'], 251))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other == str(populate(["10.244.0.1:80", "10.244.0.2:80", "[fd00::3]:80"], 251))


def test_preference_starts_with_the_lookup_and_lists_each_backend_once():
    names = _names(7)
    table = MaglevTable(names, table_size(7))
    for key in KEYS[:200]:
        order = list(table.preference(key))
        assert order[0] == table.lookup(key)
        assert sorted(order) == sorted(names)


def test_a_table_needs_a_backend():
    with pytest.raises(ValueError):
        populate([], 251)
