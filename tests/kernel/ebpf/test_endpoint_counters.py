"""--endpoint-counters: the programs also count per endpoint, exported per
(service port, endpoint) over all of the port's frontends and shown in each
slot by `ebpf dump`; an endpoint's count goes with it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Iterator

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import open_pinned_map
from backends.ebpf.maps import counters
from backends.ebpf.maps import layout as maps
from backends.ebpf.tools.dump import read_dump
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.state.skips import Skips
from lab.socket_lab import Agent, Lab
from tests.support.ebpf import datapath_config
from tests.support.ebpf_datapath import added, follower_in, service_port, updated

pytestmark = pytest.mark.kernel

# Two frontends with endpoint ids of their own: a ClusterIP and an ExternalIP.
SPREAD = service_port("spread", ["10.96.12.1"], 80, endpoints=[1, 2, 3], port_name="http",
                      families=(4,), external_ips=["10.96.13.1"])
CONNECTS = 30


@pytest.fixture(scope="module")
def backend(the_lab: Lab, metrics: Metrics) -> Iterator[EbpfBackend]:
    ebpf = EbpfBackend(replace(datapath_config(the_lab), endpoint_counters=True), metrics,
                       Skips(metrics), follower=follower_in(the_lab))
    ebpf.setup()
    ebpf.apply(ServicePortChanges(full=True))
    yield ebpf
    ebpf.close()


def endpoint_count(metrics: Metrics, endpoint: str) -> float | None:
    return metrics.registry.get_sample_value(
        "kpng_py_service_endpoint_connections_total",
        {"service_port": "default/spread:http", "protocol": "TCP", "endpoint": endpoint})


def test_connections_are_counted_per_endpoint_over_every_frontend(
        backend: EbpfBackend, agent: Agent, metrics: Metrics, the_lab: Lab) -> None:
    backend.apply(added(SPREAD))
    served = Counter(agent.call("tcp", host=host, port=80, family=family)["served_by"]
                     for host, family in (("10.96.12.1", 4), ("10.96.13.1", 4))
                     for _ in range(CONNECTS // 2))
    assert sum(served.values()) == CONNECTS and len(served) > 1
    for endpoint, count in served.items():
        assert endpoint_count(metrics, endpoint) == count
    dump = read_dump(the_lab.bpffs_dir)
    assert dump["endpointCounters"] is True  # the attached programs count per endpoint
    slots = {(svc["vip"], slot["address"]): slot["connections"]
             for svc in dump["services"] for slot in svc["backends"]}
    assert sum(slots.values()) == CONNECTS

    # An endpoint that goes takes its counts along (both frontends' entries of it).
    gone = "10.244.0.4:8080"
    endpoint_counters = open_pinned_map(the_lab.bpffs_dir, maps.ENDPOINT_COUNTERS)
    try:
        before = len(counters.read_endpoint_counts(endpoint_counters))
        backend.apply(updated(SPREAD, replace(SPREAD, endpoints=SPREAD.endpoints[:2])))
        left = len(counters.read_endpoint_counts(endpoint_counters))
    finally:
        endpoint_counters.close()
    assert endpoint_count(metrics, gone) is None
    assert left == before - sum(1 for (_, address), n in slots.items() if address == gone and n)
