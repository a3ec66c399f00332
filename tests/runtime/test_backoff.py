"""Retry delays: doubling up to a cap, stretched upward at random."""

from __future__ import annotations

import random

from kpng_py.runtime.backoff import Backoff


def test_backoff_doubles_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(1.0, 5.0, random_unit=lambda: 0.0)
    assert [backoff.next() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 1.0


def test_backoff_jitter_only_lengthens_a_delay_by_less_than_a_quarter() -> None:
    """--error-delay stays the shortest delay; clients of one brain spread out."""
    longest = Backoff(1.0, 4.0, random_unit=lambda: 1 - 1e-12)
    assert [round(longest.next(), 6) for _ in range(4)] == [1.25, 2.5, 5.0, 5.0]
    units = random.Random(12)
    delays = [Backoff(1.0, 1.0, random_unit=units.random).next() for _ in range(1000)]
    assert all(1.0 <= d < 1.25 for d in delays)
    assert len({round(d, 3) for d in delays}) > 100  # spread, not one value
