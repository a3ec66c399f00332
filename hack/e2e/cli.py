"""`hack/test_e2e.sh -i ipv4|ipv6|dual -b ebpf|userspace [-t service|nodeport] [-d] [-k]`,
and `-a` for every topology with every backend this kpng-py has (the NodePort topology
dual-stack only: ALL_RUNS_IP_MODES), what `make e2e` runs."""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from e2e.proxy import BACKENDS
from e2e.run import TOPOLOGIES, Options, run

ROOT = Path(__file__).resolve().parents[2]
IP_MODES = ("ipv4", "ipv6", "dual")
# What `-a` runs of a topology when not every mode: a dual-stack NodePort run
# checks both families (each check per family), and single-stack nodes are the
# service topology's runs; `-t nodeport -i ipv4|ipv6` stays available.
ALL_RUNS_IP_MODES = {"nodeport": ("dual",)}
# CI must run these (a backend that is missing there is a failure, not a skip).
REQUIRED_IN_CI = ("ebpf",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hack/test_e2e.sh",
        description="End-to-end suite: a cluster in network namespaces, real servers and "
                    "clients, the built-in brain and a backend. See docs/e2e.md.")
    parser.add_argument("-i", "--ip", choices=IP_MODES, help="IP families of the cluster")
    parser.add_argument("-b", "--backend", choices=sorted(BACKENDS), help="backend under test")
    parser.add_argument("-t", "--topology", choices=sorted(TOPOLOGIES), default="service",
                        help="service: one node, the ClusterIP checks S1-S15 (default); "
                             "nodeport: two nodes and an external client, N0-N19")
    parser.add_argument("-a", "--all", action="store_true",
                        help="every topology with every built-in backend, one after the "
                             "other: the service topology in every IP mode, the nodeport "
                             "one dual-stack")
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


def _run_one(argv: list[str]) -> tuple[int, int, int]:
    """Run one mode, passing its output through; (exit code, passed, failed)."""
    passed = failed = 0
    # From hack/, `python -m e2e` finds the harness package (e2e).
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT / "hack") as child:
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            if match := _SUMMARY.match(line.strip()):
                passed, failed = int(match[1]), int(match[2])
    return child.returncode, passed, failed


def run_all(args: argparse.Namespace) -> int:
    backends = list(BACKENDS)
    failed_runs = []
    total_passed = total_failed = 0
    for required in REQUIRED_IN_CI:
        if required not in backends:
            print(f"e2e: kpng-py has no to-{required} backend", file=sys.stderr)
            if os.environ.get("CI") == "true":
                failed_runs.append(f"{required} (missing)")
    runs = [(topology, backend, ip) for topology in TOPOLOGIES for backend in backends
            for ip in ALL_RUNS_IP_MODES.get(topology, IP_MODES)]
    for topology, backend, ip in runs:
        began = time.monotonic()
        argv = [sys.executable, "-m", "e2e", "-t", topology, "-i", ip, "-b", backend,
                "--logs-dir", str(args.logs_dir.resolve()),
                *(["-k"] if args.keep_logs else [])]
        label = " ".join(([] if topology == "service" else [topology]) + [backend, ip])
        print(f"== e2e {label}", flush=True)
        code, passed, failed = _run_one(argv)
        if code and not failed:
            failed = 1  # the run itself failed (set-up, teardown, missing tool)
        total_passed, total_failed = total_passed + passed, total_failed + failed
        print(f"== e2e {label}: {'ok' if code == 0 else 'FAILED'} "
              f"in {time.monotonic() - began:.0f} s", flush=True)
        if code:
            failed_runs.append(label)
    if failed_runs:
        print(f"e2e: failed: {', '.join(failed_runs)}", flush=True)
    # The whole suite's count, last, as one line.
    missing = sum(run.endswith("(missing)") for run in failed_runs)
    print(f"e2e: {total_passed} passed, {total_failed + missing} failed", flush=True)
    return 1 if failed_runs else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="e2e: %(message)s", stream=sys.stderr)
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
                       args.topology))
