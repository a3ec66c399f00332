"""`kpng-py ebpf trace` against the programs in the kernel and a real
client in the lab's cgroup: no event while nobody traces; while a trace is
attached one per translation (connect and sendmsg, v4 and v6), naming the
service port, the client's pid, command and cgroup and the verdict
(translated, affinity, refused); one trace at a time; the CLI's filters."""

from __future__ import annotations

import errno
import json
import subprocess
import time

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import default_cgroup, open_pinned_map
from backends.ebpf.maps import layout as maps
from backends.ebpf.tools.trace import TraceSession, Translation
from lab.procs import kpng_py_command, wait_until
from lab.socket_lab import Agent, Lab, backend_ip
from tests.support.ebpf_datapath import added, held, service_port

pytestmark = pytest.mark.kernel

WEB = service_port("traced", ["10.96.11.1", "fd00:96::11:1"], 80, endpoints=[1], port_name="http")
DNS = service_port("traced", ["10.96.11.1"], 53, endpoints=[2], protocol="UDP",
                   target_port=5353, port_name="dns")
STICKY = service_port("sticky", ["10.96.11.2"], 80, endpoints=[1, 2, 3], affinity=60)
EMPTY = service_port("empty", ["10.96.11.3"], 80)


def collect(session: TraceSession, count: int, seconds: float = 5.0) -> list[Translation]:
    seen: list[Translation] = []
    deadline = time.monotonic() + seconds
    for translation in session.translations(
            lambda: len(seen) < count and time.monotonic() < deadline):
        seen.append(translation)
    return seen


@pytest.fixture(scope="module")
def traced(backend: EbpfBackend) -> EbpfBackend:
    backend.apply(added(WEB, DNS, STICKY, EMPTY))
    return backend


def test_nothing_is_emitted_while_nobody_traces(traced: EbpfBackend, agent: Agent,
                                                the_lab: Lab) -> None:
    assert agent.call("tcp", host="10.96.11.1", port=80, family=4)["ok"]
    with TraceSession(the_lab.bpffs_dir) as session:
        assert collect(session, 1, seconds=0.5) == []


def test_each_translation_is_one_event_naming_what_it_did(traced: EbpfBackend, agent: Agent,
                                                         the_lab: Lab) -> None:
    with TraceSession(the_lab.bpffs_dir) as session:
        assert agent.call("tcp", host="10.96.11.1", port=80, family=4)["ok"]
        assert agent.call("tcp", host="fd00:96::11:1", port=80, family=6)["ok"]
        sock = agent.call("udp_open", family=4)["sock"]
        assert agent.call("udp_sendto", sock=sock, host="10.96.11.1", port=53)["ok"]
        agent.call("udp_close", sock=sock)
        for _ in range(2):
            assert agent.call("tcp", host="10.96.11.2", port=80, family=4)["ok"]
        assert agent.call("tcp", host="10.96.11.3", port=80, family=4)["errno"] == (
            errno.ECONNREFUSED)
        seen = collect(session, 6)
    cgroup = "/" + str(the_lab.group.path.relative_to(default_cgroup()))
    assert {(t.pid, t.cgroup) for t in seen} == {(agent.pid, cgroup)}
    assert all(t.comm.startswith("python") for t in seen)
    assert [(t.hook, t.protocol, str(t.vip), str(t.endpoint), t.service_port, t.verdict)
            for t in seen[:3]] == [
        ("connect4", "TCP", "10.96.11.1:80", f"{backend_ip(1)}:8080", "default/traced:http",
         "translated"),
        ("connect6", "TCP", "[fd00:96::11:1]:80", f"[{backend_ip(1, 6)}]:8080",
         "default/traced:http", "translated"),
        ("sendmsg4", "UDP", "10.96.11.1:53", f"{backend_ip(2)}:5353", "default/traced:dns",
         "translated")]
    first, second = seen[3:5]
    assert (first.verdict, second.verdict) == ("translated", "affinity")
    assert second.endpoint == first.endpoint and second.service_port == "default/sticky"
    refused = seen[5]
    assert (refused.verdict, refused.endpoint, refused.service_port) == (
        "refused", None, "default/empty")
    assert refused.line().startswith(time.strftime("%H:"))
    assert "10.96.11.3:80 -> (no endpoints) default/empty refused" in refused.line()


def test_events_the_ring_buffer_has_no_room_for_are_counted(traced: EbpfBackend, agent: Agent,
                                                             the_lab: Lab) -> None:
    """A trace that does not read: once the ring buffer is full (1 MiB, about
    11 000 events), each translation is counted as lost, the connects go on;
    what was traced and what was lost add up to what the client did."""
    with TraceSession(the_lab.bpffs_dir) as session:
        assert agent.call("loop_start", targets=[
            {"proto": "tcp", "host": "10.96.11.3", "port": 80, "family": 4}])["ok"]
        try:
            wait_until("a lost event", lambda: session.lost() > 0, 60)
        finally:
            stats = agent.call("loop_stop")
        traced_count = sum(1 for _ in session.translations(lambda: False))
        lost = session.lost()
    assert stats["errors"] == {"tcp 111": stats["connects"]}  # all refused: no endpoints
    assert lost > 0 and traced_count + lost == stats["connects"], (traced_count, lost, stats)


def test_one_trace_at_a_time_and_the_flag_is_cleared_after(traced: EbpfBackend,
                                                           the_lab: Lab) -> None:
    config = open_pinned_map(the_lab.bpffs_dir, maps.TRACE_CONFIG)
    try:
        with TraceSession(the_lab.bpffs_dir):
            second = subprocess.run(
                kpng_py_command("ebpf", "trace", "--bpffs-dir", str(the_lab.bpffs_dir)),
                capture_output=True, text=True, timeout=30)
            assert second.returncode != 0 and "another trace" in second.stderr, second.stderr
            assert held(config, 0).tracer_pid > 0
        assert held(config, 0).tracer_pid == 0
    finally:
        config.close()


def test_the_cli_prints_json_lines_for_the_service_asked(traced: EbpfBackend, agent: Agent,
                                                        the_lab: Lab) -> None:
    trace = subprocess.Popen(
        kpng_py_command("ebpf", "trace", "--bpffs-dir", str(the_lab.bpffs_dir), "--json",
                     "--service", "default/traced", "--count", "2"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert trace.stderr is not None
    try:
        assert "tracing" in trace.stderr.readline()
        assert agent.call("tcp", host="10.96.11.2", port=80, family=4)["ok"]  # not asked for
        assert agent.call("tcp", host="10.96.11.1", port=80, family=4)["ok"]
        sock = agent.call("udp_open", family=4)["sock"]
        assert agent.call("udp_sendto", sock=sock, host="10.96.11.1", port=53)["ok"]
        agent.call("udp_close", sock=sock)
        out, _ = trace.communicate(timeout=10)
    finally:
        trace.kill()
        trace.wait()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(line["servicePort"], line["hook"], line["pid"]) for line in lines] == [
        ("default/traced:http", "connect4", agent.pid), ("default/traced:dns", "sendmsg4",
                                                          agent.pid)]
    assert trace.returncode == 0
