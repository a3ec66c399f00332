"""Fixtures of the eBPF kernel tests: one lab (namespaces, servers, cgroup,
bpffs directory) and one loaded backend per test module, so the BPF program
is compiled once per module."""

from __future__ import annotations

from typing import Iterator

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import cleanup
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.state.skips import Skips
from lab.socket_lab import Agent, Lab, lab
from tests.support.ebpf import datapath_config
from tests.support.ebpf_datapath import follower_in
from tests.support.kernel import require_root_bpf


@pytest.fixture(scope="module")
def the_lab() -> Iterator[Lab]:
    require_root_bpf()
    with lab(cleanup) as created:
        yield created


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
