"""The backend's last line behind decode: refused ClusterIPs never reach the
interface or a listener (no root needed)."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

import pytest

from backends.userspace.guard import ClusterIPGuard
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import Protocol, ServicePortChanges
from kpng_py.state.skips import Skips
from lab.proxy_node import service_port

GOOD = "10.96.0.10"


def _guard() -> tuple[ClusterIPGuard, Metrics]:
    metrics = Metrics()
    return ClusterIPGuard(Skips(metrics)), metrics


def _skipped(metrics: Metrics, reason: str) -> float:
    return metrics.registry.get_sample_value("kpng_py_skipped_total", {"reason": reason}) or 0


@pytest.mark.parametrize("bad, reason", [
    ("0.0.0.0", "special-ip"), ("::", "special-ip"), ("127.0.0.5", "special-ip"),
    ("::1", "special-ip"), ("169.254.169.254", "special-ip"), ("fe80::1", "special-ip"),
    ("224.0.0.5", "special-ip"), ("ff02::5", "special-ip"),
    ("fd00:10:96::66%eth0", "bad-ip"), ("::ffff:10.96.0.11", "bad-ip"),
])
def test_a_refused_cluster_ip_is_dropped_and_reported_once(bad, reason, caplog):
    guard, metrics = _guard()
    port = service_port("evil", Protocol.TCP, (GOOD, bad) if ":" in bad else (bad,), 80)
    kept = guard.filter(ServicePortChanges(added=(port,), full=True)).added[0]
    assert kept.cluster_ips == ((ipaddress.ip_address(GOOD),) if ":" in bad else ())
    assert _skipped(metrics, reason) == 1
    assert [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    # A resync and an update that keeps it: not reported again.
    guard.filter(ServicePortChanges(added=(port,), full=True))
    guard.filter(ServicePortChanges(updated=((port, port),)))
    assert _skipped(metrics, reason) == 1


def test_a_port_that_drops_its_refused_address_and_brings_it_back_is_reported_again():
    guard, metrics = _guard()
    bad = service_port("evil", Protocol.TCP, ("0.0.0.0",), 80)
    fixed = service_port("evil", Protocol.TCP, (GOOD,), 80)
    guard.filter(ServicePortChanges(added=(bad,), full=True))
    guard.filter(ServicePortChanges(updated=((bad, fixed),)))
    guard.filter(ServicePortChanges(updated=((fixed, bad),)))
    assert _skipped(metrics, "special-ip") == 2
    guard.filter(ServicePortChanges(removed=(bad,)))
    guard.filter(ServicePortChanges(added=(bad,)))
    assert _skipped(metrics, "special-ip") == 3


def test_the_old_side_of_an_update_is_filtered_alike_and_good_ports_pass_unchanged():
    guard, _ = _guard()
    good = service_port("web", Protocol.TCP, (GOOD,), 80)
    bad = service_port("evil", Protocol.TCP, ("127.0.0.5", "fd00:10:96::7"), 80)
    changes = guard.filter(ServicePortChanges(added=(good,), updated=((bad, bad),), removed=(bad,)))
    assert changes.added == (good,)
    stripped = (ipaddress.ip_address("fd00:10:96::7"),)
    assert [p.cluster_ips for p in (*changes.updated[0], *changes.removed)] == [stripped] * 3


def test_refused_external_and_load_balancer_ips_are_dropped_like_cluster_ips():
    guard, metrics = _guard()
    port = replace(service_port("lb", Protocol.TCP, (GOOD,), 80),
                   external_ips=(ipaddress.ip_address("127.0.0.1"),
                                 ipaddress.ip_address("192.0.2.10")),
                   load_balancer_ips=(ipaddress.ip_address("0.0.0.0"),))
    kept = guard.filter(ServicePortChanges(added=(port,), full=True)).added[0]
    assert kept.external_ips == (ipaddress.ip_address("192.0.2.10"),)
    assert kept.load_balancer_ips == ()
    assert kept.cluster_ips == (ipaddress.ip_address(GOOD),)
    assert _skipped(metrics, "special-ip") == 2
