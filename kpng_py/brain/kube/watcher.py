"""Follows the API server and publishes each new ClusterState.

Three reflectors (Services, EndpointSlices, Nodes) keep their stores, each
on a thread of its own. The first state is made once all three have listed;
then every change wakes the publishing thread, which waits for the burst to
settle (`Coalesce`: no change for `quiet` seconds, or `longest` seconds
after the first) before it makes the state again and publishes it. A state
equal to the one served (a relist, a Node's heartbeat, an object's change
that no node's view shows) makes no new version. Each state is logged with
the resourceVersion of each kind it was made from (`published`, at info; an
unchanged one at debug): a client that wrote objects knows from it when the
brain has seen its writes.

While the API server is lost (a list or watch failed, until every resource
has been listed again), the last state stays served: ApiServerReport tells
the log, kpng_py_api_server_connected and /healthz.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, NamedTuple

from kpng_py.brain.kube.client import ApiServerClient
from kpng_py.brain.kube.cluster import ClusterBuilder
from kpng_py.brain.kube.reflector import (
    ENDPOINT_SLICES,
    NODES,
    SERVICES,
    Reflector,
    Resource,
    Timing,
)
from kpng_py.brain.settings import Coalesce
from kpng_py.brain.source import StateSnapshots
from kpng_py.brain.statefile import ClusterState
from kpng_py.healthcheck.proxier_health import SyncHealth
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.aio import ThreadsafeEvent
from kpng_py.runtime.collector import collector_paused, freeze_survivors
from kpng_py.runtime.logs import fields
from kpng_py.state.skips import Skips

log = logging.getLogger(__name__)

# stop() waits this long for each thread, and no longer: a list of a big
# cluster in progress must not hold up a stopping brain (threads are daemons).
_STOP_WAIT_SECONDS = 1.0


class ApiServerReport:
    """Whether the API server answers: told to the log, the gauge and, once
    attached, /healthz. Lost when a list or watch fails; reached again when
    every resource has been listed since."""

    def __init__(self, metrics: Metrics) -> None:
        self._gauge = metrics.api_server_connected
        self._lock = threading.Lock()
        self._lost: dict[str, str] = {}  # the problem, by resource
        self._health: SyncHealth | None = None
        self._serving = False
        self._published = False

    def attach(self, health: SyncHealth, serving: bool) -> None:
        """Tell `health` from now on; `serving`: the brain serves over
        localv1 (to-api), and /healthz follows the state it serves."""
        with self._lock:
            self._health, self._serving = health, serving
            if self._lost:
                health.api_server_lost()
            if serving and self._published:
                health.state_served()

    def reached(self, resource: Resource) -> None:
        with self._lock:
            was_lost = bool(self._lost)
            self._lost.pop(resource.name, None)
            if self._lost:
                return
            self._gauge.set(1)
            if self._health is not None:
                self._health.api_server_reached()
        if was_lost:
            log.info("the API server answers again", extra=fields(resource=resource.name))

    def lost(self, resource: Resource, problem: str) -> None:
        with self._lock:
            first = not self._lost
            self._lost[resource.name] = problem
            self._gauge.set(0)
            if self._health is not None:
                self._health.api_server_lost()
        level = logging.WARNING if first else logging.INFO
        log.log(level, "the API server cannot be reached, trying again; the last state stays "
                "served: %s", problem, extra=fields(resource=resource.name))

    def published(self) -> None:
        with self._lock:
            self._published = True
            if self._serving and self._health is not None:
                self._health.state_served()


class KubeWatcher:
    """The reflectors and the publishing thread: `start`, `wait_synced`
    (the snapshots of the first state, published to from then on), `stop`."""

    def __init__(self, client: ApiServerClient, metrics: Metrics, report: ApiServerReport,
                 coalesce: Coalesce = Coalesce(), timing: Timing = Timing(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._report = report
        self._coalesce = coalesce
        self._clock = clock
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._builder = ClusterBuilder(Skips(metrics))
        self._reflectors = [Reflector(client, resource, self, self._stop, timing)
                            for resource in (SERVICES, ENDPOINT_SLICES, NODES)]
        self._threads: list[threading.Thread] = []

    # -- the reflectors' listener

    def changed(self) -> None:
        self._changed.set()

    def reached(self, resource: Resource) -> None:
        self._report.reached(resource)

    def lost(self, resource: Resource, problem: str) -> None:
        self._report.lost(resource, problem)

    # --

    def start(self) -> None:
        for reflector in self._reflectors:
            self._spawn(reflector.run, f"kube-{reflector.resource.name}")

    def wait_synced(self, until: threading.Event | ThreadsafeEvent) -> StateSnapshots | None:
        """Once every resource has been listed: the first state, published
        from now on. None if `until` is set first."""
        for reflector in self._reflectors:
            while not reflector.synced.wait(0.1):
                if until.is_set() or self._stop.is_set():
                    return None
        self._changed.clear()
        state, versions = self._build()
        snapshots = StateSnapshots(state)
        self._report.published()
        _log_published(self._client.url, snapshots.version, state, versions)
        self._spawn(lambda: self._publish_changes(snapshots), "kube-publish")
        return snapshots

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        for thread in self._threads:
            thread.join(_STOP_WAIT_SECONDS)
        self._client.close()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _build(self) -> tuple[ClusterState, ResourceVersions]:
        """The state of the objects as they are now, and the resourceVersion
        of each kind it was made from."""
        (services, at_services), (slices, at_slices), (nodes, at_nodes) = (
            reflector.snapshot() for reflector in self._reflectors)
        # As the file brain reads a file (statefile.StateReader.read): many
        # new objects, none of them garbage, and none walked by a collection.
        with collector_paused():
            state = self._builder.build(services, slices, nodes)
            freeze_survivors()
            return state, ResourceVersions(at_services, at_slices, at_nodes)

    def _publish_changes(self, snapshots: StateSnapshots) -> None:
        while True:
            self._changed.wait()
            if self._settled_or_stopped():
                return
            try:
                state, versions = self._build()
            except Exception:  # a bug must not stop the brain from following the API server
                log.exception("making the state from the API server's objects failed; the "
                              "last state stays served")
                continue
            if snapshots.publish(state):
                self._report.published()
                _log_published(self._client.url, snapshots.version, state, versions)
            elif log.isEnabledFor(logging.DEBUG):
                log.debug("state from the API server unchanged", extra=fields(
                    version=snapshots.version, **versions.log_fields()))

    def _settled_or_stopped(self) -> bool:
        """Wait for the burst of changes to settle; True if stopped."""
        first = self._clock()
        while True:
            self._changed.clear()
            if self._stop.wait(self._coalesce.quiet):
                return True
            if not self._changed.is_set() or self._clock() - first >= self._coalesce.longest:
                return False


class ResourceVersions(NamedTuple):
    """The resourceVersion of each kind a state was made from: of its list,
    or of the last event or bookmark since (a write whose answer had a
    version up to it is in the state)."""

    services: str
    endpointslices: str
    nodes: str

    def log_fields(self) -> dict[str, str]:
        return {f"{kind}_resource_version": at for kind, at in self._asdict().items()}


def _log_published(server: str, version: int, state: ClusterState,
                   versions: ResourceVersions) -> None:
    log.info("state from the API server published", extra=fields(
        server=server, version=version, nodes=len(state.nodes),
        services=len(state.services),
        endpoints=sum(len(s.endpoints) for s in state.services), **versions.log_fields()))
