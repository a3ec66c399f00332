"""The proxy under test, fed by one of two control planes (`-c`):

- `file` (FileControlPlane): KPNG's split sidecar layout. The built-in brain
  (`kpng-py file -i STATE to-api`) and a backend (`kpng-py local ... to-X`)
  per node are separate processes, talking over a unix socket; a change is a
  new state file.
- `kube` (e2e.kube.ApiServerControlPlane): a real Kubernetes API server (the lab's, started
  for the run), which `kpng-py kube ... to-local ... to-X` follows on each
  node, brain and backend in one process (the one-container DaemonSet); a
  change is written through the API (e2e.kube).

Waiting for a change to take effect never sleeps blindly: the backend logs
`sync applied` (JSON) after each change set it programmed, and `apply`
waits for the one that brought every node to the new state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from e2e.statefile import LOCAL_NODE, ClusterState, write_atomically
from kpng_py.brain.source import changeset
from kpng_py.brain.statefile import ClusterState as BrainState
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
    """The backends (one per seat; by default one on the cluster's node),
    started and restarted, and what the checks change; the brain and the
    state's way to it are the subclass's."""

    name = ""  # as `-c` names it

    def __init__(self, cluster: Cluster | MultiNodeCluster, kind: BackendKind,
                 state: ClusterState, seats: Sequence[Seat] = ()) -> None:
        self.cluster = cluster
        self.kind = kind
        self.state = state
        if seats:
            self.seats = tuple(seats)
        elif isinstance(cluster, Cluster):  # one node: the backend runs on it
            self.seats = (Seat(LOCAL_NODE, cluster.names.places, cluster.spawn_on_node),)
        else:
            raise ValueError("a MultiNodeCluster's control plane needs its seats "
                             "(e2e.topology.seats)")
        self._running: dict[str, _Running] = {}  # by seat label
        self.synced_at = 0.0  # time.monotonic() when the last awaited sync was seen

    # -- the subclass's ---------------------------------------------------
    def start(self) -> None:
        """Start the brain (if apart) and every seat's backend, serving `state`."""
        raise NotImplementedError

    def apply(self, state: ClusterState) -> None:
        """Make `state` the cluster's and wait for every backend to apply it
        (every change the checks make shows in every node's view)."""
        raise NotImplementedError

    def write_while_backend_down(self, state: ClusterState) -> None:
        """Change the state while no backend runs (the next start picks it up)."""
        raise NotImplementedError

    def poke_help(self) -> list[str]:
        """For -d: how to change the state by hand."""
        raise NotImplementedError

    @classmethod
    def describe(cls) -> str:
        """Its `-c` name and what it runs, for the report."""
        raise NotImplementedError

    def _backend_command(self, seat: Seat) -> list[str]:
        """The seat's process, before its backend's lab flags."""
        raise NotImplementedError

    def _helpers(self) -> list[Proc]:
        """The processes besides the backends: a wait fails when one died."""
        return []

    def _stop_helpers(self) -> list[str]:
        """Stop what runs besides the backends (after them); complaints."""
        return []

    # -- processes --------------------------------------------------------
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
        proc = seat.spawn(name, [*self._backend_command(seat),
                                 *self.kind.sink_args_at(seat.places), *flags])
        self._running[seat.label] = _Running(proc, JsonLog(proc.log), starts)
        self._on_backend_started(seat)
        self.wait_sync(0, START_TIMEOUT, seat, "after it started")

    def _on_backend_started(self, seat: Seat) -> None:
        """A seat's backend process (re)started: its log is new."""

    def stop(self) -> list[str]:
        """Stop backends then the rest; returns complaints (e.g. a crash seen now)."""
        problems = [stop_cleanly(r.proc) for r in self._running.values()]
        return [p for p in problems if p is not None] + self._stop_helpers()

    # -- waiting ----------------------------------------------------------
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

    def wait_sync(self, after: int, timeout: float = SYNC_TIMEOUT, seat: Seat | None = None,
                  since: str = "after the state file changed") -> None:
        """Wait until a seat's backend (the first's by default) applied more
        than `after` change sets (`since`: what they follow, for a timeout)."""
        seat = seat or self.seats[0]
        self._wait(seat, lambda: self.syncs_of(seat) > after, timeout, lambda: since)

    def _wait(self, seat: Seat, done: Callable[[], bool], timeout: float,
              what: Callable[[], str]) -> None:
        """Until `done()`; SyncError if a process died or after `timeout` s."""
        backend = self.backend_of(seat)
        deadline = time.monotonic() + timeout
        while not done():
            if not backend.running():
                raise SyncError(f"backend died: {backend.describe_exit()}")
            for helper in self._helpers():
                if not helper.running():
                    raise SyncError(f"{helper.name} died: {helper.describe_exit()}")
            if time.monotonic() > deadline:
                raise SyncError(
                    f"the backend {backend.name} applied no change set within {timeout} s "
                    f"{what()}; "
                    + "".join(f"{p.name} log:\n{p.log_tail()}\n" for p in self._helpers())
                    + f"backend log:\n{backend.log_tail()}")
            time.sleep(0.02)
        self.synced_at = time.monotonic()

    def service_ports(self, seat: Seat | None = None) -> tuple[ServicePort, ...]:
        """The service ports of a seat's node (the first's by default) in the
        current state: what the brain serves it (what kube-proxy would
        program there)."""
        return node_service_ports(self.state, (seat or self.seats[0]).node_name)


def stop_cleanly(proc: Proc, clean: tuple[int, ...] = (0, -15)) -> str | None:
    """SIGTERM `proc`; a complaint if it had died already or exits with a
    code not in `clean`."""
    if not proc.running():
        return proc.describe_exit()
    if proc.stop() not in clean:
        return f"{proc.name} did not exit cleanly on SIGTERM: code {proc.popen.returncode}"
    return None


def node_service_ports(state: ClusterState, node: str) -> tuple[ServicePort, ...]:
    """The service ports the brain serves `node` for the harness's `state`."""
    return service_ports_of(parse_state(state.to_yaml().encode(), "the harness's state"), node)


def changed_nodes(before: ClusterState, after: ClusterState, nodes: Sequence[str]) -> set[str]:
    """The nodes whose service ports differ between the two states: those
    a change set goes to (as kube-proxy, the view leaves conditions out: a
    ready endpoint that turns serving-terminating as the only one left, say,
    changes nothing)."""
    return {node for node in nodes
            if node_service_ports(before, node) != node_service_ports(after, node)}


def service_ports_of(cluster: BrainState, node: str) -> tuple[ServicePort, ...]:
    """The service ports of `node`'s view of a brain's state, as the state
    model makes them."""
    changes = NodeState(Skips(Metrics())).apply(changeset(None, node_view(cluster, node)))
    assert changes is not None  # a full change set ends in its Sync
    return changes.added


class FileControlPlane(ControlPlane):
    """The built-in brain (`kpng-py file -i STATE to-api`) where the first
    seat is, the state file it follows, and `kpng-py local --api` per seat."""

    name = "file"

    @classmethod
    def describe(cls) -> str:
        return "file (the built-in brain following a state file)"

    def __init__(self, cluster: Cluster | MultiNodeCluster, kind: BackendKind,
                 state: ClusterState, seats: Sequence[Seat] = ()) -> None:
        super().__init__(cluster, kind, state, seats)
        self.state_path = cluster.workdir / "state.yaml"
        self.socket = cluster.workdir / "brain.sock"
        self.brain: Proc | None = None

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

    def _helpers(self) -> list[Proc]:
        return [self.brain] if self.brain is not None else []

    def _stop_helpers(self) -> list[str]:
        problem = stop_cleanly(self.brain) if self.brain is not None else None
        return [problem] if problem is not None else []

    def _backend_command(self, seat: Seat) -> list[str]:
        return kpng_py("local", "--api", f"unix://{self.socket}", "--node-name", seat.node_name)

    def apply(self, state: ClusterState) -> None:
        """Write the state file; wait for each backend whose node's view
        changed (the brain sends the others nothing)."""
        if state.to_yaml() == self.state.to_yaml():
            return
        changed = changed_nodes(self.state, state, [seat.node_name for seat in self.seats])
        before = {seat.label: self.syncs_of(seat) for seat in self.seats}
        self.state = state
        write_atomically(self.state_path, state.to_yaml())
        for seat in self.seats:
            if seat.node_name in changed:
                self.wait_sync(before[seat.label], seat=seat)

    def write_while_backend_down(self, state: ClusterState) -> None:
        self.state = state
        write_atomically(self.state_path, state.to_yaml())

    def poke_help(self) -> list[str]:
        return [f"state file (edit it; the brain re-reads it): {self.state_path}"]
