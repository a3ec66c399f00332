"""Names of every kernel object and directory the lab creates.

Every name carries the pid of the process that made it, in one of two forms:
- `kpe2e-<pid>[-...]`: a whole run (a cluster of the e2e suite or the bench,
  `RunNames`); its links carry the pid too (`kpe<pid>br`), so that `ip link`
  output in a debugging session says which run they belong to;
- `<prefix><pid>x<counter>` (`unique_name`): one object of a test (a
  namespace, cgroup, bpffs directory, link), many per process.
Parallel runs never collide, and the leftovers of a process that is gone
(killed, crashed) are recognisable by `owner_pid` and safe to remove.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab.backends import LabPlaces

PREFIX = "kpe2e"


def cgroup2_mount(mounts: str = "/proc/mounts") -> Path:
    """The machine's cgroup v2 mount: /sys/fs/cgroup on a node with the
    unified layout, /sys/fs/cgroup/unified on a hybrid one (v1 controllers
    beside it); that path when none is mounted (a kernel test then skips,
    naming it)."""
    with open(mounts, encoding="utf-8") as lines:
        for line in lines:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "cgroup2":
                return Path(parts[1])
    return Path("/sys/fs/cgroup/unified")


CGROUP2_ROOT = cgroup2_mount()
BPFFS_ROOT = Path("/sys/fs/bpf")
TEMP_ROOT = Path(tempfile.gettempdir())
# What `unique_name` may be given: the prefixes the sweep recognises.
_UNIQUE_PREFIX = re.compile(r"^(?:kpng-py-test-|kp[a-z]+|vn|vp)$")
_OWNED = re.compile(rf"^(?:{PREFIX}-(\d+)(?:-|$)|(?:kpng-py-test-|kp[a-z]+|vn|vp)(\d+)x\d+$)")
_counter = itertools.count()


@dataclass(frozen=True)
class RunNames:
    """Names for the run of process `pid`."""

    pid: int

    @classmethod
    def for_this_process(cls) -> RunNames:
        return cls(os.getpid())

    @property
    def tag(self) -> str:
        return f"{PREFIX}-{self.pid}"

    def netns(self, host: str) -> str:
        """`host` is a pod name or "node"."""
        return f"{self.tag}-{host}"

    @property
    def cgroup(self) -> Path:
        """The pods' cgroup; each pod gets a child of it."""
        return CGROUP2_ROOT / self.tag

    @property
    def bpffs_dir(self) -> Path:
        return BPFFS_ROOT / self.tag

    @property
    def workdir_prefix(self) -> str:
        return f"{self.tag}-"

    # Interface names: at most 15 characters; pids have at most 7 digits.
    @property
    def bridge(self) -> str:
        return f"kpe{self.pid}br"

    def veth(self, index: int) -> str:
        return f"kpe{self.pid}p{index}"

    @property
    def service_interface(self) -> str:
        """The node's interface for ClusterIPs (userspace backend)."""
        return f"kpe{self.pid}svc"

    @property
    def places(self) -> LabPlaces:
        """Where the run's backend keeps its dataplane (lab.backends)."""
        return LabPlaces(self.netns("node"), self.cgroup, self.bpffs_dir, self.service_interface)

    def make_workdir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=self.workdir_prefix))

    def workdirs(self) -> list[Path]:
        return sorted(TEMP_ROOT.glob(f"{self.workdir_prefix}*"))

    def in_run(self, name: str) -> bool:
        """Whether `name` is one of this run's objects (`kpe2e-<pid>...`)."""
        return name == self.tag or name.startswith(f"{self.tag}-")

    def of_process(self, name: str) -> bool:
        """Whether `name` is any object of the process: of its run or made by
        unique_name (the leftovers of a process that is gone)."""
        return owner_pid(name) == self.pid


def unique_name(prefix: str) -> str:
    """prefix + pid + counter, unique in this process; with a prefix of up to
    5 characters it fits an interface name (15 characters). The prefix is
    one the sweep of leftovers recognises (`kpng-py-test-`, `kp` and letters,
    `vn`, `vp`): a name it would not find is refused."""
    if not _UNIQUE_PREFIX.match(prefix):
        raise ValueError(f"unique_name: prefix {prefix!r} is not one the sweep of leftovers "
                         "recognises (kpng-py-test-, kp + letters, vn, vp)")
    return f"{prefix}{os.getpid()}x{next(_counter)}"


def owner_pid(name: str) -> int | None:
    """The pid in a name made by RunNames or unique_name (a netns, cgroup,
    pin or temp dir name), or None when the name is not ours."""
    match = _OWNED.match(name)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def process_exists(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not: it is dead, only
    not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses.
    return stat[stat.rindex(")") + 2] != "Z"
