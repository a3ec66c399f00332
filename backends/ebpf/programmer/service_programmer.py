"""ServicePort changes -> map writes, in an order that leaves no gap.

Every frontend of a service port (its ClusterIPs, ExternalIPs and
load-balancer IPs at its port; its node port at the wildcard address of each
family, which the programs look up for node addresses) is a key (address,
port, protocol): one master entry in `services` (slot 0: frontend id, endpoint
count, affinity, the kind of frontend) and one slot per endpoint (slots
1..count: endpoint id). Clients on the node use the cluster endpoints through
every kind of frontend. Every (frontend, endpoint)
pair has its own endpoint id in `backends`, so services that share an endpoint
never share an entry.

A change set is written in five steps (Cilium and Calico agree on them):
new endpoints, then slots 1..N, then the master with the new count, then the
slots above N, then the endpoints no slot names any more. A connect() racing
with the update reads either the old or the new master, and every slot and
endpoint it can reach exists. Frontends that go away entirely are deleted
first (master, slots, endpoints), which frees room for the rest.

The programmer keeps a mirror of what the maps hold, recovered from the
pinned maps at start, so ids stay stable across restarts and an incremental
change costs what it touches.

Who owns a frontend is the state's decision (kpng_py/state/owners.py): a
change set gives each frontend to one service port. The programmer
enforces it, with one dict lookup per frontend: a frontend given to a
second service port while another owns it raises FrontendClaimedTwice.
"""

from __future__ import annotations

import itertools
import logging
import struct
import time
import types
from array import array
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.contents import (
    SLOT_IDS,
    HostPort,
    KeyedFrontend,
    Programmed,
    endpoint_owner,
    endpoint_target,
    packed_slot_ids,
    read_contents,
)
from backends.ebpf.maps.layout import EndpointValue, ServiceKey, ServiceValue
from backends.ebpf.programmer.frontends import (
    FrontendSpec,
    FrontendSpecs,
    frontends_of,
    keyed_frontends,
)
from backends.ebpf.programmer.ids import MAX_ID, IdAllocator
from backends.ebpf.programmer.slots import MAX_SLOTS, assign_slots
from backends.ebpf.programmer.writes import (
    SERVICE_KEY_SIZE,
    SLOT_VALUE,
    U32,
    MapWrites,
    RoundWrites,
)
from kpng_py.model import Protocol, ServicePort, ServicePortChanges, ServicePortName
from kpng_py.runtime.logs import fields
from kpng_py.state.skips import SkipReason, Skips

log = logging.getLogger(__name__)

# Service ports planned and written per round of a change set: the buffers
# of the two rounds alive at once (one written, the next planned) stay small
# (about 40 KiB per 100 endpoints each), the syscalls few.
ROUND_PORTS = 512

# The affinity group of a frontend that leads it (the group is its own
# frontend id, allocated when it is programmed; see lb_maps.h).
LEADS = None


@dataclass(frozen=True)
class Capacity:
    """How many entries each map holds, and how many ids each kind has
    (fewer than MAX_ID only in tests of running out)."""

    services: int
    endpoints: int
    max_id: int = MAX_ID


class FrontendClaimedTwice(Exception):
    """A change set gives a frontend that one service port owns to another
    (or lets another remove it). The state decides one owner per frontend
    and publishes each port with the frontends it owns only, so this is a
    broken contract, not an input to skip: the change set is refused from
    that port on, and the applier counts it and retries with a full one."""

    def __init__(self, frontend: KeyedFrontend, owner: ServicePortName,
                 claimant: ServicePortName) -> None:
        super().__init__(
            f"frontend {frontend} is given to service port {claimant} while service port "
            f"{owner} owns it: a change set must give each frontend to one service port "
            f"(kpng_py.state.owners decides which); the rest of this change set is not "
            f"applied, and the maps are re-read")
        self.frontend, self.owner, self.claimant = frontend, owner, claimant


class ServiceProgrammer:
    """Owns the contents of the `services` and `backends` maps."""

    def __init__(self, services: MapAccess[ServiceKey, ServiceValue],
                 endpoints: MapAccess[int, EndpointValue], capacity: Capacity, skips: Skips,
                 round_ports: int = ROUND_PORTS) -> None:
        if round_ports < 1:
            raise ValueError(f"round_ports is {round_ports}: a round writes at least one "
                             f"service port")
        self._round_ports = round_ports
        self._services = services
        self._endpoints_map = endpoints
        self._capacity = capacity
        self._skips = skips
        self._recover()

    # -- state -----------------------------------------------------------------

    @property
    def last_stages(self) -> Mapping[str, float]:
        """How long the last apply planned and wrote, in milliseconds
        (`plan_ms`, `write_ms`)."""
        return self._last_stages

    def endpoint_targets(self) -> dict[int, tuple[int, HostPort]]:
        """Every programmed endpoint id: its frontend id and its target."""
        targets = {}
        for frontend, programmed in self._frontends.items():
            for endpoint_id, target in self._endpoints_of(frontend, programmed).items():
                targets[endpoint_id] = (programmed.frontend_id,
                                        HostPort.of_packed(target))
        return targets

    def endpoint_ids(self) -> Collection[int]:
        """Every programmed endpoint id."""
        return {endpoint_id for frontend, programmed in self._frontends.items()
                for endpoint_id in self._endpoints_of(frontend, programmed)}

    def not_programmed(self) -> dict[SkipReason, int]:
        """The service ports waiting for room (their version is not in the
        maps), by the reason that keeps them out: capacity."""
        return {SkipReason.CAPACITY: len(self._waiting)} if self._waiting else {}

    def service_port_of_ids(self) -> dict[int, ServicePortName | None]:
        """The frontend id of every programmed frontend, with the service port
        that owns it (None: recovered from the maps, not claimed yet)."""
        return {programmed.frontend_id: self._owners.get(frontend)
                for frontend, programmed in self._frontends.items()}

    def _reset(self) -> None:
        # Each frontend with its endpoints (Programmed.targets): an endpoint is
        # identified by its value (target, frontend id, affinity group), as in
        # the map, and only a frontend's own endpoints carry its frontend id.
        self._frontends: dict[KeyedFrontend, Programmed] = {}
        # Endpoints of a frontend that no slot names (recovered after a failed
        # write), by id with their packed value: reused or deleted when the
        # frontend is next programmed.
        self._unnamed: dict[KeyedFrontend, dict[int, bytes]] = {}
        # Who owns each programmed frontend, as the change sets said (none:
        # recovered from the maps, not claimed yet).
        self._owners: dict[KeyedFrontend, ServicePortName] = {}
        # The service ports whose version does not fit the maps, retried with
        # every later change set (their problem reported once per version).
        self._waiting: dict[ServicePortName, ServicePort] = {}
        # Entries recovered from the maps that no frontend explains (what a
        # crash between two write steps leaves), packed; the next full change
        # set deletes them.
        self._stray_keys = b""
        self._stray_endpoints: list[int] = []
        self.service_entries = 0
        self.endpoint_entries = 0
        self._last_stages: Mapping[str, float] = types.MappingProxyType(
            {"plan_ms": 0.0, "write_ms": 0.0})

    def _recover(self) -> None:
        """Rebuild the mirror (and the ids in use) from the maps."""
        self._reset()
        recovered = read_contents(self._services, self._endpoints_map).recovered()
        self._frontends = dict(recovered.frontends)
        self._unnamed = {frontend: dict(by_id) for frontend, by_id in recovered.unnamed.items()}
        self._stray_keys = b"".join(bytes(key) for key in recovered.stray_keys)
        self._stray_endpoints = list(recovered.stray_endpoints)
        self.service_entries = sum(1 + p.slot_count for p in self._frontends.values()) + len(
            recovered.stray_keys)
        self._frontend_ids = IdAllocator(
            (p.frontend_id for p in self._frontends.values()), self._capacity.max_id)
        self._endpoint_id_pool = IdAllocator(
            itertools.chain(recovered.adopted_endpoint_ids(), recovered.stray_endpoints),
            self._capacity.max_id)
        # Strays are no adopted endpoint's: the ids are the entries.
        self.endpoint_entries = self._endpoint_id_pool.in_use()
        log.info("recovered the programmed services from the pinned maps", extra=fields(
            frontends=len(self._frontends),
            endpoints=self.endpoint_entries - len(recovered.stray_endpoints),
            stray_entries=len(recovered.stray_keys) + len(self._stray_endpoints)))

    # -- planning --------------------------------------------------------------

    def apply(self, changes: ServicePortChanges) -> MapWrites:
        """Write one change set; returns what was written (with the (frontend
        id, endpoint) pairs UDP frontends lost). The service ports are
        planned and written in rounds (of ROUND_PORTS), each in the no-gap
        order, so a full sync never holds all of its writes at once; while a
        round is written (in a thread: the batch calls leave the GIL), the
        next is planned, and written only after it. On a failed write, or a
        change set that gives an owned frontend to another port
        (FrontendClaimedTwice), the mirror is re-read from the maps once the
        round being written has ended (so the entry counts are what the maps
        hold) and the error raised; the next full change set repairs the
        maps."""
        started = time.perf_counter()
        writes, stages = MapWrites(), {"plan_ms": 0.0, "write_ms": 0.0}
        todo: list[tuple[ServicePort, tuple[KeyedFrontend, ...], ServicePort | None]] = []
        done = 0  # the ports of the rounds written or being written
        writer: ThreadPoolExecutor | None = None
        in_flight: Future | None = None
        try:
            # Removed and updated ports stop waiting in _plan_incremental.
            ports = changes.added if changes.full else self._plan_incremental(changes, writes)
            waiting, self._waiting = self._waiting, {}
            todo = [(port, keyed_frontends(port), waiting.pop(port.name, None)) for port in ports]
            if changes.full:
                self._plan_full(todo, writes)
            else:
                # Ports still waiting from earlier change sets, retried after
                # these (a full change set lists every port there is).
                todo += [(earlier, keyed_frontends(earlier), earlier)
                         for earlier in sorted(waiting.values(),
                                               key=lambda w: w.name.sort_key())]
            if len(todo) > self._round_ports:
                writer = ThreadPoolExecutor(1, thread_name_prefix="kpng-map-writer")
            while True:
                for port, keyed, earlier in todo[done:done + self._round_ports]:
                    self._program_port(port, frontends_of(port, keyed), writes,
                                       reported=earlier == port)
                flushing = time.perf_counter()
                stages["plan_ms"] += (flushing - started) * 1000
                planned = self._take_round(writes)
                if in_flight is not None:
                    in_flight.result()  # the previous round's OSError, if any
                    in_flight = None
                done = min(done + self._round_ports, len(todo))
                if writer is None or done == len(todo):
                    self._write_round(planned)
                else:
                    in_flight = writer.submit(self._write_round, planned)
                started = time.perf_counter()
                stages["write_ms"] += (started - flushing) * 1000
                if done == len(todo):
                    break
        except (OSError, FrontendClaimedTwice):
            if in_flight is not None:
                wait([in_flight])  # the maps are read once the round being written has ended
            self._recover_after_failure(earlier for _, _, earlier in todo[done:])
            raise
        finally:
            if writer is not None:
                writer.shutdown()  # after an error elsewhere, the round in flight ends first
            self._last_stages = types.MappingProxyType(stages)
        self._frontend_ids.settle()
        self._endpoint_id_pool.settle()
        return writes

    def _recover_after_failure(self, not_retried: Iterable[ServicePort | None]) -> None:
        """Re-read the maps; who owns which frontend and which ports wait
        for room stay known (the maps cannot say), for the ports the change
        set did not reach too."""
        owners, waiting = self._owners, self._waiting
        self._recover()
        self._owners = {f: owner for f, owner in owners.items() if f in self._frontends}
        self._waiting = waiting
        for earlier in not_retried:
            if earlier is not None:
                self._waiting.setdefault(earlier.name, earlier)

    def _plan_full(self, todo: Sequence[tuple[ServicePort, tuple[KeyedFrontend, ...], object]],
                   writes: MapWrites) -> None:
        claims = {(frontend, port.name) for port, keyed, _ in todo for frontend in keyed}
        wanted = {frontend for frontend, _ in claims}
        # The owners a full change set no longer names let go of their
        # frontends (the state handed them over); those it names keep them.
        self._owners = {f: owner for f, owner in self._owners.items() if (f, owner) in claims}
        for frontend in [f for f in self._frontends if f not in wanted]:
            self._remove_frontend(frontend, writes)
        # No connect() can reach a stray (a slot above its master's count, a
        # endpoint no valid slot names), so they go first, with the frontends
        # that are gone, and never collide with what this change set writes.
        writes.gone_slots += self._stray_keys
        for endpoint_id in self._stray_endpoints:
            writes.gone_endpoints += U32.pack(endpoint_id)
            self._endpoint_id_pool.release(endpoint_id)
            writes.released_endpoint_ids.append(endpoint_id)
        self.service_entries -= len(self._stray_keys) // SERVICE_KEY_SIZE
        self.endpoint_entries -= len(self._stray_endpoints)
        self._stray_keys, self._stray_endpoints = b"", []

    def _plan_incremental(self, changes: ServicePortChanges,
                          writes: MapWrites) -> list[ServicePort]:
        for port in changes.removed:
            self._remove_port(port, keep=(), writes=writes)
        for old, new in changes.updated:
            self._remove_port(old, keep=keyed_frontends(new), writes=writes)
        return list(changes.current())

    def _remove_port(self, port: ServicePort, keep: Iterable[KeyedFrontend],
                     writes: MapWrites) -> None:
        self._waiting.pop(port.name, None)
        for frontend in set(keyed_frontends(port)) - set(keep):
            if frontend in self._frontends:
                self._check_owner(frontend, port.name)
                self._remove_frontend(frontend, writes)

    def _remove_frontend(self, frontend: KeyedFrontend, writes: MapWrites) -> None:
        programmed = self._frontends.pop(frontend)
        self._owners.pop(frontend, None)
        writes.gone_masters += frontend.packed_key(0)
        for slot in range(1, programmed.slot_count + 1):
            writes.gone_slots += frontend.packed_key(slot)
        self.service_entries -= 1 + programmed.slot_count
        endpoints = self._endpoints_of(frontend, programmed)
        self._unnamed.pop(frontend, None)
        self._drop_endpoints(frontend, programmed.frontend_id, endpoints, writes.gone_endpoints,
                             writes)
        self.endpoint_entries -= len(endpoints)
        self._frontend_ids.release(programmed.frontend_id)
        writes.released_frontend_ids.append(programmed.frontend_id)

    def _endpoints_of(self, frontend: KeyedFrontend, programmed: Programmed) -> dict[int, bytes]:
        """The frontend's endpoints, named by a slot or not: id -> packed lb_l4addr."""
        endpoints = dict(programmed.endpoints())
        for endpoint_id, value in self._unnamed.get(frontend, {}).items():
            endpoints.setdefault(endpoint_id, endpoint_target(value))
        return endpoints

    def _drop_endpoints(self, frontend: KeyedFrontend, frontend_id: int,
                        targets: Mapping[int, bytes], into: bytearray, writes: MapWrites) -> None:
        """Delete endpoints of the frontend (id -> packed lb_l4addr) in the step of `into`."""
        for endpoint_id, target in targets.items():
            self._endpoint_id_pool.release(endpoint_id)
            writes.released_endpoint_ids.append(endpoint_id)
            into += U32.pack(endpoint_id)
            if frontend.protocol is Protocol.UDP:
                writes.removed_udp.add((frontend_id, HostPort.of_packed(target)))

    def _program_port(self, port: ServicePort, specs: FrontendSpecs, writes: MapWrites,
                      reported: bool) -> None:
        """Program the frontends of a service port, which the change set gives
        it (FrontendClaimedTwice when another port owns one). When they do
        not fit the maps (`capacity`), what the port had stays programmed,
        untouched, but for frontends whose affinity group lost its leader
        (`_drop_orphaned_members`); the port waits, retried with every later
        change set, and the problem is reported once per version of the port
        (`reported`: already, for this version)."""
        for frontend in specs:
            self._check_owner(frontend, port.name)
        groups = self._affinity_groups(specs)
        if self._as_programmed(specs, groups):
            for frontend in specs:
                self._claim(frontend, port.name, writes)
            return
        known = {frontend: self._known_endpoints(frontend, self._frontends[frontend])
                 for frontend in specs if frontend in self._frontends}
        no_room = self._capacity_problem(specs, groups, known)
        if no_room:
            self._drop_orphaned_members(specs, writes)
        new_leaders: dict[int, int] = {}  # IP version -> the new group's frontend id
        for frontend, spec in specs.items():
            if not no_room:
                version = frontend.ip_version
                group = groups[frontend]
                if group is LEADS:  # a new group: its leader comes first, then its members
                    group = new_leaders.get(version, LEADS)
                frontend_id = self._program_frontend(frontend, spec, writes, group,
                                                     known.get(frontend, {}))
                if group is LEADS:
                    new_leaders[version] = frontend_id
            elif frontend in self._unnamed:  # kept as it was, without what no slot names
                self._drop_unnamed(frontend, {}, writes)
            if frontend in self._frontends:  # programmed now, or kept as it was
                self._claim(frontend, port.name, writes)
        if not no_room:
            return
        if not reported:
            kept = any(frontend in self._frontends for frontend in specs)
            self._skips.skip(SkipReason.CAPACITY, f"service port {port.name}", no_room + (
                "; its previous version stays programmed" if kept else ""))
        self._waiting[port.name] = port

    def _check_owner(self, frontend: KeyedFrontend, name: ServicePortName) -> None:
        """`name` may program or remove `frontend` unless another service port
        owns it: the state gave it to one (FrontendClaimedTwice otherwise)."""
        owner = self._owners.get(frontend)
        if owner is not None and owner != name:
            raise FrontendClaimedTwice(frontend, owner, name)

    def _claim(self, frontend: KeyedFrontend, name: ServicePortName, writes: MapWrites) -> None:
        """`name` owns the programmed frontend (its frontend id is named so)."""
        if self._owners.get(frontend) != name:
            writes.named_frontend_ids.append((self._frontends[frontend].frontend_id, name))
        self._owners[frontend] = name

    def _as_programmed(self, specs: FrontendSpecs,
                       groups: Mapping[KeyedFrontend, int | None]) -> bool:
        """Whether every frontend is in the maps as `specs` and `groups` want
        it, every slot named and nothing unnamed to drop: what programming
        it would leave as it is. A restart's first change set, or a
        reconnect's, finds most ports so, and writes nothing for them."""
        for frontend, spec in specs.items():
            old = self._frontends.get(frontend)
            if (old is None or frontend in self._unnamed
                    or groups[frontend] != old.affinity_group
                    or (spec.affinity_timeout, spec.kind_flag) != (old.affinity_timeout,
                                                                   old.kind_flag)
                    or old.targets != b"".join(spec.targets)
                    or 0 in array(SLOT_IDS, old.slot_ids)):
                return False
        return True

    def _drop_orphaned_members(self, frontends: Iterable[KeyedFrontend], writes: MapWrites) -> None:
        """Of a port's frontends kept as they were, remove those whose affinity
        group is no longer the frontend id of one of them in their family: the
        leader is gone (the port no longer has it, or the frontends were
        recovered from another port's), its id is free, and a frontend that
        got it would share their affinity."""
        kept = {frontend: self._frontends[frontend] for frontend in frontends
                if frontend in self._frontends}
        leaders = {(frontend.ip_version, programmed.frontend_id)
                   for frontend, programmed in kept.items()}
        for frontend, programmed in kept.items():
            group = programmed.affinity_group
            if group and (frontend.ip_version, group) not in leaders:
                self._remove_frontend(frontend, writes)

    def _affinity_groups(self, specs: FrontendSpecs) -> dict[KeyedFrontend, int | None]:
        """The affinity group each frontend of a port will have: 0 without
        affinity; else the frontend id of the first frontend of its family,
        LEADS while that one has none yet (it is new)."""
        leaders: dict[int, int | None] = {}
        groups: dict[KeyedFrontend, int | None] = {}
        for frontend, spec in specs.items():
            if not spec.affinity_timeout:
                groups[frontend] = 0
                continue
            version = frontend.ip_version
            if version not in leaders:
                old = self._frontends.get(frontend)
                leaders[version] = old.frontend_id if old else LEADS
            groups[frontend] = leaders[version]
        return groups

    def _capacity_problem(self, specs: FrontendSpecs, groups: Mapping[KeyedFrontend, int | None],
                          known: Mapping[KeyedFrontend, Mapping[bytes, int]]) -> str:
        """Why the port does not fit, counting every entry this change set adds
        before it deletes any (the maps hold both during the update)."""
        services_needed = endpoints_needed = frontend_ids_needed = 0
        for frontend, (targets, _, _) in specs.items():
            if len(targets) > MAX_SLOTS:
                return (f"{frontend} has {len(targets)} endpoints; a frontend holds at most "
                        f"{MAX_SLOTS}")
            old = self._frontends.get(frontend)
            old_slots = old.slot_count if old else 0
            services_needed += (0 if old else 1) + max(0, len(targets) - old_slots)
            frontend_ids_needed += 0 if old else 1
            # A new frontend's frontend id (or a new group's) is not allocated
            # yet: none of its endpoints exists.
            group = groups[frontend]
            if old is None or group is LEADS:
                endpoints_needed += len(targets)
            else:
                owner, existing = endpoint_owner(old.frontend_id, group), known[frontend]
                endpoints_needed += sum(1 for t in targets if t + owner not in existing)
        for spec, used, needed, capacity in (
                (maps.SERVICES, self.service_entries, services_needed, self._capacity.services),
                (maps.ENDPOINTS, self.endpoint_entries, endpoints_needed,
                 self._capacity.endpoints)):
            if used + needed > capacity:
                return (f"map {spec.pin} is full ({used} of {capacity} entries used, "
                        f"{needed} more needed); raise {spec.size_flag}")
        for kind, pool, needed in (("frontend", self._frontend_ids, frontend_ids_needed),
                                   ("endpoint", self._endpoint_id_pool, endpoints_needed)):
            if needed > pool.available():
                return (f"no free {kind} id ({needed} needed, {pool.available()} of "
                        f"{pool.limit} free); ids that this change set frees are reused "
                        f"from the next one, which retries the port")
        return ""

    def _program_frontend(self, frontend: KeyedFrontend, spec: FrontendSpec, writes: MapWrites,
                          affinity_group: int | None, known: dict[bytes, int]) -> int:
        """Program one frontend (`affinity_group` LEADS: its own frontend id;
        `known`: its endpoints by packed value); its frontend id."""
        old = self._frontends.get(frontend)
        frontend_id = old.frontend_id if old else self._frontend_ids.allocate()
        group = frontend_id if affinity_group is LEADS else affinity_group
        owner = endpoint_owner(frontend_id, group)
        values = [target + owner for target in spec.targets]
        self._add_endpoints([value for value in dict.fromkeys(values) if value not in known],
                            known, writes)
        wanted = [known[value] for value in values]
        previous = old.slots if old else ()
        slots = assign_slots(previous, wanted)
        if slots == wanted:
            targets = b"".join(spec.targets)
        else:
            target_of = dict(zip(wanted, spec.targets))
            targets = b"".join(target_of[endpoint_id] for endpoint_id in slots)
        for index, endpoint_id in enumerate(slots):
            if index >= len(previous) or previous[index] != endpoint_id:
                writes.slot_keys += frontend.packed_key(index + 1)
                writes.slot_values += SLOT_VALUE.pack(endpoint_id, 0, 0, 0, 0)
        new = Programmed(frontend_id, packed_slot_ids(slots), targets, spec.affinity_timeout,
                         spec.kind_flag, group)
        if old is None or not old.same_master(new):
            writes.master_keys += frontend.packed_key(0)
            writes.master_values += bytes(new.master())
        for slot in range(len(slots) + 1, len(previous) + 1):
            writes.stale_slots += frontend.packed_key(slot)
        self.service_entries += (0 if old else 1) + max(0, len(slots) - len(previous))
        self._frontends[frontend] = new
        if old is not None and new.slot_ids != old.slot_ids:
            dropped = dict(old.endpoints())
            for endpoint_id in slots:
                dropped.pop(endpoint_id, None)
            self._drop_unnamed(frontend, dropped, writes)
        elif frontend in self._unnamed:
            self._drop_unnamed(frontend, {}, writes)
        return frontend_id

    def _drop_unnamed(self, frontend: KeyedFrontend, also: dict[int, bytes],
                      writes: MapWrites) -> None:
        """Delete (in step 5) the frontend's endpoints no slot names: `also`
        (id -> packed lb_l4addr) and those recovered unnamed that no slot
        names now either."""
        programmed = self._frontends[frontend]
        named = set(programmed.slots)
        also = dict(also)
        for endpoint_id, value in self._unnamed.pop(frontend, {}).items():
            if endpoint_id not in named:
                also.setdefault(endpoint_id, endpoint_target(value))
        self._drop_endpoints(frontend, programmed.frontend_id, also, writes.orphan_endpoints,
                             writes)

    def _known_endpoints(self, frontend: KeyedFrontend, old: Programmed) -> dict[bytes, int]:
        """The frontend's endpoints by packed value (lb_endpoint): those its
        slots name and those recovered unnamed."""
        known = {value: endpoint_id
                 for endpoint_id, value in self._unnamed.get(frontend, {}).items()}
        owner = endpoint_owner(old.frontend_id, old.affinity_group)
        known.update((target + owner, endpoint_id) for endpoint_id, target in old.endpoints())
        return known

    def _add_endpoints(self, values: list[bytes], known: dict[bytes, int],
                       writes: MapWrites) -> None:
        """New endpoints (packed lb_endpoint values) of a frontend, added to
        `known` (its endpoints by value) with their new ids."""
        if not values:
            return
        ids = self._endpoint_id_pool.allocate_many(len(values))
        known.update(zip(values, ids))
        writes.new_endpoint_keys += struct.pack(f"={len(ids)}I", *ids)
        writes.new_endpoint_values += b"".join(values)
        self.endpoint_entries += len(ids)

    # -- writing ---------------------------------------------------------------

    def _take_round(self, writes: MapWrites) -> RoundWrites:
        """The round's writes, taken out of the buffers, with the entries they
        delete taken off the counts."""
        planned = writes.take_round()
        self.service_entries -= planned.counts["stale_slots"]
        self.endpoint_entries -= planned.counts["orphan_endpoints"]
        return planned

    def _write_round(self, planned: RoundWrites) -> None:
        """A round's writes, in the no-gap order."""
        services, endpoints = self._services, self._endpoints_map
        services.delete_packed(planned.gone_masters + planned.gone_slots)
        endpoints.delete_packed(planned.gone_endpoints)
        endpoints.put_packed(planned.new_endpoint_keys, planned.new_endpoint_values)
        services.put_packed(planned.slot_keys, planned.slot_values)
        services.put_packed(planned.master_keys, planned.master_values)
        services.delete_packed(planned.stale_slots)
        endpoints.delete_packed(planned.orphan_endpoints)
        log.debug("maps written", extra=fields(**planned.counts))

