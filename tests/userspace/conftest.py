"""Fixtures of the userspace backend's tests."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from backends.userspace.context import (
    Housekeeping,
    NodeAddresses,
    ProxyConfig,
    ProxyContext,
    ProxyStats,
)
from kpng_py.metrics.metrics import Metrics


@pytest.fixture
def ctx() -> Iterator[ProxyContext]:
    loop = asyncio.new_event_loop()
    config = ProxyConfig()
    yield ProxyContext(loop, config, ProxyStats(Metrics()), Housekeeping(loop, 1.0),
                       NodeAddresses(config.nodeport_addresses))
    loop.close()
