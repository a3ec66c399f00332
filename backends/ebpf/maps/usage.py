"""How full the datapath's own maps are, for /metrics, at a bounded cost.

The programs write `reverse_nat` and `affinity`; only a walk of a map tells
how many entries it holds, and a full reverse-NAT map takes tens of
milliseconds to walk (docs/ebpf.md). A scrape must not pay that, nor must
many scrapers multiply it: the count is kept, and the first scrape that finds
it older than `max_age` walks the map once (in the scrape's own thread; the
walk is syscalls, which do not hold the GIL). Every other scrape returns the
kept count at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

# How stale an LRU map's entry count on /metrics may be.
LRU_COUNT_MAX_AGE_SECONDS = 30.0


class CachedCount:
    """A count refreshed at most once per `max_age` seconds, however often
    and from however many threads it is read."""

    def __init__(self, count: Callable[[], int], max_age: float = LRU_COUNT_MAX_AGE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._count = count
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._value = 0
        self._taken_at: float | None = None

    def __call__(self) -> int:
        with self._lock:  # concurrent scrapers wait for the one walk
            now = self._clock()
            if self._taken_at is None or now - self._taken_at >= self._max_age:
                self._refresh(now)
            return self._value

    def _refresh(self, now: float) -> None:
        try:
            self._value = self._count()
        except OSError as err:  # e.g. the map was closed at shutdown: keep the last count
            log.warning("could not count the entries of a map; /metrics shows the last count",
                        extra=fields(error=err))
        self._taken_at = now
