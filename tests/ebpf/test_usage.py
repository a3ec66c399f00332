"""The LRU maps' entry counts on /metrics: cheap (no object per entry) and
bounded (one walk per period, however many scrapers)."""

from __future__ import annotations

import errno
import threading

import pytest

from backends.ebpf.maps import layout as maps
from backends.ebpf.backend import EbpfBackend
from backends.ebpf.maps.usage import CachedCount
from kpng_py.metrics.metrics import Metrics
from tests.ebpf.helpers import loaded


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
    answers = iter([4, OSError(errno.EBADF, "closed")])

    def count() -> int:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cached = CachedCount(count, max_age=1, clock=lambda: now[0])
    assert cached() == 4
    now[0] = 5
    assert cached() == 4


@pytest.mark.kernel
def test_count_is_the_number_of_entries_over_several_batches() -> None:
    with loaded(services=64, backends=64, reverse_nat=16384, affinity=16) as datapath:
        lru = datapath.maps[maps.REVERSE_NAT.pin]
        assert lru.count() == 0
        keys = [maps.RevNatKey(cookie=i + 1) for i in range(10000)]  # 3 read batches
        lru.put_many(keys, [maps.RevNatValue(service_id=1)] * len(keys))
        assert lru.count() == len(list(lru.items())) == 10000


@pytest.mark.kernel
def test_metrics_scrapes_do_not_walk_the_lru_maps_each_time(backend: EbpfBackend,
                                                            metrics: Metrics) -> None:
    """The datapath adds entries between two scrapes: both show the count of
    the first one (refreshed at most every LRU_COUNT_MAX_AGE_SECONDS)."""
    lru = backend._datapath.maps[maps.REVERSE_NAT.pin]

    def scraped() -> float:
        return metrics.registry.get_sample_value("kpng_py_map_entries",
                                                 {"map": maps.REVERSE_NAT.pin})

    first = scraped()
    lru.put_many([maps.RevNatKey(cookie=(1 << 63) + i) for i in range(3)],
                 [maps.RevNatValue(service_id=1)] * 3)
    assert scraped() == first
