"""The state model alone: `NodeState` fed the ops of the scenario's first Sync,
then one-endpoint changes, as the built-in brain sends them.

    python -m bench.state_model --services 10000 --endpoints 10 --changes 200 \
        --ops-cache /tmp/ops-10000.bin [--memory]

The ops come from the brain's own code (the scenario as a state file, the
node's view, the change set of a new stream), so they are what `kpng-py local`
receives; `--ops-cache` keeps them serialized, so that two checkouts can be
measured on the very same bytes (run this module with PYTHONPATH pointing at
the other checkout). A one-endpoint change moves the scenario's changed
service's first endpoint to a new address and back. Changes are applied with
the collector paused and a full sync's survivors frozen, as `ChangeSetApplier`
does. Prints one JSON line: seconds for the full sync (wall and CPU),
CPU microseconds per change (median, p99), and with `--memory` the
tracemalloc peak and what the state holds after the full sync (a second
pass: tracing slows everything down).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Sequence

from bench.e2e_sync import NODE, state_file_text
from bench.scenario import Scenario
from kpng_py.api import localv1
from kpng_py.brain.source import changeset
from kpng_py.brain.statefile import parse_state
from kpng_py.brain.view import NodeView, node_view
from kpng_py.metrics.metrics import Metrics
from kpng_py.runtime.collector import collector_paused, freeze_survivors
from kpng_py.state.skips import Skips
from kpng_py.state.tracker import NodeState

_MOVED_TO = "10.244.255.253"  # not a filler pod's address


def _moved_view(scenario: Scenario, view: NodeView) -> NodeView:
    """`view` with the changed service's first endpoint at a new address."""
    ref = (localv1.EndpointsSet, f"bench/svc-{scenario.changed_index()}/pod-0")
    endpoint = localv1.Endpoint.FromString(view[ref])
    del endpoint.IPs.V4[:]
    endpoint.IPs.V4.append(_MOVED_TO)
    return {**view, ref: endpoint.SerializeToString(deterministic=True)}


def _build(scenario: Scenario) -> tuple[list[bytes], list[list[bytes]]]:
    view = node_view(parse_state(state_file_text(scenario).encode(), "scenario"), NODE)
    moved = _moved_view(scenario, view)
    return ([op.SerializeToString() for op in changeset(None, view)],
            [[op.SerializeToString() for op in changeset(a, b)]
             for a, b in ((view, moved), (moved, view))])


def _load_ops(scenario: Scenario, cache: Path | None) -> tuple[list[bytes], list[list[bytes]]]:
    if cache is not None and cache.exists():
        data = json.loads(cache.read_text())
        return ([bytes.fromhex(op) for op in data["full"]],
                [[bytes.fromhex(op) for op in change] for change in data["changes"]])
    full, changes = _build(scenario)
    if cache is not None:
        cache.write_text(json.dumps({"full": [op.hex() for op in full],
                                     "changes": [[op.hex() for op in c] for c in changes]}))
    return full, changes


def _parse(ops: Sequence[bytes]) -> list[localv1.OpItem]:
    return [localv1.OpItem.FromString(op) for op in ops]


def _full_sync(state: NodeState, ops: list[localv1.OpItem]) -> tuple[float, float]:
    """Wall and CPU seconds (the machine may be shared: CPU time is this
    process's own)."""
    started, cpu = time.perf_counter(), time.process_time()
    with collector_paused():
        changes = state.apply(ops)
    seconds = time.perf_counter() - started, time.process_time() - cpu
    freeze_survivors()
    if changes is None or not changes.full:
        raise RuntimeError("the first Sync gave no full change set")
    return seconds


def measure_times(full: Sequence[bytes], changes: Sequence[Sequence[bytes]],
                  count: int) -> dict:
    state = NodeState(Skips(Metrics()))
    ops = _parse(full)
    full_s, full_cpu_s = _full_sync(state, ops)
    del ops
    samples = []
    for step in range(count):
        ops = _parse(changes[step % 2])
        started = time.process_time()
        with collector_paused():
            applied = state.apply(ops)
        samples.append((time.process_time() - started) * 1e6)
        if applied is None or len(applied.updated) != 1:
            raise RuntimeError(f"change {step} did not update one service port: {applied}")
    samples.sort()
    return {"full_sync_s": round(full_s, 3), "full_sync_cpu_s": round(full_cpu_s, 3),
            "change_cpu_us_median": round(statistics.median(samples), 1) if samples else None,
            "change_cpu_us_p99": round(samples[len(samples) * 99 // 100], 1) if samples else None}


def measure_memory(full: Sequence[bytes]) -> dict:
    ops = _parse(full)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = NodeState(Skips(Metrics()))
    with collector_paused():
        state.apply(ops)
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    mib = 1024 * 1024
    return {"tracemalloc_peak_mib": round((peak - before) / mib, 1),
            "retained_mib": round((after - before) / mib, 1),
            "service_ports": len(state.service_ports())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--ops-cache", type=Path, help="where the serialized ops are kept")
    parser.add_argument("--memory", action="store_true", help="measure memory instead of time")
    args = parser.parse_args(argv)
    full, changes = _load_ops(Scenario(args.services, args.endpoints), args.ops_cache)
    result = measure_memory(full) if args.memory else measure_times(full, changes, args.changes)
    print(json.dumps({"services": args.services, "ops": len(full), **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
