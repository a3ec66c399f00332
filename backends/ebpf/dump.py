"""`kpng-py ebpf dump`: what the pinned maps hold.

The maps are the only place a VIP is visible (translation happens before a
packet exists, so captures show backend addresses only). This reads them
directly, without BCC, from any process.
"""

from __future__ import annotations

import ipaddress
import json
from collections import defaultdict
from pathlib import Path

from backends.ebpf import maps
from backends.ebpf.libbpf import BpfMap
from backends.ebpf.loader import pinned_links
from backends.ebpf.programmer import PROTOCOL_OF
from kpng_py.backend import BackendSetupError
from kpng_py.model import format_host_port


def _open(bpffs_dir: Path, spec: maps.MapSpec) -> BpfMap:
    path = bpffs_dir / spec.pin
    if not path.exists():
        raise BackendSetupError(f"no map pinned at {path}; is a kpng-py eBPF datapath "
                                f"installed with --bpffs-dir {bpffs_dir}?")
    return BpfMap.open_pinned(path, spec.key, spec.value, spec.pin)


def read_dump(bpffs_dir: Path) -> dict:
    opened = {spec.pin: _open(bpffs_dir, spec) for spec in maps.MAP_SPECS}
    try:
        return _read(bpffs_dir, opened)
    finally:
        for bpf_map in opened.values():
            bpf_map.close()


def _read(bpffs_dir: Path, opened: dict[str, BpfMap]) -> dict:
    backends = dict(opened[maps.BACKENDS.pin].items())
    masters: dict[tuple, maps.ServiceValue] = {}
    slots: dict[tuple, dict[int, int]] = defaultdict(dict)
    for key, value in opened[maps.SERVICES.pin].items():
        frontend = (key.vip.ip.version, int(key.vip.ip), key.vip.host_port, key.proto)
        if key.slot == 0:
            masters[frontend] = (key, value)
        else:
            slots[frontend][key.slot] = value.id
    services = []
    for frontend in sorted(masters):
        key, master = masters[frontend]
        protocol = PROTOCOL_OF.get(key.proto)
        services.append({
            "vip": str(key.vip.ip),
            "port": key.vip.host_port,
            "protocol": protocol.value if protocol else str(key.proto),
            "serviceId": master.id,
            "count": master.count,
            "affinityTimeoutSeconds": (master.affinity_timeout
                                       if master.flags & maps.SVC_F_AFFINITY else 0),
            "backends": [_slot(slot, slots[frontend].get(slot), backends)
                         for slot in range(1, master.count + 1)],
        })
    return {
        "bpffsDir": str(bpffs_dir),
        "services": services,
        "maps": {pin: {"entries": len(bpf_map), "capacity": bpf_map.info().max_entries}
                 for pin, bpf_map in opened.items()},
        "links": [{"hook": link.hook, "linkId": link.link_id, "progId": link.prog_id,
                   "cgroupId": link.cgroup_id} for link in pinned_links(bpffs_dir)],
    }


def _slot(slot: int, backend_id: int | None, backends: dict) -> dict:
    backend = backends.get(backend_id) if backend_id is not None else None
    return {"slot": slot, "backendId": backend_id,
            "address": str(backend.addr) if backend is not None else None,
            "serviceId": backend.service_id if backend is not None else None}


def format_text(dump: dict) -> str:
    lines = [f"datapath pinned at {dump['bpffsDir']}"]
    for svc in dump["services"]:
        affinity = (f" affinity={svc['affinityTimeoutSeconds']}s"
                    if svc["affinityTimeoutSeconds"] else "")
        state = f"{svc['count']} backends" if svc["count"] else "no endpoints: rejects"
        vip = format_host_port(ipaddress.ip_address(svc["vip"]), svc["port"])
        lines.append(f"{vip}/{svc['protocol']} "
                     f"service {svc['serviceId']}: {state}{affinity}")
        for backend in svc["backends"]:
            lines.append(f"  slot {backend['slot']}: backend {backend['backendId']} "
                         f"{backend['address'] or '(missing)'}")
    for pin, counts in dump["maps"].items():
        lines.append(f"map {pin}: {counts['entries']} of {counts['capacity']} entries")
    for link in dump["links"]:
        lines.append(f"hook {link['hook']}: link {link['linkId']} program {link['progId']} "
                     f"cgroup {link['cgroupId']}")
    return "\n".join(lines)


def dump_json(dump: dict) -> str:
    return json.dumps(dump, indent=2)
