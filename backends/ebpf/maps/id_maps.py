"""The maps keyed by frontend id beside `services`, which follow the
frontends' ids: `counters` (entries made by the programs) and
`service_names` (written here, read by `ebpf trace` and `ebpf dump`); and
`backend_counters`, keyed by endpoint id, which follows the endpoints' alike.

After each apply the backend deletes the entries of the ids released. A
partial change set then writes the names of the ids that got a new owner
(new frontends); a full one writes every frontend's name and deletes every
entry whose id no frontend (or endpoint) has: what a connect racing a
removal, a failed write or a crash between two writes leaves.
"""

from __future__ import annotations

import struct
from typing import Collection, Iterable

from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.layout import ServiceName
from kpng_py.model import ServicePortName

_U32 = struct.Struct("=I")
_NAME = struct.Struct(f"{ServiceName.name.size}s")


def packed_ids(ids: Iterable[int]) -> bytes:
    return b"".join(_U32.pack(key) for key in ids)


def forget(bpf_map: MapAccess, ids: Iterable[int]) -> None:
    """Delete the entries of these ids (those without one are fine)."""
    bpf_map.delete_packed(packed_ids(ids))


def keep_only(bpf_map: MapAccess, ids: Collection[int]) -> int:
    """Delete every entry whose id is not in `ids`; how many."""
    gone = [int(key) for key, _ in bpf_map.items() if int(key) not in ids]
    forget(bpf_map, gone)
    return len(gone)


def write_names(service_names: MapAccess, named: Iterable[tuple[int, ServicePortName]]) -> int:
    """Write "namespace/name:port" for each frontend id; how many."""
    named = list(named)
    service_names.put_packed(packed_ids(frontend_id for frontend_id, _ in named),
                             b"".join(_NAME.pack(str(name).encode()) for _, name in named))
    return len(named)


def is_of_service(service_port: str | None, service: str) -> bool:
    """Whether a service port name ("ns/name:port", or "ns/name" for an
    unnamed port) is `service`: "ns/name" (every port of it) or exactly
    "ns/name:port"."""
    return service_port is not None and (
        service_port == service or service_port.startswith(service + ":"))


def read_names(service_names: MapAccess) -> dict[int, str]:
    """Every frontend id's name, as written (undecodable bytes replaced)."""
    return {int(key): value.name.decode(errors="replace") for key, value in service_names.items()}
