"""Removing what a process of the lab created: its processes, namespaces,
cgroups, pinned BPF objects and temporary files. The same code ends a run and
clears the leftovers of processes that are gone (an e2e run, a bench, a test
session killed outright); it only ever touches objects whose name carries
their owner's pid (names.py), in either form.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable

from lab.names import BPFFS_ROOT, CGROUP2_ROOT, TEMP_ROOT, RunNames, owner_pid, process_exists
from lab.procs import kill_pids

log = logging.getLogger(__name__)

# Runs before namespaces and cgroups go, e.g. `kpng-py ebpf cleanup`, which
# needs the cgroup its programs are attached to.
DataplaneCleanup = Callable[[RunNames], None]


def _netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


# Which objects of an owner to remove: RunNames.in_run or RunNames.of_process.
Selects = Callable[[str], bool]


def _selected(root: Path, selects: Selects) -> list[Path]:
    return sorted(p for p in root.iterdir() if selects(p.name)) if root.is_dir() else []


def _cgroups_bottom_up(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [root]


def _kill_cgroup(root: Path) -> None:
    kill_file = root / "cgroup.kill"  # kernel 5.14+: kills the whole subtree
    if kill_file.exists():
        kill_file.write_text("1")
        return
    for cgroup in _cgroups_bottom_up(root):
        kill_pids([int(p) for p in (cgroup / "cgroup.procs").read_text().split()])


def _remove_cgroups(root: Path) -> list[str]:
    problems = []
    for cgroup in _cgroups_bottom_up(root):
        for _ in range(100):  # killed processes take a moment to leave
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
        else:
            problems.append(f"cgroup {cgroup} still busy")
    return problems


def remove_run(names: RunNames, dataplane_cleanup: DataplaneCleanup | None = None) -> list[str]:
    """Remove everything of run `names`; returns what could not be removed."""
    return _remove(names, names.in_run, dataplane_cleanup)


def _remove(names: RunNames, selects: Selects,
            dataplane_cleanup: DataplaneCleanup | None) -> list[str]:
    problems: list[str] = []
    namespaces = [ns for ns in _netns_names() if selects(ns)]
    for ns in namespaces:  # brain, backend and servers of a run that died
        kill_pids(_netns_pids(ns))
    if dataplane_cleanup is not None:
        try:
            dataplane_cleanup(names)
        except Exception as err:  # the generic removal below still runs
            problems.append(f"dataplane clean-up: {err}")
    for cgroup in _selected(CGROUP2_ROOT, selects):
        _kill_cgroup(cgroup)
        problems += _remove_cgroups(cgroup)
    for ns in namespaces:
        if subprocess.run(["ip", "netns", "del", ns], capture_output=True).returncode:
            problems.append(f"netns {ns} could not be deleted")
    for path in (*_selected(BPFFS_ROOT, selects), *_selected(TEMP_ROOT, selects)):
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            problems.append(f"{path} could not be removed")
    return problems


def leftovers(names: RunNames) -> list[str]:
    """Whatever of process `names` exists: its run's namespaces, cgroups,
    pins and work directories, and what it made with unique_name."""
    found = [ns for ns in _netns_names() if names.of_process(ns)]
    found += [str(p) for p in (names.cgroup, names.bpffs_dir, *names.workdirs()) if p.exists()]
    found += [str(p) for root in (CGROUP2_ROOT, BPFFS_ROOT) for p in _entries(root)
              if names.of_process(p.name) and str(p) not in found]
    return found


def stale_runs() -> list[RunNames]:
    """Owners of objects that exist while the owner process is gone."""
    candidates: Iterable[str] = [
        *_netns_names(),
        *(p.name for root in (CGROUP2_ROOT, BPFFS_ROOT, TEMP_ROOT) for p in _entries(root)),
    ]
    pids = {pid for name in candidates if (pid := owner_pid(name)) is not None}
    return [RunNames(pid) for pid in sorted(pids) if not process_exists(pid)]


def _entries(root: Path) -> list[Path]:
    return list(root.iterdir()) if root.is_dir() else []


def remove_stale_runs(dataplane_cleanup: DataplaneCleanup | None = None) -> list[str]:
    """Clear the leftovers of dead runs; returns a line per run cleared."""
    report = []
    for names in stale_runs():
        problems = _remove(names, names.of_process, dataplane_cleanup)
        report.append(f"removed leftovers of run {names.tag}"
                      + (f" (left: {'; '.join(problems)})" if problems else ""))
    return report
