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
from typing import Callable, Sequence

from e2e.statefile import LOCAL_NODE, ClusterState, write_atomically
from kpng_py.brain.source import changeset
from kpng_py.brain.statefile import parse_state
from kpng_py.brain.view import node_view
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePort
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState
from lab.backends import LabPlaces, LabSupport, lab_backends
from lab.cluster import Cluster
from lab.multinode import MultiNodeCluster
from lab.names import RunNames
from lab.procs import JsonLog, Proc, kpng_py_command, run, wait_until

START_TIMEOUT = 120.0  # BCC compiles the programs at start-up: seconds on a busy machine
SYNC_TIMEOUT = 20.0
# Two polls of the brain (0.2 s each): enough for a file only ever replaced atomically.
ATOMIC_SAVES_SETTLE_SECONDS = 0.2


def kpng_py(*args: str) -> list[str]:
    return kpng_py_command("--log-format", "json", *args)


@dataclass(frozen=True)
class BackendKind:
    """A registered backend with its lab facts (lab.backends), as this harness
    runs it for a run's names. A backend that does not survive a restart is
    asked by S13 only to serve again, including changes made while it was down."""

    name: str
    sink: str
    lab: LabSupport

    def sink_args(self, names: RunNames) -> list[str]:
        return self.sink_args_at(names.places)

    def sink_args_at(self, places: LabPlaces) -> list[str]:
        return [self.sink, *self.lab.flags(places)]

    def inspect(self, names: RunNames) -> list[str]:
        return self.lab.inspect(names.places)

    def dataplane_cleanup(self, names: RunNames) -> None:
        self.dataplane_cleanup_at(names.places)

    def dataplane_cleanup_at(self, places: LabPlaces) -> None:
        command = self.lab.cleanup(places)
        if command is not None:
            run(command)

    @property
    def translates_in_pod(self) -> bool:
        return self.lab.translates_in_pod

    @property
    def survives_restart(self) -> bool:
        return self.lab.survives_restart


# `-b` takes these names; each is a registered backend that has a dataplane.
BACKENDS = {name: BackendKind(name, backend.sink, backend.support)
            for name, backend in lab_backends().items()}


class SyncError(Exception):
    """The backend did not apply a change set in time, or brain or backend died."""


@dataclass(frozen=True)
class Seat:
    """Where one backend runs: the node it serves (`--node-name`), the places
    of its dataplane, and how a process is started in its node's namespace."""

    node_name: str
    places: LabPlaces
    spawn: Callable[[str, Sequence[str]], Proc]
    label: str = "backend"  # its log is <label>.log, <label>-2.log after a restart...


@dataclass
class _Running:
    proc: Proc
    log: JsonLog
    starts: int


class ControlPlane:
    """Brain, backends (one per seat; by default one on the cluster's node)
    and the state file between them. The brain runs where the first seat is."""

    def __init__(self, cluster: Cluster | MultiNodeCluster, kind: BackendKind,
                 state: ClusterState, seats: Sequence[Seat] = ()) -> None:
        self.cluster = cluster
        self.kind = kind
        self.state = state
        self.state_path = cluster.workdir / "state.yaml"
        self.socket = cluster.workdir / "brain.sock"
        if seats:
            self.seats = tuple(seats)
        elif isinstance(cluster, Cluster):  # one node: the backend runs on it
            self.seats = (Seat(LOCAL_NODE, cluster.names.places, cluster.spawn_on_node),)
        else:
            raise ValueError("a MultiNodeCluster's control plane needs its seats "
                             "(e2e.topology.seats)")
        self.brain: Proc | None = None
        self._running: dict[str, _Running] = {}  # by seat label
        self.synced_at = 0.0  # time.monotonic() when the last awaited sync was seen

    # -- processes --------------------------------------------------------
    def start(self) -> None:
        write_atomically(self.state_path, self.state.to_yaml())
        # Every save is atomic (write_atomically), so the brain need not wait
        # the default settle time for a half-written file.
        self.brain = self.seats[0].spawn("brain", kpng_py(
            "file", "-i", str(self.state_path), "--settle", str(ATOMIC_SAVES_SETTLE_SECONDS),
            "to-api", "--listen", f"unix://{self.socket}"))
        wait_until("brain socket", self._brain_listening, 30.0)
        for seat in self.seats:
            self.start_backend(seat)

    def _brain_listening(self) -> bool:
        assert self.brain is not None
        if not self.brain.running():
            raise RuntimeError(self.brain.describe_exit())
        return self.socket.is_socket()

    @property
    def backend(self) -> Proc | None:
        """The first seat's backend process."""
        running = self._running.get(self.seats[0].label)
        return running.proc if running else None

    def backend_of(self, seat: Seat) -> Proc:
        return self._running[seat.label].proc

    def start_backend(self, seat: Seat | None = None, flags: Sequence[str] = ()) -> None:
        """(Re)start a seat's backend (the first's by default), with `flags`
        after its lab flags, and wait for its first applied change set."""
        seat = seat or self.seats[0]
        starts = self._running[seat.label].starts + 1 if seat.label in self._running else 1
        name = seat.label if starts == 1 else f"{seat.label}-{starts}"
        proc = seat.spawn(name, kpng_py(
            "local", "--api", f"unix://{self.socket}", "--node-name", seat.node_name,
            *self.kind.sink_args_at(seat.places), *flags))
        self._running[seat.label] = _Running(proc, JsonLog(proc.log), starts)
        self.wait_sync(0, START_TIMEOUT, seat)

    def stop(self) -> list[str]:
        """Stop backends then brain; returns complaints (e.g. a crash seen now)."""
        problems = []
        for proc in [r.proc for r in self._running.values()] + [self.brain]:
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
        """Change sets the first seat's backend applied."""
        return self.syncs_of(self.seats[0])

    def syncs_of(self, seat: Seat) -> int:
        running = self._running.get(seat.label)
        if running is None:  # never started
            return 0
        running.log.poll()
        return running.log.syncs

    def wait_sync(self, after: int, timeout: float = SYNC_TIMEOUT,
                  seat: Seat | None = None) -> None:
        """Wait until a seat's backend (the first's by default) applied more
        than `after` change sets."""
        seat = seat or self.seats[0]
        backend = self.backend_of(seat)
        deadline = time.monotonic() + timeout
        while self.syncs_of(seat) <= after:
            if not backend.running():
                raise SyncError(f"backend died: {backend.describe_exit()}")
            if self.brain is not None and not self.brain.running():
                raise SyncError(f"brain died: {self.brain.describe_exit()}")
            if time.monotonic() > deadline:
                raise SyncError(
                    f"the backend {backend.name} applied no change set within {timeout} s "
                    f"after the state file changed; brain log:\n"
                    f"{self.brain.log_tail() if self.brain else ''}"
                    f"\nbackend log:\n{backend.log_tail()}")
            time.sleep(0.02)
        self.synced_at = time.monotonic()

    def apply(self, state: ClusterState) -> None:
        """Write `state` and wait for every backend to apply it (every change
        the checks make shows in every node's view)."""
        if state.to_yaml() == self.state.to_yaml():
            return
        before = {seat.label: self.syncs_of(seat) for seat in self.seats}
        self.state = state
        write_atomically(self.state_path, state.to_yaml())
        for seat in self.seats:
            self.wait_sync(before[seat.label], seat=seat)

    def service_ports(self, seat: Seat | None = None) -> tuple[ServicePort, ...]:
        """The service ports of a seat's node (the first's by default) in the
        current state: what the brain serves it, as the state model makes
        them (what kube-proxy would program there)."""
        seat = seat or self.seats[0]
        cluster = parse_state(self.state.to_yaml().encode(), str(self.state_path))
        metrics = Metrics()
        changes = NodeState(Skips(metrics)).apply(
            changeset(None, node_view(cluster, seat.node_name)))
        assert changes is not None  # a full change set ends in its Sync
        return changes.added

    def write_while_backend_down(self, state: ClusterState) -> None:
        """Change the state while no backend runs (the next start picks it up)."""
        self.state = state
        write_atomically(self.state_path, state.to_yaml())
