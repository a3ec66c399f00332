"""The node's state as received from the brain, and its change tracker.

`NodeState.apply` takes one change set (the ops of a stream up to and including
a Sync) and returns what changed per ServicePortName. Work is proportional to
what changed: only services whose object or endpoints were touched are
recomputed.

After a reconnect the brain sends Reset and the full state again. Like KPNG's
`filterreset`, the store then ignores Sets whose bytes did not change and, at
the Sync, deletes what was not re-sent, so the backend sees only real
differences, never a flush and rebuild.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Iterable

from kpng_py.api import localv1
from kpng_py.decode import (
    EndpointRecord,
    ServiceRecord,
    decode_endpoint,
    decode_service,
    split_endpoint_path,
)
from kpng_py.model import (
    ChangeSet,
    Endpoint,
    IPAddress,
    ServicePort,
    ServicePortName,
    format_host_port,
    sorted_endpoints,
)
from kpng_py.skips import SkipReason, Skips

log = logging.getLogger(__name__)

_SERVICES = localv1.ServicesSet
_ENDPOINTS = localv1.EndpointsSet


@dataclass
class _ServiceEntry:
    """Everything known about one service path (`namespace/name`)."""

    raw: bytes | None = None
    record: ServiceRecord | None = None
    # endpoint key -> (raw bytes, decoded record or None when undecodable)
    endpoints: dict[str, tuple[bytes, EndpointRecord | None]] = field(default_factory=dict)
    # What the backend was last given for this service.
    published: dict[ServicePortName, ServicePort] = field(default_factory=dict)
    # Problems already logged, as (reason, port name or "", endpoint key), so
    # each is reported once until the service or that endpoint changes.
    reported: set[tuple[SkipReason, str, str]] = field(default_factory=set)

    def forget_reports(self, key: str) -> None:
        self.reported = {r for r in self.reported if r[2] != key}

    def is_empty(self) -> bool:
        return self.raw is None and not self.endpoints and not self.published


@dataclass
class _Counts:
    service_changes: int = 0
    endpoint_changes: int = 0


class NodeState:
    """The services and endpoints of one node's view, and what changed."""

    def __init__(self, skips: Skips) -> None:
        self._skips = skips
        self._services: dict[str, _ServiceEntry] = {}
        self._dirty: set[str] = set()
        self._counts = _Counts()
        # Refs (set, path) re-sent since a Reset; None outside a resync.
        self._resync_seen: set[tuple[int, str]] | None = None
        # The value last refused at each ref (bad path, unknown set,
        # undecodable), so a resync that re-sends it is not reported again.
        self._rejected: dict[tuple[int, str], bytes] = {}
        self._synced = False

    # -- reading ---------------------------------------------------------------

    def service_ports(self) -> list[ServicePort]:
        """Every programmable service port, sorted by name then protocol."""
        ports = [p for e in self._services.values() for p in e.published.values()]
        return sorted(ports, key=lambda p: p.name.sort_key())

    # -- applying ops ----------------------------------------------------------

    def apply(self, ops: Iterable[localv1.OpItem]) -> ChangeSet | None:
        """Apply ops; return the ChangeSet at the Sync (None if there was none)."""
        changes = None
        for op in ops:
            kind = op.WhichOneof("Op")
            if kind == "Set":
                self._set(op.Set)
            elif kind == "Delete":
                self._delete(op.Delete.Set, op.Delete.Path)
            elif kind == "Reset":
                self._resync_seen = set()
            elif kind == "Sync":
                changes = self._sync()
        return changes

    def full_changeset(self) -> ChangeSet:
        """The whole state as a full ChangeSet, for a backend that must reconcile."""
        return ChangeSet(added=tuple(self.service_ports()), full=True)

    def _set(self, value: localv1.Value) -> None:
        ref = ref_set, path = value.Ref.Set, value.Ref.Path
        data = value.Bytes
        if self._resync_seen is not None:
            self._resync_seen.add(ref)
        if self._rejected.get(ref) == data:
            return  # reported when it first came
        if ref_set == _SERVICES:
            accepted = self._set_service(path, data)
        elif ref_set == _ENDPOINTS:
            accepted = self._set_endpoint(path, data)
        else:
            self._skips.skip(SkipReason.UNKNOWN_SET, f"Set {path!r}",
                             f"Ref.Set {_set_name(ref_set)} is not served to backends")
            accepted = False
        if accepted:
            self._rejected.pop(ref, None)
        else:
            self._rejected[ref] = data

    def _set_service(self, path: str, data: bytes) -> bool:
        """False if the value was refused (the previous version stays in force)."""
        entry = self._services.get(path)
        if entry is not None and entry.raw == data:
            return True
        record = decode_service(path, data, self._skips)
        if record is None:
            return False
        entry = self._services.setdefault(path, _ServiceEntry())
        entry.raw, entry.record = data, record
        entry.reported.clear()
        self._touch(path, services=1)
        return True

    def _set_endpoint(self, path: str, data: bytes) -> bool:
        """False if the value was refused (the previous version stays in force).
        An undecodable new endpoint is kept, unused, so that it can be deleted."""
        split = split_endpoint_path(path)
        if split is None:
            self._skips.skip(SkipReason.BAD_PATH, f"endpoint {path!r}",
                             "path is not <namespace>/<service>/<key>")
            return False
        service_path, key = split
        entry = self._services.get(service_path)
        previous = entry.endpoints.get(key) if entry else None
        if previous is not None and previous[0] == data:
            return True
        record = decode_endpoint(service_path, key, data, self._skips)
        if record is None and previous is not None:
            return False
        entry = self._services.setdefault(service_path, _ServiceEntry())
        entry.endpoints[key] = (data, record)
        entry.forget_reports(key)
        self._touch(service_path, endpoints=1)
        return True

    def _delete(self, ref_set: int, path: str) -> None:
        # A Delete of a refused value ends it quietly: its Set was reported.
        rejected = self._rejected.pop((ref_set, path), None) is not None
        if ref_set == _SERVICES:
            entry = self._services.get(path)
            if entry is not None and entry.raw is not None:
                entry.raw, entry.record = None, None
                self._touch(path, services=1)
                return
        elif ref_set == _ENDPOINTS:
            split = split_endpoint_path(path)
            entry = self._services.get(split[0]) if split else None
            if split and entry is not None and entry.endpoints.pop(split[1], None) is not None:
                entry.forget_reports(split[1])
                self._touch(split[0], endpoints=1)
                return
        if rejected:
            return
        self._skips.skip(SkipReason.UNKNOWN_DELETE, f"Delete {_set_name(ref_set)} {path!r}",
                         "nothing is known at that path")

    def _touch(self, service_path: str, services: int = 0, endpoints: int = 0) -> None:
        self._dirty.add(service_path)
        self._counts.service_changes += services
        self._counts.endpoint_changes += endpoints

    # -- the Sync: compute what changed ----------------------------------------

    def _sync(self) -> ChangeSet:
        if self._resync_seen is not None:
            self._drop_not_resent(self._resync_seen)
            self._resync_seen = None
        added: list[ServicePort] = []
        updated: list[tuple[ServicePort, ServicePort]] = []
        removed: list[ServicePort] = []
        # In name order: a change set, and so what a full dataplane skips, is
        # the same whatever order the brain sent things in.
        for path in sorted(self._dirty):
            entry = self._services[path]
            if entry.raw is None:
                self._report_orphans(path, entry)
            new = self._compute_ports(entry)
            old = entry.published
            for name, port in new.items():
                before = old.get(name)
                if before is None:
                    added.append(port)
                elif before != port:
                    updated.append((before, port))
            removed.extend(port for name, port in old.items() if name not in new)
            entry.published = new
            if entry.is_empty():
                del self._services[path]
        full, self._synced = not self._synced, True
        changes = ChangeSet(tuple(added), tuple(updated), tuple(removed), full=full,
                            service_changes=self._counts.service_changes,
                            endpoint_changes=self._counts.endpoint_changes)
        self._dirty.clear()
        self._counts = _Counts()
        return changes

    def _drop_not_resent(self, seen: set[tuple[int, str]]) -> None:
        """End of a resync: what the new stream did not re-send is gone."""
        self._rejected = {ref: data for ref, data in self._rejected.items() if ref in seen}
        for path, entry in list(self._services.items()):
            for key in [k for k in entry.endpoints if (_ENDPOINTS, f"{path}/{k}") not in seen]:
                del entry.endpoints[key]
                self._touch(path, endpoints=1)
            if entry.raw is not None and (_SERVICES, path) not in seen:
                entry.raw, entry.record = None, None
                self._touch(path, services=1)

    def _compute_ports(self, entry: _ServiceEntry) -> dict[ServicePortName, ServicePort]:
        record = entry.record
        if record is None:
            return {}
        # In key order, so that of two endpoints with one address the same one
        # wins whatever order they came in (a resync may reorder them).
        endpoints = [ep for _, (_, ep) in sorted(entry.endpoints.items()) if ep is not None]
        return {
            port.name: replace(port, endpoints=self._resolve(entry, record, port, endpoints))
            for port in record.ports
        }

    def _resolve(self, entry: _ServiceEntry, record: ServiceRecord, port: ServicePort,
                 endpoints: list[EndpointRecord]) -> tuple[Endpoint, ...]:
        resolved: dict[tuple[IPAddress, int], Endpoint] = {}
        for ep in endpoints:
            target = resolve_endpoint_port(port, ep)
            if target is None:
                self._report_once(
                    entry, (SkipReason.UNRESOLVED_PORT, port.name.port, ep.key),
                    f"endpoint {ep.key} of {port.name}",
                    f"no port override named {port.name.port!r}"
                    + (f" or {port.target_port_name!r}" if port.target_port_name else "")
                    + " and no numeric targetPort")
                continue
            internal, external = ep.scopes if ep.scopes is not None else (
                ep.local or not record.internal_traffic_local,
                ep.local or not record.external_traffic_local)
            for ip in ep.ips:
                if (ip, target) in resolved:
                    self._report_once(
                        entry, (SkipReason.DUPLICATE_ENDPOINT, "", ep.key),
                        f"endpoint {record.namespace}/{record.name}/{ep.key}",
                        f"{format_host_port(ip, target)} is already an endpoint of {port.name}; "
                        "it is programmed once")
                    continue
                resolved[(ip, target)] = Endpoint(ip, target, ep.local, internal, external)
        return sorted_endpoints(resolved.values())

    def _report_orphans(self, path: str, entry: _ServiceEntry) -> None:
        """Endpoints whose service is not known are kept (the service may come
        later), and reported once each; not when the service was sent but
        refused (its own report says why)."""
        if (_SERVICES, path) in self._rejected:
            return
        for key in entry.endpoints:
            self._report_once(entry, (SkipReason.UNKNOWN_SERVICE, "", key),
                              f"endpoint {path}/{key}",
                              f"no service {path} is known (not sent yet, or deleted); "
                              "the endpoint waits for it")

    def _report_once(self, entry: _ServiceEntry, marker: tuple[SkipReason, str, str], obj: str,
                     detail: str) -> None:
        if marker not in entry.reported:
            entry.reported.add(marker)
            self._skips.skip(marker[0], obj, detail)


def resolve_endpoint_port(port: ServicePort, endpoint: EndpointRecord) -> int | None:
    """The endpoint's port for a service port: the override named like the
    service port; else the override named like the target port name; else the
    numeric target port; else none (docs/architecture.md)."""
    by_name = endpoint.override(port.name.port)
    if by_name is not None:
        return by_name
    if port.target_port_name:
        by_target = endpoint.override(port.target_port_name)
        if by_target is not None:
            return by_target
    return port.target_port or None


def _set_name(ref_set: int) -> str:
    try:
        return localv1.Set.Name(ref_set)
    except ValueError:
        return str(ref_set)
