"""Errors of the datapath loader (backends/ebpf/datapath/loader.py): real
checks, naming the object and the fix, and "needs root" only when
permission was refused. No root needed: nothing is loaded or attached (the
link requests fail on a program fd that is no program). The path checks,
which need bpffs and cgroup2, are in tests/kernel/ebpf/datapath/test_loader.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backends.ebpf.datapath import loader
from backends.ebpf.datapath.build import BuildError
from backends.ebpf.datapath.loader import HOOKS, LINKS_DIR, Datapath, DatapathConfig
from backends.ebpf.datapath.ownership import DatapathLock
from kpng_py.dataplane.contract import BackendSetupError

NOT_A_PROGRAM = -1


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
