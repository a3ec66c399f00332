"""Cgroup v2 ids as paths: what `ebpf trace` names a client's cgroup by and
`ebpf dump` a hook's (the kernel gives ids: the cgroup directory's inode
number)."""

from __future__ import annotations

import os
import time
from pathlib import Path

_RESCAN_SECONDS = 1.0


class CgroupPaths:
    """Cgroup v2 ids (inode numbers) to paths under the cgroup2 mount,
    walked again (at most once a second) when an id is unknown."""

    def __init__(self, root: Path | None) -> None:
        self._root = root
        self._paths: dict[int, str] = {}
        self._scanned = 0.0

    def path(self, cgroup_id: int) -> str:
        if cgroup_id not in self._paths and self._root is not None and (
                time.monotonic() - self._scanned > _RESCAN_SECONDS):
            self._scan(self._root)
        return self._paths.get(cgroup_id, f"cgroup {cgroup_id}")

    def _scan(self, root: Path) -> None:
        self._scanned = time.monotonic()
        for directory, _, _ in os.walk(root):
            try:
                self._paths[os.stat(directory).st_ino] = "/" + os.path.relpath(directory, root)
            except OSError:  # removed meanwhile
                continue
        self._paths[os.stat(root).st_ino] = "/"
