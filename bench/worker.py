"""One contender programming one scenario, measured from the inside.

The bench starts this module in a network namespace (and cgroup) of its own,
so what it programs reaches nothing else:

    python -m bench.worker ours --sink to-ebpf --scenario S.json -- [sink flags]
    python -m bench.worker iptables|nftables --scenario S.json

It programs the whole scenario at once (timed), then makes `--changes`
one-endpoint changes (each timed), prints one JSON line with the timings and
its peak memory, and with `--hold` keeps the dataplane up until its standard
input closes (the datapath bench measures traffic meanwhile).

- `ours`: a kpng-py backend (any `to-<backend>` sink, created from its flags
  as `kpng-py local` does), driven through `Backend.apply` with a full
  ServicePortChanges and then one-endpoint ServicePortChanges: the backend's real code path,
  map writes included, without the brain and the watch client.
- `iptables`, `nftables`: kube-proxy's rulesets for the same state, loaded
  with `iptables-restore --noflush` / `nft -f -` as kube-proxy does (a full
  sync, then partial syncs); only the load is timed, not the generation.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from bench.scenario import CLUSTER_POD_CIDR, SERVICE_CIDR, Scenario
from kpng_py.dataplane.contract import Backend
from kpng_py.metrics.metrics import Metrics
from kpng_py.model import ServicePortChanges
from lab.kube_proxy.iptables import IptablesProxier, restore_command
from lab.kube_proxy.nftables import LOAD_COMMAND, NftablesProxier

REPORT_KEY = "bench-worker"
LOAD_TIMEOUT = 1800.0  # seconds for one iptables-restore or nft -f of a whole state


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _peak_rss_mib() -> float:
    """This process's own high-water mark (VmHWM): getrusage() would include
    the one of the process this one was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _load(command: Sequence[str], text: str) -> None:
    done = subprocess.run(list(command), input=text, capture_output=True, text=True,
                          timeout=LOAD_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` exited {done.returncode}: "
                           f"{done.stderr.strip()[:2000]}")


def _changes(scenario: Scenario, count: int) -> list[ServicePortChanges]:
    return [scenario.endpoint_change(step) for step in range(count)]


def _emit(**values: object) -> None:
    """One JSON line per step, so that a run cut short still reports what it did
    (under a key of its own: a backend such as to-print writes to stdout too)."""
    print(json.dumps({REPORT_KEY: values}), flush=True)


def read_reports(stdout: str) -> dict:
    """What a worker reported, merged (the bench's side of `_emit`)."""
    merged: dict = {}
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get(REPORT_KEY), dict):
            merged.update(record[REPORT_KEY])
    return merged


def run_ours(scenario: Scenario, changes: int, sink: str, sink_args: Sequence[str]) -> Backend:
    from kpng_py.dataplane.registry import by_sink

    specs = by_sink()
    if sink not in specs:
        raise SystemExit(f"this kpng-py has no {sink} backend (has: {', '.join(specs)})")
    parser = argparse.ArgumentParser(prog=sink)
    specs[sink].add_arguments(parser)
    backend: Backend = specs[sink].create(parser.parse_args(list(sink_args)), Metrics())
    full = scenario.full_changeset()
    steps = _changes(scenario, changes)
    _emit(state_rss_mib=_peak_rss_mib())
    _emit(setup_s=_timed(backend.setup))
    _emit(full_sync_s=_timed(lambda: backend.apply(full)), full_sync_rss_mib=_peak_rss_mib())
    if steps:
        _emit(change_s=[_timed(lambda: backend.apply(step)) for step in steps])
    _emit(peak_rss_mib=_peak_rss_mib())
    return backend


def run_ruleset(scenario: Scenario, changes: int, mode: str, iptables_variant: str) -> None:
    ports = scenario.service_ports()
    if mode == "iptables":
        proxier = IptablesProxier(str(CLUSTER_POD_CIDR))
        command = restore_command(iptables_variant)
        _load((command[0], "--noflush"), proxier.jump_rules())
        full = proxier.full_sync(ports)
    else:
        nft = NftablesProxier(str(CLUSTER_POD_CIDR), str(SERVICE_CIDR))
        command = LOAD_COMMAND
        full = nft.full_sync(ports)
    partials = []
    for step in _changes(scenario, changes):
        ports[scenario.changed_index()] = step.updated[0][1]
        partials.append(proxier.partial_sync(ports, step.updated) if mode == "iptables"
                        else nft.partial_sync(step.updated))
    _emit(full_sync_bytes=len(full), change_bytes=len(partials[0]) if partials else 0)
    _emit(full_sync_s=_timed(lambda: _load(command, full)))
    if partials:
        _emit(change_s=[_timed(lambda: _load(command, text)) for text in partials])


def _hold() -> None:
    """Keep the dataplane until the bench closes our standard input."""
    _emit(ready=True)
    sys.stdin.read()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("contender", choices=("ours", "iptables", "nftables"))
    parser.add_argument("--scenario", type=Path, required=True, help="scenario JSON file")
    parser.add_argument("--changes", type=int, default=0, help="one-endpoint changes to time")
    parser.add_argument("--hold", action="store_true",
                        help="keep the dataplane until standard input closes")
    parser.add_argument("--sink", default="to-ebpf", help="our backend (ours only)")
    parser.add_argument("--iptables-variant", choices=("legacy", "nft"), default="legacy",
                        help="iptables-legacy-restore or iptables-nft-restore (iptables only)")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    sink_args = argv[split + 1:]  # the backend's own flags
    scenario = Scenario.from_json(args.scenario.read_text())
    _raise_open_files_limit()
    backend = None
    try:
        if args.contender == "ours":
            backend = run_ours(scenario, args.changes, args.sink, sink_args)
        else:
            run_ruleset(scenario, args.changes, args.contender, args.iptables_variant)
        if args.hold:
            _hold()
    finally:
        if backend is not None:
            backend.close()
    return 0


def open_files_ceiling() -> int:
    """The most open files a worker can get: the hard limit, or the kernel's
    ceiling where this process may raise the hard limit (CAP_SYS_RESOURCE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with open("/proc/sys/fs/nr_open") as f:
        ceiling = int(f.read())
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, ceiling))
    except (ValueError, OSError):
        return hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return ceiling


def _raise_open_files_limit() -> None:
    """A proxy with a listener per service port needs more than the default
    1024 descriptors (a node agent gets a high limit from its unit or pod)."""
    limit = open_files_ceiling()
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


if __name__ == "__main__":
    sys.exit(main())
