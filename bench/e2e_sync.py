"""The full sync end to end: the scenario as a KPNG state file, served by the
built-in brain (`kpng-py file ... to-api`), and `kpng-py local ... to-<backend>`
as its own process, as in the split sidecar layout; and, in the same run,
kube-proxy's `iptables-legacy-restore` of the same state (the reference).

Per N: the brain's start to a client's first Sync (`bench.brain_probe`).
Per backend run, in a fresh sandbox: `kpng-py local --exit-after 1`, its
start to its `sync applied` line seen (and to its exit), that line's stages
(receive, state, backend, the backend's own) and the process's peak RSS.
For a backend whose dataplane survives a restart (eBPF), a second `kpng-py
local` then starts on the same pins and cgroup: its start to its first
`sync applied` (adopted), whether it compiled, and then a one-endpoint edit
of the state file (saved atomically) to the `sync applied` of that change.
Times are seen by the bench as the log lines appear (polled every 10 ms).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.contenders import Contender
from bench.env import KPNG_PY, Finished, Sandbox, Watched, run_measured, stop
from bench.results import E2E_REFERENCE, Results
from bench.scenario import Scenario
from bench.worker import read_reports
from kpng_py.model import ServicePort
from lab.names import RunNames
from lab.procs import in_namespace

log = logging.getLogger("bench")

NODE = "node-a"
OTHER_NODE = "node-b"  # the endpoints' node: none is Local
PROTOCOL_NUMBERS = {"TCP": 1, "UDP": 2}
SYNC_APPLIED = "sync applied"
# The `sync applied` fields of the stage breakdown (ms), and their figures (s).
STAGES = {"receive_ms": "e2e_receive", "staged_ms": "e2e_staged", "state_ms": "e2e_state",
          "plan_ms": "e2e_plan", "write_ms": "e2e_write", "backend_ms": "e2e_backend"}
# Mapped in a process that has BCC's compiler loaded.
# The state file's mtime is set this far back, so that the brain serves it at
# once: a file modified in the last second is waited for (docs/brain.md).
SETTLED_SECONDS = 10


def state_file_text(scenario: Scenario) -> str:
    """The scenario in KPNG's state-file format (docs/brain.md)."""
    return _dump([_service_yaml(port) for port in scenario.service_ports()])


def state_file_document(scenario: Scenario) -> dict:
    """The scenario's state file as plain values, to write in any style."""
    return _document([_service_yaml(port) for port in scenario.service_ports()])


def moved_state_file_text(scenario: Scenario, text: str) -> str:
    """`text` (the scenario's state file) with the endpoint that
    `scenario.endpoint_moves()` moves at its new address, under the same pod
    name (one endpoint changes). Only that service is dumped again: a whole
    file of 10 000 services takes about a minute."""
    before, after = scenario.endpoint_moves()
    service = _service_yaml(before)
    old = _service_item(service)
    moved = next(ep for ep in after.endpoints if ep not in before.endpoints)
    service["endpoints"][0]["endpoint"]["ips"]["v4"] = [str(moved.ip)]
    if text.count(old) != 1:
        raise ValueError(f"the state file holds not exactly one {before.name} to edit")
    return text.replace(old, _service_item(service))


def _service_item(service: dict) -> str:
    """How one service of `services` reads in the state file."""
    text = _dump([service])
    return text[text.index("\nservices:\n") + len("\nservices:\n"):]


def _document(services: list[dict]) -> dict:
    return {"nodes": [{"name": NODE}, {"name": OTHER_NODE}], "services": services}


def _dump(services: list[dict]) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(_document(services), Dumper=dumper, sort_keys=False)


def _service_yaml(port: ServicePort) -> dict:
    service = {
        "namespace": port.name.namespace, "name": port.name.name, "type": port.type,
        "ips": {"clusterips": {"v4": [str(ip) for ip in port.cluster_ips]}},
        "ports": [{"name": port.name.port, "protocol": PROTOCOL_NUMBERS[port.protocol.value],
                   "port": port.port, "targetport": port.target_port}],
    }
    endpoints = [{"podname": f"pod-{i}",
                  "endpoint": {"ips": {"v4": [str(ep.ip)]},
                               "portoverrides": [{"name": port.name.port, "port": ep.port}]},
                  "topology": {"node": OTHER_NODE}}
                 for i, ep in enumerate(port.endpoints)]
    return {"service": service, "endpoints": endpoints}


class StateFile:
    """The brain's state file: the scenario, then its one-endpoint edit and
    back, alternately, each saved atomically (a new file renamed over it)."""

    def __init__(self, path: Path, scenario: Scenario) -> None:
        self.path = path
        text = state_file_text(scenario)
        self._texts = (text, moved_state_file_text(scenario, text))
        self._moved = False
        self._save(self._texts[0])
        settled = time.time() - SETTLED_SECONDS
        os.utime(path, (settled, settled))

    def edit(self) -> None:
        self._moved = not self._moved
        self._save(self._texts[self._moved])

    def _save(self, text: str) -> None:
        new = self.path.with_name(self.path.name + ".new")
        new.write_text(text)
        os.replace(new, self.path)


def _is_sync(record: dict) -> bool:
    return record.get("msg") == SYNC_APPLIED


def _compiled(watched: Watched) -> tuple[bool | None, str]:
    """Whether the process compiled its programs, as its log says (the eBPF
    loader's `compiled` field: a build in the child, or pinned programs
    adopted); None when no record says."""
    for _, record in watched.records:
        if isinstance(record.get("compiled"), bool):
            return record["compiled"], "from the log"
    return None, "not in the log"


@dataclass(frozen=True)
class _Run:
    """Where one e2e run's figures go, and its problems."""

    results: Results
    contender: str
    n: int
    label: str

    def add(self, metric: str, value: float) -> None:
        self.results.add(metric, self.contender, self.n, value)

    def failed(self, what: str, done: Finished | None = None) -> None:
        message = f"{self.label}: {what}" + (f"; {done.describe()}" if done else "")
        self.results.problems.append(message)
        log.error(message)

    def add_stages(self, record: dict) -> None:
        for name, metric in STAGES.items():
            if isinstance(record.get(name), (int, float)):
                self.add(metric, record[name] / 1000)


def run_e2e(names: RunNames, workdir: Path, results: Results, contenders: list[Contender],
            scenario: Scenario, reps: int, timeout: float) -> None:
    """Our contenders' runs and the reference's (the others are ignored)."""
    n = scenario.services
    state = StateFile(workdir / f"state-{n}.yaml", scenario)
    scenario_file = workdir / f"scenario-{n}.json"
    scenario_file.write_text(scenario.to_json())
    with ExitStack() as cleanup:  # in reverse: the brain, the probe, its log, the namespace
        brain_box = Sandbox.of(names, f"e2e-brain-{n}").create()
        cleanup.callback(lambda: results.problems.extend(brain_box.remove()))
        brain_log = cleanup.enter_context(open(workdir / f"brain-{n}.log", "wb"))
        socket = workdir / f"brain-{n}.sock"
        probe = _start_probe(brain_box, socket, workdir, n, timeout)
        cleanup.callback(probe.kill)
        brain_started = time.monotonic()
        brain = subprocess.Popen(
            in_namespace(brain_box.netns, [KPNG_PY, "file", "-i", str(state.path), "to-api",
                                           "--listen", f"unix://{socket}"]),
            stdin=subprocess.DEVNULL, stdout=brain_log, stderr=brain_log,
            start_new_session=True)
        cleanup.callback(stop, brain)
        if not _brain_served(_Run(results, "brain", n, f"e2e brain N={n}"),
                             probe.finish(timeout), brain_started):
            return
        for contender in contenders:
            unfit = contender.unfit(scenario)
            if unfit:
                results.problems.append(f"e2e {contender.name} N={n}: not run: {unfit}")
                continue
            for rep in range(reps):
                if contender.ours:
                    _run_backend(names, workdir, results, contender, scenario, state, socket,
                                 rep, timeout)
                elif contender.name == E2E_REFERENCE:
                    _run_reference(names, workdir, results, contender, scenario, scenario_file,
                                   rep, timeout)


def _start_probe(box: Sandbox, socket: Path, workdir: Path, n: int, timeout: float) -> Watched:
    """The client that notes when the brain serves; started first, it waits
    for the socket."""
    return Watched(in_namespace(box.netns, [
        sys.executable, "-m", "bench.brain_probe", "--socket", str(socket), "--node-name", NODE,
        "--timeout", str(timeout)]), workdir, f"e2e-brain-probe-{n}")


def _brain_served(run: _Run, served: Finished, brain_started: float) -> bool:
    report = next((r for r in map(_json_line, served.stdout.splitlines()) if r), None)
    if served.returncode != 0 or report is None:
        run.failed("the brain did not serve", served)
        return False
    run.add("e2e_brain_first_message", report["first_message"] - brain_started)
    run.add("e2e_brain_serving", report["first_sync"] - brain_started)
    log.info("%s: first message after %.2f s, first Sync (%d ops) after %.2f s", run.label,
             report["first_message"] - brain_started, report["ops"],
             report["first_sync"] - brain_started)
    return True


def _json_line(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _local_argv(box: Sandbox, contender: Contender, scenario: Scenario, socket: Path,
                exit_after: int) -> list[str]:
    return in_namespace(box.netns, [
        KPNG_PY, "--log-format", "json", "local", "--api", f"unix://{socket}",
        "--node-name", NODE, "--exit-after", str(exit_after), "--healthz-bind-address", "",
        "--metrics-bind-address", "", contender.sink,
        *contender.sink_flags(scenario, box.places)])


def _run_backend(names: RunNames, workdir: Path, results: Results, contender: Contender,
                 scenario: Scenario, state: StateFile, socket: Path, rep: int,
                 timeout: float) -> None:
    """A cold start, then (if the dataplane survives it) a restart with an edit."""
    n = scenario.services
    label = f"e2e-{contender.name}-{n}-{rep}"
    run = _Run(results, contender.name, n, f"e2e {contender.name} N={n} rep {rep + 1}")
    box = Sandbox.of(names, label).create()
    try:
        started = _cold_start(run, _local_argv(box, contender, scenario, socket, 1), workdir,
                              label, timeout)
        if started and contender.lab is not None and contender.lab.survives_restart:
            _restart(run, _local_argv(box, contender, scenario, socket, 2), workdir,
                     f"{label}-restart", state, timeout)
    finally:
        results.problems += box.remove()


def _cold_start(run: _Run, argv: list[str], workdir: Path, label: str, timeout: float) -> bool:
    watched = Watched(argv, workdir, label)
    try:
        applied = watched.wait_for(_is_sync, timeout)
        done = watched.finish(timeout)
    finally:
        watched.kill()
    if applied is None or done.returncode != 0:
        if done.timed_out:
            run.results.censor("e2e_start_applied", run.contender, run.n, timeout,
                               f"run stopped after {timeout:.0f} s")
        run.failed("no first sync", done)
        return False
    seen, record = applied
    run.add("e2e_start_applied", seen - watched.started)
    run.add("e2e_sync", record["duration_ms"] / 1000)
    run.add("e2e_wall", done.seconds)
    run.add("e2e_peak_rss", done.peak_rss_mib)
    own = record.get("peak_rss_mib")
    if isinstance(own, (int, float)):
        run.add("e2e_process_peak_rss", own)
    run.add_stages(record)
    log.info("%s: start to applied %.3f s (sync %.3f s: %s), exit %.1f s, peak RSS %.0f MiB "
             "(the process itself, at the sync: %s MiB)",
             run.label, seen - watched.started, record["duration_ms"] / 1000,
             ", ".join(f"{k} {record[k]:.0f}" for k in STAGES if k in record), done.seconds,
             done.peak_rss_mib, own)
    return True


def _restart(run: _Run, argv: list[str], workdir: Path, label: str, state: StateFile,
             timeout: float) -> None:
    watched = Watched(argv, workdir, label)
    try:
        adopted = watched.wait_for(_is_sync, timeout)
        if adopted is None:
            run.failed("the restart applied no first sync", watched.finish(timeout))
            return
        compiled, known = _compiled(watched)
        state.edit()
        edited = time.monotonic()
        changed = watched.wait_for(_is_sync, timeout, skip=1)
        done = watched.finish(timeout)
    finally:
        watched.kill()
    run.add("e2e_restart", adopted[0] - watched.started)
    if compiled is not None:
        run.add("e2e_restart_compiled", float(compiled))
        run.results.figure("e2e_restart_compiled", run.contender, run.n).note = known
    if changed is None or not changed[1].get("endpoint_changes"):
        run.failed("the edit of the state file was not applied", done)
        return
    run.add("e2e_edit", changed[0] - edited)
    run.add("e2e_restart_peak_rss", done.peak_rss_mib)
    log.info("%s: restart to adopted %.3f s (compiled: %s, %s); edit to applied %.3f s",
             run.label, adopted[0] - watched.started, compiled, known, changed[0] - edited)


def _run_reference(names: RunNames, workdir: Path, results: Results, contender: Contender,
                   scenario: Scenario, scenario_file: Path, rep: int, timeout: float) -> None:
    """kube-proxy's load of the same state: the figure ours is set against."""
    n = scenario.services
    label = f"e2e-{contender.name}-{n}-{rep}"
    run = _Run(results, contender.name, n, f"e2e {contender.name} N={n} rep {rep + 1}")
    box = Sandbox.of(names, label).create()
    try:
        done = run_measured(in_namespace(box.netns, contender.worker(
            scenario, scenario_file, box.places)), timeout, workdir, label)
    finally:
        results.problems += box.remove()
    report = read_reports(done.stdout)
    if "full_sync_s" not in report:
        if done.timed_out:
            results.censor("e2e_start_applied", contender.name, n, timeout,
                           f"run stopped after {timeout:.0f} s")
        run.failed("no full sync", done)
        return
    run.add("e2e_start_applied", report["full_sync_s"])
    log.info("%s: restore of the whole state %.3f s", run.label, report["full_sync_s"])
