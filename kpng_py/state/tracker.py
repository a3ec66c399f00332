"""The node's state as received from the brain, and its change tracker.

`NodeState.apply` takes one change set (the ops of a stream up to and including
a Sync) and returns what changed per ServicePortName. Work is proportional to
what changed: only services whose object or endpoints were touched are
recomputed.

Each frontend (address, port, protocol) has one owner (`kpng_py/state/owners.py`):
a service port is published with the ClusterIPs whose frontends it owns, and
not at all when it owns none, so no two published ports share a frontend.
What one service and the whole node may cost is bounded (`kpng_py/state/limits.py`);
a service over a bound keeps its previous version in force.

After a reconnect the brain sends Reset and the full state again. Like KPNG's
`filterreset`, the store then ignores Sets whose bytes did not change and, at
the Sync, deletes what was not re-sent, so the backend sees only real
differences, never a flush and rebuild.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Iterable, NamedTuple

from kpng_py.api import localv1
from kpng_py.model import (
    PACKED_ADDRESS_SIZE,
    Endpoints,
    Frontend,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
    endpoint_flag_byte,
    format_host_port,
    unpacked_address,
)
from kpng_py.state.decode import (
    DecodedEndpoint,
    DecodedService,
    EndpointTails,
    decode_endpoint,
    decode_service,
    fast_endpoint,
    split_endpoint_path,
)
from kpng_py.state.limits import Limits
from kpng_py.state.owners import FrontendOwners
from kpng_py.state.skips import SkipReason, Skips

log = logging.getLogger(__name__)

_SERVICES = localv1.ServicesSet
_ENDPOINTS = localv1.EndpointsSet


# A marker of a problem already logged for a service: (reason, port name or
# limit flag or "", endpoint key or ""), or for a frontend of one of its ports
# that another port owns: (FRONTEND_CONFLICT, the port's name, the frontend).
_Report = tuple[SkipReason, str | ServicePortName, str | Frontend]


class _Undecodable(NamedTuple):
    """An endpoint's value that cannot be decoded: kept, unused, so that it
    can be deleted."""

    raw: bytes


# An endpoint's value as the state keeps it: the bytes alone when
# `fast_endpoint` decodes them (most endpoints of a full sync: decoded again,
# as fast, when their service is computed, so that they cost no objects in
# between), else the value decoded from them.
_StoredEndpoint = bytes | DecodedEndpoint | _Undecodable


@dataclass(slots=True)
class _TrackedService:
    """Everything known about one service path (`namespace/name`)."""

    raw: bytes | None = None
    decoded: DecodedService | None = None
    # endpoint key -> its value (which holds the bytes it came in)
    endpoints: dict[str, _StoredEndpoint] = field(default_factory=dict)
    # The version in force: the service's ports with their endpoints and
    # every frontend they claim, and how many endpoints they hold.
    claiming: dict[ServicePortName, ServicePort] = field(default_factory=dict)
    endpoint_count: int = 0
    # What the backend was last given for this service (`claiming` without
    # the frontends other ports own).
    published: dict[ServicePortName, ServicePort] = field(default_factory=dict)
    # Problems already logged, so each is reported once until the service or
    # that endpoint changes (conflicts: until the service changes); None
    # while there are none (most services).
    reported: set[_Report] | None = None

    def first_report(self, marker: _Report) -> bool:
        """True the first time `marker` is reported (and remember it)."""
        if self.reported is None:
            self.reported = set()
        elif marker in self.reported:
            return False
        self.reported.add(marker)
        return True

    def forget_report(self, marker: _Report) -> None:
        if self.reported:
            self.reported.discard(marker)

    def forget_reports(self, key: str) -> None:
        if self.reported:
            self.reported = {r for r in self.reported if r[2] != key}

    def new_version(self) -> None:
        self.reported = None

    def is_empty(self) -> bool:
        return (self.raw is None and not self.endpoints and not self.claiming
                and not self.published)


@dataclass
class _Counts:
    service_changes: int = 0
    endpoint_changes: int = 0
    ops: int = 0  # Sets and Deletes received


class NodeState:
    """The services and endpoints of one node's view, and what changed."""

    def __init__(self, skips: Skips, limits: Limits = Limits()) -> None:
        self._skips = skips
        self._limits = limits
        self._owners = FrontendOwners()
        # Endpoints of every service's version in force (--max-endpoints).
        self._endpoint_total = 0
        # Services refused for --max-endpoints, with the endpoints their new
        # version holds: tried again when that much room is made.
        self._over_node_limit: dict[str, int] = {}
        self._services: dict[str, _TrackedService] = {}
        self._dirty: set[str] = set()
        self._counts = _Counts()
        # Refs (set, path) re-sent since a Reset; None outside a resync.
        self._resync_seen: set[tuple[int, str]] | None = None
        # The value last refused at each ref (bad path, unknown set,
        # undecodable), so a resync that re-sends it is not reported again.
        self._rejected: dict[tuple[int, str], bytes] = {}
        self._synced = False
        # What many endpoints' values share, decoded once.
        self._tails = EndpointTails()
        # Per service, its ports the backend does not get now, by reason
        # (only services that have some): `not_published`.
        self._unpublished: dict[str, dict[SkipReason, int]] = {}

    # -- reading ---------------------------------------------------------------

    def service_ports(self) -> list[ServicePort]:
        """Every programmable service port, sorted by name then protocol."""
        ports = [p for e in self._services.values() for p in e.published.values()]
        return sorted(ports, key=lambda p: p.name.sort_key())

    def claiming_ports(self) -> list[ServicePort]:
        """Every service port as its service and endpoints make it, with all the
        frontends it claims, owned or not; sorted like `service_ports`."""
        ports = [p for e in self._services.values() for p in e.claiming.values()]
        return sorted(ports, key=lambda p: p.name.sort_key())

    # -- applying ops ----------------------------------------------------------

    def apply(self, ops: Iterable[localv1.OpItem], staged: bool = False
              ) -> ServicePortChanges | None:
        """Apply ops; return the ServicePortChanges at the Sync (None if there
        was none). `staged`: ops before their Sync, none of which may be one
        (ValueError: what was staged must reach the backend with its Sync)."""
        changes = None
        for op in ops:
            kind = op.WhichOneof("Op")
            if kind == "Set":
                self._counts.ops += 1
                self._set(op.Set)
            elif kind == "Delete":
                self._counts.ops += 1
                self._delete(op.Delete.Set, op.Delete.Path)
            elif kind == "Reset":
                # What is set from now on is seen; only what exists now can
                # go unseen (nothing on a first stream).
                self._resync_seen = set() if self._services or self._rejected else None
            elif kind == "Sync":
                if staged:
                    raise ValueError("a Sync among staged ops; hand it over with the "
                                     "change set's last ops")
                changes = self._sync()
        return changes

    def not_published(self) -> dict[SkipReason, int]:
        """How many service ports the brain sent that the backend does not
        get now, by reason: every frontend of the port belongs to another
        one (frontend-conflict), or its service is over a limit with no
        version in force yet (limit). As of the last Sync."""
        totals: dict[SkipReason, int] = {}
        for counts in self._unpublished.values():
            for reason, count in counts.items():
                totals[reason] = totals.get(reason, 0) + count
        return totals

    def full_changeset(self) -> ServicePortChanges:
        """The whole state as a full ServicePortChanges, for a backend that must reconcile."""
        return ServicePortChanges(added=tuple(self.service_ports()), full=True)

    def _set(self, value: localv1.Value) -> None:
        where = value.Ref
        ref_set, path = where.Set, where.Path
        data = value.Bytes
        if self._resync_seen is not None:
            self._resync_seen.add((ref_set, path))
        if self._rejected and self._rejected.get((ref_set, path)) == data:
            return  # reported when it first came
        if ref_set == _ENDPOINTS:
            accepted = self._set_endpoint(path, data)
        elif ref_set == _SERVICES:
            accepted = self._set_service(path, data)
        else:
            self._skips.skip(SkipReason.UNKNOWN_SET, f"Set {path!r}",
                             f"Ref.Set {_set_name(ref_set)} is not served to backends")
            accepted = False
        if accepted:
            if self._rejected:
                self._rejected.pop((ref_set, path), None)
        else:
            self._rejected[(ref_set, path)] = data

    def _set_service(self, path: str, data: bytes) -> bool:
        """False if the value was refused (the previous version stays in force)."""
        entry = self._services.get(path)
        if entry is not None and entry.raw == data:
            return True
        decoded = decode_service(path, data, self._skips, self._limits)
        if decoded is None:
            return False
        entry = self._services.setdefault(path, _TrackedService())
        entry.raw, entry.decoded = data, decoded
        entry.new_version()
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
        if previous is not None and _raw(previous) == data:
            return True
        stored: _StoredEndpoint = data
        if fast_endpoint(data, self._tails) is None:
            decoded = decode_endpoint(service_path, key, data, self._skips, self._tails)
            if decoded is None and previous is not None:
                return False
            stored = _Undecodable(data) if decoded is None else decoded
        if entry is None:
            entry = self._services[service_path] = _TrackedService()
        entry.endpoints[key] = stored
        entry.forget_reports(key)
        self._touch(service_path, endpoints=1)
        return True

    def _delete(self, ref_set: int, path: str) -> None:
        # A Delete of a refused value ends it quietly: its Set was reported.
        rejected = self._rejected.pop((ref_set, path), None) is not None
        if ref_set == _SERVICES:
            entry = self._services.get(path)
            if entry is not None and entry.raw is not None:
                entry.raw, entry.decoded = None, None
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

    def _sync(self) -> ServicePortChanges:
        if self._resync_seen is not None:
            self._drop_not_resent(self._resync_seen)
            self._resync_seen = None
        replaced = self._recompute()
        taken_over = self._owners.update(self._claims(replaced))
        self._report_conflicts(replaced)
        added: list[ServicePort] = []
        updated: list[tuple[ServicePort, ServicePort]] = []
        removed: list[ServicePort] = []
        # In name order: a change set, and so what a full dataplane skips, is
        # the same whatever order the brain sent things in.
        republished = replaced.keys() | {_service_path(name) for name in taken_over}
        for path in sorted(republished):
            entry = self._services[path]
            new = self._publishable(entry.claiming)
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
        for path in republished | self._dirty:
            self._count_unpublished(path)
        full, self._synced = not self._synced, True
        changes = ServicePortChanges(tuple(added), tuple(updated), tuple(removed), full=full,
                            service_changes=self._counts.service_changes,
                            endpoint_changes=self._counts.endpoint_changes,
                            ops=self._counts.ops)
        self._dirty.clear()
        self._counts = _Counts()
        return changes

    def _count_unpublished(self, path: str) -> None:
        """Note the ports of service `path` the backend does not get now."""
        entry = self._services.get(path)
        counts: dict[SkipReason, int] = {}
        if entry is not None:
            if len(entry.published) < len(entry.claiming):
                counts[SkipReason.FRONTEND_CONFLICT] = len(entry.claiming) - len(entry.published)
            if entry.decoded is not None and entry.decoded.ports and not entry.claiming:
                # Computed ports are always put in force but for a limit.
                counts[SkipReason.LIMIT] = len(entry.decoded.ports)
        if counts:
            self._unpublished[path] = counts
        else:
            self._unpublished.pop(path, None)

    def _recompute(self) -> dict[str, dict[ServicePortName, ServicePort]]:
        """Compute the changed services' ports within the limits. Returns, for
        every service whose new ports are now in force, the ports it had."""
        computed: dict[str, dict[ServicePortName, ServicePort]] = {}
        for path in sorted(self._dirty):
            entry = self._services[path]
            if entry.raw is None:
                self._report_orphans(path, entry)
            ports = self._compute_ports(entry)
            if ports is None:
                self._over_node_limit.pop(path, None)
            else:
                computed[path] = ports
        return self._within_node_limit(computed)

    def _within_node_limit(self, computed: dict[str, dict[ServicePortName, ServicePort]]
                           ) -> dict[str, dict[ServicePortName, ServicePort]]:
        """Put the computed ports in force where the node total allows it
        (--max-endpoints); the others keep their previous version."""
        growth = {path: _endpoint_count(ports) - self._services[path].endpoint_count
                  for path, ports in computed.items()}
        self._retry_over_node_limit(computed, growth)
        replaced: dict[str, dict[ServicePortName, ServicePort]] = {}
        marker = (SkipReason.LIMIT, "--max-endpoints", "")
        # Services that shrink first, so that those that grow (in name order)
        # find the room made in the same Sync.
        for path in sorted(computed, key=lambda p: (growth[p] > 0, p)):
            entry = self._services[path]
            total = self._endpoint_total + growth[path]
            if growth[path] > 0 and total > self._limits.max_endpoints:
                self._over_node_limit[path] = entry.endpoint_count + growth[path]
                self._report_once(
                    entry, marker, f"service {path}",
                    f"its {entry.endpoint_count + growth[path]} endpoints would bring the node "
                    f"to {total}, over --max-endpoints {self._limits.max_endpoints}; its "
                    "previous version, if any, stays in force until other services make room "
                    "(raise --max-endpoints)")
                continue
            self._over_node_limit.pop(path, None)
            entry.forget_report(marker)
            self._endpoint_total = total
            entry.endpoint_count += growth[path]
            replaced[path], entry.claiming = entry.claiming, computed[path]
        return replaced

    def _retry_over_node_limit(self, computed: dict[str, dict[ServicePortName, ServicePort]],
                               growth: dict[str, int]) -> None:
        """Add to `computed` the unchanged services refused for --max-endpoints
        that fit in the room this Sync makes (in name order), so that only
        those are computed again."""
        room = self._limits.max_endpoints - self._endpoint_total - sum(
            g for g in growth.values() if g < 0)
        for path in sorted(self._over_node_limit.keys() - computed.keys()):
            entry = self._services[path]
            needed = self._over_node_limit[path] - entry.endpoint_count
            if needed > room:
                continue
            ports = self._compute_ports(entry)
            if ports is not None:
                computed[path] = ports
                growth[path] = _endpoint_count(ports) - entry.endpoint_count
                room -= growth[path]

    def _claims(self, replaced: dict[str, dict[ServicePortName, ServicePort]]
                ) -> dict[ServicePortName, tuple[Frontend, ...]]:
        """What each port of the replaced services whose frontends changed
        claims now."""
        claims: dict[ServicePortName, tuple[Frontend, ...]] = {}
        for path, before in replaced.items():
            now = self._services[path].claiming
            for name in before.keys() | now.keys():
                old, port = before.get(name), now.get(name)
                if old is not None and port is not None and old.frontends() == port.frontends():
                    continue  # the same frontends
                claims[name] = port.frontends() if port else ()
        return claims

    def _report_conflicts(self, replaced: dict[str, dict[ServicePortName, ServicePort]]) -> None:
        """One line per frontend a new version of a port claims but does not get."""
        for path in sorted(replaced):
            entry = self._services[path]
            for port in entry.claiming.values():
                for frontend in port.frontends():
                    owner = self._owners.owner(frontend)
                    if owner == port.name or not entry.first_report(
                            (SkipReason.FRONTEND_CONFLICT, port.name, frontend)):
                        continue
                    self._skips.skip(
                        SkipReason.FRONTEND_CONFLICT, f"service port {port.name}",
                        f"{frontend} belongs to {owner}, which claimed it first; this port "
                        "is served without it until that port gives it up")

    def _publishable(self, ports: dict[ServicePortName, ServicePort]
                     ) -> dict[ServicePortName, ServicePort]:
        """The ports with only the frontends they own; a port that owns none
        is left out. `ports` itself when they own all of theirs (most
        services: one dict of ports kept per service, not two)."""
        published: dict[ServicePortName, ServicePort] = {}
        for name, port in ports.items():
            frontends = port.frontends()
            owned = {frontend for frontend in frontends if self._owners.owner(frontend) == name}
            if owned:
                published[name] = (port if len(owned) == len(frontends)
                                   else port.only_frontends(owned))
        return ports if published == ports else published

    def _drop_not_resent(self, seen: set[tuple[int, str]]) -> None:
        """End of a resync: what the new stream did not re-send is gone."""
        self._rejected = {ref: data for ref, data in self._rejected.items() if ref in seen}
        for path, entry in list(self._services.items()):
            for key in [k for k in entry.endpoints if (_ENDPOINTS, f"{path}/{k}") not in seen]:
                del entry.endpoints[key]
                self._touch(path, endpoints=1)
            if entry.raw is not None and (_SERVICES, path) not in seen:
                entry.raw, entry.decoded = None, None
                self._touch(path, services=1)

    def _compute_ports(self, entry: _TrackedService) -> dict[ServicePortName, ServicePort] | None:
        """The service's ports with their endpoints; None (reported once) when
        that would be over --max-service-endpoints, checked before any
        endpoint is resolved."""
        decoded = entry.decoded
        if decoded is None:
            return {}
        endpoints = self._decoded_endpoints(f"{decoded.namespace}/{decoded.name}", entry)
        addresses = sum(ep.address_count for _, ep in endpoints)
        size, limit = len(decoded.ports) * addresses, self._limits.max_service_endpoints
        marker = (SkipReason.LIMIT, "--max-service-endpoints", "")
        if size > limit:
            self._report_once(
                entry, marker, f"service {decoded.namespace}/{decoded.name}",
                f"{len(decoded.ports)} ports x {addresses} endpoint addresses = {size} "
                f"endpoints, over --max-service-endpoints {limit}; its previous version, if "
                "any, stays in force (raise --max-service-endpoints)")
            return None
        entry.forget_report(marker)
        return {
            port.name: replace(port, endpoints=self._resolve(entry, decoded, port, endpoints))
            for port in decoded.ports
        }

    def _decoded_endpoints(self, service_path: str, entry: _TrackedService
                           ) -> list[tuple[str, DecodedEndpoint]]:
        """The decoded endpoints of a service, in key order, so that of two
        endpoints with one address the same one wins whatever order they
        came in (a resync may reorder them)."""
        found = []
        for key, value in sorted(entry.endpoints.items()):
            # Read by its fast path (bytes); if its tail has left the cache
            # since, decoded whole, to the same value, which needed no report.
            decoded = (decode_endpoint(service_path, key, value, self._skips, self._tails)
                       if isinstance(value, bytes) else value)
            if isinstance(decoded, DecodedEndpoint):
                found.append((key, decoded))
        return found

    def _resolve(self, entry: _TrackedService, decoded: DecodedService, port: ServicePort,
                 endpoints: list[tuple[str, DecodedEndpoint]]) -> Endpoints:
        # Packed address and port -> the packed endpoint: sorted, the keys
        # are in Endpoint.sort_key order.
        resolved: dict[bytes, bytes] = {}
        last_tail = None
        target: int | None = None
        port_bytes = flag = b""
        for key, ep in endpoints:
            tail = ep.tail  # endpoints of a service share it
            if tail is not last_tail:
                last_tail, target = tail, resolve_endpoint_port(port, ep)
                local = tail.local
                internal, external = tail.scopes if tail.scopes is not None else (
                    local or not decoded.internal_traffic_local,
                    local or not decoded.external_traffic_local)
                flag = endpoint_flag_byte(local, internal, external)
                port_bytes = target.to_bytes(2, "big") if target is not None else b""
            if target is None:
                self._report_once(
                    entry, (SkipReason.UNRESOLVED_PORT, port.name.port, key),
                    f"endpoint {key} of {port.name}",
                    f"{_overrides_looked_for(port)} and no numeric targetPort")
                continue
            addresses = ep.addresses
            for at in range(0, len(addresses), PACKED_ADDRESS_SIZE):
                where = addresses[at:at + PACKED_ADDRESS_SIZE] + port_bytes
                if where in resolved:
                    self._report_once(
                        entry, (SkipReason.DUPLICATE_ENDPOINT, "", key),
                        f"endpoint {decoded.namespace}/{decoded.name}/{key}",
                        f"{format_host_port(unpacked_address(where), target)} is already an "
                        f"endpoint of {port.name}; it is programmed once")
                    continue
                resolved[where] = where + flag
        return Endpoints(b"".join(resolved[where] for where in sorted(resolved)))

    def _report_orphans(self, path: str, entry: _TrackedService) -> None:
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

    def _report_once(self, entry: _TrackedService, marker: _Report, obj: str,
                     detail: str) -> None:
        if entry.first_report(marker):
            self._skips.skip(marker[0], obj, detail)


def _raw(endpoint: _StoredEndpoint) -> bytes:
    """The bytes an endpoint's value came in."""
    return endpoint if isinstance(endpoint, bytes) else endpoint.raw


def _endpoint_count(ports: dict[ServicePortName, ServicePort]) -> int:
    return sum(len(port.endpoints) for port in ports.values())


def _service_path(name: ServicePortName) -> str:
    return f"{name.namespace}/{name.name}"


def resolve_endpoint_port(port: ServicePort, endpoint: DecodedEndpoint) -> int | None:
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


def _overrides_looked_for(port: ServicePort) -> str:
    """The port overrides resolve_endpoint_port looked for, as missing: the
    one named like the service port, and the one named like its targetPort."""
    own, target = port.name.port, port.target_port_name
    if own and own == target:
        return f"no port override named {own!r} (the port's name and its targetPort)"
    names = [f"{name!r} ({what})" for name, what in ((own, "the port's name"),
                                                     (target, "its targetPort")) if name]
    if not names:
        return "no unnamed port override (the port has no name)"
    return "no port override named " + " or ".join(names)


def _set_name(ref_set: int) -> str:
    try:
        return localv1.Set.Name(ref_set)
    except ValueError:
        return str(ref_set)
