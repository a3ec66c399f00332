"""The contenders: our backends (any built-in `to-<backend>` sink) and what a
user would run instead, kube-proxy's iptables mode (with either iptables
backend) and nftables mode. Each is started as a `bench.worker`."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.scenario import Scenario
from bench.worker import open_files_ceiling

# Descriptors a worker needs besides one per service port.
_SPARE_FILES = 1000


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "ours", "iptables" or "nftables"
    sink: str = ""
    iptables_variant: str = ""

    @property
    def ours(self) -> bool:
        return self.kind == "ours"

    def available(self) -> str | None:
        """None if it can run here, else why not."""
        if self.ours:
            from kpng_py.cli import BACKENDS

            return None if self.sink in BACKENDS else f"this kpng-py has no {self.sink} backend"
        tool = (f"iptables-{self.iptables_variant}-restore" if self.kind == "iptables"
                else "nft")
        return None if shutil.which(tool) else f"`{tool}` is not installed"

    def unfit(self, scenario: Scenario) -> str | None:
        """Why this contender cannot program `scenario` on this machine (None
        if it can): the userspace backend needs a socket per service port."""
        if self.sink != "to-userspace":
            return None
        limit = open_files_ceiling()
        if scenario.services + _SPARE_FILES <= limit:
            return None
        return (f"needs a listening socket per service port ({scenario.services:,}) and the "
                f"open-files limit here is {limit:,} (raise it: ulimit -Hn)")

    def worker(self, scenario: Scenario, scenario_file: Path, cgroup: Path, bpffs_dir: Path,
               changes: int = 0, hold: bool = False) -> list[str]:
        """The worker command line (to run inside the contender's namespace)."""
        args = [self.kind, "--scenario", str(scenario_file), "--changes", str(changes)]
        if hold:
            args.append("--hold")
        if self.kind == "iptables":
            args += ["--iptables-variant", self.iptables_variant]
        if self.ours:
            args += ["--sink", self.sink, "--", *self.sink_flags(scenario, cgroup, bpffs_dir)]
        return [sys.executable, "-m", "bench.worker", *args]

    def sink_flags(self, scenario: Scenario, cgroup: Path, bpffs_dir: Path) -> list[str]:
        """Our backend's flags: where the eBPF backend attaches and pins, and
        maps big enough for the scenario."""
        if self.sink != "to-ebpf":
            return []
        return _ebpf_flags(scenario, cgroup, bpffs_dir)


def _ebpf_flags(scenario: Scenario, cgroup: Path, bpffs_dir: Path) -> list[str]:
    backends = scenario.services * scenario.endpoints
    return ["--cgroup", str(cgroup), "--bpffs-dir", str(bpffs_dir),
            # a master entry per frontend plus a slot per backend
            "--map-size-services", str(_capacity(scenario.services + backends)),
            "--map-size-backends", str(_capacity(backends))]


def _capacity(entries: int) -> int:
    """Room for `entries` and a quarter more, as a power of two."""
    size = 1024
    while size < entries * 5 // 4:
        size *= 2
    return size


CONTENDERS = {c.name: c for c in (
    Contender("ebpf", "ours", sink="to-ebpf"),
    Contender("userspace", "ours", sink="to-userspace"),
    Contender("iptables-legacy", "iptables", iptables_variant="legacy"),
    Contender("iptables-nft", "iptables", iptables_variant="nft"),
    Contender("nftables", "nftables"),
)}
