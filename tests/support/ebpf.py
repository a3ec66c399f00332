"""Helpers of the eBPF backend's kernel tests: the small map sizes and the
datapath set-up of a lab, the addresses a test dials and expects to be served
by, and a path that climbs out of the bpf filesystem."""

from __future__ import annotations

from pathlib import Path

from backends.ebpf.datapath.loader import DatapathConfig
from lab.socket_lab import Lab, backend_ip

# Small maps: LRU maps are preallocated, and tests never need many entries.
TEST_MAP_SIZES = {"services": 4096, "backends": 4096, "reverse_nat": 4096, "affinity": 1024,
                  "node_addresses": 64, "counters": 1024, "backend_counters": 4096,
                  "service_names": 1024}


def datapath_config(the_lab: Lab, **sizes: int) -> DatapathConfig:
    return DatapathConfig(the_lab.bpffs_dir, the_lab.group.path, {**TEST_MAP_SIZES, **sizes})


def vips(net: str) -> list[str]:
    """The dual-stack ClusterIPs of a test: 10.96.<net> and fd00:96::<net>."""
    return [f"10.96.{net}", f"fd00:96::{net.replace('.', ':')}"]


def served_by(endpoints: list[int], family: int, port: int = 8080) -> set[str]:
    return {str(backend_ip(i, family)) + f":{port}" if family == 4
            else f"[{backend_ip(i, family)}]:{port}" for i in endpoints}


def escaping(base: Path, target: Path) -> Path:
    """A path that starts under `base` and climbs out of it to `target`."""
    return base / "sub" / Path(*[".."] * (len(base.parts) + 1)) / target.relative_to("/")
