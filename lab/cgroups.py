"""cgroup v2 directories of the tests' own, uniquely named
(names.unique_name) under the unified hierarchy, never the machine's root
cgroup; removed on exit with what the test put in them."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from lab.names import CGROUP2_ROOT, unique_name
from lab.procs import kill_pids


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
        kill_pids(self.pids())
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:  # processes take a moment to leave after SIGKILL
                time.sleep(0.02)


@contextmanager
def cgroup(prefix: str = "kpng-py-test-") -> Iterator[Cgroup]:
    cg = Cgroup(CGROUP2_ROOT / unique_name(prefix)).create()
    try:
        yield cg
    finally:
        cg.delete()
