"""/healthz semantics (kube-proxy's) and /metrics names, over real HTTP."""

from __future__ import annotations

import io
import json
import threading
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator

import pytest

from kpng_py.api import localv1 as L
from kpng_py.cmd.runner import ApplierSink
from kpng_py.dataplane.applier import ChangeSetApplier
from kpng_py.dataplane.print_backend import PrintBackend
from kpng_py.healthcheck.proxier_health import (
    BindAddress,
    HealthSink,
    Observability,
    SyncHealth,
    serve_healthz,
    serve_metrics,
)
from kpng_py.metrics.metrics import Metrics
from kpng_py.serve.server import Reply
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from kpng_py.watch.client import ClientConfig, WatchClient
from tests.streams.build import port, reset, service, set_service, sync
from tests.support.watch import ScriptedSource, changeset, start

TIMEOUT = 60
WAIT = 30.0  # liveness bound: generous, the machine is shared


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(clock: Clock) -> SyncHealth:
    """Health of a dataplane that has been programmed once."""
    health = SyncHealth(timeout=TIMEOUT, clock=clock)
    health.changeset_started()
    health.changeset_applied()
    return health


def healthy(health: SyncHealth) -> bool:
    return health.status()[0]


def test_healthy_once_programmed_and_while_nothing_is_pending(clock: Clock) -> None:
    health = SyncHealth(timeout=TIMEOUT, clock=clock)
    assert not healthy(health)  # nothing applied yet
    clock.now += 3600
    assert not healthy(health)
    health.changeset_started()
    health.changeset_applied()
    ok, body = health.status()
    assert ok and body == {"lastUpdated": "2023-11-14T23:13:20Z",
                           "currentTime": "2023-11-14T23:13:20Z", "nodeEligible": True}
    clock.now += 3600  # idle for an hour with the brain connected: still current
    assert healthy(health)


def alive(health: SyncHealth) -> bool:
    return health.liveness()[0]


def test_livez_stays_up_while_the_brain_is_away_or_slow(clock: Clock) -> None:
    health = SyncHealth(timeout=TIMEOUT, clock=clock)
    clock.now += 3600  # never reached a brain
    assert alive(health) and not healthy(health)
    health.changeset_started()  # a brain that sends very slowly
    clock.now += TIMEOUT + 1
    health.brain_lost()
    clock.now += 3600
    assert alive(health) and not healthy(health)


def test_livez_fails_when_an_apply_hangs(health: SyncHealth, clock: Clock) -> None:
    health.changeset_received()
    clock.now += TIMEOUT - 1
    assert alive(health)
    clock.now += 2
    assert not alive(health)
    health.changeset_applied()
    assert alive(health)


def test_livez_fails_when_applies_keep_failing_until_one_succeeds(health: SyncHealth,
                                                                  clock: Clock) -> None:
    health.changeset_received()
    clock.now += 1
    health.changeset_failed()
    clock.now += TIMEOUT - 2
    health.changeset_received()  # the next change set fails too
    health.changeset_failed()
    assert alive(health)
    clock.now += 2  # failing since the first one arrived, longer than the timeout
    assert not alive(health)
    health.reconciled()
    assert alive(health)


def test_a_changeset_that_never_syncs_turns_stale(health: SyncHealth, clock: Clock) -> None:
    health.changeset_started()  # ops arrive, their Sync does not
    clock.now += TIMEOUT - 1
    assert healthy(health)
    clock.now += 2
    assert not healthy(health)
    health.changeset_applied()
    assert healthy(health)


def test_a_failed_apply_stays_pending_until_a_retry_succeeds(health: SyncHealth,
                                                             clock: Clock) -> None:
    last_updated = health.status()[1]["lastUpdated"]
    health.changeset_started()
    clock.now += 30
    health.changeset_failed()  # the oldest moment, the change set's start, counts
    clock.now += 31
    ok, body = health.status()
    assert not ok and body["lastUpdated"] == last_updated
    health.changeset_started()  # the next change set starting does not restart the clock
    health.changeset_failed()
    assert not healthy(health)
    health.reconciled()
    ok, body = health.status()
    assert ok and body["lastUpdated"] == body["currentTime"]


def test_a_lost_brain_turns_stale_until_a_changeset_is_applied(health: SyncHealth,
                                                               clock: Clock) -> None:
    health.brain_lost()
    clock.now += 30
    health.brain_lost()  # a second failed reconnect does not restart the clock
    health.changeset_started()  # reconnected: the new stream's first change set arrives
    clock.now += 31
    assert not healthy(health)
    health.changeset_applied()
    assert healthy(health)


def test_a_reconcile_does_not_hide_a_lost_brain(health: SyncHealth, clock: Clock) -> None:
    health.changeset_started()
    health.changeset_failed()
    clock.now += 10
    health.brain_lost()
    health.reconciled()  # the dataplane holds what is known, but the brain is still gone
    clock.now += TIMEOUT - 9
    assert not healthy(health)
    health.changeset_started()
    health.changeset_applied()
    assert healthy(health)


def test_a_failed_changeset_from_a_new_stream_ends_the_outage_once_reconciled(
        health: SyncHealth, clock: Clock) -> None:
    health.brain_lost()
    health.changeset_started()
    health.changeset_failed()  # the brain is back, the dataplane is not current yet
    health.reconciled()
    clock.now += TIMEOUT + 1
    assert healthy(health)


class Sink:
    """An OpsSink that records what it was handed."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_changeset_started(self) -> None:
        self.calls.append("started")

    def on_ops(self, ops: list[L.OpItem]) -> None:
        self.calls.append(f"ops of {len(ops)}")

    def on_changeset(self, ops: list[L.OpItem]) -> None:
        self.calls.append(f"changeset of {len(ops)}")

    def on_stream_error(self, reason: str, partial: list[L.OpItem]) -> None:
        self.calls.append(f"error {reason}")


@pytest.mark.parametrize("arrive", [
    lambda sink: sink.on_changeset_started(),  # the watch client: ops came, no Sync yet
    lambda sink: sink.on_changeset([reset(), sync()]),  # an in-process source's change set
    lambda sink: sink.on_stream_error("UNAVAILABLE: gone", []),
], ids=["started", "changeset", "stream-error"])
def test_the_sink_marks_what_arrives_as_pending(arrive: Callable[[HealthSink], None],
                                                health: SyncHealth, clock: Clock) -> None:
    sink = Sink()
    arrive(HealthSink(sink, health))
    assert len(sink.calls) == 1  # passed on
    clock.now += TIMEOUT + 1
    assert not healthy(health)  # pending until the applier reports the dataplane current


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


@pytest.fixture
def cleanup() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_healthz_over_http(host: str, clock: Clock, cleanup: ExitStack) -> None:
    health = SyncHealth(timeout=TIMEOUT, clock=clock)
    metrics = Metrics()
    server = serve_healthz(BindAddress(host, 0), health, metrics)
    cleanup.callback(server.close)
    base = f"http://{'[::1]' if ':' in host else host}:{server.port}"
    status, content_type, body = get(f"{base}/healthz")
    assert (status, content_type) == (503, "application/json")
    assert json.loads(body)["lastUpdated"] == ""
    health.changeset_started()
    health.changeset_applied()
    status, _, body = get(f"{base}/healthz")
    assert status == 200 and set(json.loads(body)) == {"lastUpdated", "currentTime", "nodeEligible"}
    health.brain_lost()
    clock.now += TIMEOUT + 1
    assert get(f"{base}/healthz")[0] == 503
    assert get(f"{base}/livez")[0] == 200  # a lost brain is not kpng-py stuck
    answers = {code: metrics.registry.get_sample_value("kubeproxy_proxy_healthz_total",
                                                       {"code": code}) for code in ("200", "503")}
    assert answers == {"200": 1, "503": 2}
    assert metrics.registry.get_sample_value("kubeproxy_proxy_livez_total", {"code": "200"}) == 1
    health.changeset_received()
    clock.now += TIMEOUT + 1
    status, content_type, body = get(f"{base}/livez")
    assert (status, content_type) == (503, "application/json")
    assert set(json.loads(body)) == {"lastUpdated", "currentTime", "nodeEligible"}
    assert get(f"{base}/nope")[0] == 404


def test_metrics_over_http(cleanup: ExitStack) -> None:
    metrics = Metrics()
    metrics.sync_duration.observe(0.01)
    metrics.skipped.labels("headless").inc()
    server = serve_metrics(BindAddress("127.0.0.1", 0), metrics)
    cleanup.callback(server.close)
    status, content_type, body = get(f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200 and content_type == "text/plain; version=0.0.4; charset=utf-8"
    for name in ("kubeproxy_sync_proxy_rules_duration_seconds_bucket",
                 "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                 "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                 "kubeproxy_sync_proxy_rules_service_changes_total",
                 "kpng_py_brain_connected", "kpng_py_brain_reconnects_total",
                 "kpng_py_apply_retries_total",
                 'kpng_py_skipped_total{reason="headless"} 1.0',
                 "process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"):
        assert name in body, name
    assert "_created" not in body  # kube-proxy has no such series
    assert get(f"http://127.0.0.1:{server.port}/")[0] == 404


def test_a_port_in_use_is_logged_and_counted_not_fatal(
        cleanup: ExitStack, caplog: pytest.LogCaptureFixture) -> None:
    taken = serve_metrics(BindAddress("127.0.0.1", 0), Metrics())
    cleanup.callback(taken.close)
    metrics = Metrics()
    in_use = BindAddress("127.0.0.1", taken.port)
    health = Observability(healthz=in_use, metrics=in_use).start(metrics)
    assert isinstance(health, SyncHealth)
    for name in ("healthz", "metrics"):
        assert metrics.dataplane_errors.labels(f"{name}-bind")._value.get() == 1
        assert f"set --{name}-bind-address to a free address" in caplog.text


class StartWatcher(ApplierSink):
    """The runner's sink, telling the test when a change set starts arriving."""

    def __init__(self, applier: ChangeSetApplier) -> None:
        super().__init__(applier)
        self.started = threading.Semaphore(0)

    def on_changeset_started(self) -> None:
        super().on_changeset_started()
        self.started.release()


def test_healthz_sees_a_changeset_whose_sync_never_comes_over_a_real_stream(
        tmp_path: Path, clock: Clock, cleanup: ExitStack) -> None:
    dns = service("dns", v4=["10.96.0.53"], ports=[port("dns", 53, L.UDP)])
    source = ScriptedSource([changeset("web"), Reply((set_service(dns),))])  # no Sync
    server, target = start(source, tmp_path)
    cleanup.callback(server.stop, 0)
    metrics = Metrics()
    health = SyncHealth(timeout=TIMEOUT, clock=clock)
    applier = ChangeSetApplier(PrintBackend(io.StringIO()), NodeState(Skips(metrics)), metrics,
                               listener=health)
    cleanup.callback(applier.close)
    inner = StartWatcher(applier)
    client = WatchClient(ClientConfig(target, "n"), HealthSink(inner, health), metrics)
    watching = threading.Thread(target=client.run, daemon=True)
    watching.start()
    cleanup.callback(watching.join, WAIT)
    cleanup.callback(client.stop)
    probe = serve_healthz(BindAddress("127.0.0.1", 0), health, metrics)
    cleanup.callback(probe.close)

    assert inner.started.acquire(timeout=WAIT)  # web's change set: applied
    assert inner.started.acquire(timeout=WAIT)  # dns's Set, and no Sync after it
    assert applier.syncs == 1 and get(f"http://127.0.0.1:{probe.port}/healthz")[0] == 200
    clock.now += TIMEOUT + 1
    assert get(f"http://127.0.0.1:{probe.port}/healthz")[0] == 503
    assert applier.syncs == 1


@pytest.mark.parametrize("text", ["10256", "host:", "a:b", "1.2.3.4:99999"])
def test_bad_bind_addresses_are_named(text: str) -> None:
    with pytest.raises(ValueError, match="--healthz-bind-address"):
        BindAddress.parse(text, "--healthz-bind-address")


def test_a_dataplane_missing_parts_fails_both_probes_until_it_is_complete(
        health: SyncHealth) -> None:
    """Issue 31: a backend that finds its dataplane taken away says so in
    /healthz and /livez (a restart of kpng-py puts it back), naming what."""
    health.dataplane_incomplete("links: connect4, connect6")
    (ok, body), (alive_now, _) = health.status(), health.liveness()
    assert not ok and not alive_now
    assert body["dataplaneMissing"] == "links: connect4, connect6"
    health.dataplane_complete()
    (ok, body), (alive_now, _) = health.status(), health.liveness()
    assert ok and alive_now and "dataplaneMissing" not in body
