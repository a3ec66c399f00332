"""The contract between the state model and a dataplane, and the loop step
that connects them.

A backend is a thin translation from ChangeSets to its dataplane. The
`ChangeSetApplier` feeds it one ChangeSet per Sync received from the brain;
the brain gets the next WatchReq only after `apply` returned, so a slow
backend gets coalesced change sets.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, Protocol

from kpng_py.api import localv1
from kpng_py.logs import fields
from kpng_py.metrics import Metrics
from kpng_py.model import ChangeSet
from kpng_py.state import NodeState

log = logging.getLogger(__name__)


class BackendSetupError(Exception):
    """A backend cannot start here; the message names the cause and the fix."""


class Backend(Protocol):
    """A dataplane. `apply` must be idempotent per service port: `added` and
    `updated` are upserts, `removed` deletes if present; with `full` set, the
    dataplane must end up holding exactly `added`."""

    def setup(self) -> None:
        """Prepare the dataplane (load programs, open sockets); called once."""

    def apply(self, changes: ChangeSet) -> None:
        """Program one change set."""

    def close(self) -> None:
        """Release resources. Dataplanes that must survive a restart stay."""


class ChangeSetApplier:
    """Applies the brain's change sets to the node state and the backend."""

    def __init__(self, backend: Backend, state: NodeState, metrics: Metrics) -> None:
        self.backend = backend
        self.state = state
        self._metrics = metrics
        self._needs_full = False
        self.syncs = 0

    def apply_ops(self, ops: Iterable[localv1.OpItem]) -> ChangeSet | None:
        """Apply one change set (ops up to and including its Sync)."""
        ops = list(ops)
        started = time.monotonic()
        changes = self.state.apply(ops)
        if changes is None:
            return None
        if self._needs_full:
            changes = self.state.full_changeset()
        try:
            self.backend.apply(changes)
        except Exception:  # a dataplane failure must not take the node's proxy down
            self._needs_full = True
            self._metrics.dataplane_errors.labels("apply").inc()
            log.exception("backend failed to apply a change set; the next change set "
                          "reconciles the whole dataplane")
        else:
            self._needs_full = False
        self.syncs += 1
        self._observe(ops, changes, time.monotonic() - started)
        return changes

    def _observe(self, ops: list[localv1.OpItem], changes: ChangeSet, seconds: float) -> None:
        m = self._metrics
        m.sync_duration.observe(seconds)
        m.sync_last_timestamp.set_to_current_time()
        m.service_changes.inc(changes.service_changes)
        m.endpoint_changes.inc(changes.endpoint_changes)
        m.changeset_ops.observe(sum(1 for op in ops if op.WhichOneof("Op") in ("Set", "Delete")))
        m.changeset_service_ports.observe(len(changes))
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
            service_changes=changes.service_changes, endpoint_changes=changes.endpoint_changes,
            duration_ms=round(seconds * 1000, 2)))
