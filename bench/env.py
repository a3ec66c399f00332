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
from typing import Callable, Sequence

from lab.backends import LabPlaces, lab_backends
from lab.names import RunNames
from lab.procs import JsonLog, kill_pids, run

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
        """Where a backend run in it keeps its dataplane (lab.backends)."""
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
    for backend in lab_backends().values():
        command = backend.support.cleanup(places)
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


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, then after 10 s SIGKILL; waited for."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_measured(argv: Sequence[str], timeout: float, workdir: Path, name: str) -> Finished:
    """Run to completion (killed after `timeout` s), with its peak RSS and its
    output kept in `workdir`."""
    return Watched(argv, workdir, name).finish(timeout)


class Watched:
    """A process started at once under /usr/bin/time, its output kept in
    `workdir`, whose JSON log lines (stderr) are read while it runs, each
    with the time.monotonic() at which it was first seen (polled every 10 ms).

    The peak RSS comes from /usr/bin/time, not from our own wait4(): Linux
    carries a process's high-water mark across fork and exec, so a child
    forked from this (large) Python process would report at least our size."""

    POLL_SECONDS = 0.01

    def __init__(self, argv: Sequence[str], workdir: Path, name: str) -> None:
        self._out, self._err = workdir / f"{name}.out", workdir / f"{name}.err"
        self._rss = workdir / f"{name}.maxrss-kib"
        self._log = JsonLog(self._err)
        with open(self._out, "wb") as stdout, open(self._err, "wb") as stderr:
            self.started = time.monotonic()
            self._popen = subprocess.Popen([TIME, "-f", "%M", "-o", str(self._rss), *argv],
                                           stdin=subprocess.DEVNULL, stdout=stdout,
                                           stderr=stderr, start_new_session=True)

    @property
    def records(self) -> list[tuple[float, dict]]:
        return self._log.records

    def wait_for(self, wanted: Callable[[dict], bool], timeout: float, skip: int = 0
                 ) -> tuple[float, dict] | None:
        """The (time seen, record) of the first log record after the first
        `skip` that is `wanted`; None if the process exits or `timeout` s
        pass first."""
        deadline = time.monotonic() + timeout
        while True:
            exited = self._popen.poll() is not None
            self._log.poll()
            found = [(seen, r) for seen, r in self.records if wanted(r)][skip:]
            if found:
                return found[0]
            if exited or time.monotonic() > deadline:
                return None
            time.sleep(self.POLL_SECONDS)

    def finish(self, timeout: float) -> Finished:
        """Wait for the exit, killing it once `timeout` s have passed since its
        start."""
        timed_out = False
        while self._popen.poll() is None:
            if time.monotonic() - self.started > timeout:
                timed_out = True
                self.kill()
                break
            time.sleep(self.POLL_SECONDS)
        self._log.poll()
        text = self._rss.read_text() if self._rss.exists() else ""
        peak_kib = text.split()[-1] if text.strip() else "0"
        return Finished(self._popen.returncode, self._out.read_text(errors="replace"),
                        self._err.read_text(errors="replace"), time.monotonic() - self.started,
                        int(peak_kib) / 1024 if peak_kib.isdigit() else 0.0, timed_out)

    def kill(self) -> None:
        """Kill its process group (its own session), if still running."""
        if self._popen.poll() is None:
            os.killpg(self._popen.pid, signal.SIGKILL)
        self._popen.wait()
