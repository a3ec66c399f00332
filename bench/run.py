"""`make bench`: run the parts, then write results.json, results.md and the
plots, and print the targets. See docs/bench.md.

Everything runs in network namespaces, cgroups and bpffs directories named
after this process (`kpe2e-<pid>-...`); all of it is removed at the end, also
on Ctrl-C or SIGTERM, and the leftovers of runs that were killed are removed
at the start. Every loop is bounded in count, every process in time.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bench.contenders import CONTENDERS, Contender
from bench.controlplane import ControlPlanePlan, run_control_plane
from bench.datapath import DatapathPlan, run_datapath
from bench.e2e_sync import run_e2e
from bench.env import ROOT, dataplane_cleanup
from bench.kube_brain import KubePlan, run_kube
from bench.report import evaluate_targets, markdown, outcomes_json, plot
from bench.results import Results
from bench.scenario import Scenario
from lab import teardown
from lab.names import CGROUP2_ROOT, RunNames

log = logging.getLogger("bench")

PARTS = ("cp", "e2e", "dp", "kube")
TOOLS = ("ip", "nsenter", "nft", "iptables-legacy-restore", "wrk", "curl", "iperf3", "dnsperf",
         "nginx", "dnsmasq", "ss")
# Loading these states takes the tool longer than a datapath run is worth
# (see the control-plane figures); raise with --dp-max-n.
DEFAULT_DP_MAX_N = {"iptables-nft": 1_000, "nftables": 10_000}


class Interrupted(Exception):
    pass


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v.replace("_", "")) for v in text.split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give numbers of 1 or more")
    return values


def _names(choices: Sequence[str]):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v for v in text.split(",") if v)
        unknown = [v for v in values if v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return values
    return parse


def _limits(text: str) -> dict[str, int]:
    limits = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in CONTENDERS or not value.isdigit():
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected CONTENDER=N with a contender from {', '.join(CONTENDERS)}")
        limits[name] = int(value)
    return limits


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="make bench BENCH_ARGS=...", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a run of a few minutes: N=1000, 2 runs per figure, 2 s samples "
                        "(explicit options still win)")
    p.add_argument("--parts", type=_names(PARTS), default=PARTS,
                   help="cp (control plane), e2e (brain + client), dp (datapath), kube "
                        "(`kpng-py kube` on the lab's API server); default: all")
    p.add_argument("--contenders", type=_names(tuple(CONTENDERS)), default=tuple(CONTENDERS),
                   help=f"default: every one available here ({', '.join(CONTENDERS)})")
    p.add_argument("--n", type=_ints, help="services, e.g. 1000,10000,30000 (the default)")
    p.add_argument("--endpoints", type=int, default=10, help="endpoints per service (10)")
    p.add_argument("--reps", type=int, help="control-plane runs per figure (3)")
    p.add_argument("--changes", type=int, help="one-endpoint changes per run of ours (200)")
    p.add_argument("--ruleset-changes", type=int,
                   help="partial syncs per run of iptables/nftables (10)")
    p.add_argument("--timeout", type=float,
                   help="seconds for one control-plane run or one state load (300)")
    p.add_argument("--e2e-reps", type=int, help="brain + client runs per figure (3)")
    p.add_argument("--e2e-n", type=_ints, help="N for the e2e part (default: --n)")
    p.add_argument("--dp-n", type=_ints, help="N for the datapath (default: --n)")
    p.add_argument("--kube-n", type=_ints, help="N for the kube part (10000)")
    p.add_argument("--kube-reps", type=int, help="`kpng-py kube` runs per figure (2)")
    p.add_argument("--kube-changes", type=int, help="one-endpoint changes per kube run (20)")
    p.add_argument("--dp-max-n", type=_limits, default={},
                   help="largest datapath N per contender, e.g. userspace=10000 (defaults: "
                        + ", ".join(f"{k}={v}" for k, v in DEFAULT_DP_MAX_N.items()) + ")")
    p.add_argument("--dp-reps", type=int, help="datapath samples per figure (3)")
    p.add_argument("--dp-seconds", type=int, help="seconds per wrk/iperf3/dnsperf sample (5)")
    p.add_argument("--dp-connections", type=int, default=16, help="wrk connections (16)")
    p.add_argument("--dp-connects", type=int, help="connects per latency sample (500)")
    p.add_argument("--report", type=Path, nargs="+", metavar="RESULTS_JSON",
                   help="measure nothing: write the table, plots and targets of earlier runs' "
                        "results.json files (a later file's figure replaces an earlier one's)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                   help="where results.json, results.md, the plots and logs go")
    return p


@dataclass(frozen=True)
class Defaults:
    n: tuple[int, ...]
    reps: int
    changes: int
    ruleset_changes: int
    timeout: float
    e2e_reps: int
    dp_reps: int
    dp_seconds: int
    dp_connects: int
    kube_n: tuple[int, ...]
    kube_reps: int
    kube_changes: int


FULL = Defaults((1_000, 10_000, 30_000), 3, 200, 10, 300.0, 3, 3, 5, 500, (10_000,), 2, 20)
QUICK = Defaults((1_000,), 2, 50, 5, 300.0, 1, 2, 2, 200, (1_000,), 1, 10)


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    defaults = QUICK if args.quick else FULL
    for key, value in vars(defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.e2e_n = args.e2e_n or args.n
    args.dp_n = args.dp_n or args.n
    args.dp_max_n = {**DEFAULT_DP_MAX_N, **args.dp_max_n}
    for n in {*args.n, *args.e2e_n, *args.dp_n}:
        Scenario(n, args.endpoints)  # range checks, before anything runs
    return args


def _preflight() -> None:
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (network namespaces, cgroups, BPF)")
    if not (CGROUP2_ROOT / "cgroup.procs").exists():
        raise SystemExit(f"bench: needs cgroup v2 mounted at {CGROUP2_ROOT}")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"bench: missing {', '.join(missing)}: run hack/setup.sh")


def _contenders(names: Sequence[str], results: Results) -> list[Contender]:
    chosen = []
    for name in names:
        why_not = CONTENDERS[name].available()
        if why_not:
            results.problems.append(f"{name}: skipped, {why_not}")
            log.warning("%s: skipped, %s", name, why_not)
        else:
            chosen.append(CONTENDERS[name])
    return chosen


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _set_signals(handler) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, handler)


def _tool_versions() -> dict[str, str]:
    commands = {"kernel": ["uname", "-r"], "iptables": ["iptables-legacy-restore", "--version"],
                "iptables-nft": ["iptables-nft-restore", "--version"], "nft": ["nft", "--version"],
                "wrk": ["wrk", "--version"], "iperf3": ["iperf3", "--version"],
                "dnsperf": ["dnsperf", "-h"], "nginx": ["nginx", "-v"]}
    versions = {}
    for name, argv in commands.items():
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = (done.stdout + done.stderr).strip().splitlines()
        versions[name] = text[0] if text else ""
    return versions


def _cleanup(names: RunNames) -> list[str]:
    return teardown.remove_run(names, lambda n: dataplane_cleanup(n.places))


def _run_parts(args: argparse.Namespace, names: RunNames, logs: Path, results: Results) -> None:
    contenders = _contenders(args.contenders, results)
    if "cp" in args.parts:
        run_control_plane(names, logs, results, contenders, ControlPlanePlan(
            args.n, args.endpoints, args.reps, args.changes, args.ruleset_changes, args.timeout))
        results.problems += _cleanup(names)
    if "e2e" in args.parts:
        for n in args.e2e_n:
            run_e2e(names, logs, results, contenders, Scenario(n, args.endpoints),
                    args.e2e_reps, args.timeout)
        results.problems += _cleanup(names)
    if "dp" in args.parts:
        run_datapath(names, logs, results, contenders, DatapathPlan(
            args.dp_n, args.endpoints, args.dp_reps, args.dp_seconds, args.dp_connections,
            args.dp_connects, args.timeout, args.dp_max_n))
        results.problems += _cleanup(names)
    if "kube" in args.parts:
        run_kube(names, logs, results, KubePlan(args.kube_n, args.endpoints, args.kube_reps,
                                                args.kube_changes, args.timeout))


def main(argv: Sequence[str] | None = None) -> int:
    args = _resolve(build_parser().parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.report:
        args.out.mkdir(parents=True, exist_ok=True)
        _write(Results.read_json(args.report), args.out)
        return 0
    _preflight()
    names = RunNames.for_this_process()
    logs = args.out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    results = Results(meta={
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv[1:]),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.release()})",
        "load_before": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "tools": _tool_versions(), "endpoints_per_service": args.endpoints})
    interrupted = False
    _set_signals(_interrupt)
    try:
        for line in teardown.remove_stale_runs(lambda n: dataplane_cleanup(n.places)):
            log.info(line)
        _run_parts(args, names, logs, results)
    except Interrupted as err:
        interrupted = True
        results.problems.append(f"interrupted by {err}: the figures are partial")
        log.warning("interrupted by %s; cleaning up", err)
    finally:
        _set_signals(signal.SIG_IGN)  # a second Ctrl-C must not leave half a cluster
        results.problems += _cleanup(names)
        _set_signals(signal.SIG_DFL)
    results.meta.update(finished=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                        load_after=" ".join(f"{v:.2f}" for v in os.getloadavg()))
    _write(results, args.out)
    return 130 if interrupted else 0


def _write(results: Results, out: Path) -> None:
    outcomes = evaluate_targets(results)
    results.write_json(out / "results.json", {"targets": outcomes_json(outcomes)})
    (out / "results.md").write_text(markdown(results, outcomes))
    plots = plot(results, out)
    print(f"\nresults: {out / 'results.json'}, {out / 'results.md'}, {len(plots)} plots")
    for problem in results.problems:
        print(f"problem: {problem}")
    print("\ntargets (goals, not asserts):")
    for outcome in outcomes:
        print(outcome.line())

