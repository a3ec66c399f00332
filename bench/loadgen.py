"""The load generators, real tools run in the client pod, and what they report.

- `wrk -H "Connection: close"`: every request is a new TCP connection, so
  requests per second are new connections per second.
- `curl -w %{time_connect}` over a URL range with `Connection: close`: one
  TCP connect per URL, timed by curl (the SYN is where iptables walks its
  rules, so connect latency shows what wrk's request latency would not).
- `iperf3 -J`: one long-lived TCP stream.
- `dnsperf`: DNS queries over UDP from one socket.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from typing import Sequence

from lab.cluster import Pod
from lab.procs import run

NO_CONTENT_PATH = "/connect"  # nginx answers 204: curl prints only its timings


class LoadError(Exception):
    """A tool failed or saw errors; the sample is not valid."""


@dataclass(frozen=True)
class Endpoints:
    """Where the client sends each kind of traffic (a ClusterIP or the pod)."""

    http: tuple[str, int]
    tcp_stream: tuple[str, int]
    dns: tuple[str, int]

    def url(self, path: str = "/") -> str:
        host, port = self.http
        return f"http://{host}:{port}{path}"


def _in_pod(pod: Pod, argv: Sequence[str], timeout: float) -> str:
    done = run(pod.command(argv), timeout=timeout, check=False)
    if done.returncode != 0:
        raise LoadError(f"`{' '.join(argv)}` exited {done.returncode}: "
                        f"{(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def _number(pattern: str, text: str, tool: str) -> float:
    match = re.search(pattern, text)
    if match is None:
        raise LoadError(f"{tool}: no {pattern!r} in its output:\n{text[-800:]}")
    return float(match.group(1))


def connection_rate(pod: Pod, target: Endpoints, seconds: int, connections: int) -> float:
    out = _in_pod(pod, ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s",
                        "-H", "Connection: close", target.url()], timeout=seconds + 60)
    requests = _number(r"(\d+) requests in", out, "wrk")
    errors = sum(int(n) for n in re.findall(r"(?:connect|timeout) (\d+)", out))
    if "Non-2xx" in out:
        errors += int(_number(r"Non-2xx or 3xx responses: (\d+)", out, "wrk"))
    if requests == 0 or errors > requests / 100:
        raise LoadError(f"wrk: {errors:.0f} errors in {requests:.0f} requests:\n{out[-800:]}")
    return _number(r"Requests/sec:\s+([\d.]+)", out, "wrk")


def connect_latency_ms(pod: Pod, target: Endpoints, count: int) -> float:
    out = _in_pod(pod, ["curl", "-sS", "-o", "/dev/null", "-H", "Connection: close",
                        "-w", "%{http_code} %{time_connect}\n",
                        f"{target.url(NO_CONTENT_PATH)}?[1-{count}]"], timeout=count + 60)
    samples = [line.split() for line in out.splitlines() if line.strip()]
    failed = [s for s in samples if s[0] != "204"]
    if len(samples) != count or failed:
        raise LoadError(f"curl: {len(failed)} failed of {len(samples)}/{count} connections")
    return statistics.median(float(s[1]) for s in samples) * 1000


def tcp_throughput_gbps(pod: Pod, target: Endpoints, seconds: int) -> float:
    host, port = target.tcp_stream
    out = _in_pod(pod, ["iperf3", "-c", host, "-p", str(port), "-t", str(seconds), "-J"],
                  timeout=seconds + 60)
    try:
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9
    except (ValueError, KeyError) as err:
        raise LoadError(f"iperf3: unexpected output ({err}):\n{out[-800:]}") from err


def udp_query_rate(pod: Pod, target: Endpoints, seconds: int, query_file: str) -> float:
    host, port = target.dns
    out = _in_pod(pod, ["dnsperf", "-s", host, "-p", str(port), "-d", query_file,
                        "-l", str(seconds)], timeout=seconds + 60)
    completed = _number(r"Queries completed:\s+(\d+)", out, "dnsperf")
    lost = _number(r"Queries lost:\s+(\d+)", out, "dnsperf")
    if completed == 0 or lost > completed / 100:
        raise LoadError(f"dnsperf: {lost:.0f} lost, {completed:.0f} completed:\n{out[-800:]}")
    return _number(r"Queries per second:\s+([\d.]+)", out, "dnsperf")
