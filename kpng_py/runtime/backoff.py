"""Retry delays that double up to a cap, stretched at random: the watch
client's reconnects to the brain and the applier's reconciles of the
dataplane after a failed apply both wait by them."""

from __future__ import annotations

import random
from typing import Callable

# Retry delays are stretched by a random factor in [1, 1 + JITTER): upward
# only, so --error-delay stays the shortest delay.
JITTER = 0.25


class Backoff:
    """Retry delays: `first`, then doubling up to `cap`, each times a random
    factor in [1, 1 + JITTER); `reset` starts again from `first`."""

    def __init__(self, first: float, cap: float,
                 random_unit: Callable[[], float] = random.random) -> None:
        self._first, self._cap = first, max(cap, first)
        self._next = first
        self._random_unit = random_unit

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self._cap)
        return delay * (1 + JITTER * self._random_unit())

    def reset(self) -> None:
        self._next = self._first
