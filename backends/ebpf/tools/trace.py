"""`kpng-py ebpf trace`: every translation of the datapath, live.

Packet captures never show a ClusterIP: translation happens before a packet
exists. While a trace is attached (`trace_config` holds its pid), the
connect and sendmsg programs put one event per translation into the pinned
`events` ring buffer (lb_maps.h); with no trace they only read the flag.
This reads the events, names the service port from `service_names`, the
client's cgroup from its id, and filters them.

One trace at a time: a second one is refused while the first one's process
lives; one that was killed (SIGKILL) leaves its pid behind, and the programs
emit into a ring buffer nobody reads (each event then fails its reservation,
which costs the connect nothing more) until the next trace takes over.
Events the ring buffer has no room for (a reader that falls behind) are
lost, and counted in `trace_config`; the connects are not.
"""

from __future__ import annotations

import ctypes as ct
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from backends.ebpf.datapath.loader import mount_point, open_pinned_map
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps import libbpf
from backends.ebpf.maps.contents import HostPort
from backends.ebpf.maps.id_maps import is_of_service
from backends.ebpf.maps.layout import TraceConfig, TraceEvent
from backends.ebpf.tools.cgroup_paths import CgroupPaths
from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.model import IPAddress

_PROTOCOLS = {6: "TCP", 17: "UDP"}
_VERDICTS = {maps.TRACE_TRANSLATED: "translated", maps.TRACE_AFFINITY: "affinity",
             maps.TRACE_REFUSED: "refused"}
# The programs submit without waking the reader (a wakeup per event cost
# each traced connect several microseconds): it reads on this timer.
_READ_EVERY_SECONDS = 0.05


@dataclass(frozen=True)
class Translation:
    """One event, decoded."""

    time: float  # Unix time
    pid: int  # 0: the kernel could not say (older kernels)
    comm: str
    cgroup: str
    hook: str
    protocol: str
    vip: HostPort  # as dialled (for a node port, the node address)
    endpoint: HostPort | None  # None: refused
    service_port: str | None  # None: no name for its frontend id
    frontend_id: int
    endpoint_id: int
    verdict: str

    def line(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time)) + f".{self._micros:06d}"
        target = str(self.endpoint) if self.endpoint is not None else "(no endpoints)"
        return (f"{stamp} {self.hook} {self.protocol} {self.vip} -> {target} "
                f"{self.service_port or f'service {self.frontend_id}'} {self.verdict} "
                f"pid {self.pid} {self.comm or '?'} {self.cgroup}")

    @property
    def _micros(self) -> int:
        return int(self.time * 1e6) % 1_000_000

    def to_json(self) -> str:
        # Its keys are an interface: they keep their historical names (backend,
        # serviceId, backendId; docs/ebpf.md, "Names").
        return json.dumps({"time": self.time, "pid": self.pid, "comm": self.comm,
                           "cgroup": self.cgroup, "hook": self.hook,
                           "protocol": self.protocol, "vip": str(self.vip),
                           "backend": str(self.endpoint) if self.endpoint else None,
                           "servicePort": self.service_port, "serviceId": self.frontend_id,
                           "backendId": self.endpoint_id, "verdict": self.verdict})


@dataclass(frozen=True)
class TraceFilter:
    """Which translations to show: all fields None or 0 show every one."""

    service: str | None = None  # "ns/name" (every port) or "ns/name:port"
    vip: IPAddress | None = None
    vip_port: int | None = None
    pid: int = 0

    def __call__(self, seen: Translation) -> bool:
        if self.pid and seen.pid != self.pid:
            return False
        if self.service is not None and not is_of_service(seen.service_port, self.service):
            return False
        if self.vip is not None and seen.vip.ip != self.vip:
            return False
        return self.vip_port is None or seen.vip.port == self.vip_port


class TraceSession:
    """Attached to the datapath pinned under `bpffs_dir` while open: the
    programs emit events, `translations()` yields them."""

    def __init__(self, bpffs_dir: Path) -> None:
        self._bpffs_dir = bpffs_dir
        for spec in (maps.TRACE_CONFIG, maps.EVENTS, maps.SERVICE_NAMES):
            if not (bpffs_dir / spec.pin).exists():
                raise BackendSetupError(
                    f"no map {spec.pin} pinned under {bpffs_dir}: no kpng-py eBPF datapath "
                    f"with tracing is installed there (a backend of this version makes one)")
        self._config = open_pinned_map(bpffs_dir, maps.TRACE_CONFIG)
        self._names = open_pinned_map(bpffs_dir, maps.SERVICE_NAMES)
        self._events = libbpf.obj_get(bpffs_dir / maps.EVENTS.pin)
        self._known_names: dict[int, str] = {}
        self._cgroups = CgroupPaths(mount_point("cgroup2"))
        # bpf_ktime_get_ns() is CLOCK_MONOTONIC.
        self._wall_minus_monotonic = time.time() - time.monotonic()
        self._attached = False

    def __enter__(self) -> TraceSession:
        current = self._config.get(0)
        holder = current.tracer_pid if current is not None else 0
        if holder and holder != os.getpid() and _alive(holder):
            self.close()
            raise BackendSetupError(f"another trace (pid {holder}) is attached to the datapath "
                                    f"under {self._bpffs_dir}; stop it first")
        self._config.put(0, TraceConfig(tracer_pid=os.getpid()))
        self._attached = True
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Detach (if still ours: the programs stop emitting) and close."""
        if self._attached:
            current = self._config.get(0)
            if current is not None and current.tracer_pid == os.getpid():
                self._config.put(0, TraceConfig(tracer_pid=0))
            self._attached = False
        for bpf_map in (self._config, self._names):
            bpf_map.close()
        if self._events >= 0:
            os.close(self._events)
            self._events = -1

    def lost(self) -> int:
        """Events the ring buffer had no room for since this trace attached."""
        current = self._config.get(0)
        return current.lost if current is not None and current.tracer_pid == os.getpid() else 0

    def translations(self, keep_going: Callable[[], bool]) -> Iterator[Translation]:
        """The events as they come (at most 50 ms late), while
        `keep_going()` (asked every 50 ms); then those already submitted."""
        pending: list[Translation] = []
        ring = libbpf.RingBuffer(self._events, lambda raw: pending.append(self.decode(raw)),
                                 maps.EVENTS.pin)
        try:
            while True:
                going = keep_going()
                ring.consume()
                yield from pending
                pending.clear()
                if not going:
                    return
                time.sleep(_READ_EVERY_SECONDS)
        finally:
            ring.close()

    def decode(self, raw: bytes) -> Translation:
        event = TraceEvent.from_buffer_copy(raw[:_EVENT_SIZE].ljust(_EVENT_SIZE, b"\0"))
        refused = event.verdict == maps.TRACE_REFUSED
        return Translation(
            time=event.ktime_ns / 1e9 + self._wall_minus_monotonic,
            pid=event.pid, comm=event.comm.decode(errors="replace"),
            cgroup=self._cgroups.path(event.cgroup_id),
            hook=maps.TRACE_HOOKS.get(event.hook, f"hook {event.hook}"),
            protocol=_PROTOCOLS.get(event.proto, str(event.proto)),
            vip=HostPort.of(event.vip),
            endpoint=None if refused else HostPort.of(event.endpoint),
            service_port=self._name(event.frontend_id), frontend_id=event.frontend_id,
            endpoint_id=event.endpoint_id,
            verdict=_VERDICTS.get(event.verdict, f"verdict {event.verdict}"))

    def _name(self, frontend_id: int) -> str | None:
        """Looked up once per id (the backend writes a new frontend's name
        right after its entries: an early event may find none yet)."""
        if frontend_id not in self._known_names:
            found = self._names.get(frontend_id)
            if found is None:
                return None
            self._known_names[frontend_id] = found.name.decode(errors="replace")
        return self._known_names[frontend_id]


_EVENT_SIZE = ct.sizeof(TraceEvent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
