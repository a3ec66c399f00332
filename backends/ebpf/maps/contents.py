"""What the `services` and `backends` maps hold, as typed values.

The one reader of the maps the control plane writes: `ebpf dump` prints
what it reads, the programmer rebuilds its mirror (and the ids in use) from
it at start and after a failed write, and the stale-UDP terminator names
backends with its `HostPort`. Reading keeps every entry as it is;
`Contents.recovered()` says which of them a connect() can reach (what the
programmer adopts) and which are strays (what a crash between two write
steps, or a neighbour, leaves).
"""

from __future__ import annotations

import ctypes as ct
import socket
import struct
from array import array
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Iterator, Mapping

from backends.ebpf.maps import layout as maps
from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.layout import (
    BackendValue,
    L4Addr,
    RevNatKey,
    RevNatValue,
    ServiceKey,
    ServiceValue,
)
from kpng_py.model import FrontendKind, IPAddress, Protocol, format_host_port

IPPROTO = {Protocol.TCP: socket.IPPROTO_TCP, Protocol.UDP: socket.IPPROTO_UDP}
PROTOCOL_OF = {number: protocol for protocol, number in IPPROTO.items()}
# A services key without its slot: the address, port, protocol and pads.
_PREFIX_SIZE = ServiceKey.slot.offset
# Packed entries, in native byte order as the maps hold them.
_SERVICE_KEY = struct.Struct(f"={_PREFIX_SIZE}sH")  # prefix, slot
_SLOT = struct.Struct("=H")
_SERVICE_VALUE = struct.Struct("=IIIII")  # id, count, affinity_timeout, flags, affinity_group
_SERVICE_ID = struct.Struct("=I")  # a backend id (the key of `backends`), a service id
# What follows the lb_l4addr in an lb_backend: its service_id, affinity_group.
_BACKEND_OWNER = struct.Struct("=II")
TARGET_SIZE = ct.sizeof(L4Addr)
# The array type of Programmed.slot_ids: a u32 backend id each, as the maps' values hold them.
SLOT_IDS = "I"
_SLOT_ID_SIZE = array(SLOT_IDS).itemsize
_NO_TARGET = bytes(TARGET_SIZE)  # of a recovered slot that names no backend


def packed_slot_ids(backend_ids: Iterable[int]) -> bytes:
    """Backend ids as Programmed.slot_ids holds them."""
    return array(SLOT_IDS, backend_ids).tobytes()


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

    @classmethod
    def of(cls, addr: L4Addr) -> HostPort:
        return cls(addr.ip, addr.host_port)

    @classmethod
    def of_packed(cls, target: bytes) -> HostPort:
        """From the bytes of an lb_l4addr (a backend's target)."""
        return cls.of(L4Addr.from_buffer_copy(target))

    def __str__(self) -> str:
        return format_host_port(self.ip, self.port)


@dataclass(frozen=True)
class FrontendKeys:
    """What a socket dials: a frontend's address (ClusterIP, ExternalIP,
    load-balancer IP, or the wildcard of a node port), port, protocol.

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

    def packed_key(self, slot: int) -> bytes:
        """The bytes of `key(slot)`, without the ctypes object."""
        return self._key_prefix + _SLOT.pack(slot)

    def __str__(self) -> str:
        return f"{self.vip}/{self.protocol.value}"


@dataclass(frozen=True, slots=True)
class Programmed:
    """A frontend as the maps hold it."""

    service_id: int
    # The backend id of slot i+1, packed (packed_slot_ids: a u32 each, an int
    # object each would cost ten times that); 0 where a recovered slot was missing.
    slot_ids: bytes
    # The packed lb_l4addr of each slot's backend (TARGET_SIZE bytes per slot,
    # zeros where a slot was missing): with the service id and the affinity
    # group, which every backend of the frontend shares, what its entry holds.
    # Kept once per frontend, not as an object per backend.
    targets: bytes
    affinity_timeout: int
    kind_flag: int = 0  # maps.KIND_FLAGS of the frontend's kind
    # With affinity: the service id of the first frontend of its service
    # port and family (lb_maps.h); 0 without.
    affinity_group: int = 0

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(array(SLOT_IDS, self.slot_ids))

    @property
    def slot_count(self) -> int:
        return len(self.slot_ids) // _SLOT_ID_SIZE

    def master(self) -> ServiceValue:
        return ServiceValue(id=self.service_id, count=self.slot_count,
                            affinity_timeout=self.affinity_timeout,
                            flags=(maps.SVC_F_AFFINITY if self.affinity_timeout else 0)
                            | self.kind_flag, affinity_group=self.affinity_group)

    def backends(self) -> Iterator[tuple[int, bytes]]:
        """(backend id, packed lb_l4addr) of every slot that names one."""
        targets = self.targets
        for index, backend_id in enumerate(array(SLOT_IDS, self.slot_ids)):
            if backend_id:
                yield backend_id, targets[index * TARGET_SIZE:(index + 1) * TARGET_SIZE]

    def same_master(self, other: Programmed) -> bool:
        return (self.service_id, self.slot_count, self.affinity_timeout, self.kind_flag,
                self.affinity_group) == (other.service_id, other.slot_count,
                                         other.affinity_timeout, other.kind_flag,
                                         other.affinity_group)


@dataclass(frozen=True)
class StoredBackend:
    """An entry of `backends`: where a slot sends, and whose slot it is."""

    target: HostPort
    service_id: int

    @classmethod
    def of(cls, raw: bytes) -> StoredBackend:
        """From an entry's packed value."""
        return cls(HostPort.of_packed(backend_target(raw)), backend_service_id(raw))


def backend_owner(service_id: int, affinity_group: int) -> bytes:
    """What follows the target in the packed lb_backend of every backend of a
    frontend: target + owner is the value that identifies its backend id."""
    return _BACKEND_OWNER.pack(service_id, affinity_group)


def backend_target(raw: bytes) -> bytes:
    """The packed lb_l4addr of a packed `backends` value."""
    return raw[:TARGET_SIZE]


def backend_service_id(raw: bytes) -> int:
    """The service id of a packed `backends` value."""
    return _SERVICE_ID.unpack_from(raw, BackendValue.service_id.offset)[0]


@dataclass(frozen=True)
class StoredFrontend:
    """A master entry of `services` with every slot entry of its key prefix
    (those above its count too), whatever they hold."""

    master_key: ServiceKey
    master: ServiceValue
    slots: Mapping[int, int]  # slot number -> backend id

    @cached_property  # sorting and adopting ask for it: made once, from ctypes
    def vip(self) -> HostPort:
        return HostPort.of(self.master_key.vip)

    @property
    def proto(self) -> int:
        return self.master_key.proto

    @property
    def protocol(self) -> Protocol | None:
        return PROTOCOL_OF.get(self.proto)

    @property
    def affinity_timeout(self) -> int:
        """The timeout the datapath applies: none without the affinity flag."""
        return self.master.affinity_timeout if self.master.flags & maps.SVC_F_AFFINITY else 0

    @property
    def affinity_group(self) -> int:
        """The group the datapath keys affinity by: none without the flag."""
        return self.master.affinity_group if self.master.flags & maps.SVC_F_AFFINITY else 0

    @property
    def kind(self) -> FrontendKind | None:
        """The kind of frontend its flags say; None when they say what no
        programmer writes: two kinds, or a node port at another address than
        the wildcard (or the wildcard, which only node ports have, without
        the flag)."""
        kind = maps.kind_of_flags(self.master.flags)
        wildcard = self.vip.ip.is_unspecified
        return kind if wildcard == (kind is FrontendKind.NODE_PORT) else None

    def backend_ids(self) -> list[int | None]:
        """The backend id of slots 1..count; None where a slot is missing."""
        return [self.slots.get(slot) for slot in range(1, self.master.count + 1)]

    def frontend(self) -> FrontendKeys | None:
        """The frontend of these keys; None when no frontend has such keys
        (a protocol the programs do not serve, pad bytes that are not 0)."""
        if self.protocol is None or self.master_key.pad or self.master_key.vip.pad:
            return None
        return FrontendKeys(self.vip, self.protocol)

    def keys(self) -> Iterator[ServiceKey]:
        yield self.master_key
        yield from self.slot_keys(self.slots)

    def slot_keys(self, slots: Iterable[int]) -> Iterator[ServiceKey]:
        prefix = bytes(self.master_key)[:_PREFIX_SIZE]
        return (ServiceKey.at_slot(prefix, slot) for slot in slots)

    def sort_key(self) -> tuple:
        vip = self.vip
        return vip.ip.version, int(vip.ip), vip.port, self.proto, bytes(self.master_key)


@dataclass(frozen=True)
class Recovered:
    """What a connect() can reach, as the programmer adopts it, and the rest."""

    frontends: Mapping[FrontendKeys, Programmed]
    # The backends no slot names yet (or any more) that carry the service id
    # of a recovered frontend (what a write that failed between steps 1 and
    # 5 left), by id with their packed values, which the next change set
    # that programs the frontend reuses or deletes. Those a slot names are
    # in its Programmed (id and target): nothing is kept per backend twice.
    unnamed: Mapping[FrontendKeys, Mapping[int, bytes]]
    stray_keys: tuple[ServiceKey, ...]
    stray_backends: tuple[int, ...]

    def adopted_backend_ids(self) -> Iterator[int]:
        """The ids of the backends adopted: named by a slot (an id named by
        two slots comes twice), or unnamed."""
        for programmed in self.frontends.values():
            yield from filter(None, array(SLOT_IDS, programmed.slot_ids))  # 0: a missing slot
        for by_id in self.unnamed.values():
            yield from by_id


@dataclass(frozen=True)
class Contents:
    """Every entry of the two maps."""

    frontends: tuple[StoredFrontend, ...]  # by address, port and protocol
    masterless_slots: tuple[ServiceKey, ...]
    backends: Mapping[int, bytes]  # backend id -> packed value

    def backend(self, backend_id: int | None) -> StoredBackend | None:
        """The backend with this id, or None when there is none."""
        raw = self.backends.get(backend_id) if backend_id is not None else None
        return StoredBackend.of(raw) if raw is not None else None

    def recovered(self) -> Recovered:
        """A master is adopted with its slots 1..count when its keys are a
        frontend's and its service id is neither 0 nor taken by a frontend
        sorted before it; a slot is adopted as missing (0) when it names no
        backend of that frontend (one with its service id and affinity
        group); a backend with the service id of an adopted master is adopted
        with it. Every other entry is a stray."""
        frontends: dict[FrontendKeys, Programmed] = {}
        named: set[int] = set()
        strays = list(self.masterless_slots)
        service_ids: dict[int, FrontendKeys] = {}
        for stored in self.frontends:
            frontend, service_id = stored.frontend(), stored.master.id
            if frontend is None or service_id == 0 or service_id in service_ids:
                strays += stored.keys()
                continue
            service_ids[service_id] = frontend
            slots, targets = self._adopt_slots(stored, named)
            strays += stored.slot_keys(s for s in stored.slots if s > stored.master.count)
            frontends[frontend] = Programmed(service_id, slots, targets, stored.affinity_timeout,
                                             stored.master.flags & maps.SVC_F_KINDS,
                                             stored.affinity_group)
        unnamed: dict[FrontendKeys, dict[int, bytes]] = {}
        stray_backends = []
        for backend_id, raw in self.backends.items():
            if backend_id in named:
                continue
            owner = service_ids.get(backend_service_id(raw))
            if owner is None:
                stray_backends.append(backend_id)
            else:
                unnamed.setdefault(owner, {})[backend_id] = raw
        return Recovered(frontends, unnamed, tuple(strays), tuple(stray_backends))

    def _adopt_slots(self, stored: StoredFrontend, named: set[int]) -> tuple[bytes, bytes]:
        """The backend id of each slot 1..count (packed), 0 where the slot is missing or
        names no backend of the frontend (one that carries its service id and
        affinity group, as all its backends do), and their packed targets;
        the backends named are added to `named`. One pass over the slots (a
        restart adopts every backend of the node)."""
        owner = backend_owner(stored.master.id, stored.affinity_group)
        backends, slots, targets = self.backends, [], []
        for backend_id in stored.backend_ids():
            if (backend_id is not None and (raw := backends.get(backend_id)) is not None
                    and raw[TARGET_SIZE:] == owner):
                slots.append(backend_id)
                targets.append(raw[:TARGET_SIZE])
                named.add(backend_id)
            else:
                slots.append(0)
                targets.append(_NO_TARGET)
        return packed_slot_ids(slots), b"".join(targets)


def read_contents(services: MapAccess[ServiceKey, ServiceValue],
                  backends: MapAccess[int, BackendValue]) -> Contents:
    """Both maps, read once each as packed entries: an object per frontend,
    none per slot or backend."""
    masters: dict[bytes, tuple[int, int, int, int, int]] = {}
    slots: dict[bytes, dict[int, int]] = {}
    keys, values = services.read_packed()
    for (prefix, slot), value in zip(_SERVICE_KEY.iter_unpack(keys),
                                     _SERVICE_VALUE.iter_unpack(values)):
        if slot == 0:
            masters[prefix] = value
        else:
            slots.setdefault(prefix, {})[slot] = value[0]
    frontends = sorted((StoredFrontend(ServiceKey.at_slot(prefix, 0), ServiceValue(*value),
                                       slots.pop(prefix, {}))
                        for prefix, value in masters.items()),
                       key=StoredFrontend.sort_key)
    masterless = tuple(ServiceKey.at_slot(prefix, slot)
                       for prefix, by_slot in slots.items() for slot in by_slot)
    backend_keys, backend_values = backends.read_packed()
    size = ct.sizeof(BackendValue)
    return Contents(tuple(frontends), masterless, {
        backend_id: backend_values[i * size:(i + 1) * size]
        for i, (backend_id,) in enumerate(_SERVICE_ID.iter_unpack(backend_keys))})


def reached_through(reverse_nat: MapAccess[RevNatKey, RevNatValue], cookie: int,
                    backend: HostPort) -> int | None:
    """The service through which the socket with this cookie reached the
    backend (its reverse-NAT entry), or None when it has no entry."""
    entry = reverse_nat.get(RevNatKey(cookie=cookie, backend=backend.l4addr()))
    return entry.service_id if entry is not None else None
