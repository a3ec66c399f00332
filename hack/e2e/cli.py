"""`hack/test_e2e.sh -i ipv4|ipv6|dual -b ebpf|userspace [-t service|nodeport]
[-c file|kube] [-d] [-k]`, and `-a [-j N]` for every topology with every backend
this kpng-py has (the NodePort topology dual-stack only: ALL_RUNS_IP_MODES), N
runs at a time, what `make e2e` runs."""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from e2e.proxy import BACKENDS
from e2e.run import CONTROL_PLANES, TOPOLOGIES, Options, run

ROOT = Path(__file__).resolve().parents[2]
IP_MODES = ("ipv4", "ipv6", "dual")
# What `-a` runs of a topology when not every mode: a dual-stack NodePort run
# checks both families (each check per family), and single-stack nodes are the
# service topology's runs; `-t nodeport -i ipv4|ipv6` stays available.
ALL_RUNS_IP_MODES = {"nodeport": ("dual",)}
# CI must run these (a backend that is missing there is a failure, not a skip).
REQUIRED_IN_CI = ("ebpf",)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a count of runs (1 or more)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hack/test_e2e.sh",
        description="End-to-end suite: a cluster in network namespaces, real servers and "
                    "clients, the built-in brain and a backend. See docs/e2e.md.")
    parser.add_argument("-i", "--ip", choices=IP_MODES, help="IP families of the cluster")
    parser.add_argument("-b", "--backend", choices=sorted(BACKENDS), help="backend under test")
    parser.add_argument("-t", "--topology", choices=sorted(TOPOLOGIES), default="service",
                        help="service: one node, the ClusterIP checks S1-S18 (default); "
                             "nodeport: two nodes and an external client, N0-N19")
    parser.add_argument("-c", "--control-plane", choices=sorted(CONTROL_PLANES),
                        default="file",
                        help="what the checks change: file: a state file the built-in brain "
                             "follows (default); kube: a Kubernetes API server (the lab's, "
                             "started for the run) that `kpng-py kube` follows")
    parser.add_argument("-a", "--all", action="store_true",
                        help="every topology with every built-in backend, one after the "
                             "other: the service topology in every IP mode, the nodeport "
                             "one dual-stack")
    parser.add_argument("-j", "--jobs", type=_positive, default=DEFAULT_JOBS,
                        help=f"with -a: runs at a time (default {DEFAULT_JOBS}); each prints "
                             "its output when it ends")
    parser.add_argument("-d", "--debug", action="store_true",
                        help="after the checks, leave the cluster up (Ctrl-C tears it down)")
    parser.add_argument("-k", "--keep-logs", action="store_true",
                        help="keep the logs also when every check passed")
    parser.add_argument("--logs-dir", type=Path, default=ROOT / "hack" / "e2e-logs",
                        help="where logs and JUnit XML go (default: hack/e2e-logs)")
    parser.add_argument("--list", action="store_true",
                        help="list the checks and the upstream tests they mirror")
    return parser


_SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed(?:, \d+ n/a)?$")
# Runs of `-a` at a time: a run mostly waits (on timeouts, syncs, clients), and
# runs never share a kernel object (lab/names.py), so two overlap well on two cores.
DEFAULT_JOBS = 2


@dataclass(frozen=True)
class RunOutcome:
    label: str
    code: int
    passed: int
    failed: int
    seconds: float


class _Running:
    """One mode's run, its output (stdout and stderr) kept until it ends, so
    that runs side by side print one after the other, each in one piece."""

    def __init__(self, label: str, argv: list[str], workdir: Path) -> None:
        self.label = label
        self.began = time.monotonic()
        self._output = tempfile.TemporaryFile(mode="w+", dir=workdir)
        # From hack/, `python -m e2e` finds the harness package (e2e).
        self.child = subprocess.Popen(argv, stdout=self._output, stderr=subprocess.STDOUT,
                                      text=True, cwd=ROOT / "hack")

    def finish(self) -> RunOutcome:
        """Print its output; its outcome (the child has exited)."""
        passed = failed = 0
        self._output.seek(0)
        print(f"== e2e {self.label}", flush=True)
        for line in self._output:
            print(line, end="", flush=True)
            if match := _SUMMARY.match(line.strip()):
                passed, failed = int(match[1]), int(match[2])
        self._output.close()
        code = self.child.returncode
        if code and not failed:
            failed = 1  # the run itself failed (set-up, teardown, missing tool)
        outcome = RunOutcome(self.label, code, passed, failed, time.monotonic() - self.began)
        print(f"== e2e {self.label}: {'ok' if code == 0 else 'FAILED'} "
              f"in {outcome.seconds:.0f} s", flush=True)
        return outcome


def _run_side_by_side(runs: list[tuple[str, list[str]]], jobs: int,
                      workdir: Path) -> list[RunOutcome]:
    """Run at most `jobs` at a time, in order; each one's output when it ends."""
    waiting, outcomes = list(runs), []
    running: list[_Running] = []
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                label, argv = waiting.pop(0)
                running.append(_Running(label, argv, workdir))
            time.sleep(0.2)
            for done in [r for r in running if r.child.poll() is not None]:
                running.remove(done)
                outcomes.append(done.finish())
    finally:
        # Interrupted: each run tears its own cluster down on SIGINT/SIGTERM.
        for left in running:
            left.child.terminate()
        for left in running:
            left.child.wait()
    return outcomes


def _one_run(topology: str, backend: str, ip: str,
             args: argparse.Namespace) -> tuple[str, list[str]]:
    """A mode of `-a`: its label and its command line."""
    label = " ".join(([] if topology == "service" else [topology]) + [backend, ip])
    if args.control_plane != "file":
        label = f"{args.control_plane} {label}"
    return label, [sys.executable, "-m", "e2e", "-t", topology, "-i", ip, "-b", backend,
                   "-c", args.control_plane, "--logs-dir", str(args.logs_dir.resolve()),
                   *(["-k"] if args.keep_logs else [])]


def run_all(args: argparse.Namespace) -> int:
    backends = list(BACKENDS)
    failed_runs = []
    for required in REQUIRED_IN_CI:
        if required not in backends:
            print(f"e2e: kpng-py has no to-{required} backend", file=sys.stderr)
            if os.environ.get("CI") == "true":
                failed_runs.append(f"{required} (missing)")
    runs = [_one_run(topology, backend, ip, args) for topology in TOPOLOGIES
            for backend in backends for ip in ALL_RUNS_IP_MODES.get(topology, IP_MODES)]
    args.logs_dir.mkdir(parents=True, exist_ok=True)
    outcomes = _run_side_by_side(runs, args.jobs, args.logs_dir)
    failed_runs += [outcome.label for outcome in outcomes if outcome.code]
    if failed_runs:
        print(f"e2e: failed: {', '.join(failed_runs)}", flush=True)
    # The whole suite's count, last, as one line.
    missing = sum(run.endswith("(missing)") for run in failed_runs)
    total_passed = sum(outcome.passed for outcome in outcomes)
    total_failed = sum(outcome.failed for outcome in outcomes) + missing
    print(f"e2e: {total_passed} passed, {total_failed} failed", flush=True)
    return 1 if failed_runs else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="e2e: %(message)s", stream=sys.stderr)
    # The harness computes a node's view with kpng-py's own state model (M1's
    # kube-proxy rules): its skips of expected objects are the backend's to log.
    logging.getLogger("kpng_py.state.skips").setLevel(logging.WARNING)
    if args.list:
        for check in TOPOLOGIES[args.topology].checks:
            print(f"{check.name}: {check.upstream}")
        return 0
    if args.all:
        if args.ip or args.backend or args.debug:
            parser.error("-a runs every mode: no -i, -b or -d with it")
        return run_all(args)
    if not (args.ip and args.backend):
        parser.error("-i and -b are required (or -a)")
    return run(Options(args.ip, args.backend, args.debug, args.keep_logs, args.logs_dir,
                       args.topology, args.control_plane))
