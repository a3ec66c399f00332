"""ChangeSetApplier: a failed apply is retried on a timer, without waiting for
the brain's next change set, and /healthz follows."""

from __future__ import annotations

import errno
import gc
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from typing import Callable, Iterator

import pytest

from kpng_py.api import localv1 as L
from kpng_py.cmd.runner import ApplierSink
from kpng_py.dataplane.applier import ChangeSetApplier
from kpng_py.healthcheck.proxier_health import BindAddress, HealthSink, SyncHealth, serve_healthz
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePort, ServicePortChanges
from kpng_py.runtime.backoff import Backoff
from kpng_py.runtime.logs import record_fields
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from lab.procs import wait_until
from tests.streams.build import endpoint, port, reset, service, set_endpoint, set_service, sync
from tests.support.dataplane import OldBackend

WAIT = 30.0  # liveness bound: generous, the machine is shared
FAST = (0.01, 0.04)  # retry delays: first, cap


class FlakyBackend:
    """A dataplane that fails while `failures` is above zero (or forever while
    `broken` is set), else holds what it is given. Records every call."""

    def __init__(self, failures: int = 0, apply_seconds: float = 0.0) -> None:
        self.failures = failures
        self.broken = threading.Event()
        self.apply_seconds = apply_seconds
        self.held: dict[str, ServicePort] = {}
        self.calls: list[tuple[ServicePortChanges, int, bool]] = []  # (changes, thread, applied)
        self.overlapped = False
        self._busy = threading.Lock()
        self._changed = threading.Condition()

    def setup(self) -> None:
        pass

    def close(self) -> None:
        pass

    def apply(self, changes: ServicePortChanges) -> None:
        if not self._busy.acquire(blocking=False):
            self.overlapped = True
            self._busy.acquire()
        try:
            time.sleep(self.apply_seconds)
            failing = self.broken.is_set() or self.failures > 0
            if not failing:
                self._hold(changes)
            with self._changed:
                self.failures -= 1 if self.failures > 0 else 0
                self.calls.append((changes, threading.get_ident(), not failing))
                self._changed.notify_all()
            if failing:
                raise OSError(errno.ENOSPC, "No space left on device (map full)")
        finally:
            self._busy.release()

    def _hold(self, changes: ServicePortChanges) -> None:
        if changes.full:
            self.held.clear()
        for gone in changes.removed:
            self.held.pop(str(gone.name), None)
        for current in changes.current():
            self.held[str(current.name)] = current

    def wait_for(self, predicate: Callable[[], bool]) -> None:
        with self._changed:
            assert self._changed.wait_for(predicate, WAIT), self.calls

    def successes(self) -> list[ServicePortChanges]:
        return [changes for changes, _, applied in self.calls if applied]

    def apply_stages(self) -> dict[str, float]:
        return {}

    def not_programmed(self) -> dict[str, int]:
        return {}


def web_and_dns() -> list[L.OpItem]:
    return [reset(),
            set_service(service("web", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])),
            set_endpoint("default", "web", "a", endpoint(["10.244.0.5"])),
            set_service(service("dns", v4=["10.96.0.53"], ports=[port("dns", 53, L.UDP)])),
            set_endpoint("default", "dns", "a", endpoint(["10.244.0.7"])),
            sync()]


def another_web_endpoint() -> list[L.OpItem]:
    return [set_endpoint("default", "web", "b", endpoint(["10.244.0.6"])), sync()]


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def cleanup() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def new_applier(metrics: Metrics, cleanup: ExitStack):
    def make(backend: FlakyBackend, delays: tuple[float, float] = FAST,
             health: SyncHealth | None = None) -> ChangeSetApplier:
        applier = ChangeSetApplier(backend, NodeState(Skips(metrics)), metrics, listener=health,
                                   retry_backoff=Backoff(*delays))
        cleanup.callback(applier.close)
        return applier
    return make


def counts(metrics: Metrics) -> tuple[float, float]:
    """(failed applies, retries)"""
    return (metrics.dataplane_errors.labels("apply")._value.get(),
            metrics.apply_retries._value.get())


def test_a_failed_apply_is_retried_without_a_new_changeset(new_applier, metrics: Metrics) -> None:
    backend = FlakyBackend(failures=3)
    applier = new_applier(backend)
    applier.apply_ops(web_and_dns())  # fails; then two retries fail and the third succeeds
    backend.wait_for(lambda: bool(backend.successes()))
    (reconcile,) = backend.successes()
    assert reconcile.full and reconcile.added == tuple(applier.state.service_ports())
    assert sorted(backend.held) == ["default/dns:dns", "default/web:http"]
    assert counts(metrics) == (3, 3)
    retry_threads = {thread for _, thread, _ in backend.calls[1:]}
    assert len(retry_threads) == 1 and threading.get_ident() not in retry_threads
    time.sleep(0.3)  # many retry delays: nothing more is retried once it worked
    assert len(backend.calls) == 4 and counts(metrics) == (3, 3)
    applier.apply_ops(another_web_endpoint())  # and the next change set is incremental again
    assert not backend.calls[-1][0].full


def test_retry_delays_double_up_to_the_cap_and_start_over_after_a_success(
        new_applier, caplog: pytest.LogCaptureFixture) -> None:
    backend = FlakyBackend(failures=5)
    applier = new_applier(backend)
    with caplog.at_level(logging.ERROR, logger="kpng_py.dataplane.applier"):
        applier.apply_ops(web_and_dns())
        backend.wait_for(lambda: bool(backend.successes()))
        backend.failures = 1
        applier.apply_ops(another_web_endpoint())
        backend.wait_for(lambda: len(backend.successes()) == 2)
    delays = [record_fields(record)["retry_in_s"] for record in caplog.records]
    first, cap = FAST
    bases = [first, 2 * first, cap, cap, cap, first]
    assert len(delays) == len(bases)
    assert all(base <= delay < 2 * base for base, delay in zip(bases, delays)), delays


def test_a_changeset_that_comes_first_reconciles_everything_itself(
        new_applier, metrics: Metrics) -> None:
    backend = FlakyBackend(failures=1)
    applier = new_applier(backend, delays=(0.5, 0.5))
    applier.apply_ops(web_and_dns())
    changes = applier.apply_ops(another_web_endpoint())
    assert changes is not None and changes.full and changes.endpoint_changes == 1
    assert [str(p.name) for p in backend.successes()[0].added] == [
        "default/dns:dns", "default/web:http"]
    assert len(backend.held["default/web:http"].cluster_endpoints()) == 2
    time.sleep(1.0)  # past the retry's delay: it was cancelled
    assert len(backend.calls) == 2 and counts(metrics) == (1, 0)


def test_close_cancels_a_pending_retry(new_applier, metrics: Metrics) -> None:
    backend = FlakyBackend(failures=1)
    applier = new_applier(backend, delays=(0.3, 0.3))
    applier.apply_ops(web_and_dns())
    applier.close()
    time.sleep(1.0)  # past the retry's delay
    assert len(backend.calls) == 1 and counts(metrics) == (1, 0)


def test_retries_and_changesets_never_overlap(new_applier) -> None:
    backend = FlakyBackend(apply_seconds=0.01)
    applier = new_applier(backend, delays=(0.005, 0.005))
    backend.broken.set()  # retries come every few ms while change sets keep arriving
    applier.apply_ops(web_and_dns())
    for n in range(40):
        applier.apply_ops([set_endpoint("default", "dns", f"k{n}", endpoint([f"10.244.1.{n}"])),
                           sync()])
    backend.broken.clear()
    backend.wait_for(lambda: backend.calls[-1][2])
    assert not backend.overlapped
    assert backend.held == {str(p.name): p for p in applier.state.service_ports()}


class CollectorWatchingBackend(FlakyBackend):
    """Records whether Python's cyclic collector was enabled during each apply."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__(failures)
        self.collector_enabled: list[bool] = []

    def apply(self, changes: ServicePortChanges) -> None:
        self.collector_enabled.append(gc.isenabled())
        super().apply(changes)


def test_changesets_are_applied_with_the_collector_paused_and_a_full_sync_is_frozen(
        new_applier) -> None:
    backend = CollectorWatchingBackend()
    applier = new_applier(backend)
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    applier.apply_ops(web_and_dns())  # a full sync
    assert gc.isenabled() and gc.get_freeze_count() > frozen_before
    frozen_after_full = gc.get_freeze_count()
    applier.apply_ops(another_web_endpoint())  # an incremental one: nothing more frozen
    assert gc.isenabled() and gc.get_freeze_count() <= frozen_after_full  # (some freed)
    assert backend.collector_enabled == [False, False]


def test_the_collector_comes_back_after_a_failed_apply_and_its_retry(new_applier) -> None:
    backend = CollectorWatchingBackend(failures=1)
    applier = new_applier(backend)
    applier.apply_ops(web_and_dns())  # fails, then the retry on its timer thread succeeds
    backend.wait_for(lambda: bool(backend.successes()))
    assert backend.collector_enabled == [False, False]
    assert gc.isenabled()


def test_a_collector_disabled_by_someone_else_stays_disabled(new_applier) -> None:
    backend = CollectorWatchingBackend()
    applier = new_applier(backend)
    gc.disable()
    try:
        applier.apply_ops(web_and_dns())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_staged_ops_reach_the_backend_only_with_their_sync(new_applier) -> None:
    backend = FlakyBackend()
    applier = new_applier(backend)
    *staged, last = web_and_dns()
    applier.stage_ops(staged[:3])
    applier.stage_ops(staged[3:])
    assert backend.calls == []
    changes = applier.apply_ops([last])
    assert changes is not None and changes.full
    assert sorted(backend.held) == ["default/dns:dns", "default/web:http"]


def test_a_cut_change_set_never_reaches_the_backend_and_the_next_stream_supersedes_it(
        new_applier) -> None:
    """Staged ops of a change set whose Sync never came stay out of the
    dataplane; the next stream's Reset and full state leave exactly what it
    holds, as if the cut change set had never been sent."""
    backend = FlakyBackend()
    applier = new_applier(backend)
    applier.apply_ops(web_and_dns())
    gone = L.OpItem(Delete=L.Ref(Set=L.ServicesSet, Path="default/dns"))
    applier.stage_ops([set_endpoint("default", "web", "b", endpoint(["10.244.0.6"])), gone])
    applier.changeset_cut()
    assert len(backend.calls) == 1
    changes = applier.apply_ops(web_and_dns())  # the next stream: Reset, the same full state
    assert changes is not None and not changes.updated and not changes.removed
    assert sorted(backend.held) == ["default/dns:dns", "default/web:http"]
    assert [str(e.ip) for e in backend.held["default/web:http"].endpoints] == ["10.244.0.5"]


def test_a_sync_among_staged_ops_is_refused(new_applier) -> None:
    applier = new_applier(FlakyBackend())
    with pytest.raises(ValueError, match="a Sync among staged ops"):
        applier.stage_ops(web_and_dns())
    assert gc.isenabled()  # the change set is given up: the collector is back


def test_the_collector_stays_paused_from_staged_ops_to_their_sync_or_cut(new_applier) -> None:
    backend = CollectorWatchingBackend()
    applier = new_applier(backend)
    *staged, last = web_and_dns()
    applier.stage_ops(staged)
    assert not gc.isenabled()
    applier.apply_ops([last])
    assert gc.isenabled() and backend.collector_enabled == [False]
    applier.stage_ops([set_endpoint("default", "web", "b", endpoint(["10.244.0.6"]))])
    assert not gc.isenabled()
    applier.changeset_cut()
    assert gc.isenabled()


class GatedRetryBackend(FlakyBackend):
    """Fails its first apply; the next one (the retry) waits for `go`."""

    def __init__(self) -> None:
        super().__init__(failures=1)
        self.retrying, self.go = threading.Event(), threading.Event()

    def apply(self, changes: ServicePortChanges) -> None:
        if self.calls:
            self.retrying.set()
            assert self.go.wait(WAIT)
        super().apply(changes)


def test_staging_ops_does_not_wait_for_a_retry_in_progress(new_applier) -> None:
    """The watch client stages ops on its event loop: a reconcile that takes
    long must not hold it up; the change set's Sync waits for it."""
    backend = GatedRetryBackend()
    applier = new_applier(backend)
    applier.apply_ops(web_and_dns())  # fails: the retry is armed, and then waits
    assert backend.retrying.wait(WAIT)
    applier.stage_ops([set_endpoint("default", "web", "b", endpoint(["10.244.0.6"]))])
    assert len(backend.calls) == 1  # staged while the retry still waits
    backend.go.set()
    changes = applier.apply_ops([sync()])
    assert changes is not None and [new.name for _, new in changes.updated] == [
        backend.held["default/web:http"].name]
    assert len(backend.held["default/web:http"].endpoints) == 2


def get_healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert json.loads(response.read())["nodeEligible"]
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_healthz_is_503_while_applies_fail_past_the_timeout_and_200_after(
        new_applier, metrics: Metrics, cleanup: ExitStack) -> None:
    now = [1_700_000_000.0]
    health = SyncHealth(timeout=60, clock=lambda: now[0])
    backend = FlakyBackend()
    applier = new_applier(backend, health=health)
    sink = HealthSink(ApplierSink(applier), health)
    server = serve_healthz(BindAddress("127.0.0.1", 0), health, metrics)
    cleanup.callback(server.close)
    sink.on_changeset(web_and_dns())
    assert get_healthz(server.port) == 200
    backend.broken.set()
    sink.on_changeset(another_web_endpoint())  # fails, and every retry fails
    backend.wait_for(lambda: len(backend.calls) >= 4)
    now[0] += 59
    assert get_healthz(server.port) == 200  # within the timeout
    now[0] += 2
    assert get_healthz(server.port) == 503
    backend.broken.clear()
    backend.wait_for(lambda: backend.calls[-1][2])  # a retry, not a change set, heals it
    # The backend records its success before the applier tells /healthz.
    wait_until("/healthz 200 after the retry", lambda: get_healthz(server.port) == 200, WAIT)
    assert len(backend.held["default/web:http"].cluster_endpoints()) == 2


def _gauge(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels}"
    return value


def test_metrics_of_the_programmed_dataplane_follow_each_change_set() -> None:
    """kpng_py_service_ports and the no-local-endpoints gauges for any
    backend; full and partial syncs timed apart; queued before applied."""
    metrics = Metrics()
    applier = ChangeSetApplier(FlakyBackend(), NodeState(Skips(metrics)), metrics)
    with_node_port = port("http", 80, target=8080)
    with_node_port.NodePort = 30080
    local_in = service("in", v4=["10.96.0.20"], ports=[port("http", 80, target=8080)],
                       InternalTrafficToLocal=True)
    local_out = service("out", v4=["10.96.0.21"], ports=[with_node_port], Type="NodePort",
                        ExternalTrafficToLocal=True)
    inside_only = service("inside", v4=["10.96.0.22"], ports=[port("http", 80, target=8080)],
                          ExternalTrafficToLocal=True)  # no frontend reachable from outside
    elsewhere = endpoint(["10.244.1.5"], overrides=[("http", 8080)])
    applier.apply_ops([reset(), set_service(local_in), set_service(local_out),
                       set_service(inside_only), set_endpoint("default", "in", "a", elsewhere),
                       set_endpoint("default", "out", "a", elsewhere), sync()])
    assert _gauge(metrics, "kpng_py_service_ports") == 3
    assert _gauge(metrics, "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                  traffic_policy="internal") == 1
    assert _gauge(metrics, "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                  traffic_policy="external") == 1
    here = endpoint(["10.244.0.5"], local=True, overrides=[("http", 8080)])
    sink = ApplierSink(applier)
    sink.on_changeset_started()
    queued = _gauge(metrics, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds")
    assert queued > _gauge(metrics, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
    sink.on_changeset([set_endpoint("default", "out", "b", here),
                       L.OpItem(Delete=L.Ref(Set=L.ServicesSet, Path="default/inside")), sync()])
    assert _gauge(metrics, "kpng_py_service_ports") == 2
    assert _gauge(metrics, "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                  traffic_policy="external") == 0
    assert queued <= _gauge(metrics, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
    assert _gauge(metrics, "kubeproxy_sync_full_proxy_rules_duration_seconds_count") == 1
    assert _gauge(metrics, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count") == 1


class CrampedBackend(FlakyBackend):
    """Holds every port it is given but says some did not fit."""

    def __init__(self) -> None:
        super().__init__()
        self.left_out: dict[str, int] = {}

    def not_programmed(self) -> dict[str, int]:
        return dict(self.left_out)


def test_what_is_not_programmed_stays_in_view_by_reason() -> None:
    """Issue 31: ports a full map could not take were only counted once in
    kpng_py_skipped_total, while kpng_py_service_ports counted them as
    programmed. kpng_py_service_ports counts what the dataplane holds; the
    rest is a gauge by reason (the backend's, and the state's: ports every
    frontend of which another port owns) for as long as it lasts."""
    metrics = Metrics()
    backend = CrampedBackend()
    applier = ChangeSetApplier(backend, NodeState(Skips(metrics)), metrics)
    backend.left_out = {"capacity": 1}
    # "twin" claims web's only frontend: it is left out by the state.
    twin = service("twin", v4=["10.96.0.10"], ports=[port("http", 80, target=8080)])
    applier.apply_ops([*web_and_dns()[:-1], set_service(twin), sync()])
    assert _gauge(metrics, "kpng_py_service_ports") == 1  # web and dns given, one did not fit
    assert _gauge(metrics, "kpng_py_service_ports_not_programmed", reason="capacity") == 1
    assert _gauge(metrics, "kpng_py_service_ports_not_programmed",
                  reason="frontend-conflict") == 1
    backend.left_out = {}
    applier.apply_ops([L.OpItem(Delete=L.Ref(Set=L.ServicesSet, Path="default/twin")),
                       *another_web_endpoint()])
    assert _gauge(metrics, "kpng_py_service_ports") == 2
    for reason in ("capacity", "frontend-conflict"):  # still exported, at 0
        assert _gauge(metrics, "kpng_py_service_ports_not_programmed", reason=reason) == 0


def test_a_backend_older_than_apply_stages_and_not_programmed_still_applies(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    # No Backend to the type checker: the two later methods are missing on purpose.
    applier = ChangeSetApplier(OldBackend(), NodeState(Skips(metrics)), metrics)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="kpng_py"):
        applier.apply_ops(web_and_dns())
    assert _gauge(metrics, "kpng_py_service_ports") == 2
    (applied,) = [record_fields(r) for r in caplog.records if r.getMessage() == "sync applied"]
    assert applied["added"] == 2
