"""The LRU maps' entry counts on /metrics, on real maps (the cache itself:
tests/ebpf/maps/test_usage.py)."""

from __future__ import annotations

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.maps import layout as maps
from kpng_py.metrics.metrics import Metrics
from tests.support.ebpf_datapath import datapath_of, loaded


@pytest.mark.kernel
def test_count_is_the_number_of_entries_over_several_batches() -> None:
    with loaded(services=64, backends=64, reverse_nat=16384, affinity=16) as datapath:
        lru = datapath.maps[maps.REVERSE_NAT.pin]
        assert lru.count() == 0
        keys = [maps.RevNatKey(cookie=i + 1) for i in range(10000)]  # 3 read batches
        lru.put_many(keys, [maps.RevNatValue(frontend_id=1)] * len(keys))
        assert lru.count() == len(list(lru.items())) == 10000


@pytest.mark.kernel
def test_metrics_scrapes_do_not_walk_the_lru_maps_each_time(backend: EbpfBackend,
                                                            metrics: Metrics) -> None:
    """The datapath adds entries between two scrapes: both show the count of
    the first one (refreshed at most every LRU_COUNT_MAX_AGE_SECONDS)."""
    lru = datapath_of(backend).maps[maps.REVERSE_NAT.pin]

    def scraped() -> float | None:
        return metrics.registry.get_sample_value("kpng_py_map_entries",
                                                 {"map": maps.REVERSE_NAT.pin})

    first = scraped()
    lru.put_many([maps.RevNatKey(cookie=(1 << 63) + i) for i in range(3)],
                 [maps.RevNatValue(frontend_id=1)] * 3)
    assert scraped() == first
