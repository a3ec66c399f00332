"""/healthz semantics (kube-proxy's) and /metrics names, over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from kpng_py.health import BindAddress, SyncHealth, serve_healthz, serve_metrics
from kpng_py.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_health_follows_the_pipeline() -> None:
    clock = Clock()
    health = SyncHealth(timeout=60, clock=clock)
    assert health.status()[0] is False  # nothing applied yet
    health.apply_started()
    health.apply_finished()
    healthy, body = health.status()
    assert healthy and body["lastUpdated"] == "2023-11-14T22:13:20Z" and body["nodeEligible"]

    clock.now += 3600  # idle for an hour with the brain connected: still current
    assert health.status()[0]

    health.apply_started()  # a change set stuck in the dataplane
    clock.now += 59
    assert health.status()[0]
    clock.now += 2
    assert health.status()[0] is False
    health.apply_finished()
    assert health.status()[0]

    health.brain_lost()  # the brain is gone: stale after the timeout
    clock.now += 30
    health.brain_lost()  # a second failed reconnect does not restart the clock
    clock.now += 31
    assert health.status()[0] is False
    health.apply_started()  # reconnected: the new stream's first change set
    health.apply_finished()
    assert health.status()[0]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_healthz_over_http(host: str) -> None:
    health = SyncHealth(timeout=60)
    port = serve_healthz(BindAddress(host, 0), health)
    base = f"http://{'[::1]' if ':' in host else host}:{port}"
    status, body = get(f"{base}/healthz")
    assert status == 503 and json.loads(body)["lastUpdated"] == ""
    health.apply_started()
    health.apply_finished()
    status, body = get(f"{base}/healthz")
    assert status == 200 and set(json.loads(body)) == {"lastUpdated", "currentTime", "nodeEligible"}
    assert get(f"{base}/nope")[0] == 404


def test_metrics_over_http() -> None:
    metrics = Metrics()
    metrics.sync_duration.observe(0.01)
    metrics.skipped.labels("headless").inc()
    port = serve_metrics(BindAddress("127.0.0.1", 0), metrics)
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    for name in ("kubeproxy_sync_proxy_rules_duration_seconds_bucket",
                 "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                 "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                 "kubeproxy_sync_proxy_rules_service_changes_total",
                 "kpng_py_brain_connected", "kpng_py_brain_reconnects_total",
                 'kpng_py_skipped_total{reason="headless"} 1.0'):
        assert name in body, name


@pytest.mark.parametrize("text", ["10256", "host:", "a:b", "1.2.3.4:99999"])
def test_bad_bind_addresses_are_named(text: str) -> None:
    with pytest.raises(ValueError, match="--healthz-bind-address"):
        BindAddress.parse(text, "--healthz-bind-address")
