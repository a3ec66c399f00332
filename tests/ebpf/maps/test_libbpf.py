"""Errors of the bpf() calls (backends/ebpf/maps/libbpf.py) name the object
and what was asked, and a refused permission is an error, not an empty
answer. No root needed (the capabilities are dropped where there are any)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backends.ebpf.maps import libbpf

REPOSITORY = Path(__file__).resolve().parents[3]


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
