"""`kpng-py ebpf dump`: what the pinned maps hold.

The maps are the only place a VIP is visible (translation happens before a
packet exists, so captures show endpoint addresses only). This reads them
directly, without BCC, from any process.

Each frontend's kind (ClusterIP, ExternalIP, LoadBalancerIP, NodePort) comes
from its master entry's kind flag (LB_SVC_F_*): the key alone tells a node
port (its wildcard address) but not a ClusterIP from an ExternalIP or an LB
IP. A master whose flags name more than one kind shows `unknown`.

Connections per endpoint are counted only by programs built with
--endpoint-counters (KPNG_ENDPOINT_COUNTERS); the backend_counters map is
pinned either way. So they are shown when an attached program uses that map
(the kernel lists the maps of each program), and as unknown (null; one
`n/a` line in the text) when none does, rather than as a 0 never counted.

`--service` and `--vip` that leave no frontend are NothingMatched, naming
them: the command says so and exits 1 rather than printing an empty dump.

The output, JSON keys and text alike, keeps the historical words, as the
pins do (docs/ebpf.md, "Names"): a frontend's id is its `serviceId`
("service N"), its endpoint entries are its `backends` (`backendId`,
"backend N").
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from backends.ebpf.datapath.loader import AttachedLink, mount_point, open_pinned_map, pinned_links
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps import libbpf
from backends.ebpf.maps.access import MapAccess
from backends.ebpf.maps.contents import Contents, StoredEndpoint, StoredFrontend, read_contents
from backends.ebpf.maps.counters import read_counts, read_endpoint_counts
from backends.ebpf.maps.id_maps import is_of_service, read_names
from backends.ebpf.maps.layout import NodeAddressKey, NodeAddressValue
from backends.ebpf.maps.libbpf import BpfMap
from backends.ebpf.tools.cgroup_paths import CgroupPaths
from kpng_py.dataplane.contract import BackendSetupError, NothingMatched
from kpng_py.metrics.service_counters import ServiceCounts
from kpng_py.model import FrontendKind, IPAddress, format_host_port


def _open(bpffs_dir: Path, spec: maps.MapSpec) -> BpfMap:
    path = bpffs_dir / spec.pin
    if not path.exists():
        raise BackendSetupError(f"no map pinned at {path}; is a kpng-py eBPF datapath "
                                f"installed with --bpffs-dir {bpffs_dir}?")
    return open_pinned_map(bpffs_dir, spec)


def read_dump(bpffs_dir: Path) -> dict:
    opened = {spec.pin: _open(bpffs_dir, spec) for spec in maps.MAP_SPECS}
    try:
        return _read(bpffs_dir, opened)
    finally:
        for bpf_map in opened.values():
            bpf_map.close()


def _read(bpffs_dir: Path, opened: dict[str, BpfMap]) -> dict:
    contents = read_contents(opened[maps.SERVICES.pin], opened[maps.ENDPOINTS.pin])
    cgroups = CgroupPaths(mount_point("cgroup2"))
    links = list(pinned_links(bpffs_dir))
    endpoint_counters = opened[maps.ENDPOINT_COUNTERS.pin]
    counted = _counted_per_endpoint(links, endpoint_counters)
    return {
        "bpffsDir": str(bpffs_dir),
        "endpointCounters": counted,
        "services": services_of(contents, ByIds(
            read_counts(opened[maps.COUNTERS.pin]), read_names(opened[maps.SERVICE_NAMES.pin]),
            read_endpoint_counts(endpoint_counters) if counted else None)),
        "nodeAddresses": node_addresses_of(opened[maps.NODE_ADDRESSES.pin]),
        "maps": {spec.pin: _usage(spec, opened[spec.pin]) for spec in maps.MAP_SPECS},
        "links": [{"hook": link.hook, "linkId": link.link_id, "progId": link.prog_id,
                   "cgroupId": link.cgroup_id, "cgroup": cgroups.path(link.cgroup_id)}
                  for link in links],
    }


def _counted_per_endpoint(links: list[AttachedLink], endpoint_counters: BpfMap) -> bool:
    """Whether an attached program counts per endpoint (uses the map)."""
    map_id = endpoint_counters.info().id
    return any(map_id in _map_ids_of(link.prog_id) for link in links)


def _map_ids_of(prog_id: int) -> list[int]:
    fd = libbpf.prog_fd_by_id(prog_id)
    try:
        return libbpf.prog_map_ids(fd, f"program {prog_id}")
    finally:
        os.close(fd)


def matching(dump: dict, service: str | None = None,
             vip: tuple[IPAddress, int | None] | None = None) -> dict:
    """The dump with only the frontends of `service` and at `vip` (each one
    when given); NothingMatched, naming them, when they leave none."""
    shown = of_service(dump, service) if service else dump
    shown = of_vip(shown, *vip) if vip else shown
    if shown["services"] or not (service or vip):
        return shown
    given = ([f"--service {service}"] if service else []) + (
        [f"--vip {_vip_text(*vip)}"] if vip else [])
    raise NothingMatched(f"not found: no frontend of the datapath under {dump['bpffsDir']} "
                         f"matches {' '.join(given)}")


def _vip_text(ip: IPAddress, port: int | None) -> str:
    return str(ip) if port is None else format_host_port(ip, port)


def of_service(dump: dict, service: str) -> dict:
    """The dump with only the frontends of `service` ("ns/name" or
    "ns/name:port"), by the names the datapath holds."""
    return {**dump, "services": [svc for svc in dump["services"]
                                 if is_of_service(svc["servicePort"], service)]}


def of_vip(dump: dict, ip: IPAddress, port: int | None) -> dict:
    """The dump with only the frontends a client reaches at `ip` (and
    `port`): those at that address, and the node ports of its family when it
    is one of the node-port addresses."""
    node_port_address = str(ip) in dump["nodeAddresses"]

    def reached(svc: dict) -> bool:
        vip = ipaddress.ip_address(svc["vip"])
        at = vip == ip or (node_port_address and vip.version == ip.version
                           and svc["kind"] == FrontendKind.NODE_PORT.value)
        return at and (port is None or svc["port"] == port)

    return {**dump, "services": [svc for svc in dump["services"] if reached(svc)]}


def _usage(spec: maps.MapSpec, bpf_map: BpfMap) -> dict:
    """Entries and capacity; a ring buffer's capacity in bytes, and no entries."""
    capacity = bpf_map.info().max_entries
    if spec.ring_buffer:
        return {"entries": None, "capacity": capacity}
    return {"entries": len(bpf_map), "capacity": capacity}


@dataclass(frozen=True)
class ByIds:
    """What the maps keyed by frontend or endpoint id hold for a dump."""

    counts: Mapping[int, ServiceCounts] = field(default_factory=dict)  # by frontend id
    names: Mapping[int, str] = field(default_factory=dict)  # by frontend id
    # By endpoint id; None: not counted (no attached program counts per endpoint).
    endpoint_counts: Mapping[int, int] | None = None


def services_of(contents: Contents, by_ids: ByIds = ByIds()) -> list[dict]:
    """The services of a dump: every master entry, with its service port's
    name (None if the map has none for its id), its slots 1..count and its
    counters (zero until a client used it; per endpoint None unless counted,
    with --endpoint-counters)."""
    return [_service(stored, contents, by_ids) for stored in contents.frontends]


def node_addresses_of(node_addresses: MapAccess[NodeAddressKey, NodeAddressValue]) -> list[str]:
    """The node-port addresses, IPv4 first, in order."""
    ips = (key.ip for key, _ in node_addresses.items())
    return [str(ip) for ip in sorted(ips, key=lambda ip: (ip.version, int(ip)))]


def _service(stored: StoredFrontend, contents: Contents, by_ids: ByIds) -> dict:
    protocol, vip, kind = stored.protocol, stored.vip, stored.kind
    counts = by_ids.counts.get(stored.master.id, ServiceCounts())
    return {
        "vip": str(vip.ip),
        "port": vip.port,
        "protocol": protocol.value if protocol else str(stored.proto),
        "kind": kind.value if kind else "unknown",
        "serviceId": stored.master.id,
        "servicePort": by_ids.names.get(stored.master.id),
        "count": stored.master.count,
        "affinityTimeoutSeconds": stored.affinity_timeout,
        "affinityGroup": stored.affinity_group,
        "connections": counts.translated,
        "rejections": counts.rejected,
        "backends": [_slot(slot, endpoint_id, contents.endpoint(endpoint_id), by_ids)
                     for slot, endpoint_id in enumerate(stored.endpoint_ids(), start=1)],
    }


def _slot(slot: int, endpoint_id: int | None, endpoint: StoredEndpoint | None,
          by_ids: ByIds) -> dict:
    counts = by_ids.endpoint_counts
    connections = None if counts is None else counts.get(endpoint_id or 0, 0)
    return {"slot": slot, "backendId": endpoint_id,
            "address": str(endpoint.target) if endpoint is not None else None,
            "serviceId": endpoint.frontend_id if endpoint is not None else None,
            "connections": connections}


def format_text(dump: dict) -> str:
    """Grouped by service, as an operator looks for one: its ports'
    frontends under it (in the order of the maps), then the frontends no
    service port's name was found for."""
    lines = [f"datapath pinned at {dump['bpffsDir']}"]
    if not dump["endpointCounters"]:
        lines.append("connections per backend: n/a (not counted: run to-ebpf with "
                     "--endpoint-counters)")
    # service -> its ports' frontends as (port name, frontend); None: no name
    by_service: dict[str | None, list[tuple[str, dict]]] = {}
    for svc in dump["services"]:
        service, _, port = (svc["servicePort"] or "").partition(":")
        by_service.setdefault(service or None, []).append((port, svc))
    for service in sorted(name for name in by_service if name is not None):
        lines.append(f"service {service}")
        for port, svc in sorted(by_service[service], key=lambda named: named[0]):
            lines += _frontend_lines(svc, f"  port {port or '(unnamed)'}: ")
    if None in by_service:
        lines.append("no service port's name (a leftover, or written before its name)")
        for _, svc in by_service[None]:
            lines += _frontend_lines(svc, "  ")
    lines += [f"node-port address {ip}" for ip in dump["nodeAddresses"]]
    for pin, counts in dump["maps"].items():
        lines.append(f"map {pin}: ring buffer of {counts['capacity']} bytes"
                     if counts["entries"] is None else
                     f"map {pin}: {counts['entries']} of {counts['capacity']} entries")
    for link in dump["links"]:
        lines.append(f"hook {link['hook']}: link {link['linkId']} program {link['progId']} "
                     f"cgroup {link['cgroup']} (id {link['cgroupId']})")
    return "\n".join(lines)


def _frontend_lines(svc: dict, lead: str) -> list[str]:
    affinity = (f" affinity={svc['affinityTimeoutSeconds']}s"
                if svc["affinityTimeoutSeconds"] else "")
    if svc["affinityGroup"] not in (0, svc["serviceId"]):
        affinity += f" (shared with service {svc['affinityGroup']})"
    state = f"{svc['count']} backends" if svc["count"] else "no endpoints: rejects"
    vip = format_host_port(ipaddress.ip_address(svc["vip"]), svc["port"])
    lines = [f"{lead}{vip}/{svc['protocol']} {svc['kind']} service {svc['serviceId']}: "
             f"{state}{affinity}, {svc['connections']} connections, "
             f"{svc['rejections']} rejected"]
    indent = " " * (len(lead) - len(lead.lstrip()) + 2)
    for endpoint in svc["backends"]:
        counted = f", {endpoint['connections']} connections" if endpoint["connections"] else ""
        lines.append(f"{indent}slot {endpoint['slot']}: backend {endpoint['backendId']} "
                     f"{endpoint['address'] or '(missing)'}{counted}")
    return lines


def dump_json(dump: dict) -> str:
    return json.dumps(dump, indent=2)
