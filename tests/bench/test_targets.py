"""Issue 14's targets as the bench prints them (PASS/MISS/N/A), from synthetic
results: the thresholds, the ratio to iptables-legacy, runs stopped at their
time limit, and what results.json and results.md carry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import issue_14_targets, markdown, stage_table
from bench.results import Results
from bench.run import _write


def results_with(*figures: tuple[str, str, int, list[float]]) -> Results:
    results = Results(meta={"started": "then"})
    for metric, contender, n, samples in figures:
        for value in samples:
            results.add(metric, contender, n, value)
    return results


def outcome(results: Results, starts_with: str):
    found = [o for o in issue_14_targets(results) if o.target.startswith(starts_with)]
    assert len(found) == 1, [o.target for o in issue_14_targets(results)]
    return found[0]


START_10K = "`kpng-py local` (to-ebpf) start -> first sync applied, N=10,000"
START_30K = "`kpng-py local` (to-ebpf) start -> first sync applied, N=30,000"


@pytest.mark.parametrize(("ours", "reference", "status"), [
    ([2.4, 2.5, 9.0], [8.0], "PASS"),  # the median counts: 2.5 s, 0.31x
    ([2.9], [5.0], "MISS"),            # under 3 s, but 0.58x
    ([3.5], [20.0], "MISS"),           # 0.18x, but over 3 s
    ([3.0], [10.0], "PASS"),           # 3 s included
    ([2.8], [8.0], "PASS"),            # 0.35x included (exact in binary: 2.8 / 8)
])
def test_start_to_applied_needs_both_the_time_and_the_ratio(ours, reference, status) -> None:
    results = results_with(("e2e_start_applied", "ebpf", 10_000, ours),
                           ("e2e_start_applied", "iptables-legacy", 10_000, reference))
    assert outcome(results, START_10K).status == status


def test_start_to_applied_without_the_reference_is_not_judged() -> None:
    results = results_with(("e2e_start_applied", "ebpf", 10_000, [1.0]))
    found = outcome(results, START_10K)
    assert found.status == "N/A" and "iptables-legacy" in found.detail
    assert outcome(Results(), START_10K).status == "N/A"


def test_a_stopped_run_is_a_bound() -> None:
    slow_reference = results_with(("e2e_start_applied", "ebpf", 10_000, [2.0]))
    slow_reference.censor("e2e_start_applied", "iptables-legacy", 10_000, 300, "stopped")
    found = outcome(slow_reference, START_10K)
    assert found.status == "PASS" and "<= 0.01x" in found.detail and ">= 300" in found.detail

    stopped_ours = results_with(("e2e_start_applied", "iptables-legacy", 30_000, [60.0]))
    stopped_ours.censor("e2e_start_applied", "ebpf", 30_000, 300, "stopped")
    found = outcome(stopped_ours, START_30K)
    assert found.status == "MISS" and ">= 300" in found.detail


def test_30k_and_the_peak_rss_have_their_own_limits() -> None:
    results = results_with(("e2e_start_applied", "ebpf", 30_000, [8.9]),
                           ("e2e_peak_rss", "ebpf", 10_000, [149.0]),
                           ("e2e_peak_rss", "ebpf", 30_000, [251.0]))
    assert outcome(results, START_30K).status == "PASS"
    assert outcome(results, "peak RSS of `kpng-py local` (to-ebpf), N=10,000").status == "PASS"
    assert outcome(results, "peak RSS of `kpng-py local` (to-ebpf), N=30,000").status == "MISS"


def restart_results(seconds: float, compiled: list[float], edits: int) -> Results:
    results = results_with(("e2e_restart", "ebpf", 10_000, [seconds] * len(compiled)),
                           ("e2e_restart_compiled", "ebpf", 10_000, compiled),
                           ("e2e_edit", "ebpf", 10_000, [1.5] * edits))
    results.figure("e2e_restart_compiled", "ebpf", 10_000).note = "from the log"
    return results


@pytest.mark.parametrize(("seconds", "compiled", "edits", "status"), [
    (2.0, [0.0, 0.0], 2, "PASS"),
    (2.0, [0.0, 1.0], 2, "MISS"),  # one restart compiled
    (3.5, [0.0], 1, "MISS"),       # too slow
    (2.0, [0.0, 0.0], 1, "MISS"),  # one restart did not apply the later change
])
def test_a_restart_must_be_fast_compile_nothing_and_apply_a_change(
        seconds, compiled, edits, status) -> None:
    found = outcome(restart_results(seconds, compiled, edits), "restart over the pinned datapath")
    assert found.status == status, found


def test_a_restart_not_known_to_compile_or_not_is_not_judged() -> None:
    results = results_with(("e2e_restart", "ebpf", 10_000, [1.0]))
    assert outcome(results, "restart over the pinned datapath").status == "N/A"


def test_the_brain_the_edit_and_the_backend_change() -> None:
    results = results_with(("e2e_brain_serving", "brain", 10_000, [1.9]),
                           ("e2e_edit", "ebpf", 10_000, [2.1]),
                           ("cp_change", "ebpf", 1_000, [0.1]),
                           ("cp_change", "ebpf", 30_000, [1.2]))
    assert outcome(results, "brain: start -> serving").status == "PASS"
    assert outcome(results, "one-endpoint edit of the 10,000-service file").status == "MISS"
    change = outcome(results, "eBPF one-endpoint change in the backend")
    assert change.status == "MISS" and "N=30000: 1.20 ms" in change.detail


def test_the_stage_breakdown_has_a_row_per_run_kind() -> None:
    results = results_with(("e2e_sync", "ebpf", 1_000, [0.4]),
                           ("e2e_receive", "ebpf", 1_000, [0.5]),
                           ("e2e_plan", "ebpf", 1_000, [0.1]),
                           ("e2e_sync", "userspace", 1_000, [0.6]))
    rows = [line for line in stage_table(results) if line.startswith("| ebpf")
            or line.startswith("| userspace")]
    assert rows[0].startswith("| ebpf | 1,000 | - | 0.5 | - | - | 0.1 | - | - | 0.4 |")
    assert rows[1].startswith("| userspace | 1,000 | - | - | - | - | - | - | - | 0.6 |")


def test_results_json_and_md_carry_the_targets(tmp_path: Path) -> None:
    results = results_with(("e2e_start_applied", "ebpf", 1_000, [0.5]),
                           ("e2e_start_applied", "iptables-legacy", 1_000, [0.25]),
                           ("e2e_sync", "ebpf", 1_000, [0.3]),
                           ("e2e_brain_serving", "brain", 10_000, [5.0]))
    _write(results, tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    by_target = {t["target"]: t["status"] for t in data["targets"]}
    assert by_target["brain: start -> serving a 10,000-service state file <= 2 s"] == "MISS"
    assert by_target[f"{START_10K}: <= 3 s and <= 0.35x iptables-legacy"] == "N/A"
    text = (tmp_path / "results.md").read_text()
    assert "| brain: start -> serving a 10,000-service state file <= 2 s | **MISS** | 5 s |" in text
    assert "| ebpf | 1,000 | 1 | 0.5 | 0.5 | 0.5 | 2 |" in text  # 2x iptables-legacy
    assert (tmp_path / "e2e_start_applied.png").stat().st_size > 0
    assert markdown(results, []).count("## Stage breakdown") == 1
