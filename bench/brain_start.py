"""The built-in brain's start on its own, for its reader's figures side by
side (docs/bench.md, "The brain's reader"): the scenario as a state file in
one style, `kpng-py file -i FILE to-api` on a unix socket, and a client
(`bench.brain_probe`) that waits for its first Sync. No namespace, no root;
a CPU-heavy run all the same (on a shared machine, under its lock).

    python -m bench.brain_start --services 10000 --style flow \\
        [--checkout DIR ...] [--runs 3]

prints one JSON line a run: the checkout, the style, the brain's start to
the client's first message and first Sync (s), the brain's CPU seconds by
then (its second process's included) and its peak RSS (MiB, the kernel's
VmHWM of the brain), and that of the second process that read half of the
services of a big file (kpng_py/brain/processes.py; from the brain's log
line about it, 0 when there was none): both run at once. Runs alternate
between the checkouts given (default: this one); another checkout's brain
runs with this Python, from its own tree (its generated protobuf code
included), e.g. a `git worktree` of the commit before.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import yaml

from bench.e2e_sync import NODE, SETTLED_SECONDS, state_file_document
from bench.scenario import Scenario

STYLES = ("block", "flow", "flow-inline", "json", "json-line")
# This checkout: the tree the bench package is in.
HERE = Path(__file__).resolve().parent.parent
# The brain's log line about the second process that read half the services.
SECOND_PROCESS_PEAK = re.compile(r"second process read its share.* peak_rss_mib=([0-9.]+)")


def state_file_in_style(scenario: Scenario, style: str) -> str:
    """The scenario's state file: block style (what `make bench` writes),
    flow style inside (collections of scalars inline, as
    docs/examples/state.yaml), flow style throughout (`flow-inline`: one
    flow mapping, wrapped at 80 columns), JSON (one space of indent a level)
    or JSON on one line."""
    document = state_file_document(scenario)
    if style.startswith("json"):
        return json.dumps(document, indent=1 if style == "json" else None) + "\n"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    flow_style = {"block": False, "flow": None, "flow-inline": True}[style]
    return yaml.dump(document, Dumper=dumper, sort_keys=False, default_flow_style=flow_style)


def brain_start(checkout: Path, state: Path, timeout: float) -> dict:
    """One start of `checkout`'s brain on `state`, to a client's first Sync."""
    settled = time.time() - SETTLED_SECONDS  # served at once (docs/brain.md)
    os.utime(state, (settled, settled))
    with tempfile.TemporaryDirectory(prefix="brain-start-") as workdir:
        socket = Path(workdir) / "brain.sock"
        probe = subprocess.Popen(
            [sys.executable, "-m", "bench.brain_probe", "--socket", str(socket),
             "--node-name", NODE, "--timeout", str(timeout)],
            cwd=HERE, stdout=subprocess.PIPE, text=True)
        started = time.monotonic()
        # `-c` puts its working directory first on the path: the checkout's
        # kpng_py before the one installed.
        log = Path(workdir) / "brain.log"
        with log.open("wb") as log_file:
            brain = subprocess.Popen(
                [sys.executable, "-c",
                 "import sys; from kpng_py.cmd.cli import main; sys.exit(main())",
                 "file", "-i", str(state), "to-api", "--listen", f"unix://{socket}"],
                cwd=checkout, stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            out, _ = probe.communicate(timeout=timeout + 10)
            cpu, peak = _cpu_seconds(brain.pid), _peak_mib(brain.pid)
        finally:
            brain.terminate()
            brain.wait()
        second = SECOND_PROCESS_PEAK.search(log.read_text())
    if probe.returncode != 0:
        raise RuntimeError(f"{checkout}: the brain did not serve {state} in {timeout} s")
    report = json.loads(out)
    return {"first_message_s": round(report["first_message"] - started, 2),
            "first_sync_s": round(report["first_sync"] - started, 2),
            "brain_cpu_s": round(cpu, 2), "peak_rss_mib": round(peak),
            "second_process_peak_rss_mib": round(float(second[1])) if second else 0}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime, stime, and those of the children it waited for.
    return sum(map(int, fields[11:15])) / os.sysconf("SC_CLK_TCK")


def _peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.brain_start")
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--style", choices=STYLES, action="append",
                        help="the state file's style (repeat for more; default: all)")
    parser.add_argument("--checkout", type=Path, action="append",
                        help="a checkout whose brain runs (repeat to alternate; default: this)")
    parser.add_argument("--runs", type=int, default=1, help="rounds over checkouts and styles")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    scenario = Scenario(args.services, args.endpoints)
    checkouts = [path.resolve() for path in args.checkout or [HERE]]
    with tempfile.TemporaryDirectory(prefix="brain-start-files-") as files:
        states = {}
        for style in args.style or STYLES:
            suffix = "json" if style.startswith("json") else "yaml"
            states[style] = Path(files) / f"state-{style}.{suffix}"
            states[style].write_text(state_file_in_style(scenario, style))
        for _ in range(args.runs):
            for style, state in states.items():
                for checkout in checkouts:
                    figures = brain_start(checkout, state, args.timeout)
                    print(json.dumps({"checkout": str(checkout), "style": style,
                                      "bytes": state.stat().st_size, **figures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
