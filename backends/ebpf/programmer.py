"""ServicePort changes -> map writes, in an order that leaves no gap.

Every ClusterIP of a service port is a *frontend* (VIP, port, protocol): one
master entry in `services` (slot 0: service id, backend count, affinity) and
one slot per backend (slots 1..count: backend id). Every (frontend, endpoint)
pair has its own backend id in `backends`, so services that share an endpoint
never share an entry.

A change set is written in five steps (Cilium and Calico agree on them):
new backends, then slots 1..N, then the master with the new count, then the
slots above N, then the backends no slot names any more. A connect() racing
with the update reads either the old or the new master, and every slot and
backend it can reach exists. Frontends that go away entirely are deleted
first (master, slots, backends), which frees room for the rest.

The programmer keeps a mirror of what the maps hold, recovered from the
pinned maps at start, so ids stay stable across restarts and an incremental
change costs what it touches.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from backends.ebpf import maps
from backends.ebpf.libbpf import BpfMap
from backends.ebpf.maps import Backend, L4Addr, ServiceKey, ServiceValue
from kpng_py.logs import fields
from kpng_py.model import (
    ChangeSet,
    IPAddress,
    Protocol,
    ServicePort,
    ServicePortName,
    family_of,
    format_host_port,
)
from kpng_py.skips import SkipReason, Skips

log = logging.getLogger(__name__)

IPPROTO = {Protocol.TCP: socket.IPPROTO_TCP, Protocol.UDP: socket.IPPROTO_UDP}
PROTOCOL_OF = {number: protocol for protocol, number in IPPROTO.items()}
# Slots are 16 bits wide (lb_service_key.slot), slot 0 is the master.
MAX_SLOTS = 0xFFFF
MAX_ID = 0xFFFFFFFF


@dataclass(frozen=True, order=True)
class HostPort:
    ip: IPAddress
    port: int
    # ipaddress hashes through hex(), too slowly for dicts of every backend
    # of a full sync: hash once, from the integer.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((int(self.ip), self.ip.version, self.port)))

    def __hash__(self) -> int:
        return self._hash

    def l4addr(self) -> L4Addr:
        return L4Addr.of(self.ip, self.port)

    def __str__(self) -> str:
        return format_host_port(self.ip, self.port)


@dataclass(frozen=True)
class Frontend:
    """What a socket dials: ClusterIP, port, protocol.

    Two frontends are the same exactly when their map keys are: 10.96.0.10
    and ::ffff:10.96.0.10, or fd00::1%a and fd00::1%b, are different
    addresses to Python but one key to the datapath, so one frontend here,
    which one service port at a time may own."""

    vip: HostPort = field(compare=False)
    protocol: Protocol = field(compare=False)
    # What every key of this frontend starts with (computed once: a frontend
    # has a key per slot, and a full sync makes hundreds of thousands).
    _key_prefix: bytes = field(init=False, repr=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prefix = ServiceKey.frontend_prefix(self.vip.l4addr(), IPPROTO[self.protocol])
        object.__setattr__(self, "_key_prefix", prefix)
        object.__setattr__(self, "_hash", hash(prefix))

    def __hash__(self) -> int:
        return self._hash

    def key(self, slot: int) -> ServiceKey:
        return ServiceKey.at_slot(self._key_prefix, slot)

    def __str__(self) -> str:
        return f"{self.vip}/{self.protocol.value}"


@dataclass(frozen=True)
class Programmed:
    """A frontend as the maps hold it."""

    service_id: int
    slots: tuple[int, ...]  # backend id of slot i+1; 0 where a recovered slot was missing
    affinity_timeout: int

    def master(self) -> ServiceValue:
        return ServiceValue(id=self.service_id, count=len(self.slots),
                            affinity_timeout=self.affinity_timeout,
                            flags=maps.SVC_F_AFFINITY if self.affinity_timeout else 0)

    def same_master(self, other: Programmed) -> bool:
        return (self.service_id, len(self.slots), self.affinity_timeout) == (
            other.service_id, len(other.slots), other.affinity_timeout)


# Each frontend of a service port: its backends and affinity timeout.
FrontendSpecs = dict[Frontend, tuple[tuple[HostPort, ...], int]]


def frontends_of(port: ServicePort) -> FrontendSpecs:
    """Each ClusterIP's frontend with its backends (the endpoints of its
    family that ClusterIP traffic may use) and affinity timeout."""
    return {
        Frontend(HostPort(ip, port.port), port.protocol): (
            tuple(HostPort(ep.ip, ep.port) for ep in port.cluster_endpoints(family_of(ip))),
            port.affinity_timeout_seconds)
        for ip in port.cluster_ips
    }


def assign_slots(previous: Sequence[int], wanted: Sequence[int]) -> list[int]:
    """Backend ids in slot order for an update from `previous` to the set
    `wanted`: ids that stay keep their slot, new ids fill the slots of removed
    ones, and the tail moves into holes that are left, so an update rewrites
    few slots and unconnected UDP sockets mostly keep their backend."""
    wanted_set = set(wanted)
    slots: list[int | None] = []
    for backend_id in previous:
        keep = backend_id in wanted_set and backend_id not in slots
        slots.append(backend_id if keep else None)
    fresh = iter([b for b in wanted if b not in slots])
    slots = [next(fresh, None) if b is None else b for b in slots]
    slots.extend(fresh)
    i = 0
    while i < len(slots):
        if slots[i] is None:
            last = slots.pop()
            if i < len(slots):
                slots[i] = last
            continue
        i += 1
    return [b for b in slots if b is not None]


class IdAllocator:
    """Ids 1..MAX_ID, handed out in increasing order so that a freed id is
    reused as late as possible (affinity and reverse-NAT entries name ids).
    Released ids stay taken until `settle`, after the change set that freed
    them is written, so one change set never deletes an id it reuses."""

    def __init__(self, in_use: Iterable[int] = ()) -> None:
        self._in_use = set(in_use)
        self._released: list[int] = []
        self._cursor = max(self._in_use, default=0)

    def allocate(self) -> int:
        if len(self._in_use) >= MAX_ID:
            raise RuntimeError("all 2^32-1 ids are in use")
        while True:
            self._cursor = self._cursor % MAX_ID + 1
            if self._cursor not in self._in_use:
                self._in_use.add(self._cursor)
                return self._cursor

    def release(self, value: int) -> None:
        self._released.append(value)

    def settle(self) -> None:
        self._in_use.difference_update(self._released)
        self._released.clear()


@dataclass
class MapWrites:
    """One change set's writes, by step."""

    gone_service_keys: list[ServiceKey] = field(default_factory=list)  # masters first
    gone_backends: list[int] = field(default_factory=list)
    new_backends: list[tuple[int, Backend]] = field(default_factory=list)
    slots: list[tuple[ServiceKey, ServiceValue]] = field(default_factory=list)
    masters: list[tuple[ServiceKey, ServiceValue]] = field(default_factory=list)
    stale_slots: list[ServiceKey] = field(default_factory=list)
    orphan_backends: list[int] = field(default_factory=list)
    # (service id, backend) pairs of UDP frontends that are gone: connected
    # sockets still pointing there must be terminated (S9).
    removed_udp: set[tuple[int, HostPort]] = field(default_factory=set)

    def entries_written(self) -> dict[str, int]:
        """Entries created, updated or deleted, by map."""
        return {
            maps.SERVICES.pin: len(self.gone_service_keys) + len(self.slots) + len(self.masters)
            + len(self.stale_slots),
            maps.BACKENDS.pin: len(self.gone_backends) + len(self.new_backends)
            + len(self.orphan_backends),
        }


@dataclass(frozen=True)
class Capacity:
    services: int
    backends: int


@dataclass(frozen=True)
class Waiting:
    """A service port not (fully) programmed: a frontend of it belongs to
    another service port, or its new version does not fit the maps. It is
    retried with every later change set; `reported` holds the problems
    already logged and counted for this version of it."""

    port: ServicePort
    reported: frozenset[tuple[SkipReason, Frontend | None]]


class ServiceProgrammer:
    """Owns the contents of the `services` and `backends` maps."""

    def __init__(self, services: BpfMap, backends: BpfMap, capacity: Capacity,
                 skips: Skips) -> None:
        self._services = services
        self._backends_map = backends
        self._capacity = capacity
        self._skips = skips
        self._recover()

    # -- state -----------------------------------------------------------------

    def _reset(self) -> None:
        self._frontends: dict[Frontend, Programmed] = {}
        self._backends: dict[int, tuple[int, HostPort]] = {}
        self._backend_ids: dict[tuple[int, HostPort], int] = {}
        self._owners: dict[Frontend, ServicePortName] = {}
        self._waiting: dict[ServicePortName, Waiting] = {}
        # Entries recovered from the maps that no frontend explains (what a
        # crash between two write steps leaves); the next full change set
        # deletes them.
        self._stray_keys: list[ServiceKey] = []
        self._stray_backends: list[int] = []
        self.service_entries = 0
        self.backend_entries = 0

    def _recover(self) -> None:
        """Rebuild the mirror (and the ids in use) from the maps."""
        self._reset()
        masters: dict[Frontend, ServiceValue] = {}
        slot_ids: dict[tuple[Frontend, int], int] = {}
        for key, value in self._services.items():
            frontend = _frontend_of_key(key)
            if frontend is None:
                self._stray_keys.append(key)
            elif key.slot == 0:
                masters[frontend] = value
            else:
                slot_ids[(frontend, key.slot)] = value.id
        stored = {int(bid): (b.service_id, HostPort(b.addr.ip, b.addr.host_port))
                  for bid, b in self._backends_map.items()}
        service_ids: set[int] = set()
        for frontend, master in masters.items():
            if master.id in service_ids or master.id == 0:
                # A corrupt master: drop it with its slots, reprogram afresh.
                self._stray_keys.append(frontend.key(0))
                continue
            service_ids.add(master.id)
            slots = []
            for slot in range(1, master.count + 1):
                backend_id = slot_ids.pop((frontend, slot), 0)
                owner = stored.get(backend_id)
                slots.append(backend_id if owner is not None and owner[0] == master.id else 0)
            self._frontends[frontend] = Programmed(
                master.id, tuple(slots),
                master.affinity_timeout if master.flags & maps.SVC_F_AFFINITY else 0)
            for backend_id in slots:
                if backend_id and backend_id not in self._backends:
                    self._keep_backend(backend_id, *stored[backend_id])
        self._stray_keys += [frontend.key(slot) for frontend, slot in slot_ids]
        self._stray_backends = [b for b in stored if b not in self._backends]
        self.service_entries = sum(1 + len(p.slots) for p in self._frontends.values()) + len(
            self._stray_keys)
        self.backend_entries = len(stored)
        self._service_ids = IdAllocator(service_ids)
        self._backend_id_pool = IdAllocator(stored)
        log.info("recovered the programmed services from the pinned maps", extra=fields(
            frontends=len(self._frontends), backends=len(self._backends),
            stray_entries=len(self._stray_keys) + len(self._stray_backends)))

    def _keep_backend(self, backend_id: int, service_id: int, target: HostPort) -> None:
        self._backends[backend_id] = (service_id, target)
        self._backend_ids[(service_id, target)] = backend_id

    # -- planning --------------------------------------------------------------

    def apply(self, changes: ChangeSet) -> MapWrites:
        """Write one change set; returns what was written (with the (service
        id, backend) pairs UDP frontends lost). On a failed write the mirror is
        re-read from the maps (so the entry counts are what the maps hold) and
        the error raised; the next full change set repairs the maps."""
        writes = MapWrites()
        ports = (changes.added if changes.full
                 else self._plan_incremental(changes, writes))
        planned = [(port, frontends_of(port)) for port in ports]
        if changes.full:
            self._plan_full(planned, writes)
        waiting, self._waiting = self._waiting, {}
        for port, specs in planned:
            self._program_port(port, specs, writes, _reported(waiting.pop(port.name, None), port))
        if not changes.full:  # a full change set lists every port there is
            for earlier in sorted(waiting.values(), key=lambda w: w.port.name.sort_key()):
                self._program_port(earlier.port, frontends_of(earlier.port), writes,
                                   earlier.reported)
        try:
            self._write(writes)
        except OSError:
            self._recover_after_failed_write()
            raise
        self._service_ids.settle()
        self._backend_id_pool.settle()
        self.service_entries -= len(writes.stale_slots)
        self.backend_entries -= len(writes.orphan_backends)
        return writes

    def _recover_after_failed_write(self) -> None:
        """Re-read the maps; who owns which frontend and what was already
        reported stay known (the maps cannot say)."""
        owners, waiting = self._owners, self._waiting
        self._recover()
        self._owners = {f: owner for f, owner in owners.items() if f in self._frontends}
        self._waiting = waiting

    def _plan_full(self, planned: Sequence[tuple[ServicePort, FrontendSpecs]],
                   writes: MapWrites) -> None:
        claims = {(frontend, port.name) for port, specs in planned for frontend in specs}
        wanted = {frontend for frontend, _ in claims}
        # An owner keeps its frontend through a full change set (a reconnect)
        # while it still claims it: no churn, whatever the order of claimants.
        self._owners = {f: owner for f, owner in self._owners.items() if (f, owner) in claims}
        for frontend in [f for f in self._frontends if f not in wanted]:
            self._remove_frontend(frontend, writes)
        # No connect() can reach a stray (a slot above its master's count, a
        # backend no valid slot names), so they go first, with the frontends
        # that are gone, and never collide with what this change set writes.
        writes.gone_service_keys += self._stray_keys
        writes.gone_backends += self._stray_backends
        for backend_id in self._stray_backends:
            self._backend_id_pool.release(backend_id)
        self.service_entries -= len(self._stray_keys)
        self.backend_entries -= len(self._stray_backends)
        self._stray_keys, self._stray_backends = [], []

    def _plan_incremental(self, changes: ChangeSet, writes: MapWrites) -> list[ServicePort]:
        for port in changes.removed:
            self._remove_port(port, keep=(), writes=writes)
        for old, new in changes.updated:
            self._remove_port(old, keep=frontends_of(new), writes=writes)
        return list(changes.current())

    def _remove_port(self, port: ServicePort, keep: Iterable[Frontend],
                     writes: MapWrites) -> None:
        self._waiting.pop(port.name, None)
        for frontend in set(frontends_of(port)) - set(keep):
            # Unowned: recovered from the maps, not yet claimed by a full change set.
            if frontend in self._frontends and self._owners.get(frontend, port.name) == port.name:
                self._remove_frontend(frontend, writes)

    def _remove_frontend(self, frontend: Frontend, writes: MapWrites) -> None:
        programmed = self._frontends.pop(frontend)
        self._owners.pop(frontend, None)
        writes.gone_service_keys.insert(0, frontend.key(0))
        writes.gone_service_keys += [frontend.key(i) for i in range(1, len(programmed.slots) + 1)]
        self.service_entries -= 1 + len(programmed.slots)
        for backend_id in set(programmed.slots) - {0}:
            self._drop_backend(backend_id, frontend, writes.gone_backends, writes)
        self.backend_entries -= len(set(programmed.slots) - {0})
        self._service_ids.release(programmed.service_id)

    def _drop_backend(self, backend_id: int, frontend: Frontend, into: list[int],
                      writes: MapWrites) -> None:
        service_id, target = self._backends.pop(backend_id)
        del self._backend_ids[(service_id, target)]
        self._backend_id_pool.release(backend_id)
        into.append(backend_id)
        if frontend.protocol is Protocol.UDP:
            writes.removed_udp.add((service_id, target))

    def _program_port(self, port: ServicePort, specs: FrontendSpecs, writes: MapWrites,
                      reported: frozenset) -> None:
        """Program the frontends of a service port. A frontend that another
        service port owns stays with its owner (`frontend-conflict`; the
        state model already decides so, this is the datapath's own guard).
        When the rest does not fit the maps (`capacity`), what the port had
        stays programmed, untouched. Either way the port waits, retried with
        every later change set, and each problem is reported once per
        version of the port."""
        problems: list[tuple[SkipReason, Frontend | None, str]] = []
        fitting: FrontendSpecs = {}
        for frontend, spec in specs.items():
            owner = self._owners.get(frontend, port.name)
            if owner == port.name:
                fitting[frontend] = spec
            else:
                problems.append((SkipReason.FRONTEND_CONFLICT, frontend,
                                 f"frontend {frontend} is already programmed for service port "
                                 f"{owner}, which keeps it"))
        no_room = self._capacity_problem(fitting)
        for frontend, (targets, affinity_timeout) in fitting.items():
            if not no_room:
                self._program_frontend(frontend, targets, affinity_timeout, writes)
            if frontend in self._frontends:  # programmed now, or kept as it was
                self._owners[frontend] = port.name
        if no_room:
            kept = any(frontend in self._frontends for frontend in fitting)
            problems.append((SkipReason.CAPACITY, None, no_room + (
                "; its previous version stays programmed" if kept else "")))
        if not problems:
            return
        for reason, frontend, detail in problems:
            if (reason, frontend) not in reported:
                self._skips.skip(reason, f"service port {port.name}", detail)
        self._waiting[port.name] = Waiting(port, reported | {
            (reason, frontend) for reason, frontend, _ in problems})

    def _capacity_problem(self, specs: FrontendSpecs) -> str:
        """Why the port does not fit, counting every entry this change set adds
        before it deletes any (the maps hold both during the update)."""
        services_needed = backends_needed = 0
        for frontend, (targets, _) in specs.items():
            if len(targets) > MAX_SLOTS:
                return (f"{frontend} has {len(targets)} endpoints; a ClusterIP holds at most "
                        f"{MAX_SLOTS}")
            old = self._frontends.get(frontend)
            old_slots = len(old.slots) if old else 0
            services_needed += (0 if old else 1) + max(0, len(targets) - old_slots)
            service_id = old.service_id if old else 0
            backends_needed += sum(1 for t in targets if (service_id, t) not in self._backend_ids)
        for spec, used, needed, capacity in (
                (maps.SERVICES, self.service_entries, services_needed, self._capacity.services),
                (maps.BACKENDS, self.backend_entries, backends_needed, self._capacity.backends)):
            if used + needed > capacity:
                return (f"map {spec.pin} is full ({used} of {capacity} entries used, "
                        f"{needed} more needed); raise {spec.size_flag}")
        return ""

    def _program_frontend(self, frontend: Frontend, targets: tuple[HostPort, ...],
                          affinity_timeout: int, writes: MapWrites) -> None:
        old = self._frontends.get(frontend)
        service_id = old.service_id if old else self._service_ids.allocate()
        wanted = [self._backend_id(service_id, target, writes) for target in targets]
        previous = old.slots if old else ()
        slots = assign_slots(previous, wanted)
        for index, backend_id in enumerate(slots):
            if index >= len(previous) or previous[index] != backend_id:
                writes.slots.append((frontend.key(index + 1), ServiceValue(id=backend_id)))
        new = Programmed(service_id, tuple(slots), affinity_timeout)
        if old is None or not old.same_master(new):
            writes.masters.append((frontend.key(0), new.master()))
        writes.stale_slots += [frontend.key(i + 1) for i in range(len(slots), len(previous))]
        self.service_entries += (0 if old else 1) + max(0, len(slots) - len(previous))
        for backend_id in set(previous) - set(slots) - {0}:
            self._drop_backend(backend_id, frontend, writes.orphan_backends, writes)
        self._frontends[frontend] = new

    def _backend_id(self, service_id: int, target: HostPort, writes: MapWrites) -> int:
        backend_id = self._backend_ids.get((service_id, target))
        if backend_id is None:
            backend_id = self._backend_id_pool.allocate()
            self._keep_backend(backend_id, service_id, target)
            writes.new_backends.append(
                (backend_id, Backend(addr=target.l4addr(), service_id=service_id)))
            self.backend_entries += 1
        return backend_id

    # -- writing ---------------------------------------------------------------

    def _write(self, writes: MapWrites) -> None:
        services, backends = self._services, self._backends_map
        services.delete_many(writes.gone_service_keys)
        backends.delete_many(writes.gone_backends)
        backends.put_many([k for k, _ in writes.new_backends], [v for _, v in writes.new_backends])
        services.put_many([k for k, _ in writes.slots], [v for _, v in writes.slots])
        services.put_many([k for k, _ in writes.masters], [v for _, v in writes.masters])
        services.delete_many(writes.stale_slots)
        backends.delete_many(writes.orphan_backends)
        log.debug("maps written", extra=fields(
            **writes.entries_written(),
            gone=len(writes.gone_service_keys), new_backends=len(writes.new_backends),
            slots=len(writes.slots), masters=len(writes.masters),
            stale_slots=len(writes.stale_slots), orphan_backends=len(writes.orphan_backends)))


def _frontend_of_key(key: ServiceKey) -> Frontend | None:
    protocol = PROTOCOL_OF.get(key.proto)
    if protocol is None or key.pad or key.vip.pad:
        return None
    return Frontend(HostPort(key.vip.ip, key.vip.host_port), protocol)


def _reported(earlier: Waiting | None, port: ServicePort) -> frozenset:
    """What was already reported for this version of a port (nothing for a
    new version: it is a new input)."""
    return earlier.reported if earlier is not None and earlier.port == port else frozenset()
