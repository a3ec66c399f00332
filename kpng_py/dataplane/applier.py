"""The loop step between the state and a dataplane (kpng_py.dataplane.contract).

The `ChangeSetApplier` feeds it one ServicePortChanges per Sync received from the brain;
the brain gets the next WatchReq only after `apply` returned, so a slow
backend gets coalesced change sets. After a failed apply the dataplane's
content is unknown: the applier reconciles it whole, on a timer with backoff
(a quiet cluster may send no change set for hours), or with the next change
set if that comes first.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from dataclasses import dataclass, replace
from typing import Iterable, Protocol

from kpng_py.api import localv1
from kpng_py.dataplane.census import EXTERNAL, INTERNAL, DataplaneCensus
from kpng_py.dataplane.contract import Backend, backend_not_programmed, backend_stages
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.runtime.backoff import Backoff
from kpng_py.runtime.collector import CollectorPause, collector_paused, freeze_survivors
from kpng_py.runtime.logs import fields
from kpng_py.runtime.retrytimer import RetryTimer
from kpng_py.state.tracker import NodeState

log = logging.getLogger(__name__)

# Delays before reconciling the dataplane after a failed apply: the first,
# doubling up to the last (with the client's upward jitter).
APPLY_RETRY_FIRST_SECONDS = 1.0
APPLY_RETRY_MAX_SECONDS = 30.0


@dataclass(frozen=True)
class SyncTimes:
    """Where the seconds of one applied change set went: receiving its
    messages (from the first to the Sync; 0 without a transport), of which
    the state took `staged` for the ops handed over before the Sync; from the
    Sync, the state (the last ops, computing the change set), the backend's
    apply, and both (`total`)."""

    receive: float
    staged: float
    state: float
    backend: float
    total: float

    def log_fields(self) -> dict[str, float]:
        return {"duration_ms": _ms(self.total), "receive_ms": _ms(self.receive),
                "staged_ms": _ms(self.staged), "state_ms": _ms(self.state),
                "backend_ms": _ms(self.backend)}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _with_stages(own: dict[str, float], stages: dict[str, float]) -> dict[str, float]:
    """`own`, then the backend's stages; a stage never replaces one of `own`."""
    return {**own, **{name: ms for name, ms in stages.items() if name not in own}}


def peak_rss_mib() -> float:
    """This process's own peak resident memory (not its children's, such as
    the eBPF backend's BCC build), in MiB: one getrusage() call."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


# How many changed service ports `sync applied` names (all of them with -v).
NAMED_IN_SYNC_LINE = 3


def changed_names(changes: ServicePortChanges) -> str:
    """The first few service ports a change set added, updated or removed,
    `ns/name:port` comma-separated, and how many more there are."""
    ports = (*changes.added, *(new for _, new in changes.updated), *changes.removed)
    named = ",".join(str(port.name) for port in ports[:NAMED_IN_SYNC_LINE])
    more = len(ports) - NAMED_IN_SYNC_LINE
    return f"{named},+{more} more" if more > 0 else named


class ApplyListener(Protocol):
    """Told what became of each apply (`SyncHealth` is one)."""

    def changeset_applied(self) -> None:
        """The brain's change set is in the dataplane."""

    def changeset_failed(self) -> None:
        """The backend failed to apply the brain's change set."""

    def reconciled(self) -> None:
        """A retry put the whole state held into the dataplane."""


class _Unobserved:
    def changeset_applied(self) -> None:
        pass

    def changeset_failed(self) -> None:
        pass

    def reconciled(self) -> None:
        pass


@dataclass(frozen=True)
class _ApplyDurations:
    """How long one apply took, in seconds."""

    total: float    # seconds since the change set's start
    backend: float  # of them, the backend's apply


class ChangeSetApplier:
    """Applies the brain's change sets to the node state and the backend, and
    reconciles the whole dataplane after a failed apply. `close` it before
    closing the backend."""

    def __init__(self, backend: Backend, state: NodeState, metrics: Metrics,
                 listener: ApplyListener | None = None, retry_backoff: Backoff | None = None
                 ) -> None:
        self.backend = backend
        self.state = state
        self._metrics = metrics
        self._listener = listener or _Unobserved()
        self._backoff = retry_backoff or Backoff(APPLY_RETRY_FIRST_SECONDS,
                                                 APPLY_RETRY_MAX_SECONDS)
        # The dataplane: held by a change set's Sync and by a retry from the
        # state they read to the backend's apply, so neither programs an older state.
        self._lock = threading.Lock()
        # The state: held while it is read or updated, never while a backend
        # applies, so ops arriving (on the watch client's event loop) never
        # wait for one.
        self._state_lock = threading.Lock()
        self._retry = RetryTimer(self._retry_now, name="apply-retry")
        self._needs_full = False
        self._queued = False  # a change set's first message came since the last apply
        # Seconds the state took for the ops of the change set arriving, before its Sync.
        self._staged_seconds = 0.0
        self._collector = CollectorPause()
        self._census = DataplaneCensus()
        self._not_programmed_reasons: set[str] = set()
        self.syncs = 0

    def changeset_queued(self) -> None:
        """A change set began to arrive (its changes are queued)."""
        self._queued = True
        self._metrics.sync_last_queued_timestamp.set_to_current_time()

    def stage_ops(self, ops: list[localv1.OpItem]) -> None:
        """Ops of the change set arriving, none of them its Sync: into the
        state now, so that they need not be held; the backend gets them with
        the Sync (`apply_ops`), or never if it never comes (`changeset_cut`).
        Waits for no backend (the watch client calls it on its event loop).
        The collector stays paused from the change set's first ops to its
        Sync: the state they build is long-lived."""
        self._note_queued()
        with self._state_lock:
            started = time.monotonic()
            with self._collector.paused():
                self.state.apply(ops, staged=True)
            self._staged_seconds += time.monotonic() - started

    def apply_ops(self, ops: Iterable[localv1.OpItem], receive_seconds: float = 0.0
                  ) -> ServicePortChanges | None:
        """Apply a change set: its ops not staged yet, ending with its Sync,
        which sends what changed to the backend (without a Sync: into the
        state only, as `stage_ops`). `receive_seconds`: the time its messages
        took to arrive (logged)."""
        ops = list(ops)
        self._note_queued()
        with self._lock:
            started = time.monotonic()
            with self._state_lock, self._collector.paused():
                changes = self.state.apply(ops)
                if changes is None:
                    self._staged_seconds += time.monotonic() - started
                    return None
                staged_seconds, self._staged_seconds = self._staged_seconds, 0.0
                self._queued = False
                if self._needs_full:
                    changes = replace(self.state.full_changeset(),
                                      service_changes=changes.service_changes,
                                      endpoint_changes=changes.endpoint_changes,
                                      ops=changes.ops)
            try:
                self._retry.cancel()  # this change set reconciles, if that is needed
                state_seconds = time.monotonic() - started
                seconds = self._program(changes, "a change set", started)
            finally:
                self._collector.resume()
            if changes.full:
                freeze_survivors()
            self.syncs += 1
            self._observe(changes)
            if seconds is not None:
                self._log_sync(changes, SyncTimes(receive_seconds, staged_seconds,
                                                  state_seconds, seconds.backend, seconds.total))
                self._listener.changeset_applied()
            else:
                self._listener.changeset_failed()
        return changes

    def changeset_cut(self) -> None:
        """The change set being received will never get its Sync (the stream
        failed). Its ops stay in the state, unpublished: the next stream's
        Reset and full state supersede them."""
        with self._state_lock:
            self._staged_seconds, self._queued = 0.0, False
            self._collector.resume()

    def _note_queued(self) -> None:
        if not self._queued:  # handed over whole (an in-process source): queued now
            self._metrics.sync_last_queued_timestamp.set_to_current_time()
        self._queued = True

    def close(self) -> None:
        """Stop retrying (waiting for a retry in progress)."""
        self._retry.close()

    def _retry_now(self) -> None:
        with self._lock:
            if not self._needs_full or self._retry.armed():
                return  # a change set reconciled meanwhile, or failed and re-armed
            self._metrics.apply_retries.inc()
            started = time.monotonic()
            with collector_paused():
                with self._state_lock:
                    changes = self.state.full_changeset()
                seconds = self._program(changes, "the retried reconcile", started)
            freeze_survivors()
            if seconds is not None:
                log.info("dataplane reconciled after a failed apply", extra=fields(
                    service_ports=len(changes.added), duration_ms=_ms(seconds.total)))
                self._listener.reconciled()

    def _program(self, changes: ServicePortChanges, what: str, started: float
                 ) -> _ApplyDurations | None:
        """Give the backend `changes`: the seconds since `started` (time.monotonic())
        once it has them, and those of its apply; None when it failed (logged,
        counted, a retry armed)."""
        backend_started = time.monotonic()
        try:
            self.backend.apply(changes)
        except Exception:  # a dataplane failure must not take the node's proxy down
            self._needs_full = True
            self._metrics.dataplane_errors.labels("apply").inc()
            delay = self._backoff.next()
            self._retry.arm(delay)
            log.exception("backend failed to apply %s; the whole dataplane is reconciled in "
                          "%.3g s, or with the next change set", what, delay,
                          extra=fields(retry_in_s=round(delay, 2)))
            return None
        done = time.monotonic()
        self._needs_full = False
        self._backoff.reset()
        self._observe_programmed(changes, done - started)
        return _ApplyDurations(done - started, done - backend_started)

    def _observe_programmed(self, changes: ServicePortChanges, seconds: float) -> None:
        """Called holding the dataplane lock: no Sync changes the state meanwhile."""
        m = self._metrics
        m.sync_duration.observe(seconds)
        (m.sync_full_duration if changes.full else m.sync_partial_duration).observe(seconds)
        m.sync_last_timestamp.set_to_current_time()
        census = self._census
        census.applied(changes)
        for policy in (INTERNAL, EXTERNAL):
            m.no_local_endpoints.labels(policy).set(census.no_local_endpoints(policy))
        left_out = backend_not_programmed(self.backend)
        m.service_ports.set(census.service_ports - sum(left_out.values()))
        for skip_reason, count in self.state.not_published().items():
            left_out[skip_reason.value] = left_out.get(skip_reason.value, 0) + count
        # A reason seen once stays exported, at 0 when it is gone.
        for reason in self._not_programmed_reasons | left_out.keys():
            m.service_ports_not_programmed.labels(reason).set(left_out.get(reason, 0))
        self._not_programmed_reasons |= left_out.keys()

    def _observe(self, changes: ServicePortChanges) -> None:
        m = self._metrics
        m.service_changes.inc(changes.service_changes)
        m.endpoint_changes.inc(changes.endpoint_changes)
        m.changeset_ops.observe(changes.ops)
        m.changeset_service_ports.observe(len(changes))

    def _log_sync(self, changes: ServicePortChanges, times: SyncTimes) -> None:
        if log.isEnabledFor(logging.DEBUG):
            updated = tuple(new for _, new in changes.updated)
            for kind, ports in (("added", changes.added), ("updated", updated),
                                ("removed", changes.removed)):
                for port in ports:
                    log.debug("service port %s", kind, extra=fields(
                        service_port=str(port.name), protocol=port.protocol.value,
                        endpoints=len(port.cluster_endpoints())))
        log.info("sync applied", extra=fields(
            sync=self.syncs, full=changes.full, added=len(changes.added),
            updated=len(changes.updated), removed=len(changes.removed),
            changed=changed_names(changes),
            service_changes=changes.service_changes, endpoint_changes=changes.endpoint_changes,
            peak_rss_mib=peak_rss_mib(),
            **_with_stages(times.log_fields(), backend_stages(self.backend))))
