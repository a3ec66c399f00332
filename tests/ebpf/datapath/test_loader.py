"""Errors of the eBPF backend outside the programmer: real checks (not
asserts, which python -O strips), naming the object and the fix, and "needs
root" only when permission was refused. No root needed: nothing is loaded or
attached (the link requests fail on a program fd that is no program)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backends.ebpf.backend import BackendNotReadyError, EbpfBackend
from backends.ebpf.datapath import loader
from backends.ebpf.datapath.build import BuildError
from backends.ebpf.datapath.loader import HOOKS, LINKS_DIR, Datapath, DatapathConfig
from backends.ebpf.datapath.ownership import DatapathLock
from backends.ebpf.maps import libbpf
from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from kpng_py.state.skips import Skips

NOT_A_PROGRAM = -1
REPOSITORY = Path(__file__).resolve().parents[3]


def test_apply_before_setup_names_the_backend_and_the_fix() -> None:
    """A check of its own (an assert would raise AssertionError, or under -O
    an AttributeError half-way through)."""
    metrics = Metrics()
    backend = EbpfBackend(DatapathConfig(Path("/nonexistent/bpffs"), Path("/nonexistent/cgroup")),
                          metrics, Skips(metrics))
    with pytest.raises(BackendNotReadyError, match=r"cgroup /nonexistent/cgroup .*call setup\(\)"):
        backend.apply(ServicePortChanges(full=True))
    backend.close()
    with pytest.raises(BackendNotReadyError):
        backend.apply(ServicePortChanges(full=True))


@pytest.fixture
def unattached(tmp_path: Path) -> Datapath:
    """A Datapath whose programs are no programs, on a plain directory as its
    cgroup: attach() fails before the kernel attaches anything."""
    (tmp_path / "bpffs" / LINKS_DIR).mkdir(parents=True)
    (tmp_path / "cgroup").mkdir()
    config = DatapathConfig(tmp_path / "bpffs", tmp_path / "cgroup")
    lock = DatapathLock.take(config.bpffs_dir)
    assert lock is not None
    return Datapath(config, build="none", maps={},
                    programs={h.name: NOT_A_PROGRAM for h in HOOKS}, lock=lock)


def test_a_missing_cgroup_is_named_at_attach(unattached: Datapath) -> None:
    unattached.config.cgroup.rmdir()
    with pytest.raises(FileNotFoundError, match=f"open cgroup {unattached.config.cgroup} to "
                                                "attach the programs: No such file"):
        unattached.attach()


def test_a_failed_attach_names_the_hook_the_cgroup_and_the_pin(unattached: Datapath) -> None:
    with pytest.raises(OSError) as failed:
        unattached.attach()
    config, hook = unattached.config, HOOKS[0]
    assert (f"attach {hook.function} to cgroup {config.cgroup} (link pinned at "
            f"{config.bpffs_dir / LINKS_DIR / hook.name}): create a cgroup link") in str(
        failed.value)
    needs_root = failed.value.errno in (1, 13)  # EPERM, EACCES: run without privileges
    assert ("needs root" in str(failed.value)) == needs_root
    assert list((config.bpffs_dir / LINKS_DIR).iterdir()) == []


def test_info_of_a_non_bpf_fd_names_the_object(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="read LinkInfo of the link pinned at /x:"):
            libbpf.obj_info(fd, libbpf.LinkInfo, "the link pinned at /x")
    finally:
        os.close(fd)


def without_capabilities(*command: str) -> subprocess.CompletedProcess:
    """Runs a command with no capabilities (as root: dropped by setpriv)."""
    drop: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux) to drop root's capabilities")
        drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    return subprocess.run([*drop, *command], capture_output=True, text=True, timeout=120,
                          cwd=REPOSITORY)


def test_listing_links_without_the_capability_is_an_error_not_an_empty_list() -> None:
    """`ebpf cleanup --cgroup` would otherwise find no link and say so."""
    ran = without_capabilities(sys.executable, "-c", "from backends.ebpf.maps import libbpf\n"
                               "try:\n    list(libbpf.link_ids())\n"
                               "except PermissionError as refused:\n    print(refused)\n")
    assert ran.stdout.strip() == ("[Errno 1] list the BPF links of the machine: Operation not "
                                  "permitted"), ran.stderr


def test_a_failed_load_is_not_blamed_on_root() -> None:
    """The capabilities are checked before loading; BCC's bare Exception for
    a compile or verifier failure (as the build child reports it) says
    nothing about permissions. test_build.py makes BCC fail for real."""
    source = loader.BPF_SOURCE_DIR / "sock_lb.c"
    cause = BuildError("Failed to compile BPF module b'sock_lb.c'").as_exception()
    with pytest.raises(BackendSetupError) as refused:
        loader._raise_unloadable(source, cause)
    message = str(refused.value)
    assert "needs root" not in message
    assert f"{source}: Failed to compile BPF module" in message
    assert f"linux-headers-{os.uname().release}" in message
