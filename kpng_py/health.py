"""`/healthz` and `/metrics`, as kube-proxy serves them.

`/healthz` (default 0.0.0.0:10256) answers 200 with
``{"lastUpdated": ..., "currentTime": ..., "nodeEligible": true}`` while the
dataplane is current, 503 with the same body when it is stale: before the
first applied sync, while a change set has been applying for longer than the
timeout, and when the brain has been unreachable for longer than the timeout
(the dataplane keeps serving meanwhile, but it no longer follows the cluster).
`/metrics` (default 127.0.0.1:10249) serves the process's Prometheus registry.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import start_http_server

from kpng_py.api import localv1
from kpng_py.client import OpsSink
from kpng_py.logs import fields
from kpng_py.metrics import Metrics
from kpng_py.model import MAX_PORT

log = logging.getLogger(__name__)

DEFAULT_HEALTHZ = "0.0.0.0:10256"
DEFAULT_METRICS = "127.0.0.1:10249"


class SyncHealth:
    """What /healthz reports, fed by the change-set pipeline."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.time) -> None:
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._last_applied: float | None = None
        self._applying_since: float | None = None
        self._disconnected_since: float | None = None

    def apply_started(self) -> None:
        with self._lock:
            self._applying_since = self._clock()
            self._disconnected_since = None

    def apply_finished(self) -> None:
        with self._lock:
            self._applying_since = None
            self._last_applied = self._clock()

    def brain_lost(self) -> None:
        with self._lock:
            if self._disconnected_since is None:
                self._disconnected_since = self._clock()

    def status(self) -> tuple[bool, dict]:
        with self._lock:
            now = self._clock()
            healthy = (
                self._last_applied is not None
                and (self._applying_since is None or now - self._applying_since < self._timeout)
                and (self._disconnected_since is None
                     or now - self._disconnected_since < self._timeout)
            )
            body = {
                "lastUpdated": _timestamp(self._last_applied),
                "currentTime": _timestamp(now),
                "nodeEligible": True,
            }
        return healthy, body


def _timestamp(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


class HealthSink:
    """An OpsSink wrapper that tells SyncHealth what the pipeline is doing."""

    def __init__(self, sink: OpsSink, health: SyncHealth) -> None:
        self._sink = sink
        self._health = health

    def on_changeset(self, ops: list[localv1.OpItem]) -> None:
        self._health.apply_started()
        try:
            self._sink.on_changeset(ops)
        finally:
            self._health.apply_finished()

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


class _HealthzHandler(BaseHTTPRequestHandler):
    health: SyncHealth  # set on the per-server subclass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?")[0] not in ("/healthz", "/livez"):
            self.send_error(404)
            return
        healthy, body = self.health.status()
        payload = json.dumps(body).encode()
        self.send_response(200 if healthy else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        del format, args  # no log line per request


class _DualStackServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: BindAddress, handler: type) -> None:
        self.address_family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        super().__init__((address.host, address.port), handler)


def serve_healthz(address: BindAddress, health: SyncHealth) -> int:
    """Serve /healthz; returns the bound port."""
    handler = type("HealthzHandler", (_HealthzHandler,), {"health": health})
    server = _DualStackServer(address, handler)
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    log.info("serving /healthz", extra=fields(address=f"{address.host}:{server.server_port}"))
    return server.server_port


def serve_metrics(address: BindAddress, metrics: Metrics) -> int:
    """Serve /metrics; returns the bound port."""
    server, _ = start_http_server(address.port, address.host, registry=metrics.registry)
    log.info("serving /metrics", extra=fields(address=f"{address.host}:{server.server_port}"))
    return server.server_port


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
        for name, address, serve in (("healthz", self.healthz, lambda a: serve_healthz(a, health)),
                                     ("metrics", self.metrics, lambda a: serve_metrics(a, metrics))):
            if address is None:
                continue
            try:
                serve(address)
            except OSError as err:
                metrics.dataplane_errors.labels(f"{name}-bind").inc()
                log.error("cannot serve /%s on %s:%s: %s; set --%s-bind-address to a free "
                          "address", name, address.host, address.port, err.strerror, name)
        return health
