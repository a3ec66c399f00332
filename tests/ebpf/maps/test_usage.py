"""The LRU maps' entry counts on /metrics: cheap (no object per entry) and
bounded (one walk per period, however many scrapers)."""

from __future__ import annotations

import errno
import threading
from typing import Iterator

from backends.ebpf.maps.usage import CachedCount


class Walks:
    """A count that says how often it was taken."""

    def __init__(self, entries: int = 0) -> None:
        self.entries = entries
        self.walks = 0

    def __call__(self) -> int:
        self.walks += 1
        return self.entries


def test_a_count_is_taken_at_most_once_per_period() -> None:
    now = [100.0]
    walks = Walks(5)
    cached = CachedCount(walks, max_age=30, clock=lambda: now[0])
    assert [cached() for _ in range(50)] == [5] * 50
    walks.entries = 7
    now[0] += 29.9
    assert cached() == 5 and walks.walks == 1
    now[0] += 0.1
    assert cached() == 7 and walks.walks == 2


def test_concurrent_scrapers_share_one_walk() -> None:
    started, release = threading.Event(), threading.Event()

    def slow_walk() -> int:
        started.set()
        release.wait(10)
        return 3

    walks = Walks()
    cached = CachedCount(lambda: (walks(), slow_walk())[1], max_age=30)
    results: list[int] = []
    scrapers = [threading.Thread(target=lambda: results.append(cached())) for _ in range(8)]
    scrapers[0].start()
    assert started.wait(10)
    for scraper in scrapers[1:]:
        scraper.start()
    release.set()
    for scraper in scrapers:
        scraper.join(10)
    assert results == [3] * 8 and walks.walks == 1


def test_a_failed_count_keeps_the_last_one() -> None:
    now = [0.0]
    answers: Iterator[int | OSError] = iter([4, OSError(errno.EBADF, "closed")])

    def count() -> int:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cached = CachedCount(count, max_age=1, clock=lambda: now[0])
    assert cached() == 4
    now[0] = 5
    assert cached() == 4
