"""Datapath figures: real clients in a client pod dial real servers in a web
pod, directly or through a ClusterIP, with one contender programming N
service ports on the node.

Each (N, contender) gets a cluster of its own from the lab's builder
(a node namespace with a bridge and no uplink, two pods), torn down after, so
no contender sees another's leftovers. Pod-to-pod traffic is routed through
the node (a /32 route each way, as routed CNIs do), so that every contender,
and the direct baseline, takes the same path and only the translation
differs: iptables and nftables DNAT in the node, the eBPF backend at the
client's connect(), the userspace backend proxies on the node.
"""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bench.contenders import Contender
from bench.env import dataplane_cleanup
from bench.loadgen import (
    NO_CONTENT_PATH,
    Endpoints,
    LoadError,
    connect_latency_ms,
    connection_rate,
    tcp_throughput_gbps,
    udp_query_rate,
)
from bench.results import DIRECT, Results
from bench.scenario import Probe, Scenario
from bench.worker import read_reports
from kpng_py.model import Protocol
from lab import teardown
from lab.cluster import ADDRESSING, Cluster, Family, Pod
from lab.names import RunNames
from lab.procs import CommandError, in_namespace, run, sysctl, wait_until
from lab.servers import nginx_conf

log = logging.getLogger("bench")

SERVER_POD, CLIENT_POD = "web", "client"
FIRST_HTTP_PORT = 8080
IPERF_PORT = 5201
DNS_PORT = 53
DNS_NAME = "bench.test"
# ClusterIP ports of the probes (what a client dials through the service).
PROBE_PORTS = {"dns": DNS_PORT, "iperf": IPERF_PORT, "http": 80}
# Metrics the targets compare with direct: measured in pairs (see _measure).
PAIRED = ("dp_conn_rate", "dp_tcp_throughput")


@dataclass(frozen=True)
class DatapathPlan:
    ns: tuple[int, ...]
    endpoints: int
    reps: int
    seconds: int       # per wrk, iperf3 and dnsperf sample
    connections: int   # wrk's concurrent connections
    connects: int      # connections timed by curl per latency sample
    load_timeout: float
    # Largest N per contender (where loading the state is the bottleneck).
    max_n: dict[str, int] = field(default_factory=dict)


def probes(web: Pod, endpoints: int) -> tuple[Probe, ...]:
    """The services the clients dial; http comes last, so that its rule is
    the last one kube-proxy's iptables chain walks past."""
    ip = str(web.ip(Family.IPV4))
    return (Probe("dns", Protocol.UDP, DNS_PORT, ((ip, DNS_PORT),)),
            Probe("iperf", Protocol.TCP, IPERF_PORT, ((ip, IPERF_PORT),)),
            Probe("http", Protocol.TCP, PROBE_PORTS["http"],
                  tuple((ip, FIRST_HTTP_PORT + j) for j in range(endpoints))))


def run_datapath(names: RunNames, workdir: Path, results: Results,
                 contenders: list[Contender], plan: DatapathPlan) -> None:
    for n in plan.ns:
        for contender in [None, *contenders]:
            name = contender.name if contender else DIRECT
            if n > plan.max_n.get(name, n):
                log.info("dp %s N=%d: skipped (--dp-max-n %s=%d)", name, n, name,
                         plan.max_n[name])
                continue
            try:
                _measure(names, workdir, results, contender, n, plan)
            finally:
                results.problems += teardown.remove_run(
                    names, lambda run_names: dataplane_cleanup(run_names.places))


def _measure(names: RunNames, workdir: Path, results: Results, contender: Contender | None,
             n: int, plan: DatapathPlan) -> None:
    name = contender.name if contender else DIRECT
    cluster = Cluster(names, (Family.IPV4,), names.make_workdir())
    worker = None
    try:
        web, client = _build(cluster, plan.endpoints)
        scenario = Scenario(n, plan.endpoints, probes(web, plan.endpoints))
        unfit = contender.unfit(scenario) if contender else None
        if unfit:
            raise LoadError(unfit)
        if contender is None:
            target = _direct(web)
        else:
            worker = _load(cluster, contender, scenario, workdir, plan.load_timeout)
            target = _through_services(scenario)
        _check_reachable(client, target)
    except (LoadError, CommandError, RuntimeError, TimeoutError) as err:
        message = f"dp {name} N={n}: not measured: {err}"
        results.problems.append(message)
        log.error(message)
        _stop(worker)
        return
    query_file = cluster.workdir / "queries.txt"
    query_file.write_text(f"{DNS_NAME} TXT\n")
    tools: dict[str, Callable[[Endpoints], float]] = {
        "dp_conn_rate": lambda t: connection_rate(client, t, plan.seconds, plan.connections),
        "dp_connect_latency": lambda t: connect_latency_ms(client, t, plan.connects),
        "dp_tcp_throughput": lambda t: tcp_throughput_gbps(client, t, plan.seconds),
        "dp_udp_rate": lambda t: udp_query_rate(client, t, plan.seconds, str(query_file)),
    }
    try:
        for rep in range(plan.reps):
            line = []
            for metric, tool in tools.items():
                try:
                    # The targets' figures are also taken straight to the pod just
                    # before, in the same cluster: their ratio does not drift
                    # with what else the machine runs.
                    paired = (tool(_direct(web)) if contender and metric in PAIRED
                              else None)
                    value = tool(target)
                except LoadError as err:
                    message = f"dp {name} N={n} rep {rep + 1} {metric}: {err}"
                    results.problems.append(message)
                    log.error(message)
                    continue
                results.add(metric, name, n, value)
                line.append(f"{metric[3:]} {value:.4g}")
                if paired:
                    results.add(f"{metric}_ratio", name, n, value / paired)
                    line.append(f"({value / paired:.3f}x direct)")
            if contender and contender.lab and contender.lab.trace:
                line.append(_traced_rate(cluster, contender.lab.trace(cluster.names.places),
                                         results, name, n, tools["dp_conn_rate"], target))
            log.info("dp %s N=%d rep %d: %s", name, n, rep + 1, ", ".join(line))
    finally:
        _stop(worker)


def _traced_rate(cluster: Cluster, trace: list[str], results: Results, name: str, n: int,
                 rate: Callable[[Endpoints], float], target: Endpoints) -> str:
    """The connection rate with the contender's trace attached (its output
    to a file on the node), and over the rate without one, back to back."""
    idle = rate(target)
    tracer = cluster.spawn_on_node("trace", trace)
    try:
        wait_until("the trace attached", lambda: "tracing" in tracer.log.read_text(), 30.0)
        traced = rate(target)
    finally:
        tracer.stop()
    results.add("dp_conn_rate_traced", name, n, traced)
    results.add("dp_conn_rate_traced_ratio", name, n, traced / idle)
    return f"conn_rate traced {traced:.4g} ({traced / idle:.3f}x idle)"


# -- the cluster -------------------------------------------------------------

def _build(cluster: Cluster, endpoints: int) -> tuple[Pod, Pod]:
    cluster.build([SERVER_POD, CLIENT_POD])
    web, client = cluster.pods[SERVER_POD], cluster.pods[CLIENT_POD]
    gateway = ADDRESSING[Family.IPV4].gateway
    for pod, peer in ((client, web), (web, client)):
        run(["ip", "-n", pod.netns, "route", "add", f"{peer.ip(Family.IPV4)}/32",
             "via", str(gateway)])
        sysctl(pod.netns, "net.ipv4.conf.all.accept_redirects=0",
               "net.ipv4.conf.eth0.accept_redirects=0")
    # Forwarding back out of the bridge it came in on must not make the node
    # send redirects (pods would then bypass it).
    node = cluster.node_netns
    sysctl(node, "net.ipv4.conf.all.send_redirects=0",
           f"net.ipv4.conf.{cluster.names.bridge}.send_redirects=0")
    # Tens of thousands of connections per run: wide port range on the client,
    # deep accept queue on the server.
    sysctl(client.netns, "net.ipv4.ip_local_port_range=1024 65535", "net.ipv4.tcp_tw_reuse=1")
    sysctl(web.netns, "net.core.somaxconn=8192")
    _start_servers(cluster, web, endpoints)
    return web, client


def _nginx_conf(prefix: Path, endpoints: int) -> str:
    listens = "".join(f"        listen {FIRST_HTTP_PORT + j} backlog=8192;\n"
                      for j in range(endpoints))
    server = (f"    server {{\n{listens}"
              "        location / { return 200 \"ok\\n\"; }\n"
              f"        location = {NO_CONTENT_PATH} {{ return 204; }}\n    }}\n")
    return nginx_conf(prefix, server, worker_connections=8192)


def _start_servers(cluster: Cluster, web: Pod, endpoints: int) -> None:
    prefix = cluster.workdir / web.name
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(_nginx_conf(prefix, endpoints))
    servers = [
        cluster.spawn_in_pod(web, "nginx", ["nginx", "-p", str(prefix), "-c",
                                            str(prefix / "nginx.conf"), "-e", "stderr"]),
        cluster.spawn_in_pod(web, "dnsmasq", [
            "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
            "--no-hosts", "--pid-file=", "--log-facility=-", "--user=root",
            f"--port={DNS_PORT}", f"--txt-record={DNS_NAME},ok"]),
        cluster.spawn_in_pod(web, "iperf3", ["iperf3", "-s", "-p", str(IPERF_PORT)]),
    ]
    wanted = {("tcp", FIRST_HTTP_PORT + j) for j in range(endpoints)}
    wanted |= {("tcp", IPERF_PORT), ("udp", DNS_PORT)}

    def listening() -> bool:
        dead = [p for p in servers if not p.running()]
        if dead:
            raise RuntimeError(dead[0].describe_exit())
        out = run(["ip", "netns", "exec", web.netns, "ss", "-Hlntu"]).stdout
        open_ = {(cols[0], int(cols[4].rsplit(":", 1)[1]))
                 for cols in (line.split() for line in out.splitlines())}
        return wanted <= open_

    wait_until(f"servers in pod {web.name} listening", listening, 20.0)


def _direct(web: Pod) -> Endpoints:
    ip = str(web.ip(Family.IPV4))
    return Endpoints((ip, FIRST_HTTP_PORT), (ip, IPERF_PORT), (ip, DNS_PORT))


def _through_services(scenario: Scenario) -> Endpoints:
    def vip(name: str) -> tuple[str, int]:
        return str(scenario.probe_ip(name)), PROBE_PORTS[name]

    return Endpoints(vip("http"), vip("iperf"), vip("dns"))


def _check_reachable(client: Pod, target: Endpoints) -> None:
    done = run(client.command(["curl", "-sS", "-m", "5", target.url()]), check=False,
               timeout=30)
    if done.stdout.strip() != "ok":
        raise LoadError(f"{target.url()} does not answer from pod {client.name}: "
                        f"{(done.stderr or done.stdout).strip()}")


# -- the contender's worker ----------------------------------------------------

@dataclass
class _Worker:
    popen: subprocess.Popen
    out: Path


def _load(cluster: Cluster, contender: Contender, scenario: Scenario, workdir: Path,
          timeout: float) -> _Worker:
    n = scenario.services
    scenario_file = workdir / f"dp-scenario-{n}.json"
    scenario_file.write_text(scenario.to_json())
    names = cluster.names
    out = workdir / f"dp-{contender.name}-{n}.out"
    argv = in_namespace(cluster.node_netns, contender.worker(
        scenario, scenario_file, names.places, hold=True))
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr,
                                 start_new_session=True)
    worker = _Worker(popen, out)

    def ready() -> bool:
        if popen.poll() is not None:
            raise RuntimeError(f"the {contender.name} worker exited {popen.returncode}: "
                               f"{out.with_suffix('.err').read_text(errors='replace')[-1500:]}")
        return bool(read_reports(out.read_text(errors="replace")).get("ready"))

    began = time.monotonic()
    try:
        wait_until(f"{contender.name} programming {n} service ports", ready, timeout, 0.2)
    except BaseException:
        _stop(worker)
        raise
    log.info("dp %s N=%d: state programmed in %.1f s", contender.name, n,
             time.monotonic() - began)
    return worker


def _stop(worker: _Worker | None) -> None:
    """Close the worker's standard input (it then releases its dataplane and
    exits); kill it if it does not within a minute."""
    if worker is None:
        return
    if worker.popen.stdin is not None:
        worker.popen.stdin.close()
    try:
        worker.popen.wait(60)
    except subprocess.TimeoutExpired:
        worker.popen.kill()
        worker.popen.wait()

