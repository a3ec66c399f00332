"""Listener state outside the data path (no root needed: loopback sockets)."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Iterator

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
from backends.userspace.picker import FrontendPickers
from backends.userspace.tcp import TcpListener
from backends.userspace.udp import UdpListener
from kpng_py.metrics import Metrics
from kpng_py.model import Endpoint

EP = (Endpoint(ipaddress.ip_address("10.244.1.1"), 8080),)
CLIENT = ipaddress.ip_address("10.244.0.2")
LOOPBACK = ipaddress.ip_address("127.0.0.1")


@pytest.fixture
def ctx() -> Iterator[ProxyContext]:
    loop = asyncio.new_event_loop()
    config = ProxyConfig()
    yield ProxyContext(loop, config, ProxyStats(Metrics()), Housekeeping(loop, 1.0),
                       NodeAddresses(config.nodeport_addresses))
    loop.close()


@pytest.mark.parametrize("kind", [TcpListener, UdpListener])
def test_a_closed_listener_has_nothing_left_to_expire(ctx, kind: type[Listener]):
    pickers = FrontendPickers("test", EP, None, 100, ctx.node_addresses.is_local)
    listener = kind(ctx, "test", LOOPBACK, 0, pickers, Tally())
    listener.start()
    listener.picker_for(CLIENT).served(CLIENT, EP[0], now=0)
    assert listener.expire(now=1)
    # Its affinity can serve no new flow: housekeeping may drop it at once.
    listener.close()
    assert not listener.expire(now=1)
