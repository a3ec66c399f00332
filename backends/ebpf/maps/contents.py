"""What the `services` and `backends` maps hold, as typed values.

The one reader of the maps the control plane writes: `ebpf dump` prints
what it reads, the programmer rebuilds its mirror (and the ids in use) from
it at start and after a failed write, and the stale-UDP terminator names
endpoints with its `HostPort`. Reading keeps every entry as it is;
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
    EndpointValue,
    L4Addr,
    RevNatKey,
    RevNatValue,
    ServiceKey,
    ServiceValue,
)
from kpng_py.model import Frontend, FrontendKind, IPAddress, Protocol, format_host_port

IPPROTO = {Protocol.TCP: socket.IPPROTO_TCP, Protocol.UDP: socket.IPPROTO_UDP}
PROTOCOL_OF = {number: protocol for protocol, number in IPPROTO.items()}
# A services key without its slot: the address, port, protocol and pads.
_PREFIX_SIZE = ServiceKey.slot.offset
# Packed entries, in native byte order as the maps hold them.
_SERVICE_KEY = struct.Struct(f"={_PREFIX_SIZE}sH")  # prefix, slot
_SLOT = struct.Struct("=H")
_SERVICE_VALUE = struct.Struct("=IIIII")  # id, count, affinity_timeout, flags, affinity_group
_ID = struct.Struct("=I")  # an id: an endpoint id (the key of `backends`), a frontend id
# What follows the lb_l4addr in an lb_endpoint: its frontend_id, affinity_group.
_ENDPOINT_OWNER = struct.Struct("=II")
TARGET_SIZE = ct.sizeof(L4Addr)
# The array type of Programmed.slot_ids: a u32 endpoint id each, as the maps' values hold them.
SLOT_IDS = "I"
_SLOT_ID_SIZE = array(SLOT_IDS).itemsize
_NO_TARGET = bytes(TARGET_SIZE)  # of a recovered slot that names no endpoint


def packed_slot_ids(endpoint_ids: Iterable[int]) -> bytes:
    """Endpoint ids as Programmed.slot_ids holds them."""
    return array(SLOT_IDS, endpoint_ids).tobytes()


@dataclass(frozen=True, order=True)
class HostPort:
    """An address and port as an lb_l4addr holds them, without a protocol:
    an endpoint's target (the model's `Endpoint` without its flags), the
    address and port of a frontend as its key holds them
    (`StoredFrontend.vip`), or a VIP as a client dialled it (`ebpf trace`).
    A frontend with its protocol is a `KeyedFrontend`, which holds the
    model's `Frontend`."""

    ip: IPAddress
    port: int
    # ipaddress hashes through hex(), too slowly for dicts of every endpoint
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
        """From the bytes of an lb_l4addr (an endpoint's target)."""
        return cls.of(L4Addr.from_buffer_copy(target))

    def __str__(self) -> str:
        return format_host_port(self.ip, self.port)


@dataclass(frozen=True)
class KeyedFrontend:
    """A frontend (the model's `Frontend`: the address, port and protocol a
    socket dials) as the `services` map keys it: its address and port as an
    lb_l4addr, its protocol, then a slot.

    Two are equal exactly when their keys are: 10.96.0.10 and
    ::ffff:10.96.0.10, or fd00::1%a and fd00::1%b, are different Frontends
    to Python but one key to the datapath, so one KeyedFrontend here, which
    one service port at a time may own. (The state model refuses those
    spellings, and the maps hold none: in practice the two agree.)"""

    frontend: Frontend = field(compare=False)
    # What every key of this frontend starts with (computed once: a frontend
    # has a key per slot, and a full sync makes hundreds of thousands).
    _key_prefix: bytes = field(init=False, repr=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        frontend = self.frontend
        prefix = ServiceKey.frontend_prefix(L4Addr.of(frontend.ip, frontend.port),
                                            IPPROTO[frontend.protocol])
        object.__setattr__(self, "_key_prefix", prefix)
        object.__setattr__(self, "_hash", hash(prefix))

    def __hash__(self) -> int:
        return self._hash

    @property
    def protocol(self) -> Protocol:
        return self.frontend.protocol

    @property
    def ip_version(self) -> int:
        """The IP version of its address (the family of its endpoints)."""
        return self.frontend.ip.version

    def key(self, slot: int) -> ServiceKey:
        return ServiceKey.at_slot(self._key_prefix, slot)

    def packed_key(self, slot: int) -> bytes:
        """The bytes of `key(slot)`, without the ctypes object."""
        return self._key_prefix + _SLOT.pack(slot)

    def __str__(self) -> str:
        return str(self.frontend)


@dataclass(frozen=True, slots=True)
class Programmed:
    """A frontend as the maps hold it."""

    frontend_id: int
    # The endpoint id of slot i+1, packed (packed_slot_ids: a u32 each, an int
    # object each would cost ten times that); 0 where a recovered slot was missing.
    slot_ids: bytes
    # The packed lb_l4addr of each slot's endpoint (TARGET_SIZE bytes per slot,
    # zeros where a slot was missing): with the frontend id and the affinity
    # group, which every endpoint of the frontend shares, what its entry holds.
    # Kept once per frontend, not as an object per endpoint.
    targets: bytes
    affinity_timeout: int
    kind_flag: int = 0  # maps.KIND_FLAGS of the frontend's kind
    # With affinity: the frontend id of the first frontend of its service
    # port and family (lb_maps.h); 0 without.
    affinity_group: int = 0

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(array(SLOT_IDS, self.slot_ids))

    @property
    def slot_count(self) -> int:
        return len(self.slot_ids) // _SLOT_ID_SIZE

    def master(self) -> ServiceValue:
        return ServiceValue(id=self.frontend_id, count=self.slot_count,
                            affinity_timeout=self.affinity_timeout,
                            flags=(maps.SVC_F_AFFINITY if self.affinity_timeout else 0)
                            | self.kind_flag, affinity_group=self.affinity_group)

    def endpoints(self) -> Iterator[tuple[int, bytes]]:
        """(endpoint id, packed lb_l4addr) of every slot that names one."""
        targets = self.targets
        for index, endpoint_id in enumerate(array(SLOT_IDS, self.slot_ids)):
            if endpoint_id:
                yield endpoint_id, targets[index * TARGET_SIZE:(index + 1) * TARGET_SIZE]

    def same_master(self, other: Programmed) -> bool:
        return (self.frontend_id, self.slot_count, self.affinity_timeout, self.kind_flag,
                self.affinity_group) == (other.frontend_id, other.slot_count,
                                         other.affinity_timeout, other.kind_flag,
                                         other.affinity_group)


@dataclass(frozen=True)
class StoredEndpoint:
    """An entry of `backends`: where a slot sends, and whose slot it is."""

    target: HostPort
    frontend_id: int

    @classmethod
    def of(cls, raw: bytes) -> StoredEndpoint:
        """From an entry's packed value."""
        return cls(HostPort.of_packed(endpoint_target(raw)), endpoint_frontend_id(raw))


def endpoint_owner(frontend_id: int, affinity_group: int) -> bytes:
    """What follows the target in the packed lb_endpoint of every endpoint of a
    frontend: target + owner is the value that identifies its endpoint id."""
    return _ENDPOINT_OWNER.pack(frontend_id, affinity_group)


def endpoint_target(raw: bytes) -> bytes:
    """The packed lb_l4addr of a packed `backends` value."""
    return raw[:TARGET_SIZE]


def endpoint_frontend_id(raw: bytes) -> int:
    """The frontend id of a packed `backends` value."""
    return _ID.unpack_from(raw, EndpointValue.frontend_id.offset)[0]


@dataclass(frozen=True)
class StoredFrontend:
    """A master entry of `services` with every slot entry of its key prefix
    (those above its count too), whatever they hold."""

    master_key: ServiceKey
    master: ServiceValue
    slots: Mapping[int, int]  # slot number -> endpoint id

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

    def endpoint_ids(self) -> list[int | None]:
        """The endpoint id of slots 1..count; None where a slot is missing."""
        return [self.slots.get(slot) for slot in range(1, self.master.count + 1)]

    def frontend(self) -> KeyedFrontend | None:
        """The frontend of these keys; None when no frontend has such keys
        (a protocol the programs do not serve, pad bytes that are not 0)."""
        protocol = self.protocol
        if protocol is None or self.master_key.pad or self.master_key.vip.pad:
            return None
        return KeyedFrontend(Frontend(self.vip.ip, self.vip.port, protocol))

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

    frontends: Mapping[KeyedFrontend, Programmed]
    # The endpoints no slot names yet (or any more) that carry the frontend id
    # of a recovered frontend (what a write that failed between steps 1 and
    # 5 left), by id with their packed values, which the next change set
    # that programs the frontend reuses or deletes. Those a slot names are
    # in its Programmed (id and target): nothing is kept per endpoint twice.
    unnamed: Mapping[KeyedFrontend, Mapping[int, bytes]]
    stray_keys: tuple[ServiceKey, ...]
    stray_endpoints: tuple[int, ...]

    def adopted_endpoint_ids(self) -> Iterator[int]:
        """The ids of the endpoints adopted: named by a slot (an id named by
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
    endpoints: Mapping[int, bytes]  # endpoint id -> packed value

    def endpoint(self, endpoint_id: int | None) -> StoredEndpoint | None:
        """The endpoint with this id, or None when there is none."""
        raw = self.endpoints.get(endpoint_id) if endpoint_id is not None else None
        return StoredEndpoint.of(raw) if raw is not None else None

    def recovered(self) -> Recovered:
        """A master is adopted with its slots 1..count when its keys are a
        frontend's and its frontend id is neither 0 nor taken by a frontend
        sorted before it; a slot is adopted as missing (0) when it names no
        endpoint of that frontend (one with its frontend id and affinity
        group); an endpoint with the frontend id of an adopted master is adopted
        with it. Every other entry is a stray."""
        frontends: dict[KeyedFrontend, Programmed] = {}
        named: set[int] = set()
        strays = list(self.masterless_slots)
        frontend_ids: dict[int, KeyedFrontend] = {}
        for stored in self.frontends:
            frontend, frontend_id = stored.frontend(), stored.master.id
            if frontend is None or frontend_id == 0 or frontend_id in frontend_ids:
                strays += stored.keys()
                continue
            frontend_ids[frontend_id] = frontend
            slots, targets = self._adopt_slots(stored, named)
            strays += stored.slot_keys(s for s in stored.slots if s > stored.master.count)
            frontends[frontend] = Programmed(frontend_id, slots, targets, stored.affinity_timeout,
                                             stored.master.flags & maps.SVC_F_KINDS,
                                             stored.affinity_group)
        unnamed: dict[KeyedFrontend, dict[int, bytes]] = {}
        stray_endpoints = []
        for endpoint_id, raw in self.endpoints.items():
            if endpoint_id in named:
                continue
            owner = frontend_ids.get(endpoint_frontend_id(raw))
            if owner is None:
                stray_endpoints.append(endpoint_id)
            else:
                unnamed.setdefault(owner, {})[endpoint_id] = raw
        return Recovered(frontends, unnamed, tuple(strays), tuple(stray_endpoints))

    def _adopt_slots(self, stored: StoredFrontend, named: set[int]) -> tuple[bytes, bytes]:
        """The endpoint id of each slot 1..count (packed), 0 where the slot is missing or
        names no endpoint of the frontend (one that carries its frontend id and
        affinity group, as all its endpoints do), and their packed targets;
        the endpoints named are added to `named`. One pass over the slots (a
        restart adopts every endpoint of the node)."""
        owner = endpoint_owner(stored.master.id, stored.affinity_group)
        endpoints, slots, targets = self.endpoints, [], []
        for endpoint_id in stored.endpoint_ids():
            if (endpoint_id is not None and (raw := endpoints.get(endpoint_id)) is not None
                    and raw[TARGET_SIZE:] == owner):
                slots.append(endpoint_id)
                targets.append(raw[:TARGET_SIZE])
                named.add(endpoint_id)
            else:
                slots.append(0)
                targets.append(_NO_TARGET)
        return packed_slot_ids(slots), b"".join(targets)


def read_contents(services: MapAccess[ServiceKey, ServiceValue],
                  endpoints: MapAccess[int, EndpointValue]) -> Contents:
    """Both maps, read once each as packed entries: an object per frontend,
    none per slot or endpoint."""
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
    endpoint_keys, endpoint_values = endpoints.read_packed()
    size = ct.sizeof(EndpointValue)
    return Contents(tuple(frontends), masterless, {
        endpoint_id: endpoint_values[i * size:(i + 1) * size]
        for i, (endpoint_id,) in enumerate(_ID.iter_unpack(endpoint_keys))})


def reached_through(reverse_nat: MapAccess[RevNatKey, RevNatValue], cookie: int,
                    endpoint: HostPort) -> int | None:
    """The service through which the socket with this cookie reached the
    endpoint (its reverse-NAT entry), or None when it has no entry."""
    entry = reverse_nat.get(RevNatKey(cookie=cookie, endpoint=endpoint.l4addr()))
    return entry.frontend_id if entry is not None else None
