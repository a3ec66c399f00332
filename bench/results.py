"""Figures: the samples of one metric for one contender at one N, and what is
derived from them (min/median/max, ratios).

A sample is one run's number (for a per-change latency, the median over that
run's changes). A run that did not finish within its time limit leaves a
*censored* figure: it is then known only to be at least the limit.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

DIRECT = "direct"  # the datapath baseline: the pod's own address, nothing translated
# kube-proxy's mode that the end-to-end figures are set against (issue 14).
E2E_REFERENCE = "iptables-legacy"


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str
    higher_is_better: bool


METRICS = {m.key: m for m in (
    Metric("cp_full_sync", "Full sync of N services x E endpoints", "s", False),
    Metric("cp_change", "One-endpoint change (median of a run's changes)", "ms", False),
    Metric("cp_change_p99", "One-endpoint change, 99th percentile of a run's changes", "ms", False),
    Metric("cp_setup", "Backend set-up before the first sync (load, compile)", "s", False),
    Metric("cp_peak_rss", "Peak RSS of the backend process", "MiB", False),
    Metric("e2e_sync", "Full sync via brain + watch client (Sync received to programmed)",
           "s", False),
    Metric("e2e_wall", "Backend start to first change set applied (brain + watch client)",
           "s", False),
    Metric("e2e_peak_rss", "Peak RSS of `kpng-py local` (brain + watch client)", "MiB", False),
    Metric("e2e_process_peak_rss", "Peak RSS of the `kpng-py local` process itself at its first "
           "sync (its `sync applied` line: without the BCC build child, which the figure above "
           "includes)", "MiB", False),
    Metric("e2e_start_applied", "`kpng-py local` start to its first sync applied (brain + "
           "watch client; iptables-legacy: iptables-restore of the same state)", "s", False),
    Metric("e2e_receive", "First sync, stage: receiving the change set (first message to "
           "Sync)", "s", False),
    Metric("e2e_staged", "First sync, stage: decoding into the state model as the ops arrive "
           "(within receiving)", "s", False),
    Metric("e2e_state", "First sync, stage: from the Sync, the last ops and computing the "
           "change set", "s", False),
    Metric("e2e_backend", "First sync, stage: the backend's apply", "s", False),
    Metric("e2e_plan", "First sync, stage: eBPF planning (within the backend's apply)", "s",
           False),
    Metric("e2e_write", "First sync, stage: eBPF map writes (within the backend's apply)", "s",
           False),
    Metric("e2e_restart", "Restart over the pinned datapath: start to adopted (first sync "
           "applied)", "s", False),
    Metric("e2e_restart_compiled", "Restart over the pinned datapath: BCC compiled (1) or not "
           "(0)", "compiled", False),
    Metric("e2e_restart_peak_rss", "Peak RSS of the restarted `kpng-py local`", "MiB", False),
    Metric("e2e_edit", "One-endpoint edit of the state file (saved atomically) to `sync "
           "applied`", "s", False),
    Metric("e2e_brain_first_message", "Brain start to a client's first message (state file of "
           "N services)", "s", False),
    Metric("e2e_brain_serving", "Brain start to a client's first Sync (state file of N "
           "services)", "s", False),
    Metric("kube_first_sync", "`kpng-py kube ... to-api` start to a client's first Sync (N "
           "Services and EndpointSlices of E endpoints on the lab's API server)", "s", False),
    Metric("kube_change", "`kpng-py kube`: one endpoint's change in the API server to a "
           "client's Sync (median of a run's changes)", "ms", False),
    Metric("kube_peak_rss", "Peak RSS of `kpng-py kube ... to-api` (first Sync and changes)",
           "MiB", False),
    Metric("dp_conn_rate", "New connections per second (wrk, Connection: close)", "conn/s", True),
    Metric("dp_connect_latency", "TCP connect latency, median (curl time_connect)", "ms", False),
    Metric("dp_conn_rate_ratio", "New connections per second through the ClusterIP over direct, "
           "measured back to back in the same cluster", "x direct", True),
    Metric("dp_conn_rate_traced", "New connections per second through the ClusterIP while "
           "a trace (`kpng-py ebpf trace --json`) is attached and writing every line",
           "conn/s", True),
    Metric("dp_conn_rate_traced_ratio", "New connections per second with a trace attached "
           "over without, measured back to back in the same cluster", "x idle", True),
    Metric("dp_tcp_throughput", "Long-lived TCP throughput (iperf3)", "Gbit/s", True),
    Metric("dp_tcp_throughput_ratio", "TCP throughput through the ClusterIP over direct, "
           "measured back to back in the same cluster", "x direct", True),
    Metric("dp_udp_rate", "DNS queries per second over UDP (dnsperf)", "query/s", True),
)}


@dataclass
class Figure:
    metric: str
    contender: str
    n: int
    samples: list[float] = field(default_factory=list)
    # Set when a run hit its time limit: the figure is at least this.
    censored_at: float | None = None
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def minimum(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def maximum(self) -> float | None:
        return max(self.samples) if self.samples else None

    def to_json(self) -> dict:
        return {**asdict(self), "min": self.minimum, "median": self.median,
                "max": self.maximum, "unit": METRICS[self.metric].unit}


@dataclass
class Results:
    meta: dict = field(default_factory=dict)
    figures: dict[tuple[str, str, int], Figure] = field(default_factory=dict)
    # Runs that failed, in words (also logged as they happen).
    problems: list[str] = field(default_factory=list)

    def figure(self, metric: str, contender: str, n: int) -> Figure:
        if metric not in METRICS:
            raise KeyError(f"unknown metric {metric!r}")
        return self.figures.setdefault((metric, contender, n), Figure(metric, contender, n))

    def add(self, metric: str, contender: str, n: int, value: float) -> None:
        self.figure(metric, contender, n).samples.append(value)

    def censor(self, metric: str, contender: str, n: int, limit: float, note: str) -> None:
        fig = self.figure(metric, contender, n)
        fig.censored_at, fig.note = limit, note

    def get(self, metric: str, contender: str, n: int) -> Figure | None:
        return self.figures.get((metric, contender, n))

    def median(self, metric: str, contender: str, n: int) -> float | None:
        fig = self.get(metric, contender, n)
        return fig.median if fig else None

    def ns(self, metric: str) -> list[int]:
        return sorted({n for (m, _, n) in self.figures if m == metric})

    def contenders(self, metric: str) -> list[str]:
        return list(dict.fromkeys(c for (m, c, _) in self.figures if m == metric))

    def to_json(self) -> dict:
        return {"meta": self.meta, "figures": [f.to_json() for f in self.figures.values()],
                "problems": self.problems}

    @classmethod
    def read_json(cls, paths: list[Path]) -> Results:
        """The figures of earlier runs' results.json files; a figure of a later
        file replaces the same figure (metric, contender, N) of an earlier one."""
        merged = cls(meta={"merged_from": []})
        for path in paths:
            data = json.loads(path.read_text())
            runs = data["meta"].get("merged_from") or [{"file": str(path), **data["meta"]}]
            merged.meta["merged_from"] += runs
            merged.problems += [p for p in data["problems"] if p not in merged.problems]
            for f in data["figures"]:
                merged.figures[(f["metric"], f["contender"], f["n"])] = Figure(
                    f["metric"], f["contender"], f["n"], f["samples"], f["censored_at"],
                    f["note"])
        return merged

    def write_json(self, path: Path, extra: dict) -> None:
        path.write_text(json.dumps({**self.to_json(), **extra}, indent=2) + "\n")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator
