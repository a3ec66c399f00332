"""Names of every kernel object and directory a run creates.

All of them carry one tag, `kpe2e-<pid>`, with the pid of the process that
built the cluster: parallel runs never collide, and the leftovers of a run
whose process is gone (killed, crashed) are recognisable and safe to remove.
Links live inside the run's own namespaces, but carry the pid too so that
`ip link` output in a debugging session says which run they belong to.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREFIX = "kpe2e"
CGROUP2_ROOT = Path("/sys/fs/cgroup/unified")
BPFFS_ROOT = Path("/sys/fs/bpf")
TEMP_ROOT = Path(tempfile.gettempdir())
_TAG = re.compile(rf"^{PREFIX}-(\d+)(?:-|$)")


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

    def make_workdir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=self.workdir_prefix))

    def workdirs(self) -> list[Path]:
        return sorted(TEMP_ROOT.glob(f"{self.workdir_prefix}*"))


def owner_pid(name: str) -> int | None:
    """The pid in a name made by RunNames (a netns, cgroup, pin or temp dir
    name), or None when the name is not ours."""
    match = _TAG.match(name)
    return int(match.group(1)) if match else None


def process_exists(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not: it is dead, only
    not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses.
    return stat[stat.rindex(")") + 2] != "Z"
