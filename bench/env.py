"""Where the bench runs things: throwaway network namespaces (with a cgroup
and a bpffs directory for the eBPF backend), and processes in them.

Every object is named after the run (`lab.names.RunNames`: `kpe2e-<pid>-...`),
so the lab's sweep removes what a killed bench left behind, and
parallel runs never collide.

Node-side processes (workers, the brain, backends) enter a namespace with
`nsenter --net`, not `ip netns exec`: the latter gives the process a fresh
/sys in which bpffs and the cgroup2 mount are gone, so the eBPF backend could
neither pin maps nor attach to its cgroup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kpng_py.registry import LabPlaces, lab_backends
from lab.names import RunNames
from lab.procs import kill_pids, run

TIME = "/usr/bin/time"  # GNU time (Debian package "time")

ROOT = Path(__file__).resolve().parent.parent
KPNG_PY = str(Path(sys.executable).with_name("kpng-py"))


@dataclass(frozen=True)
class Sandbox:
    """A network namespace with loopback only, a cgroup and a bpffs directory,
    for one control-plane run."""

    netns: str
    cgroup: Path
    bpffs_dir: Path
    service_interface: str

    @classmethod
    def of(cls, names: RunNames, label: str) -> Sandbox:
        return cls(names.netns(label), names.cgroup / label, names.bpffs_dir / label,
                   names.service_interface)

    @property
    def places(self) -> LabPlaces:
        """Where a backend run in it keeps its dataplane (kpng_py.registry)."""
        return LabPlaces(self.netns, self.cgroup, self.bpffs_dir, self.service_interface)

    def create(self) -> Sandbox:
        run(["ip", "netns", "add", self.netns])
        run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        self.cgroup.mkdir(parents=True)
        self.bpffs_dir.parent.mkdir(exist_ok=True)
        return self

    def remove(self) -> list[str]:
        """Remove it; returns what could not be removed. No process ever
        joins the cgroup (the eBPF backend only attaches programs to it)."""
        problems = []
        dataplane_cleanup(self.places)
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True,
                             text=True).stdout
        kill_pids([int(pid) for pid in out.split()])
        try:
            self.cgroup.rmdir()
        except FileNotFoundError:
            pass
        except OSError as err:
            problems.append(f"cgroup {self.cgroup}: {err}")
        if subprocess.run(["ip", "netns", "del", self.netns], capture_output=True).returncode:
            problems.append(f"netns {self.netns} could not be deleted")
        return problems


def dataplane_cleanup(places: LabPlaces) -> None:
    """Remove what any of our backends left in `places` beyond its processes
    and namespace (e.g. the eBPF backend's pins), if anything."""
    for spec in lab_backends().values():
        command = spec.lab.cleanup(places) if spec.lab else None
        if command is not None:
            run(command, check=False, timeout=60)


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss_mib: float
    timed_out: bool

    def describe(self) -> str:
        how = "timed out" if self.timed_out else f"exited {self.returncode}"
        return f"{how}; stderr: {self.stderr.strip()[-1500:]}"


def run_measured(argv: Sequence[str], timeout: float, workdir: Path, name: str) -> Finished:
    """Run to completion (killed after `timeout` s), with its peak RSS and its
    output kept in `workdir`.

    The peak RSS comes from /usr/bin/time, not from our own wait4(): Linux
    carries a process's high-water mark across fork and exec, so a child
    forked from this (large) Python process would report at least our size."""
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    rss = workdir / f"{name}.maxrss-kib"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        started = time.monotonic()
        popen = subprocess.Popen([TIME, "-f", "%M", "-o", str(rss), *argv],
                                 stdin=subprocess.DEVNULL, stdout=stdout,
                                 stderr=stderr, start_new_session=True)
        timed_out = False
        while popen.poll() is None:
            if time.monotonic() - started > timeout:
                timed_out = True
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
                break
            time.sleep(0.02)
    peak_kib = rss.read_text().split()[-1] if rss.exists() and rss.read_text().strip() else "0"
    return Finished(popen.returncode, out.read_text(errors="replace"),
                    err.read_text(errors="replace"), time.monotonic() - started,
                    int(peak_kib) / 1024 if peak_kib.isdigit() else 0.0, timed_out)
