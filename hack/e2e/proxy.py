"""The proxy under test in KPNG's split sidecar layout: the built-in brain
(`kpng-py file -i STATE to-api`) and a backend (`kpng-py local ... to-X`) as
separate processes on the node, talking over a unix socket.

Waiting for a change to take effect never sleeps blindly: the backend logs
`sync applied` (JSON) after each change set it programmed, and `apply` waits
for the next one after the state file changed.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from e2e.cluster import Cluster
from e2e.names import RunNames
from e2e.procs import Proc, run, wait_until
from e2e.statefile import LOCAL_NODE, ClusterState, write_atomically

KPNG_PY = str(Path(sys.executable).with_name("kpng-py"))
START_TIMEOUT = 120.0  # BCC compiles the programs at start-up: seconds on a busy machine
SYNC_TIMEOUT = 20.0
# Two polls of the brain (0.2 s each): enough for a file only ever replaced atomically.
ATOMIC_SAVES_SETTLE_SECONDS = 0.2


def kpng_py(*args: str) -> list[str]:
    return [KPNG_PY, "--log-format", "json", *args]


def ebpf_cleanup(names: RunNames) -> None:
    """Detach and unpin what the eBPF backend installed for run `names`."""
    if names.bpffs_dir.exists() or names.cgroup.exists():
        run([KPNG_PY, "ebpf", "cleanup", "--cgroup", str(names.cgroup),
             "--bpffs-dir", str(names.bpffs_dir)])


@dataclass(frozen=True)
class BackendKind:
    name: str
    sink_args: Callable[[RunNames], list[str]]
    # A command that shows what the backend programmed (saved with the logs).
    inspect: Callable[[RunNames], list[str]]
    dataplane_cleanup: Callable[[RunNames], None] | None
    # Whether every packet to a ClusterIP must be translated inside the pod
    # (a socket-level balancer), so that none may ever reach the node.
    translates_in_pod: bool
    # Whether the dataplane outlives the process (kernel state), so that a
    # restart neither refuses a new connection nor breaks an established one.
    # A userspace proxy cannot: its sockets die with it (kube-proxy's
    # userspace mode behaved the same); S13 then asks only that it serves
    # again, including changes made while it was down.
    survives_restart: bool


BACKENDS = {
    "ebpf": BackendKind(
        "ebpf",
        sink_args=lambda names: ["to-ebpf", "--cgroup", str(names.cgroup),
                                 "--bpffs-dir", str(names.bpffs_dir)],
        inspect=lambda names: [KPNG_PY, "ebpf", "dump", "--bpffs-dir", str(names.bpffs_dir)],
        dataplane_cleanup=ebpf_cleanup, translates_in_pod=True, survives_restart=True),
    "userspace": BackendKind(
        "userspace",
        sink_args=lambda names: ["to-userspace", "--interface", names.service_interface],
        inspect=lambda names: ["ip", "-n", names.netns("node"), "addr", "show",
                               "dev", names.service_interface],
        dataplane_cleanup=None, translates_in_pod=False, survives_restart=False),
}


def built_in_backends() -> list[str]:
    """The backends this kpng-py has (`to-<name>` sinks)."""
    from kpng_py.cli import BACKENDS as SINKS

    return [name for name in BACKENDS if f"to-{name}" in SINKS]


class JsonLog:
    """Follows a process's JSON log lines as the file grows."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""
        self.syncs = 0

    def poll(self) -> None:
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:  # tracebacks, BCC warnings
                continue
            if isinstance(record, dict) and record.get("msg") == "sync applied":
                self.syncs += 1


class SyncError(Exception):
    """The backend did not apply a change set in time, or brain or backend died."""


class ControlPlane:
    """Brain, backend and the state file between them."""

    def __init__(self, cluster: Cluster, kind: BackendKind, state: ClusterState) -> None:
        self.cluster = cluster
        self.kind = kind
        self.state = state
        self.state_path = cluster.workdir / "state.yaml"
        self.socket = cluster.workdir / "brain.sock"
        self.brain: Proc | None = None
        self.backend: Proc | None = None
        self._backend_log: JsonLog | None = None
        self._starts = 0
        self.synced_at = 0.0  # time.monotonic() when the last awaited sync was seen

    # -- processes --------------------------------------------------------
    def start(self) -> None:
        write_atomically(self.state_path, self.state.to_yaml())
        # Every save is atomic (write_atomically), so the brain need not wait
        # the default settle time for a half-written file.
        self.brain = self.cluster.spawn_on_node("brain", kpng_py(
            "file", "-i", str(self.state_path), "--settle", str(ATOMIC_SAVES_SETTLE_SECONDS),
            "to-api", "--listen", f"unix://{self.socket}"))
        wait_until("brain socket", self._brain_listening, 30.0)
        self.start_backend()

    def _brain_listening(self) -> bool:
        assert self.brain is not None
        if not self.brain.running():
            raise RuntimeError(self.brain.describe_exit())
        return self.socket.is_socket()

    def start_backend(self) -> None:
        """(Re)start the backend and wait for its first applied change set."""
        self._starts += 1
        name = "backend" if self._starts == 1 else f"backend-{self._starts}"
        self.backend = self.cluster.spawn_on_node(name, kpng_py(
            "local", "--api", f"unix://{self.socket}", "--node-name", LOCAL_NODE,
            *self.kind.sink_args(self.cluster.names)))
        self._backend_log = JsonLog(self.backend.log)
        self.wait_sync(0, START_TIMEOUT)

    def stop(self) -> list[str]:
        """Stop backend then brain; returns complaints (e.g. a crash seen now)."""
        problems = []
        for proc in (self.backend, self.brain):
            if proc is None:
                continue
            if not proc.running():
                problems.append(proc.describe_exit())
            elif proc.stop() not in (0, -15):
                problems.append(f"{proc.name} did not exit cleanly on SIGTERM: "
                                f"code {proc.popen.returncode}")
        return problems

    # -- state ------------------------------------------------------------
    @property
    def syncs(self) -> int:
        assert self._backend_log is not None
        self._backend_log.poll()
        return self._backend_log.syncs

    def wait_sync(self, after: int, timeout: float = SYNC_TIMEOUT) -> None:
        """Wait until the backend applied more than `after` change sets."""
        backend = self.backend
        assert backend is not None
        deadline = time.monotonic() + timeout
        while self.syncs <= after:
            if not backend.running():
                raise SyncError(f"backend died: {backend.describe_exit()}")
            if self.brain is not None and not self.brain.running():
                raise SyncError(f"brain died: {self.brain.describe_exit()}")
            if time.monotonic() > deadline:
                raise SyncError(
                    f"the backend applied no change set within {timeout} s after the state "
                    f"file changed; brain log:\n{self.brain.log_tail() if self.brain else ''}"
                    f"\nbackend log:\n{backend.log_tail()}")
            time.sleep(0.02)
        self.synced_at = time.monotonic()

    def apply(self, state: ClusterState) -> None:
        """Write `state` and wait for the backend to apply it."""
        if state.to_yaml() == self.state.to_yaml():
            return
        before = self.syncs
        self.state = state
        write_atomically(self.state_path, state.to_yaml())
        self.wait_sync(before)

    def write_while_backend_down(self, state: ClusterState) -> None:
        """Change the state while no backend runs (the next start picks it up)."""
        self.state = state
        write_atomically(self.state_path, state.to_yaml())
