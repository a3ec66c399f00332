"""The proxy under test in KPNG's split sidecar layout: the built-in brain
(`kpng-py file -i STATE to-api`) and a backend (`kpng-py local ... to-X`) as
separate processes on the node, talking over a unix socket.

Waiting for a change to take effect never sleeps blindly: the backend logs
`sync applied` (JSON) after each change set it programmed, and `apply` waits
for the next one after the state file changed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from e2e.statefile import LOCAL_NODE, ClusterState, write_atomically
from kpng_py.registry import LabSupport, kpng_py_command, lab_backends
from lab.cluster import Cluster
from lab.names import RunNames
from lab.procs import JsonLog, Proc, run, wait_until

START_TIMEOUT = 120.0  # BCC compiles the programs at start-up: seconds on a busy machine
SYNC_TIMEOUT = 20.0
# Two polls of the brain (0.2 s each): enough for a file only ever replaced atomically.
ATOMIC_SAVES_SETTLE_SECONDS = 0.2


def kpng_py(*args: str) -> list[str]:
    return kpng_py_command("--log-format", "json", *args)


@dataclass(frozen=True)
class BackendKind:
    """A registered backend (kpng_py.registry), as this harness runs it for a run's
    names. A backend that does not survive a restart is asked by S13 only to
    serve again, including changes made while it was down."""

    name: str
    sink: str
    lab: LabSupport

    def sink_args(self, names: RunNames) -> list[str]:
        return [self.sink, *self.lab.flags(names.places)]

    def inspect(self, names: RunNames) -> list[str]:
        return self.lab.inspect(names.places)

    def dataplane_cleanup(self, names: RunNames) -> None:
        command = self.lab.cleanup(names.places)
        if command is not None:
            run(command)

    @property
    def translates_in_pod(self) -> bool:
        return self.lab.translates_in_pod

    @property
    def survives_restart(self) -> bool:
        return self.lab.survives_restart


# `-b` takes these names; each is a registered backend that has a dataplane.
BACKENDS = {name: BackendKind(name, spec.sink, spec.lab)
            for name, spec in lab_backends().items() if spec.lab is not None}


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
