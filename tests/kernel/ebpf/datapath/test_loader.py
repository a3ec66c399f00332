"""--bpffs-dir and --cgroup: resolved once (symlinks, "..", relative paths),
checked as resolved, and only the resolved path used afterwards; a bpffs
mount root refused; errors that are not about permissions not blamed on
root (backends/ebpf/datapath/loader.py). The real bpffs and cgroup2 mounts,
with directories of the test's own; /sys/fs/bpf itself is only checked,
never changed. The command line's checks: tests/kernel/ebpf/test_cli.py."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from backends.ebpf.datapath.loader import (
    LINKS_DIR,
    PROGRAMS_DIR,
    Datapath,
    DatapathConfig,
    checked_bpffs_dir,
    checked_cgroup,
    cleanup,
)
from backends.ebpf.datapath.privileges import privilege_hint
from backends.ebpf.maps import layout as maps
from kpng_py.dataplane.contract import BackendSetupError
from lab.cgroups import cgroup
from lab.names import BPFFS_ROOT as BPFFS
from lab.names import CGROUP2_ROOT, unique_name
from lab.socket_lab import unique_bpffs_dir
from tests.support.ebpf import TEST_MAP_SIZES, escaping
from tests.support.ebpf_datapath import loaded
from tests.support.kernel import require_root_bpf

pytestmark = pytest.mark.kernel


@pytest.fixture(autouse=True)
def _root() -> None:
    require_root_bpf()


def test_dot_dot_out_of_bpffs_is_refused(tmp_path: Path) -> None:
    given = escaping(BPFFS, tmp_path / "pins")
    with pytest.raises(BackendSetupError) as refused:
        checked_bpffs_dir(given)
    assert str(refused.value) == (
        f"--bpffs-dir {given} (that is {tmp_path / 'pins'}) is not on a bpf filesystem; "
        "mount one (mount -t bpf bpf /sys/fs/bpf) or pick a directory under it")


@pytest.mark.parametrize("given", [BPFFS, BPFFS / "kpng-py" / "..", BPFFS / "."])
def test_a_bpffs_mount_root_is_refused(given: Path) -> None:
    with pytest.raises(BackendSetupError) as refused:
        checked_bpffs_dir(given)
    assert "is the root of a bpf filesystem, which kpng-py would make root-only (0700)" in str(
        refused.value)
    assert "pick a directory under it, such as /sys/fs/bpf/kpng-py" in str(refused.value)


def test_a_symlink_to_a_bpffs_directory_is_followed(tmp_path: Path) -> None:
    target = unique_bpffs_dir()
    (tmp_path / "link").symlink_to(target)
    assert checked_bpffs_dir(tmp_path / "link" / "pins") == target / "pins"


def test_a_cgroup_path_is_checked_as_resolved(tmp_path: Path) -> None:
    # Lexically under the cgroup2 mount, with a cgroup.procs: what a check of
    # the path as given accepted, and where no program would ever run.
    (tmp_path / "cgroup.procs").write_text("")
    given = escaping(CGROUP2_ROOT, tmp_path)
    with pytest.raises(BackendSetupError) as refused:
        checked_cgroup(given)
    assert str(refused.value).startswith(
        f"--cgroup {given} (that is {tmp_path}) is not a cgroup v2 directory (it is on ")
    assert str(refused.value).endswith(
        f"); the cgroup2 mounts here: {CGROUP2_ROOT}; pass one of them (or a directory under "
        "one)")
    with cgroup() as group:
        (tmp_path / "link").symlink_to(group.path)
        assert checked_cgroup(tmp_path / "link") == group.path


def test_relative_paths_are_taken_from_the_cwd_and_compiled_in_resolved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = unique_name("kpng-py-test-")
    with cgroup() as group:
        monkeypatch.chdir(BPFFS)
        relative_cgroup = Path("..") / "cgroup" / CGROUP2_ROOT.name / group.path.name
        config = DatapathConfig(Path(name), relative_cgroup, TEST_MAP_SIZES)
        datapath = Datapath.load(config)
        try:
            assert datapath.config.bpffs_dir == BPFFS / name
            assert datapath.config.cgroup == group.path
            monkeypatch.chdir("/")  # nothing may depend on the cwd any more
            datapath.attach()
            pinned = sorted(p.name for p in (BPFFS / name).iterdir())
            assert pinned == sorted([LINKS_DIR, PROGRAMS_DIR,
                                     *(spec.pin for spec in maps.MAP_SPECS)])
            assert len(list((BPFFS / name / LINKS_DIR).iterdir())) == 8
            assert len(list((BPFFS / name / PROGRAMS_DIR / datapath.build).iterdir())) == 8
        finally:
            datapath.close()
            cleanup(BPFFS / name, group.path)


def test_only_a_refused_permission_is_said_to_need_root() -> None:
    assert privilege_hint(OSError(errno.EPERM, "x")) == " (needs root)"
    assert privilege_hint(OSError(errno.EACCES, "x")) == " (needs root)"
    assert privilege_hint(OSError(errno.ENOTDIR, "x")) == ""
    with loaded(**TEST_MAP_SIZES) as datapath, cgroup() as group:
        # Under a pinned map, which is no directory: mkdir fails with EEXIST.
        inside_a_pin = datapath.config.bpffs_dir / maps.SERVICES.pin / "pins"
        with pytest.raises(BackendSetupError) as refused:
            Datapath.load(DatapathConfig(inside_a_pin, group.path, TEST_MAP_SIZES))
    assert "File exists" in str(refused.value)
    assert "needs root" not in str(refused.value)


def test_the_root_of_a_hybrid_cgroup_layout_stands_for_its_cgroup_v2_hierarchy(
        tmp_path: Path) -> None:
    """Issue 31: on a node with v1 controllers and v2 at /sys/fs/cgroup/unified
    the manifest's --cgroup (the node's /sys/fs/cgroup) was refused. Made
    here in a mount namespace of its own: a tmpfs with cgroup2 at `unified`."""
    root = tmp_path / "cgroup"
    root.mkdir()
    script = ('mount -t tmpfs tmpfs "$ROOT" && mkdir "$ROOT/unified" && '
              'mount -t cgroup2 none "$ROOT/unified" && "$PYTHON" -c "$CHECK" "$ROOT"')
    check = ("import sys; from pathlib import Path; "
             "from backends.ebpf.datapath.loader import checked_cgroup; "
             "print(checked_cgroup(Path(sys.argv[1])))")
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        env={"ROOT": str(root), "PYTHON": sys.executable, "CHECK": check,
             "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(root / "unified")
