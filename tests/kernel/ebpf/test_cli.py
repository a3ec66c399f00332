"""`kpng-py to-ebpf` and `kpng-py ebpf dump|cleanup` (backends/ebpf/cli.py)
check --bpffs-dir and --cgroup before they touch anything: a bpffs mount
root refused with its mode left alone, a path that climbs out of bpffs or
cgroup2 named as given and as resolved; exit status 2, one line, no
traceback. The mount-root cases run on a private bpffs instance in a mount
namespace of their own, so /sys/fs/bpf (1777) is never touched."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lab.cgroups import cgroup
from lab.names import BPFFS_ROOT as BPFFS
from lab.socket_lab import unique_bpffs_dir
from tests.support.ebpf import escaping
from tests.support.kernel import require_root_bpf
from tests.support.process import KPNG_PY, LOOPBACK_PROBES

pytestmark = pytest.mark.kernel


@pytest.fixture(autouse=True)
def _root() -> None:
    require_root_bpf()


def in_private_bpffs(script: str, mount: Path) -> subprocess.CompletedProcess:
    """Runs a shell script in a mount namespace of its own, with a fresh bpffs
    instance (mode 1777, like /sys/fs/bpf) at $MNT, and the command at $KPNG_PY."""
    mount.mkdir()
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         f'mount -t bpf -o mode=1777 bpf "$MNT" && {script}'],
        env={"MNT": str(mount), "KPNG_PY": KPNG_PY, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [
    "local --api unix:///nonexistent {probes} to-ebpf --bpffs-dir $MNT --cgroup {cgroup}",
    "ebpf cleanup --bpffs-dir $MNT",
    "ebpf dump --bpffs-dir $MNT/x/..",
])
def test_the_cli_refuses_a_bpffs_root_and_leaves_its_mode_alone(
        tmp_path: Path, command: str) -> None:
    with cgroup() as group:
        args = command.format(probes=" ".join(LOOPBACK_PROBES), cgroup=group.path)
        # timeout: a backend that accepted the path would watch the brain forever.
        result = in_private_bpffs(
            f'timeout -s KILL 60 "$KPNG_PY" {args}; echo "rc=$?"; stat -c %a "$MNT"',
            tmp_path / "mnt")
    rc, mode = result.stdout.splitlines()[-2:]
    assert (rc, mode) == ("rc=2", "1777"), result.stderr
    (error,) = [line for line in result.stderr.splitlines() if "kpng-py: error:" in line]
    assert "is the root of a bpf filesystem" in error and "Traceback" not in result.stderr


def test_the_cli_checks_the_paths_of_dump_and_cleanup(tmp_path: Path) -> None:
    outside = escaping(BPFFS, tmp_path)
    with cgroup() as group:
        for args in (["ebpf", "dump", "--bpffs-dir", str(outside)],
                     ["ebpf", "cleanup", "--bpffs-dir", str(outside)],
                     ["ebpf", "cleanup", "--bpffs-dir", str(unique_bpffs_dir()),
                      "--cgroup", str(group.path / ".." / ".." / "..")]):
            result = subprocess.run([KPNG_PY, *args], capture_output=True, text=True,
                                    timeout=60)
            assert result.returncode == 2, (args, result.stderr)
            (error,) = [line for line in result.stderr.splitlines() if "kpng-py: error:" in line]
            assert "(that is " in error and " is not " in error, error
