"""Fixtures of the eBPF kernel tests: one lab (namespaces, servers, cgroup,
bpffs directory) and one loaded backend per test module, so the BPF program
is compiled once per module."""

from __future__ import annotations

from typing import Iterator

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import DatapathConfig, cleanup
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.state.skips import Skips
from lab.socket_lab import Agent, Lab, lab
from tests.ebpf.helpers import follower_in
from tests.support.kernel import require_root_bpf

# Small maps: LRU maps are preallocated, and tests never need many entries.
TEST_MAP_SIZES = {"services": 4096, "backends": 4096, "reverse_nat": 4096, "affinity": 1024,
                  "node_addresses": 64, "counters": 1024, "backend_counters": 4096,
                  "service_names": 1024}


@pytest.fixture(scope="module")
def the_lab() -> Iterator[Lab]:
    require_root_bpf()
    with lab(cleanup) as created:
        yield created


def datapath_config(the_lab: Lab, **sizes: int) -> DatapathConfig:
    return DatapathConfig(the_lab.bpffs_dir, the_lab.group.path, {**TEST_MAP_SIZES, **sizes})


@pytest.fixture(scope="module")
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture(scope="module")
def backend(the_lab: Lab, metrics: Metrics) -> Iterator[EbpfBackend]:
    """A loaded and attached backend, starting from an empty full sync."""
    ebpf = EbpfBackend(datapath_config(the_lab), metrics, Skips(metrics),
                       follower=follower_in(the_lab))
    ebpf.setup()
    ebpf.apply(ServicePortChanges(full=True))
    yield ebpf
    ebpf.close()


@pytest.fixture(scope="module")
def agent(the_lab: Lab) -> Agent:
    return the_lab.agent()
