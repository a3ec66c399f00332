"""Control-plane figures: each contender programs the scenario from nothing,
in a fresh namespace (and cgroup and bpffs directory) per run, then makes
one-endpoint changes; `bench.worker` says what is timed.

A contender whose run hits the time limit is not tried at larger N (it would
only take longer); its figure is reported as at least the limit.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench.contenders import Contender
from bench.env import Sandbox, run_measured
from bench.results import Results
from bench.scenario import Scenario
from bench.worker import read_reports
from lab.names import RunNames
from lab.procs import in_namespace

log = logging.getLogger("bench")


@dataclass(frozen=True)
class ControlPlanePlan:
    ns: tuple[int, ...]
    endpoints: int
    reps: int
    changes: int          # one-endpoint changes per run of our backends
    ruleset_changes: int  # partial syncs per run of kube-proxy's rulesets (each costs more)
    timeout: float        # seconds for one run


def run_control_plane(names: RunNames, workdir: Path, results: Results,
                      contenders: list[Contender], plan: ControlPlanePlan) -> None:
    gave_up: set[str] = set()
    for n in plan.ns:
        scenario = Scenario(n, plan.endpoints)
        scenario_file = workdir / f"scenario-{n}.json"
        scenario_file.write_text(scenario.to_json())
        for contender in contenders:
            if contender.name in gave_up:
                results.censor("cp_full_sync", contender.name, n, plan.timeout,
                               "not run: timed out at a smaller N")
                continue
            unfit = contender.unfit(scenario)
            if unfit:
                results.problems.append(f"cp {contender.name} N={n}: not run: {unfit}")
                log.warning("cp %s N=%d: not run: %s", contender.name, n, unfit)
                continue
            for rep in range(plan.reps):
                if not _run_once(names, workdir, results, contender, scenario, scenario_file,
                                 rep, plan):
                    gave_up.add(contender.name)
                    break


def _run_once(names: RunNames, workdir: Path, results: Results, contender: Contender,
              scenario: Scenario, scenario_file: Path, rep: int, plan: ControlPlanePlan) -> bool:
    """One run; False if it timed out."""
    n = scenario.services
    label = f"cp-{contender.name}-{n}-{rep}"
    box = Sandbox.of(names, label).create()
    changes = plan.changes if contender.ours else plan.ruleset_changes
    try:
        argv = in_namespace(box.netns, contender.worker(scenario, scenario_file, box.places,
                                                    changes=changes))
        done = run_measured(argv, plan.timeout, workdir, label)
    finally:
        results.problems += box.remove()
    report = read_reports(done.stdout)
    if "full_sync_s" in report:
        results.add("cp_full_sync", contender.name, n, report["full_sync_s"])
    change_ms = None  # the run's median one-endpoint change
    if report.get("change_s"):
        ms = sorted(s * 1000 for s in report["change_s"])
        change_ms = statistics.median(ms)
        results.add("cp_change", contender.name, n, change_ms)
        results.add("cp_change_p99", contender.name, n, ms[min(len(ms) - 1, len(ms) * 99 // 100)])
    if contender.ours and "full_sync_s" in report:
        results.add("cp_setup", contender.name, n, report["setup_s"])
        results.add("cp_peak_rss", contender.name, n, done.peak_rss_mib)
    if done.timed_out:
        metric = "cp_change" if "full_sync_s" in report else "cp_full_sync"
        results.censor(metric, contender.name, n, plan.timeout,
                       f"run stopped after {plan.timeout:.0f} s")
        log.warning("cp %s N=%d rep %d: stopped after %.0f s", contender.name, n, rep + 1,
                    plan.timeout)
        return False
    if done.returncode != 0:
        message = f"cp {contender.name} N={n} rep {rep + 1}: {done.describe()}"
        results.problems.append(message)
        log.error(message)
        return True
    log.info("cp %s N=%d rep %d: full sync %.3f s, one-endpoint change %s", contender.name, n,
             rep + 1, report["full_sync_s"],
             f"{change_ms:.2f} ms (median of {changes})" if change_ms is not None
             else "not measured")
    return True
