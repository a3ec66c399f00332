"""ctypes mirrors of bpf/lb_maps.h, and the specification of every map.

This is the only Python definition of the map layouts; tests/ebpf/maps/test_layout.py
checks every size and offset against the C header compiled by gcc.
"""

from __future__ import annotations

import ctypes as ct
import ipaddress
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from kpng_py import model
from kpng_py.model import FrontendKind, IPAddress, format_host_port

if TYPE_CHECKING:
    from backends.ebpf.maps.libbpf import MapInfo

# Where the maps and links are pinned unless --bpffs-dir says otherwise.
DEFAULT_PIN_DIR = Path("/sys/fs/bpf/kpng-py")

# enum bpf_map_type and map flags (uapi/linux/bpf.h)
BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PERCPU_HASH = 5
BPF_MAP_TYPE_LRU_HASH = 9
BPF_MAP_TYPE_RINGBUF = 27
BPF_F_NO_PREALLOC = 1

_V4_MAPPED_PREFIX = model.V4_MAPPED_PREFIX
# What follows an lb_l4addr's address and port (`Endpoints.targets`).
L4ADDR_PAD = bytes(2)
# An lb_l4addr of each family in one pack: the address (IPv4 after its
# mapped prefix), the port and the padding, in network order.
_V4_L4ADDR = struct.Struct("!12sIHH")
_V6_L4ADDR = struct.Struct("!16sHH")


def packed_address(ip: IPAddress) -> bytes:
    """The 16-byte address format of every map: IPv4 as ::ffff:a.b.c.d (the
    model's packed address without its version byte)."""
    return model.packed_address(ip)[1:]


def packed_l4addr(ip: IPAddress, port: int) -> bytes:
    """The 20 bytes of an lb_l4addr (address and port in network order)."""
    if ip.version == 4:
        return _V4_L4ADDR.pack(_V4_MAPPED_PREFIX, int(ip), port, 0)
    return _V6_L4ADDR.pack(ip.packed, port, 0)


def unpacked_address(raw: bytes) -> IPAddress:
    """The address of the 16-byte map format (packed_address)."""
    if raw[:12] == _V4_MAPPED_PREFIX:
        return ipaddress.IPv4Address(raw[12:])
    return ipaddress.IPv6Address(raw)


class L4Addr(ct.Structure):
    """struct lb_l4addr (20 bytes): address words and port in network order."""

    _fields_ = [("addr", ct.c_uint32 * 4), ("port", ct.c_uint16), ("pad", ct.c_uint16)]

    @classmethod
    def of(cls, ip: IPAddress, port: int) -> L4Addr:
        # One copy from bytes: the control plane builds hundreds of thousands.
        return cls.from_buffer_copy(packed_l4addr(ip, port))

    @property
    def ip(self) -> IPAddress:
        return unpacked_address(bytes(self.addr))

    @property
    def host_port(self) -> int:
        return socket.ntohs(self.port)

    def __str__(self) -> str:
        return format_host_port(self.ip, self.host_port)


class ServiceKey(ct.Structure):
    """struct lb_service_key (24 bytes)."""

    _fields_ = [("vip", L4Addr), ("proto", ct.c_uint8), ("pad", ct.c_uint8),
                ("slot", ct.c_uint16)]

    @staticmethod
    def frontend_prefix(vip: L4Addr, proto: int) -> bytes:
        """The bytes all slot keys of one frontend share: all but the slot."""
        return bytes(vip) + bytes((proto, 0))

    @classmethod
    def at_slot(cls, prefix: bytes, slot: int) -> ServiceKey:
        return cls.from_buffer_copy(prefix + slot.to_bytes(2, sys.byteorder))


class ServiceValue(ct.Structure):
    """struct lb_service_value (20 bytes): a master entry or a slot."""

    _fields_ = [("id", ct.c_uint32), ("count", ct.c_uint32),
                ("affinity_timeout", ct.c_uint32), ("flags", ct.c_uint32),
                ("affinity_group", ct.c_uint32)]


# Master entry flags (LB_SVC_F_*).
SVC_F_AFFINITY = 0x1
SVC_F_EXTERNAL_IP = 0x2
SVC_F_LOAD_BALANCER_IP = 0x4
SVC_F_NODE_PORT = 0x8
# The kind flag of each kind of frontend (a ClusterIP has none).
KIND_FLAGS = {FrontendKind.CLUSTER_IP: 0, FrontendKind.EXTERNAL_IP: SVC_F_EXTERNAL_IP,
              FrontendKind.LOAD_BALANCER_IP: SVC_F_LOAD_BALANCER_IP,
              FrontendKind.NODE_PORT: SVC_F_NODE_PORT}
SVC_F_KINDS = SVC_F_EXTERNAL_IP | SVC_F_LOAD_BALANCER_IP | SVC_F_NODE_PORT
_KIND_OF_FLAG = {flag: kind for kind, flag in KIND_FLAGS.items()}


def kind_of_flags(flags: int) -> FrontendKind | None:
    """The kind of frontend a master's flags say; None when they set more
    than one kind bit (no programmer writes that)."""
    return _KIND_OF_FLAG.get(flags & SVC_F_KINDS)


EndpointKey = ct.c_uint32


class EndpointValue(ct.Structure):
    """struct lb_endpoint (28 bytes): one endpoint of one frontend, an entry
    of the map pinned as `backends`."""

    _fields_ = [("addr", L4Addr), ("frontend_id", ct.c_uint32),
                ("affinity_group", ct.c_uint32)]


class RevNatKey(ct.Structure):
    """struct lb_revnat_key (32 bytes)."""

    _fields_ = [("cookie", ct.c_uint64), ("endpoint", L4Addr), ("pad", ct.c_uint32)]


class RevNatValue(ct.Structure):
    """struct lb_revnat_value (24 bytes)."""

    _fields_ = [("vip", L4Addr), ("frontend_id", ct.c_uint32)]


class NodeAddressKey(ct.Structure):
    """struct lb_node_address_key (16 bytes)."""

    _fields_ = [("addr", ct.c_uint32 * 4)]

    @classmethod
    def of(cls, ip: IPAddress) -> NodeAddressKey:
        return cls.from_buffer_copy(packed_address(ip))

    @property
    def ip(self) -> IPAddress:
        return unpacked_address(bytes(self.addr))


class NodeAddressValue(ct.Structure):
    """struct lb_node_address_value (4 bytes)."""

    _fields_ = [("flags", ct.c_uint32)]


class AffinityKey(ct.Structure):
    """struct lb_affinity_key (16 bytes)."""

    _fields_ = [("netns_cookie", ct.c_uint64), ("affinity_group", ct.c_uint32),
                ("pad", ct.c_uint32)]


class AffinityValue(ct.Structure):
    """struct lb_affinity_value (16 bytes)."""

    _fields_ = [("last_used_ns", ct.c_uint64), ("endpoint_id", ct.c_uint32),
                ("pad", ct.c_uint32)]


class Counters(ct.Structure):
    """struct lb_counters (16 bytes): one CPU's counts of one frontend."""

    _fields_ = [("translated", ct.c_uint64), ("rejected", ct.c_uint64)]


class EndpointCounters(ct.Structure):
    """struct lb_endpoint_counters (8 bytes): one CPU's count of one endpoint."""

    _fields_ = [("translated", ct.c_uint64)]


class ServiceName(ct.Structure):
    """struct lb_service_name (160 bytes): "namespace/name:port", NUL-terminated."""

    _fields_ = [("name", ct.c_char * 160)]


class TraceConfig(ct.Structure):
    """struct lb_trace_config (8 bytes)."""

    _fields_ = [("tracer_pid", ct.c_uint32), ("lost", ct.c_uint32)]


class TraceEvent(ct.Structure):
    """struct lb_trace_event (88 bytes)."""

    _fields_ = [("ktime_ns", ct.c_uint64), ("cgroup_id", ct.c_uint64), ("pid", ct.c_uint32),
                ("frontend_id", ct.c_uint32), ("endpoint_id", ct.c_uint32), ("hook", ct.c_uint8),
                ("proto", ct.c_uint8), ("verdict", ct.c_uint8), ("pad", ct.c_uint8),
                ("vip", L4Addr), ("endpoint", L4Addr), ("comm", ct.c_char * 16)]


# LB_HOOK_* and LB_TRACE_* of an event.
TRACE_HOOKS = {1: "connect4", 2: "connect6", 3: "sendmsg4", 4: "sendmsg6"}
TRACE_TRANSLATED, TRACE_AFFINITY, TRACE_REFUSED = 1, 2, 3


class NoEntries(ct.Structure):
    """A ring buffer's key and value: it has no entries (0 bytes)."""

    _fields_ = []


# Every struct of lb_maps.h and its mirror, for the layout test.
MIRRORS: dict[str, type[ct.Structure]] = {
    "lb_l4addr": L4Addr,
    "lb_service_key": ServiceKey,
    "lb_service_value": ServiceValue,
    "lb_endpoint": EndpointValue,
    "lb_revnat_key": RevNatKey,
    "lb_revnat_value": RevNatValue,
    "lb_node_address_key": NodeAddressKey,
    "lb_node_address_value": NodeAddressValue,
    "lb_affinity_key": AffinityKey,
    "lb_affinity_value": AffinityValue,
    "lb_counters": Counters,
    "lb_endpoint_counters": EndpointCounters,
    "lb_service_name": ServiceName,
    "lb_trace_config": TraceConfig,
    "lb_trace_event": TraceEvent,
}


# A map's key type (a ctypes integer for maps with integer keys) and value type.
KeyT = TypeVar("KeyT", bound=ct._SimpleCData | ct.Structure)
ValueT = TypeVar("ValueT", bound=ct.Structure)


@dataclass(frozen=True)
class MapSpec(Generic[KeyT, ValueT]):
    """One pinned map: its pin file, layout, kind, and the flag that sizes it."""

    pin: str
    key: type[KeyT]
    value: type[ValueT]
    type: int
    flags: int
    size_macro: str
    default_size: int
    # A lookup gives one value per possible CPU (what `value` is for one).
    per_cpu: bool = False
    # A ring buffer: its size is bytes, and it has no entries to read,
    # count or copy.
    ring_buffer: bool = False
    # Whether --map-size-* sets its size (else it is default_size).
    resizable: bool = True

    @property
    def size_flag(self) -> str:
        return f"--map-size-{self.pin.replace('_', '-')}"

    def matches(self, info: MapInfo, size: int) -> bool:
        return self.same_layout(info) and info.max_entries == size

    def same_layout(self, info: MapInfo) -> bool:
        return (info.type, info.key_size, info.value_size, info.map_flags) == (
            self.type, ct.sizeof(self.key), ct.sizeof(self.value), self.flags)


# The pins keep their historical names (docs/ebpf.md, "Names"): `services`
# holds the frontends, `backends` the endpoint entries (ENDPOINTS),
# `backend_counters` their counters (ENDPOINT_COUNTERS); the --map-size-*
# flags are named after the pins.
# Defaults: services holds a master per frontend plus a slot per endpoint, so
# it is at least as large as `backends`; Calico's NAT maps are of this order.
SERVICES = MapSpec("services", ServiceKey, ServiceValue, BPF_MAP_TYPE_HASH,
                   BPF_F_NO_PREALLOC, "KPNG_SERVICES_MAX", 131072)
ENDPOINTS = MapSpec("backends", EndpointKey, EndpointValue, BPF_MAP_TYPE_HASH,
                    BPF_F_NO_PREALLOC, "KPNG_ENDPOINTS_MAX", 131072)
# One entry per TCP connection and per UDP (socket, endpoint) pair; LRU, so a
# busy node evicts the oldest.
REVERSE_NAT = MapSpec("reverse_nat", RevNatKey, RevNatValue, BPF_MAP_TYPE_LRU_HASH, 0,
                      "KPNG_REVNAT_MAX", 131072)
AFFINITY = MapSpec("affinity", AffinityKey, AffinityValue, BPF_MAP_TYPE_LRU_HASH, 0,
                   "KPNG_AFFINITY_MAX", 65536)
# A node has a few addresses; room for many interfaces' worth.
NODE_ADDRESSES = MapSpec("node_addresses", NodeAddressKey, NodeAddressValue, BPF_MAP_TYPE_HASH,
                         BPF_F_NO_PREALLOC, "KPNG_NODE_ADDRESSES_MAX", 1024)
# One entry per frontend clients used; a full map leaves new ones uncounted.
COUNTERS = MapSpec("counters", ct.c_uint32, Counters, BPF_MAP_TYPE_PERCPU_HASH,
                   BPF_F_NO_PREALLOC, "KPNG_COUNTERS_MAX", 65536, per_cpu=True)
# One entry per endpoint clients used, with --endpoint-counters (sized as `backends`).
ENDPOINT_COUNTERS = MapSpec("backend_counters", ct.c_uint32, EndpointCounters,
                            BPF_MAP_TYPE_PERCPU_HASH, BPF_F_NO_PREALLOC,
                            "KPNG_ENDPOINT_COUNTERS_MAX", 131072, per_cpu=True)
# One entry per frontend, as services' masters.
SERVICE_NAMES = MapSpec("service_names", ct.c_uint32, ServiceName, BPF_MAP_TYPE_HASH,
                        BPF_F_NO_PREALLOC, "KPNG_SERVICE_NAMES_MAX", 65536)
TRACE_CONFIG = MapSpec("trace_config", ct.c_uint32, TraceConfig, BPF_MAP_TYPE_ARRAY, 0,
                       "KPNG_TRACE_CONFIG_MAX", 1, resizable=False)
# 88-byte events (plus an 8-byte header each): room for about 11 000 between
# two reads of the tracer.
EVENTS = MapSpec("events", NoEntries, NoEntries, BPF_MAP_TYPE_RINGBUF, 0, "KPNG_EVENTS_MAX",
                 1 << 20, ring_buffer=True, resizable=False)
MAP_SPECS = (SERVICES, ENDPOINTS, REVERSE_NAT, AFFINITY, NODE_ADDRESSES, COUNTERS,
             ENDPOINT_COUNTERS, SERVICE_NAMES, TRACE_CONFIG, EVENTS)
# The maps whose size --map-size-* sets.
SIZED_SPECS = tuple(spec for spec in MAP_SPECS if spec.resizable)
