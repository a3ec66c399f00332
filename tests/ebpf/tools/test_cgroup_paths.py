"""Cgroup ids as paths (backends/ebpf/tools/cgroup_paths.py) on a directory
tree of the test's own (a cgroup v2 id is its directory's inode number, so
any tree stands for the cgroup2 mount; no root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backends.ebpf.tools import cgroup_paths
from backends.ebpf.tools.cgroup_paths import CgroupPaths


def id_of(directory: Path) -> int:
    return os.stat(directory).st_ino


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "kubepods" / "pod1").mkdir(parents=True)
    return tmp_path


def test_an_id_is_named_by_its_path_under_the_root(root: Path) -> None:
    paths = CgroupPaths(root)
    assert paths.path(id_of(root / "kubepods" / "pod1")) == "/kubepods/pod1"
    assert paths.path(id_of(root / "kubepods")) == "/kubepods"
    assert paths.path(id_of(root)) == "/"


def test_an_unknown_id_or_no_cgroup2_mount_is_named_by_the_number(root: Path) -> None:
    outside = root.parent
    assert CgroupPaths(root).path(id_of(outside)) == f"cgroup {id_of(outside)}"
    assert CgroupPaths(None).path(id_of(root)) == f"cgroup {id_of(root)}"


def test_a_cgroup_made_later_is_found_once_the_rescan_delay_passed(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = CgroupPaths(root)
    paths.path(id_of(root))
    (root / "late").mkdir()
    monkeypatch.setattr(cgroup_paths, "_RESCAN_SECONDS", 3600.0)
    assert paths.path(id_of(root / "late")) == f"cgroup {id_of(root / 'late')}"
    monkeypatch.setattr(cgroup_paths, "_RESCAN_SECONDS", 0.0)
    assert paths.path(id_of(root / "late")) == "/late"
