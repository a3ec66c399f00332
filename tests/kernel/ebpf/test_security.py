"""Security of the eBPF backend: its pins and their directory are root-only,
and it refuses to start, naming what it lacks, without the capabilities it
needs (the CLI run as root with capabilities dropped by setpriv)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from backends.ebpf.datapath.loader import LINKS_DIR, PROGRAMS_DIR, Datapath, DatapathConfig, cleanup
from backends.ebpf.maps.layout import MAP_SPECS
from kpng_py.dataplane.contract import BackendSetupError
from lab.cgroups import cgroup
from lab.socket_lab import Lab, unique_bpffs_dir
from tests.support.ebpf import TEST_MAP_SIZES
from tests.support.ebpf_datapath import loaded
from tests.support.kernel import require_root_bpf
from tests.support.process import KPNG_PY, LOOPBACK_PROBES

pytestmark = pytest.mark.kernel

NOBODY = 65534


def mode_and_owner(path: Path) -> tuple[str, int]:
    info = path.lstat()
    return oct(stat.S_IMODE(info.st_mode)), info.st_uid


def test_pins_and_their_directories_are_root_only() -> None:
    with loaded(**TEST_MAP_SIZES) as datapath:
        datapath.attach()
        bpffs_dir = datapath.config.bpffs_dir
        build_dir = bpffs_dir / PROGRAMS_DIR / datapath.build
        directories = [bpffs_dir, bpffs_dir / LINKS_DIR, bpffs_dir / PROGRAMS_DIR, build_dir]
        pins = [bpffs_dir / spec.pin for spec in MAP_SPECS] + sorted(
            (bpffs_dir / LINKS_DIR).iterdir()) + sorted(build_dir.iterdir())
        assert len(pins) == len(MAP_SPECS) + 8 + 8
        assert {str(d): mode_and_owner(d) for d in directories} == {
            str(d): ("0o700", 0) for d in directories}
        assert {str(p): mode_and_owner(p) for p in pins} == {str(p): ("0o600", 0) for p in pins}


def test_an_existing_open_directory_is_made_root_only(caplog: pytest.LogCaptureFixture) -> None:
    require_root_bpf()
    bpffs_dir = unique_bpffs_dir()
    bpffs_dir.mkdir(mode=0o755)
    bpffs_dir.chmod(0o755)
    with caplog.at_level(logging.WARNING), loaded(bpffs_dir, **TEST_MAP_SIZES):
        assert mode_and_owner(bpffs_dir) == ("0o700", 0)
    assert "made the datapath's directory root-only" in caplog.text


def test_a_directory_of_another_user_is_refused() -> None:
    """Someone who could create it could swap our pins: refused, not adopted."""
    require_root_bpf()
    bpffs_dir = unique_bpffs_dir()
    bpffs_dir.mkdir(mode=0o700)
    try:
        os.chown(bpffs_dir, NOBODY, NOBODY)
        with cgroup() as group, pytest.raises(BackendSetupError) as refused:
            Datapath.load(DatapathConfig(bpffs_dir, group.path, TEST_MAP_SIZES))
        assert f"{bpffs_dir} belongs to uid {NOBODY}" in str(refused.value)
        assert "pick another --bpffs-dir" in str(refused.value)
        assert list(bpffs_dir.iterdir()) == []
    finally:
        cleanup(bpffs_dir)


@pytest.mark.parametrize("dropped, lacking", [
    ("all", ["CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE"]),
    ("sys_ptrace", ["CAP_SYS_PTRACE"]),
    ("net_admin", ["CAP_NET_ADMIN"]),
])
def test_without_capabilities_the_backend_refuses_to_start_and_lists_them(
        the_lab: Lab, dropped: str, lacking: list[str]) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    bpffs_dir = unique_bpffs_dir()
    try:
        result = subprocess.run(
            ["setpriv", "--inh-caps=-all", f"--bounding-set=-{dropped}", "--", KPNG_PY,
             "local", "--api", "unix:///nonexistent", *LOOPBACK_PROBES, "to-ebpf",
             "--cgroup", str(the_lab.group.path), "--bpffs-dir", str(bpffs_dir)],
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        (error,) = [line for line in result.stderr.splitlines() if "kpng-py: error:" in line]
        assert "to-ebpf lacks capabilities it needs: " in error
        assert [cap for cap in ("CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE")
                if f"{cap} (" in error] == lacking, error
        assert "run it as root, or grant them" in error
        assert not bpffs_dir.exists(), "nothing is touched before the check"
    finally:
        cleanup(bpffs_dir)
