"""The full sync end to end: the scenario as a KPNG state file, served by the
built-in brain (`kpng-py file ... to-api`), and `kpng-py local ... to-<backend>
--exit-after 1` as its own process, as in the split sidecar layout.

The sync time is what the backend process logs for its first change set
(`sync applied`, duration_ms: from the Sync received to the dataplane
programmed, the state model's decoding included); the wall time runs from
the process's start to its exit after that change set; the peak RSS is the
kernel's account of the whole process.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import yaml

from bench.contenders import Contender
from bench.env import KPNG_PY, Sandbox, run_measured
from bench.results import Results
from bench.scenario import Scenario
from lab.names import RunNames
from lab.procs import in_namespace, wait_until
from kpng_py.model import ServicePort

log = logging.getLogger("bench")

NODE = "node-a"
OTHER_NODE = "node-b"  # the endpoints' node: none is Local
PROTOCOL_NUMBERS = {"TCP": 1, "UDP": 2}


def state_file_text(scenario: Scenario) -> str:
    """The scenario in KPNG's state-file format (docs/brain.md)."""
    services = [_service_yaml(port) for port in scenario.service_ports()]
    body = {"nodes": [{"name": NODE}, {"name": OTHER_NODE}], "services": services}
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(body, Dumper=dumper, sort_keys=False)


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


def _sync_seconds(stderr: str) -> float | None:
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("msg") == "sync applied":
            return float(record["duration_ms"]) / 1000
    return None


def run_e2e(names: RunNames, workdir: Path, results: Results, contenders: list[Contender],
            scenario: Scenario, reps: int, timeout: float) -> None:
    n = scenario.services
    state = workdir / f"state-{n}.yaml"
    state.write_text(state_file_text(scenario))
    brain_box = Sandbox.of(names, f"e2e-brain-{n}").create()
    socket = workdir / f"brain-{n}.sock"
    brain_log = open(workdir / f"brain-{n}.log", "wb")
    brain = subprocess.Popen(
        in_namespace(brain_box.netns, [KPNG_PY, "file", "-i", str(state), "to-api",
                                   "--listen", f"unix://{socket}"]),
        stdin=subprocess.DEVNULL, stdout=brain_log, stderr=brain_log, start_new_session=True)
    try:
        def listening() -> bool:
            if brain.poll() is not None:
                raise RuntimeError(f"the brain exited {brain.returncode}; see {brain_log.name}")
            return socket.is_socket()

        wait_until(f"brain serving {state.name}", listening, timeout)
        for contender in contenders:
            unfit = contender.unfit(scenario)
            if unfit:
                results.problems.append(f"e2e {contender.name} N={n}: not run: {unfit}")
                continue
            for rep in range(reps):
                _run_backend(names, workdir, results, contender, scenario, socket, rep, timeout)
    finally:
        brain.terminate()
        try:
            brain.wait(10)
        except subprocess.TimeoutExpired:
            brain.kill()
            brain.wait()
        brain_log.close()
        brain_box.remove()


def _run_backend(names: RunNames, workdir: Path, results: Results, contender: Contender,
                 scenario: Scenario, socket: Path, rep: int, timeout: float) -> None:
    n = scenario.services
    box = Sandbox.of(names, f"e2e-{contender.name}-{n}-{rep}").create()
    try:
        sink_flags = contender.sink_flags(scenario, box.places)
        argv = in_namespace(box.netns, [
            KPNG_PY, "--log-format", "json", "local", "--api", f"unix://{socket}",
            "--node-name", NODE, "--exit-after", "1", "--healthz-bind-address", "",
            "--metrics-bind-address", "", contender.sink, *sink_flags])
        done = run_measured(argv, timeout, workdir, f"e2e-{contender.name}-{n}-{rep}")
    finally:
        problems = box.remove()
    results.problems += problems
    seconds = _sync_seconds(done.stderr)
    if done.returncode != 0 or seconds is None:
        message = f"e2e {contender.name} N={n} rep {rep + 1}: {done.describe()}"
        results.problems.append(message)
        log.error(message)
        return
    results.add("e2e_sync", contender.name, n, seconds)
    results.add("e2e_wall", contender.name, n, done.seconds)
    results.add("e2e_peak_rss", contender.name, n, done.peak_rss_mib)
    log.info("e2e %s N=%d rep %d: sync %.3f s, wall %.1f s, peak RSS %.0f MiB",
             contender.name, n, rep + 1, seconds, done.seconds, done.peak_rss_mib)
