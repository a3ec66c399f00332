#!/usr/bin/env python3
"""TCP throughput through the userspace proxy, as a ratio to a direct connection.

Builds the test topology (client, node and server network namespaces, see
lab/proxy_node.py), runs iperf3 in the server namespace and measures
from the client: directly to the server (routed by the node's kernel) and
through a ClusterIP served by the userspace backend on the node, once per
splice pipe size. Each figure is the median of --runs runs. Not a test: the
numbers depend on the machine. Needs root and iperf3.

    .venv/bin/python bench/userspace_throughput.py [--seconds 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys

from kpng_py.model import Protocol, ServicePortChanges
from lab.proxy_node import SERVER_V4, NodeBackend, cluster, service_port

IPERF_PORT = 5201
VIP = "10.96.0.40"
PIPE_SIZES = ("64K", "1M")
# Each figure's direction, and whether iperf3 runs it reversed (-R).
DIRECTIONS = (("client->server", False), ("server->client", True))


def _iperf(the_cluster, host: str, seconds: float, reverse: bool) -> float:
    """Gbit/s received in one iperf3 run from the client namespace."""
    args = ["iperf3", "-c", host, "-p", str(IPERF_PORT), "-t", str(seconds), "-J"]
    out = the_cluster.client.run(*args, *(["-R"] if reverse else []), timeout=seconds + 30)
    return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9


def _measure(results: dict[str, dict[str, float]], path: str, the_cluster, host: str,
             args: argparse.Namespace) -> None:
    """The median of --runs runs to `host`, in each direction, as `path`."""
    for direction, reverse in DIRECTIONS:
        results.setdefault(direction, {})[path] = statistics.median(
            _iperf(the_cluster, host, args.seconds, reverse) for _ in range(args.runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one iperf3 run")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the namespaces and
    # processes are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    results: dict[str, dict[str, float]] = {}
    with cluster() as the_cluster:
        node, client, server = the_cluster.node, the_cluster.client, the_cluster.server
        # The direct path: the node routes between client and server.
        node.run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        client.ip("route", "add", "10.244.1.0/24", "via", "10.244.0.1")
        server.ip("route", "add", "10.244.0.0/24", "via", "10.244.1.1")
        iperf = subprocess.Popen(server.exec_args("iperf3", "-s", "--forceflush", "-B",
                                                  SERVER_V4[0], "-p", str(IPERF_PORT)),
                                 stdout=subprocess.PIPE, text=True)
        assert iperf.stdout is not None  # piped
        try:
            while "Server listening" not in (line := iperf.stdout.readline()):
                if not line:
                    sys.exit("iperf3 -s exited before listening")
            _measure(results, "direct", the_cluster, SERVER_V4[0], args)
            service = service_port("iperf", Protocol.TCP, (VIP,), IPERF_PORT,
                                   ((SERVER_V4[0], IPERF_PORT),))
            for pipe_size in PIPE_SIZES:
                backend = NodeBackend(the_cluster, "--tcp-pipe-size", pipe_size)
                try:
                    backend.apply(ServicePortChanges(added=(service,), full=True))
                    _measure(results, f"proxy pipe {pipe_size}", the_cluster, VIP, args)
                finally:
                    backend.close()
        finally:
            iperf.kill()
            iperf.wait()
    print(f"{'direction':16} {'path':16} {'Gbit/s':>8} {'ratio':>6}")
    for direction, figures in results.items():
        for path, gbps in figures.items():
            print(f"{direction:16} {path:16} {gbps:8.2f} {gbps / figures['direct']:6.2f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
