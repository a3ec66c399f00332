"""`kpng-py kube` at scale (`--parts kube`; docs/bench.md, "`kpng-py kube`
on a real API server"): the lab's control plane (lab/kube_control_plane.py)
holds N Services and N EndpointSlices of E endpoints each (made as
bench/kube_list.py makes them), and each run starts `kpng-py kube ...
to-api` against it, with kpng-py's watch client (`bench.brain_probe`, a
process of its own) asking for node-0's view:

- the brain's start to the client's first Sync;
- one endpoint's address changed in the API server (a merge patch of its
  slice) to the client's next Sync, `changes` times, one after the other
  (the run's median);
- the brain's peak RSS (VmHWM of its process, read before it is stopped).

KPNG's brain is not built here, so the figures stand alone. Needs root (the
control plane's cgroup) and the components hack/setup.sh builds:

    flock /work/notes/heavy.lock .venv/bin/python -m bench.kube_brain --n 10000 --reps 2
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bench.env import KPNG_PY, stop
from bench.kube_list import Poster, create_objects, endpoint_slice
from bench.results import Results
from lab.kube_control_plane import ApiAccess, ControlPlaneError, KubeControlPlane
from lab.names import RunNames

log = logging.getLogger("bench")

CONTENDER = "kpng-py-kube"
NODE = "node-0"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
# Where the endpoints changed are moved to, each to an address of its own
# (outside the slices' 10.244.0.0/13): a patch to what is there already
# changes nothing, and no Sync would follow.
MOVED = "10.255"


@dataclass(frozen=True)
class KubePlan:
    ns: tuple[int, ...]
    endpoints: int
    reps: int
    changes: int
    timeout: float  # seconds for the first Sync, and for each change's


def run_kube(names: RunNames, logs: Path, results: Results, plan: KubePlan) -> None:
    """Every N (objects made once each, N ascending), `reps` runs of the brain."""
    workdir = names.make_workdir()
    control = KubeControlPlane(names, workdir, ["10.96.0.0/16"])
    try:
        try:
            access = control.start().access
        except ControlPlaneError as err:
            results.problems.append(f"kube: not run: {err}")
            log.error("kube: not run: %s", err)
            return
        poster = Poster(access.url, access.token, str(access.ca))
        token = workdir / "token"
        token.write_text(access.token)
        for n in sorted(plan.ns):
            seconds = create_objects(poster, n, plan.endpoints)
            log.info("kube N=%d: %d services and slices of %d endpoints made in %.1f s", n, n,
                     plan.endpoints, seconds)
            for rep in range(plan.reps):
                _run(_Brain(access, token, logs / f"kube-brain-{n}-{rep}.log"), poster, results,
                     plan, n, rep)
    finally:
        control.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class _Brain:
    """How to start `kpng-py kube ... to-api` against the API server."""

    access: ApiAccess
    token: Path
    log: Path

    def argv(self, socket: Path) -> list[str]:
        return [KPNG_PY, "--log-format", "json", "kube", "--server", self.access.url,
                "--token-file", str(self.token), "--certificate-authority", str(self.access.ca),
                "to-api", "--listen", f"unix://{socket}"]


class _Probe:
    """`bench.brain_probe` following the brain: the times of its Syncs, as
    its lines arrive."""

    def __init__(self, socket: Path, syncs: int, timeout: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.brain_probe", "--socket", str(socket), "--node-name",
             NODE, "--syncs", str(syncs), "--timeout", str(timeout)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
        self.ops = 0  # of the first change set
        self._syncs: list[float] = []
        self._arrived = threading.Condition()
        threading.Thread(target=self._read, name="kube-bench-probe", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = json.loads(line)
            with self._arrived:
                self.ops = record.get("ops", self.ops)
                self._syncs.append(record.get("sync") or record["first_sync"])
                self._arrived.notify_all()

    def wait_for(self, count: int, timeout: float) -> float | None:
        """The time of the `count`th Sync, once it arrived; None after `timeout` s."""
        with self._arrived:
            if self._arrived.wait_for(lambda: len(self._syncs) >= count, timeout):
                return self._syncs[count - 1]
            return None


def _run(brain: _Brain, poster: Poster, results: Results, plan: KubePlan, n: int,
         rep: int) -> None:
    label = f"kube N={n} rep {rep + 1}"
    socket = brain.log.with_suffix(".sock")
    probe = _Probe(socket, plan.changes + 1, plan.timeout * (plan.changes + 1))
    with open(brain.log, "wb") as out:
        started = time.monotonic()
        process = subprocess.Popen(brain.argv(socket), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=out, start_new_session=True)
    try:
        first = probe.wait_for(1, plan.timeout)
        if first is None:
            results.problems.append(f"{label}: no first Sync within {plan.timeout:.0f} s "
                                    f"(log: {brain.log})")
            results.censor("kube_first_sync", CONTENDER, n, plan.timeout, "no first Sync")
            return
        changes = _changes(poster, probe, plan, n, rep * plan.changes)
        peak_mib = _peak_rss_kib(process.pid) / 1024
    finally:
        stop(probe.process)
        stop(process)
    results.add("kube_first_sync", CONTENDER, n, first - started)
    results.add("kube_peak_rss", CONTENDER, n, peak_mib)
    if len(changes) < plan.changes:
        results.problems.append(f"{label}: {plan.changes - len(changes)} of {plan.changes} "
                                f"changes got no Sync within {plan.timeout:.0f} s")
    if changes:
        results.add("kube_change", CONTENDER, n, statistics.median(changes))
    log.info("%s: start to first Sync %.2f s (%d ops); one-endpoint change to Sync: median "
             "%s ms of %d; peak RSS %.0f MiB", label, first - started, probe.ops,
             f"{statistics.median(changes):.0f}" if changes else "-", len(changes), peak_mib)


def _changes(poster: Poster, probe: _Probe, plan: KubePlan, n: int, first: int
             ) -> list[float]:
    """Each change's time to its Sync (ms): the first endpoint of a service's
    slice moved to an address no change gave before (`first`: the number of
    changes made before, in the run)."""
    seconds = []
    for change in range(plan.changes):
        number = first + change
        obj = endpoint_slice(number * 7919 % n, plan.endpoints)  # services spread over the N
        obj["endpoints"][0]["addresses"] = [f"{MOVED}.{number // 256 % 256}.{number % 256}"]
        sent = time.monotonic()
        poster.send("PATCH", f"{SLICES}/{obj['metadata']['name']}",
                    {"endpoints": obj["endpoints"]}, "application/merge-patch+json")
        synced = probe.wait_for(change + 2, plan.timeout)
        if synced is None:
            break
        seconds.append((synced - sent) * 1000)
    return seconds


def _peak_rss_kib(pid: int) -> int:
    """The process's peak RSS since its exec (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def main(argv: Sequence[str] | None = None) -> int:
    """The kube part alone: its figures as JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m bench.kube_brain",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10_000], help="services (10000)")
    parser.add_argument("--endpoints", type=int, default=10, help="endpoints per service (10)")
    parser.add_argument("--reps", type=int, default=2, help="runs of the brain per N (2)")
    parser.add_argument("--changes", type=int, default=20, help="changes per run (20)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--logs", type=Path, default=Path("bench/results/logs"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args.logs.mkdir(parents=True, exist_ok=True)
    results = Results()
    run_kube(RunNames.for_this_process(), args.logs, results,
             KubePlan(tuple(args.n), args.endpoints, args.reps, args.changes, args.timeout))
    for figure in results.figures.values():
        print(json.dumps(figure.to_json()))
    for problem in results.problems:
        print(f"problem: {problem}")
    return 1 if results.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
