"""One process at a time programs a datapath: it holds an exclusive lock
(flock) on the datapath's bpffs directory for as long as it runs.

The kernel drops the lock when the holder exits, whatever the way (a kill -9
too), and every process that sees the node's bpffs sees the same directory
(a container mounting it from the host included), so:
- a second backend on the same directory is refused at start, instead of
  overwriting the first one's maps behind its back;
- `kpng-py ebpf cleanup` refuses to remove a datapath a live process owns
  (unless forced), and holds the lock itself while it removes one, so that
  no backend starts in the middle of it.

A lock belongs to the directory's inode: a directory removed and made again
(a forced cleanup, then the owner putting its datapath back) is a new one,
which the owner locks again (`DatapathLock.renew`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.runtime.logs import fields

log = logging.getLogger(__name__)

# How long a start waits for the owner to go: the time a stopping kpng-py
# may take to exit (it exits at the latest 10 s after SIGTERM), with room.
START_WAIT_SECONDS = 15.0
_POLL_SECONDS = 0.1


class DatapathInUse(BackendSetupError):
    """Another live process holds the datapath's lock."""


def holder(directory: Path) -> str:
    """Who holds the lock of `directory`, as this process can tell: `pid N`
    from /proc/locks, or "a process of another PID namespace"."""
    try:
        info = directory.stat()
        with open("/proc/locks", encoding="ascii") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return "another process"
    inode = f":{info.st_ino} "
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 15336 00:28:436619 0 EOF"
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and f"{parts[5]} ".endswith(inode):
            major, minor = (int(part, 16) for part in parts[5].split(":")[:2])
            if os.makedev(major, minor) == info.st_dev:
                return f"pid {parts[4]}" if parts[4] not in ("0", "-1") else (
                    "a process of another PID namespace")
    return "another process"


class DatapathLock:
    """The lock on one datapath directory, held by this process."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd = fd

    @classmethod
    def take(cls, directory: Path) -> DatapathLock | None:
        """The lock if it is free now; None while another process holds it."""
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(directory, fd)

    @classmethod
    def wait_for(cls, directory: Path, seconds: float) -> DatapathLock | None:
        """The lock, waiting up to `seconds` for its holder to go (a
        stopping process; logged once); None if it stays."""
        deadline = time.monotonic() + seconds
        lock = cls.take(directory)
        if lock is None and seconds > 0:
            log.warning("another process owns the datapath; waiting for it to stop",
                        extra=fields(bpffs_dir=directory, owner=holder(directory),
                                     wait_s=seconds))
        while lock is None and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
            lock = cls.take(directory)
        return lock

    def held(self) -> bool:
        """Whether the lock is still on the directory at its path (not on a
        directory removed since)."""
        try:
            return os.stat(self.directory).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False

    def renew(self) -> None:
        """Lock the directory now at the path (made again after a removal);
        DatapathInUse if another process took it meanwhile."""
        fresh = DatapathLock.take(self.directory)
        if fresh is None:
            raise DatapathInUse(f"the datapath directory {self.directory} was made again by "
                                f"another process ({holder(self.directory)}), which holds it")
        os.close(self._fd)
        self._fd = fresh._fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1


def owned_datapaths(bpffs_root: Path, layout: tuple[str, ...]) -> dict[Path, str]:
    """The directories under a bpf filesystem's root that hold a datapath
    (`layout`: the subdirectories one has) and whose lock a live process
    holds, with who holds it."""
    owned: dict[Path, str] = {}
    for directory, subdirectories, _ in os.walk(bpffs_root):
        if not set(layout) <= set(subdirectories):
            continue
        subdirectories.clear()  # a datapath holds no other
        path = Path(directory)
        try:
            lock = DatapathLock.take(path)
        except OSError:
            continue  # gone meanwhile, or not ours to open
        if lock is None:
            owned[path] = holder(path)
        else:
            lock.release()
    return owned
