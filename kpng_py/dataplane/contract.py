"""The contract between the state model and a dataplane.

A backend is a thin translation from ServicePortChanges to its dataplane
(`Backend`); kpng_py.dataplane.applier feeds it.
"""

from __future__ import annotations

from typing import Mapping, Protocol

from kpng_py.healthcheck.service_health import ProxyHealth
from kpng_py.model import ServicePortChanges


class BackendSetupError(Exception):
    """A backend cannot start here; the message names the cause and the fix."""


class DataplaneHealth(ProxyHealth, Protocol):
    """What /healthz says, and what a backend tells it of its dataplane's
    integrity (kpng_py.healthcheck.proxier_health.SyncHealth is one)."""

    def dataplane_incomplete(self, missing: str) -> None:
        """`missing` (what, in a few words) is gone from the dataplane."""

    def dataplane_complete(self) -> None:
        """Nothing is missing (any more)."""


class NothingMatched(Exception):
    """A backend tool's filter matched nothing (`ebpf dump --service ns/nope`);
    the message names the filter. The command exits 1."""


class Backend(Protocol):
    """A dataplane. `apply` must be idempotent per service port: `added` and
    `updated` are upserts, `removed` deletes if present; with `full` set, the
    dataplane must end up holding exactly `added`."""

    def setup(self) -> None:
        """Prepare the dataplane (load programs, open sockets); called once."""

    def apply(self, changes: ServicePortChanges) -> None:
        """Program one change set."""

    def close(self) -> None:
        """Release resources. Dataplanes that must survive a restart stay."""

    def apply_stages(self) -> Mapping[str, float]:
        """The backend's own stages of its last successful `apply`, in
        milliseconds by name ending in `_ms` (e.g. the eBPF backend's plan_ms,
        write_ms); empty if it has none. Logged with `sync applied`."""

    def not_programmed(self) -> Mapping[str, int]:
        """How many of the service ports it was given the dataplane does not
        hold now (it could not: a full map, a port it cannot listen on), by
        reason; empty while it holds them all."""


def backend_stages(backend: Backend) -> dict[str, float]:
    """`backend.apply_stages()`, rounded; {} for a backend that predates the
    method (one of another package's, through the registry)."""
    stages = getattr(backend, "apply_stages", None)
    if stages is None:
        return {}
    return {str(name): round(ms, 2) for name, ms in stages().items()
            if isinstance(ms, (int, float))}


def backend_not_programmed(backend: Backend) -> dict[str, int]:
    """`backend.not_programmed()`; {} for a backend without the method."""
    counts = getattr(backend, "not_programmed", None)
    return {} if counts is None else dict(counts())
