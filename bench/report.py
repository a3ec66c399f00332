"""Reading the figures: ratios, the targets (goals printed PASS/MISS, never
asserted), the Markdown table and the plots."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from bench.results import DIRECT, METRICS, Figure, Results, ratio

# What each metric's ratio column compares with: the eBPF backend for the
# control plane ("x ours": how many times our time), the pod itself for the
# datapath ("x direct").
REFERENCE = {"cp_full_sync": "ebpf", "cp_change": "ebpf", "cp_change_p99": "ebpf",
             "dp_conn_rate": DIRECT, "dp_connect_latency": DIRECT,
             "dp_tcp_throughput": DIRECT, "dp_udp_rate": DIRECT}
IPTABLES = ("iptables-legacy", "iptables-nft")
TARGET_N = 10_000


@dataclass(frozen=True)
class Outcome:
    target: str
    status: str  # PASS, MISS or N/A
    detail: str

    def line(self) -> str:
        return f"{self.status:<4} {self.target}: {self.detail}"


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _value(fig: Figure | None) -> str:
    """A figure's median, or its lower bound when censored."""
    if fig is None:
        return "not measured"
    if fig.median is None:
        return f">= {_fmt(fig.censored_at)}" if fig.censored_at else "no valid sample"
    return _fmt(fig.median)


def reference_ratio(results: Results, fig: Figure) -> float | None:
    ref = REFERENCE.get(fig.metric)
    if ref is None or fig.contender == ref:
        return None
    return ratio(fig.median, results.median(fig.metric, ref, fig.n))


# -- targets -----------------------------------------------------------------

def _every_n(results: Results, metric: str, contender: str, target: str,
             check: Callable[[int, float], tuple[bool, str]]) -> Outcome:
    ns = [n for n in results.ns(metric) if results.median(metric, contender, n) is not None]
    if not ns:
        return Outcome(target, "N/A", f"{contender} {metric} not measured")
    verdicts = [check(n, results.median(metric, contender, n)) for n in ns]
    ok = all(v for v, _ in verdicts)
    return Outcome(target, "PASS" if ok else "MISS", "; ".join(d for _, d in verdicts))


def _vs_direct(results: Results, metric: str, contender: str, floor: float, target: str
               ) -> Outcome:
    def check(n: int, value: float) -> tuple[bool, str]:
        paired = results.get(f"{metric}_ratio", contender, n)
        if paired is not None and paired.median is not None:
            return paired.median >= floor, (
                f"N={n}: {paired.median:.3f}x direct (median of {len(paired.samples)} "
                f"back-to-back pairs, {_fmt(paired.minimum)}-{_fmt(paired.maximum)})")
        direct = results.median(metric, DIRECT, n)
        r = ratio(value, direct)
        if r is None:
            return False, f"N={n}: no direct baseline"
        return r >= floor, f"N={n}: {_fmt(value)} vs {_fmt(direct)} direct = {r:.3f}x"

    return _every_n(results, metric, contender, target, check)


def _sync_under(results: Results) -> Outcome:
    target = "eBPF full sync of 10 000 x 10 under 2 s"
    value = results.median("cp_full_sync", "ebpf", TARGET_N)
    if value is None:
        return Outcome(target, "N/A", f"N={TARGET_N} not measured")
    return Outcome(target, "PASS" if value < 2 else "MISS", f"median {value:.3f} s")


def _sync_vs_iptables(results: Results) -> Outcome:
    target = "eBPF full sync of 10 000 x 10 >= 10x faster than iptables-restore"
    ours = results.median("cp_full_sync", "ebpf", TARGET_N)
    if ours is None:
        return Outcome(target, "N/A", f"eBPF at N={TARGET_N} not measured")
    bounds = []
    for variant in IPTABLES:
        fig = results.get("cp_full_sync", variant, TARGET_N)
        if fig is None:
            continue
        seconds = fig.median if fig.median is not None else fig.censored_at
        if seconds is not None:
            exact = fig.median is not None
            bounds.append((seconds, exact, variant))
    if not bounds:
        return Outcome(target, "N/A", f"iptables-restore at N={TARGET_N} not measured")
    # Against the fastest iptables backend: the harder bar.
    seconds, exact, variant = min(bounds)
    r = seconds / ours
    detail = (f"{variant} {'' if exact else '>= '}{seconds:.2f} s vs eBPF {ours:.3f} s = "
              f"{'' if exact else '>= '}{r:.1f}x (the faster iptables backend)")
    return Outcome(target, "PASS" if r >= 10 else "MISS", detail)


def _change_under(results: Results, contender: str) -> Outcome:
    return _every_n(results, "cp_change", contender,
                    f"{contender} one-endpoint change under 10 ms at every N",
                    lambda n, v: (v < 10, f"N={n}: {v:.2f} ms"))


def evaluate_targets(results: Results) -> list[Outcome]:
    return [
        _vs_direct(results, "dp_conn_rate", "ebpf", 0.97,
                   "eBPF connection rate through a ClusterIP >= 0.97x direct at every N"),
        _sync_under(results),
        _sync_vs_iptables(results),
        _change_under(results, "ebpf"),
        _change_under(results, "userspace"),
        _vs_direct(results, "dp_tcp_throughput", "userspace", 0.5,
                   "userspace TCP throughput >= 0.5x direct"),
    ]


# -- Markdown ------------------------------------------------------------------

def markdown(results: Results, outcomes: list[Outcome]) -> str:
    lines = ["# kpng-py benchmark results", ""]
    for meta in results.meta.get("merged_from", [results.meta]):
        lines.append(f"- Run {meta.get('started')} to {meta.get('finished')} on "
                     f"{meta.get('host')}; load average before {meta.get('load_before')}, "
                     f"after {meta.get('load_after')}; options `{meta.get('command')}`.")
    lines += ["", "Each figure is the median of its samples (one per run); min and max show "
              "the spread. `>= x`: the run hit its time limit.", "", "## Targets", ""]
    lines += [f"- **{o.status}** {o.target}: {o.detail}" for o in outcomes]
    for key, metric in METRICS.items():
        figs = [f for f in results.figures.values() if f.metric == key]
        if not figs:
            continue
        ref = REFERENCE.get(key)
        ref_title = {None: "", DIRECT: "x direct"}.get(ref, f"x {ref}")
        lines += ["", f"## {metric.title} ({metric.unit})", "",
                  f"| contender | N | runs | min | median | max |{f' {ref_title} |' if ref else ''}",
                  f"|---|--:|--:|--:|--:|--:|{'--:|' if ref else ''}"]
        for fig in sorted(figs, key=lambda f: (f.n, f.contender)):
            row = (f"| {fig.contender} | {fig.n:,} | {len(fig.samples)} | {_fmt(fig.minimum)} | "
                   f"{_value(fig)} | {_fmt(fig.maximum)} |")
            if ref:
                row += f" {_fmt(reference_ratio(results, fig))} |"
            lines.append(row + (f" {fig.note}" if fig.note else ""))
    if results.problems:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in results.problems]
    return "\n".join(lines) + "\n"


# -- plots ---------------------------------------------------------------------

def plot(results: Results, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for key, metric in METRICS.items():
        contenders = results.contenders(key)
        if not contenders:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for contender in contenders:
            points = [f for f in (results.get(key, contender, n) for n in results.ns(key))
                      if f is not None and f.median is not None]
            if not points:
                continue
            xs = [p.n for p in points]
            ys = [p.median for p in points]
            errors = [[y - p.minimum for y, p in zip(ys, points)],
                      [p.maximum - y for y, p in zip(ys, points)]]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=contender)
        stopped = [f for f in results.figures.values()
                   if f.metric == key and f.median is None and f.censored_at]
        if stopped:
            ax.scatter([f.n for f in stopped], [f.censored_at for f in stopped], marker="^",
                       color="black", label="stopped at the time limit (at least this)")
            stacked: dict[tuple[int, float], int] = {}
            for f in stopped:
                above = stacked[(f.n, f.censored_at)] = stacked.get((f.n, f.censored_at), -1) + 1
                ax.annotate(f.contender, (f.n, f.censored_at), fontsize=7,
                            textcoords="offset points", xytext=(4, 4 - 9 * above))
        ax.set_xscale("log")
        if key.startswith("cp_"):
            ax.set_yscale("log")
        ax.set_xlabel("services (N)")
        ax.set_ylabel(metric.unit)
        ax.set_title(metric.title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        path = out_dir / f"{key}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def outcomes_json(outcomes: list[Outcome]) -> list[dict]:
    return [asdict(o) for o in outcomes]
