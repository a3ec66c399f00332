"""Fixtures of the userspace backend's tests."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Callable, Iterator

import pytest

from backends.userspace.context import (
    Housekeeping,
    NodeAddresses,
    ProxyConfig,
    ProxyContext,
    ProxyStats,
    Tally,
)
from backends.userspace.listener import Listener
from backends.userspace.picker import FrontendPickers, PortAffinity
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Endpoint
from tests.support.userspace import Started


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def ctx(metrics: Metrics) -> Iterator[ProxyContext]:
    loop = asyncio.new_event_loop()
    config = ProxyConfig()
    yield ProxyContext(loop, config, ProxyStats(metrics), Housekeeping(loop, 1.0),
                       NodeAddresses(config.nodeport_addresses))
    loop.close()


def _free_port(kind: socket.SocketKind) -> int:
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def start_listener(ctx: ProxyContext) -> Iterator[Callable[..., Started]]:
    """start_listener(kind, *endpoints): a listener of `kind` at
    127.0.0.1 on a free port, for a ClusterIP of those endpoints; its tally
    and port. Closed at the end."""
    started: list[Listener] = []

    def start(kind: type[Listener], *endpoints: Endpoint) -> Started:
        tally, port = Tally(), _free_port(kind.KIND)
        pickers = FrontendPickers("test", endpoints, None, PortAffinity(lambda item: None),
                                  ctx.node_addresses.is_internal)
        listener = kind(ctx, "test", ipaddress.ip_address("127.0.0.1"), port, pickers, tally,
                        None)
        listener.start()
        started.append(listener)
        return listener, tally, port

    yield start
    for listener in started:
        listener.close()
