"""Kernel test environment: private network namespaces and cgroups.

Every object gets a unique name (prefix + pid + counter) so concurrent runs
never collide, and is removed on exit, also when the test fails.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import pytest

CGROUP2_ROOT = Path("/sys/fs/cgroup/unified")
_counter = itertools.count()


def unique_name(prefix: str) -> str:
    """prefix + pid + counter; with a prefix of up to 5 characters it fits an
    interface name (15 characters)."""
    return f"{prefix}{os.getpid()}x{next(_counter)}"


def require_root() -> None:
    """Skip (a failure under CI=true) where network namespaces cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip`)")


def require_root_bpf() -> None:
    """Skip (a failure under CI=true) where kernel tests cannot run."""
    if os.geteuid() != 0:
        pytest.skip("needs root for BPF, cgroups and network namespaces")
    if not CGROUP2_ROOT.is_dir() or not (CGROUP2_ROOT / "cgroup.procs").exists():
        pytest.skip(f"needs cgroup v2 mounted at {CGROUP2_ROOT}")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip`)")


def run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kwargs)


class NetNS:
    """A named network namespace (`ip netns`), loopback up, no route out."""

    def __init__(self, name: str) -> None:
        self.name = name

    def create(self) -> NetNS:
        run(["ip", "netns", "add", self.name])
        self.ip("link", "set", "lo", "up")
        return self

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "pids", self.name], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def exec_args(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def run(self, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
        return run(self.exec_args(*cmd), **kwargs)

    def ip(self, *args: str) -> subprocess.CompletedProcess:
        return run(["ip", "-n", self.name, *args])


class Cgroup:
    """A cgroup v2 directory of our own under the unified hierarchy."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def create(self) -> Cgroup:
        self.path.mkdir()
        return self

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def delete(self) -> None:
        """Kill what we put in it (our own children) and remove it."""
        if not self.path.exists():
            return
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:  # processes take a moment to leave after SIGKILL
                time.sleep(0.02)


@contextmanager
def netns(prefix: str = "kpt") -> Iterator[NetNS]:
    ns = NetNS(unique_name(prefix)).create()
    try:
        yield ns
    finally:
        ns.delete()


@contextmanager
def cgroup(prefix: str = "kpng-py-test-") -> Iterator[Cgroup]:
    cg = Cgroup(CGROUP2_ROOT / unique_name(prefix)).create()
    try:
        yield cg
    finally:
        cg.delete()


_OWNED = re.compile(r"^(?:kpng-py-test-|kp[a-z]|vn|vp)(\d+)x\d+$")


def _owner_is_gone(name: str) -> bool:
    match = _OWNED.match(name)
    return bool(match) and not Path(f"/proc/{match[1]}").exists()


def sweep_stale() -> list[str]:
    """Remove what test processes that were killed (not failed: those clean up
    after themselves) left behind: their cgroups with the BPF links on them,
    pinned maps, namespaces. Only names of this suite whose pid is gone."""
    from backends.ebpf.loader import cleanup

    removed: list[str] = []
    bpffs = Path("/sys/fs/bpf")
    for pins in (p for p in bpffs.iterdir() if p.is_dir() and _owner_is_gone(p.name)):
        cleanup(pins)
        shutil.rmtree(pins, ignore_errors=True)
        removed.append(str(pins))
    for path in (p for p in CGROUP2_ROOT.iterdir() if p.is_dir() and _owner_is_gone(p.name)):
        Cgroup(path).delete()
        removed.append(str(path))
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        if _owner_is_gone(name):
            NetNS(name).delete()
            removed.append(f"netns {name}")
    return removed
