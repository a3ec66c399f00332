"""`/healthz` and `/metrics`, as kube-proxy serves them.

`/healthz` (default 0.0.0.0:10256) answers 200 with
``{"lastUpdated": ..., "currentTime": ..., "nodeEligible": true}`` while the
dataplane is current, 503 with the same body when it is stale. As in
kube-proxy, it is current once it has been programmed and nothing has been
pending for longer than `--healthz-timeout`. Pending, from the moment it
starts until the dataplane holds the state again: a change set that has
started arriving, a failed apply (until an apply or its retry succeeds), the
brain lost (until a change set from it is applied), and under `kpng-py kube`
the Kubernetes API server lost (until it answers again; the body then has
`"apiServerConnected": false`). The oldest pending moment
counts; the dataplane keeps serving meanwhile, but it no longer follows the
cluster. `/livez` (same address and body, kube-proxy's liveness endpoint)
turns 503 only when kpng-py itself is stuck: a complete change set has been
applying, or the dataplane has kept failing to take the state, for longer
than `--healthz-timeout`. A lost or slow brain never fails it: restarting
kpng-py cannot fix the brain, so `/livez` is for liveness probes and
`/healthz` for readiness. Both answer 503 at once, with `dataplaneMissing`
in the body, while the backend finds part of its dataplane taken away by
another process and has not put it back yet (`dataplane_incomplete`).
`/metrics` (default 127.0.0.1:10249) serves the process's Prometheus
registry. Both are served by `BoundedHTTPServer`.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from prometheus_client import Counter
from prometheus_client.exposition import generate_latest

from kpng_py.api import localv1
from kpng_py.healthcheck.httpserver import BoundedHTTPServer, Handler, Response
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import MAX_PORT
from kpng_py.runtime.logs import fields
from kpng_py.watch.client import OpsSink

log = logging.getLogger(__name__)

DEFAULT_HEALTHZ = "0.0.0.0:10256"
DEFAULT_METRICS = "127.0.0.1:10249"
# The text format generate_latest writes (and prometheus_client's own server announced).
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SyncHealth:
    """What /healthz reports. The watch client tells it what the brain does
    (through `HealthSink`), the `ChangeSetApplier` what the dataplane did."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.time) -> None:
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._last_applied: float | None = None
        self._pending_since: float | None = None
        # Why the dataplane is not current (each cleared by its own event).
        self._receiving = False  # a change set has started arriving
        self._unapplied = False  # the last apply failed
        self._brain_lost = False  # the stream failed; cleared by the next change set
        # `kpng-py kube`: the API server cannot be reached; cleared when it
        # answers again (a return with nothing changed sends no change set).
        self._api_server_lost = False
        # What /livez counts: kpng-py's own work that has not finished.
        self._applying_since: float | None = None  # a complete change set is applying
        self._failing_since: float | None = None  # applies failed since then
        # What the backend found taken away from its dataplane and could not
        # put back yet (e.g. "links, maps"); "" while it is complete.
        self._missing = ""

    def changeset_started(self) -> None:
        """The first op of a change set arrived."""
        with self._lock:
            self._receiving = True
            self._update()

    def changeset_received(self) -> None:
        """A complete change set arrived and goes to the dataplane now."""
        with self._lock:
            self._receiving = True
            self._applying_since = self._clock()
            self._update()

    def brain_lost(self) -> None:
        with self._lock:
            self._brain_lost = True
            self._update()

    def api_server_lost(self) -> None:
        with self._lock:
            self._api_server_lost = True
            self._update()

    def api_server_reached(self) -> None:
        with self._lock:
            self._api_server_lost = False
            self._update()

    def state_served(self) -> None:
        """A brain serving over localv1 (`kube ... to-api`) serves the API
        server's state: what lastUpdated tells there."""
        with self._lock:
            self._last_applied = self._clock()
            self._update()

    def changeset_applied(self) -> None:
        """The brain's change set is in the dataplane."""
        with self._lock:
            self._receiving = self._unapplied = self._brain_lost = False
            self._applying_since = self._failing_since = None
            self._last_applied = self._clock()
            self._update()

    def changeset_failed(self) -> None:
        """A whole change set arrived, but the dataplane failed to take it."""
        with self._lock:
            self._receiving = self._brain_lost = False
            self._unapplied = True
            if self._failing_since is None:
                self._failing_since = (self._clock() if self._applying_since is None
                                       else self._applying_since)
            self._applying_since = None
            self._update()

    def reconciled(self) -> None:
        """A retry put the whole state held into the dataplane."""
        with self._lock:
            self._unapplied = False
            self._failing_since = None
            self._last_applied = self._clock()
            self._update()

    def dataplane_incomplete(self, missing: str) -> None:
        """The backend found `missing` gone from its dataplane (another
        process removed it) and has not put it back yet: both probes fail,
        since traffic does."""
        with self._lock:
            self._missing = missing

    def dataplane_complete(self) -> None:
        with self._lock:
            self._missing = ""

    def _update(self) -> None:
        if not (self._receiving or self._unapplied or self._brain_lost
                or self._api_server_lost):
            self._pending_since = None
        elif self._pending_since is None:
            self._pending_since = self._clock()

    def status(self) -> tuple[bool, dict]:
        """/healthz: the dataplane follows the brain."""
        with self._lock:
            now = self._clock()
            healthy = not self._missing and self._last_applied is not None and (
                self._within_timeout(self._pending_since, now))
            return healthy, self._body(now)

    def liveness(self) -> tuple[bool, dict]:
        """/livez: kpng-py's own work is not stuck (whatever the brain does)."""
        with self._lock:
            now = self._clock()
            stuck_since = (self._applying_since if self._failing_since is None
                           else self._failing_since)
            return not self._missing and self._within_timeout(stuck_since, now), self._body(now)

    def _within_timeout(self, since: float | None, now: float) -> bool:
        return since is None or now - since < self._timeout

    def _body(self, now: float) -> dict:
        body = {"lastUpdated": _timestamp(self._last_applied), "currentTime": _timestamp(now),
                "nodeEligible": True}
        if self._missing:
            body["dataplaneMissing"] = self._missing
        if self._api_server_lost:
            body["apiServerConnected"] = False
        return body


def _timestamp(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


class HealthSink:
    """An OpsSink wrapper that tells SyncHealth what the brain is doing. What
    the dataplane did with a change set, the applier tells it."""

    def __init__(self, sink: OpsSink, health: SyncHealth) -> None:
        self._sink = sink
        self._health = health

    def on_changeset_started(self) -> None:
        self._health.changeset_started()
        self._sink.on_changeset_started()

    def on_ops(self, ops: list[localv1.OpItem]) -> None:
        self._sink.on_ops(ops)

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        # In-process sources hand over whole change sets, without a start.
        self._health.changeset_received()
        self._sink.on_changeset(ops)

    def on_stream_error(self, reason: str, partial: list[localv1.OpItem]) -> None:
        self._health.brain_lost()
        self._sink.on_stream_error(reason, partial)


@dataclass(frozen=True)
class BindAddress:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, flag: str) -> BindAddress:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or int(port) > MAX_PORT:
            raise ValueError(f"{flag} {text!r}: use host:port, e.g. 0.0.0.0:10256 or [::]:10256")
        return cls(host.strip("[]") or "0.0.0.0", int(port))


def _probe(check: Callable[[], tuple[bool, dict]], answers: Counter) -> Response:
    ok, body = check()
    code = 200 if ok else 503
    answers.labels(str(code)).inc()
    return Response(code, "application/json", json.dumps(body).encode())


def _metrics(metrics: Metrics) -> Response:
    return Response(200, METRICS_CONTENT_TYPE, generate_latest(metrics.registry))


def _serve(name: str, address: BindAddress, routes: dict[str, Handler],
           metrics: Metrics) -> BoundedHTTPServer:
    server = BoundedHTTPServer(name, routes, metrics)
    port = server.start(address.host, address.port)
    log.info("serving /%s", name, extra=fields(address=f"{address.host}:{port}"))
    return server


def serve_healthz(address: BindAddress, health: SyncHealth,
                  metrics: Metrics) -> BoundedHTTPServer:
    """Serve /healthz and /livez on a thread of its own."""
    routes: dict[str, Handler] = {
        "/healthz": functools.partial(_probe, health.status, metrics.healthz_requests),
        "/livez": functools.partial(_probe, health.liveness, metrics.livez_requests)}
    return _serve("healthz", address, routes, metrics)


def serve_metrics(address: BindAddress, metrics: Metrics) -> BoundedHTTPServer:
    """Serve /metrics on a thread of its own."""
    return _serve("metrics", address, {"/metrics": functools.partial(_metrics, metrics)}, metrics)


@dataclass(frozen=True)
class Observability:
    """Where to serve /healthz and /metrics (None: not served)."""

    healthz: BindAddress | None
    metrics: BindAddress | None
    healthz_timeout: float = 60.0

    def start(self, metrics: Metrics) -> SyncHealth:
        """Start the servers. A port that cannot be bound is logged and counted,
        not fatal: the dataplane matters more than its probes."""
        health = SyncHealth(self.healthz_timeout)
        servers = (("healthz", self.healthz, lambda a: serve_healthz(a, health, metrics)),
                   ("metrics", self.metrics, lambda a: serve_metrics(a, metrics)))
        for name, address, serve in servers:
            if address is None:
                continue
            try:
                serve(address)
            except OSError as err:
                metrics.dataplane_errors.labels(f"{name}-bind").inc()
                log.error("cannot serve /%s on %s:%s: %s; set --%s-bind-address to a free "
                          "address", name, address.host, address.port, err.strerror, name)
        return health
