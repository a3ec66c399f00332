"""One run: clear stale runs, build the cluster, start servers, brain and
backend, run the checks, report, and tear everything down whatever happens
(success, failure, Ctrl-C, SIGTERM)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import textwrap
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic

from e2e import nodeport_checks, topology
from e2e.checks import CHECKS, Check, EnvT, base_state
from e2e.expect import CheckFailed, CheckRun, Env
from e2e.kube import ApiServerControlPlane
from e2e.proxy import BACKENDS, BackendKind, ControlPlane, FileControlPlane, SyncError
from e2e.report import Report, Result
from e2e.statefile import ClusterState
from e2e.topology import NodePortEnv
from lab import clients, procs, teardown
from lab.backends import LabPlaces
from lab.cluster import Cluster, Family, families_of_mode
from lab.multinode import MultiNodeCluster
from lab.names import CGROUP2_ROOT, RunNames
from lab.pods import PodNetworkError, build_cluster

log = logging.getLogger("e2e")


@dataclass(frozen=True)
class Options:
    ip_mode: str
    backend: str
    debug: bool  # leave the cluster up until a signal
    keep_logs: bool
    logs_root: Path
    topology: str = "service"  # a key of TOPOLOGIES
    control: str = "file"  # a key of CONTROL_PLANES

    @property
    def run_name(self) -> str:
        """`<backend>-<mode>`, `nodeport-<backend>-<mode>`, each after `kube-`
        with `-c kube`: logs and JUnit names."""
        prefix = "" if self.control == "file" else f"{self.control}-"
        prefix += "" if self.topology == "service" else f"{self.topology}-"
        return f"{prefix}{self.backend}-{self.ip_mode}"

    @property
    def suite(self) -> str:
        return f"e2e-{self.run_name}"


@dataclass
class Built:
    """What set-up made so far: what the end of the run stops and removes."""

    cluster: Cluster | MultiNodeCluster | None = None
    control: ControlPlane | None = None


# `-c`: what feeds the brain the checks' states.
CONTROL_PLANES: dict[str, type[ControlPlane]] = {
    plane.name: plane for plane in (FileControlPlane, ApiServerControlPlane)}


@dataclass(frozen=True)
class Topology(Generic[EnvT]):
    checks: list[Check[EnvT]]
    # Builds the cluster and starts the proxy with the control plane
    # (filling in `built` as it goes); the checks' environment.
    set_up: Callable[[Built, RunNames, tuple[Family, ...], BackendKind, type[ControlPlane]],
                     EnvT]
    # Where its backends keep their dataplanes (inspect, clean-up).
    places: Callable[[RunNames], list[LabPlaces]]
    poke_help: Callable[[EnvT], str]


class SetupError(Exception):
    pass


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM: like KeyboardInterrupt, not caught as a check's error."""


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(f"interrupted by {signal.Signals(signum).name}")


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _set_up_service_topology(built: Built, names: RunNames, families: tuple[Family, ...],
                             kind: BackendKind, plane: type[ControlPlane]) -> Env:
    cluster = built.cluster = Cluster(names, families, names.make_workdir())
    servers, client = build_cluster(cluster)
    control = built.control = plane(cluster, kind, base_state(cluster.families, servers))
    _start_control_plane(control)
    return Env(cluster, control, kind, servers, client, control.state)


def _set_up_nodeport_topology(built: Built, names: RunNames, families: tuple[Family, ...],
                              kind: BackendKind, plane: type[ControlPlane]) -> NodePortEnv:
    cluster = built.cluster = MultiNodeCluster(names, families, names.make_workdir())
    topology.build(cluster)
    state = nodeport_checks.base_state(cluster)
    control = built.control = plane(cluster, kind, state, topology.seats(cluster))
    _start_control_plane(control)
    return NodePortEnv(cluster, control, kind, state)


# Each entry is checked as a Topology of its own environment; the table
# holds them all, so a run takes the one chosen as a Topology of any.
TOPOLOGIES: dict[str, Topology[Any]] = {
    "service": Topology(CHECKS, _set_up_service_topology, lambda names: [names.places],
                        lambda env: _poke_help(env)),  # defined below
    "nodeport": Topology(nodeport_checks.NODEPORT_CHECKS, _set_up_nodeport_topology,
                         topology.nodeport_places, nodeport_checks.poke_help),
}


def run(options: Options) -> int:
    report = Report(options.suite, sys.stdout)
    names = RunNames.for_this_process()
    kind = BACKENDS[options.backend]
    chosen = TOPOLOGIES[options.topology]
    plane = CONTROL_PLANES[options.control]
    built = Built()
    started = time.monotonic()
    previous = {s: signal.signal(s, _interrupt) for s in _STOP_SIGNALS}
    try:
        _preflight()
        report.note(f"control plane: {plane.describe()}")
        for line in teardown.remove_stale_runs(_stale_dataplane_cleanup):
            log.info(line)
        env = chosen.set_up(built, names, families_of_mode(options.ip_mode), kind, plane)
        run_checks(env, chosen.checks, report)
        if options.debug:
            _wait_while_debugging(chosen.poke_help(env))
    except Interrupted as err:
        report.add(Result("interrupted", str(err), time.monotonic() - started))
    except Exception as err:  # checks catch their own: this is the cluster or the proxy
        if not isinstance(err, (SetupError, PodNetworkError, SyncError, TimeoutError)):
            log.error("set-up failed: %s", traceback.format_exc())
        report.add(Result("setup", f"{err}", time.monotonic() - started))
    finally:
        # A second Ctrl-C must not leave half a cluster behind.
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        _finish(options, names, chosen, built, report)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0 if report.failed == 0 else 1


def _preflight() -> None:
    if os.geteuid() != 0:
        raise SetupError("needs root (network namespaces, cgroups, BPF)")
    if not (CGROUP2_ROOT / "cgroup.procs").exists():
        raise SetupError(f"needs cgroup v2 mounted at {CGROUP2_ROOT}")
    for tool in ("ip", "nft", "nginx", "dnsmasq", "socat", "curl", "dig", "ss"):
        if shutil.which(tool) is None:
            raise SetupError(f"`{tool}` not found: run hack/setup.sh")


def _stale_dataplane_cleanup(names: RunNames) -> None:
    """A dead run's dataplanes, whichever topology and backend it ran."""
    for kind in BACKENDS.values():
        for places in {p for t in TOPOLOGIES.values() for p in t.places(names)}:
            kind.dataplane_cleanup_at(places)


def _start_control_plane(control: ControlPlane) -> None:
    began = time.monotonic()
    control.start()
    log.info("brain and %s backend synced in %.1f s", control.kind.name,
             time.monotonic() - began)


def run_checks(env: Env | NodePortEnv, checks: list[Check[Any]], report: Report) -> None:
    for check in checks:
        families = check.families(env.families)
        if not families:
            continue
        why_not = check.why_not(env.kind, env.control.name)
        if why_not is not None:
            for family in families:
                report.add(Result(f"{check.name}/{family.value}", None, 0.0, why_not))
            continue
        _run_check(env, check, families, report)
        _restore_shared_services(env)


def _run_check(env: Env | NodePortEnv, check: Check[Any], families: tuple[Family, ...],
               report: Report) -> None:
    watch_escapes = check.translated and env.kind.translates_in_pod
    escaped = {f: env.cluster.escaped_packets(f) for f in families} if watch_escapes else {}
    t = CheckRun(env, families)
    began = time.monotonic()
    try:
        check.body(t)
    except (CheckFailed, SyncError) as err:
        for family in families:
            t.fail(family, str(err))
    except Exception as err:  # a harness bug must not stop the other checks
        log.error("check %s: %s", check.name, traceback.format_exc())
        for family in families:
            t.fail(family, f"harness error: {type(err).__name__}: {err}")
    for family, before in escaped.items():
        leaked = env.cluster.escaped_packets(family) - before
        if leaked:
            t.fail(family, f"{leaked} packets to service addresses left the pods "
                           f"untranslated (counted in the node namespace)")
    seconds = time.monotonic() - began
    for family in families:
        report.add(Result(f"{check.name}/{family.value}", t.failures.get(family), seconds))


def _restore_shared_services(env: Env | NodePortEnv) -> None:
    state: ClusterState = env.control.state
    for service in env.base_state.services:
        state = state.with_service(service)
    try:
        env.control.apply(state)
    except SyncError as err:
        log.error("could not restore the shared services: %s", err)


def _poke_help(env: Env) -> str:
    cluster, control = env.cluster, env.control
    names, client = cluster.names, env.client
    in_pod = cluster.workdir / "in-pod"
    in_pod.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        # in-pod POD COMMAND...: run COMMAND in POD's network namespace and cgroup
        pod="$1"; shift
        echo 0 >"{names.cgroup}/$pod/cgroup.procs" &&
            exec nsenter --net="/run/netns/{names.tag}-$pod" -- "$@"
        """))
    in_pod.chmod(0o755)
    web, dns = env.shared("web"), env.shared("dns")
    family = env.families[0]
    lines = [
        f"cluster {names.tag} is up ({control.kind.name} backend, "
        f"{'/'.join(f.value for f in env.families)}). Poke it:",
        f"  {in_pod} {client.name} curl -s http://{clients.host_literal(web.cluster_ip(family))}/",
        f"  {in_pod} {client.name} dig +short @{dns.cluster_ip(family)} whoami.e2e TXT",
        f"  {in_pod} {client.name} bash      # a shell in the client pod",
        f"  pods: {', '.join(cluster.pods)}; netns: {names.netns('<pod>')}, node: "
        f"{cluster.node_netns}",
        *(f"  {line}" for line in control.poke_help()),
        f"  logs: {cluster.workdir}/*.log",
    ]
    lines.append(f"  {' '.join(control.kind.inspect(names))}      # the dataplane")
    lines.append(f"Ctrl-C (or kill {os.getpid()}) tears it down.")
    return "\n".join(lines)


def _wait_while_debugging(help_text: str) -> None:
    """Until Ctrl-C or SIGTERM: here they are the way to end, not a failure."""
    print(help_text, file=sys.stderr, flush=True)
    try:
        while True:
            signal.pause()
    except Interrupted as stop:
        log.info("%s: tearing down", stop)


def _finish(options: Options, names: RunNames, chosen: Topology, built: Built,
            report: Report) -> None:
    logs = options.logs_root / options.run_name
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    problems: list[str] = []
    kind = BACKENDS[options.backend]
    if built.control is not None:
        every = chosen.places(names)
        with open(logs / "dataplane.txt", "w") as out:
            for places in every:
                dataplane = procs.run(kind.lab.inspect(places), check=False)
                out.write((f"== {places.node_netns}\n" if len(every) > 1 else "")
                          + dataplane.stdout + dataplane.stderr)
        problems += built.control.stop()
    if built.cluster is not None:
        workdir = built.cluster.workdir
        # The Kubernetes control plane's own logs (-c kube) among them.
        for path in [*workdir.glob("*.log"), *workdir.glob("*.txt"), *workdir.glob("*.yaml"),
                     *workdir.glob("control-plane/logs/*.log")]:
            shutil.copy(path, logs / path.name)

    def dataplane_cleanup(_: RunNames) -> None:
        for places in chosen.places(names):
            kind.dataplane_cleanup_at(places)

    problems += teardown.remove_run(names, dataplane_cleanup)
    if problems:
        report.add(Result("teardown", "\n".join(problems), 0.0))
    (logs / "checks.txt").write_text("".join(r.line() + "\n" for r in report.results))
    junit = options.logs_root / f"junit-{options.run_name}.xml"
    report.junit(junit)
    print(report.summary(), flush=True)
    if options.keep_logs or report.failed:
        log.info("logs: %s; JUnit: %s", logs, junit)
    else:
        shutil.rmtree(logs)
        log.info("JUnit: %s", junit)
