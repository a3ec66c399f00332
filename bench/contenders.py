"""The contenders: our backends (every backend of kpng_py.dataplane.registry with a
dataplane, driven as lab.backends says) and what a user would run instead,
kube-proxy's iptables mode (with either iptables backend) and nftables mode.
Each is started as a `bench.worker`."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.scenario import Scenario
from bench.worker import open_files_ceiling
from lab.backends import LabPlaces, LabSupport, lab_backends

# Descriptors a worker needs besides its backend's sockets.
_SPARE_FILES = 1000


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # "ours", "iptables" or "nftables"
    sink: str = ""  # ours: a registered backend's, with its lab support
    lab: LabSupport | None = None
    iptables_variant: str = ""

    @property
    def ours(self) -> bool:
        return self.kind == "ours"

    def available(self) -> str | None:
        """None if it can run here, else why not."""
        if self.ours:
            return None
        tool = (f"iptables-{self.iptables_variant}-restore" if self.kind == "iptables"
                else "nft")
        return None if shutil.which(tool) else f"`{tool}` is not installed"

    def unfit(self, scenario: Scenario) -> str | None:
        """Why this contender cannot program `scenario` on this machine (None
        if it can): a backend with listening sockets needs them per service port."""
        per_port = self.lab.sockets_per_service_port if self.lab else 0
        if not per_port:
            return None
        limit = open_files_ceiling()
        if scenario.services * per_port + _SPARE_FILES <= limit:
            return None
        sockets = "a listening socket" if per_port == 1 else f"{per_port} listening sockets"
        return (f"needs {sockets} per service port ({scenario.services:,}) and the "
                f"open-files limit here is {limit:,} (raise it: ulimit -Hn)")

    def worker(self, scenario: Scenario, scenario_file: Path, places: LabPlaces,
               changes: int = 0, hold: bool = False) -> list[str]:
        """The worker command line (to run inside the contender's namespace)."""
        args = [self.kind, "--scenario", str(scenario_file), "--changes", str(changes)]
        if hold:
            args.append("--hold")
        if self.kind == "iptables":
            args += ["--iptables-variant", self.iptables_variant]
        if self.ours:
            args += ["--sink", self.sink, "--", *self.sink_flags(scenario, places)]
        return [sys.executable, "-m", "bench.worker", *args]

    def sink_flags(self, scenario: Scenario, places: LabPlaces) -> list[str]:
        """Our backend's flags: its dataplane in `places`, with room for the
        scenario (e.g. the eBPF maps' sizes)."""
        if self.lab is None:
            return []
        return [*self.lab.flags(places), *self.lab.capacity_flags(
            scenario.services, scenario.services * scenario.endpoints)]


CONTENDERS = {c.name: c for c in (
    *(Contender(name, "ours", sink=backend.sink, lab=backend.support)
      for name, backend in lab_backends().items()),
    Contender("iptables-legacy", "iptables", iptables_variant="legacy"),
    Contender("iptables-nft", "iptables", iptables_variant="nft"),
    Contender("nftables", "nftables"),
)}
