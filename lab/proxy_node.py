"""A node, a client and a server in network namespaces, for testing a proxy
that runs on the node (the userspace backend's tests and throughput bench).

    client (10.244.0.2, fd00:10:244::2) --veth-- node --veth-- server
    routes 10.96.0.0/16 and fd00:10:96::/112     (10.244.1.10-12 and
    to the node                                   fd00:10:244:1::10-12,
                                                  peer_server on ENDPOINT_PORT)

The node runs the userspace backend (`lab.node_driver`), fed ServicePortChanges built
from model objects; `lab.agent` is the client. No namespace has a route
anywhere else.
"""

from __future__ import annotations

import ipaddress
import json
import pickle
import struct
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from kpng_py.model import (
    Endpoint,
    Endpoints,
    Protocol,
    ServicePort,
    ServicePortChanges,
    ServicePortName,
)
from lab.netns import NetNS, netns
from lab.procs import start_ready

REPO = Path(__file__).resolve().parents[1]
ENDPOINT_PORT = 8080
# Nothing listens there: connections to it are refused.
CLOSED_PORT = 9999
SERVER_V4 = ("10.244.1.10", "10.244.1.11", "10.244.1.12")
SERVER_V6 = ("fd00:10:244:1::10", "fd00:10:244:1::11", "fd00:10:244:1::12")


def _start(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=REPO, text=True, stdout=subprocess.PIPE, **kwargs)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@dataclass
class ClientNodeServer:
    node: NetNS
    client: NetNS
    server: NetNS

    def python(self, ns: NetNS, module: str, *args: str) -> list[str]:
        return ns.exec_args(sys.executable, "-m", module, *args)


def _link(node: NetNS, peer: NetNS, node_side: str, node_ips: tuple[str, str],
          peer_ips: tuple[str, ...]) -> None:
    node.ip("link", "add", node_side, "type", "veth", "peer", "name", "eth0", "netns", peer.name)
    for ip in node_ips:
        node.ip("addr", "add", ip, "dev", node_side, *(["nodad"] if ":" in ip else []))
    for ip in peer_ips:
        peer.ip("addr", "add", ip, "dev", "eth0", *(["nodad"] if ":" in ip else []))
    node.ip("link", "set", node_side, "up")
    peer.ip("link", "set", "eth0", "up")


@contextmanager
def cluster() -> Iterator[ClientNodeServer]:
    with ExitStack() as stack:
        node = stack.enter_context(netns("kpn"))
        client = stack.enter_context(netns("kpc"))
        server = stack.enter_context(netns("kps"))
        _link(node, client, "c0", ("10.244.0.1/24", "fd00:10:244::1/64"),
              ("10.244.0.2/24", "fd00:10:244::2/64"))
        client.ip("route", "add", "10.96.0.0/16", "via", "10.244.0.1")
        client.ip("-6", "route", "add", "fd00:10:96::/112", "via", "fd00:10:244::1")
        _link(node, server, "s0", ("10.244.1.1/24", "fd00:10:244:1::1/64"),
              tuple(f"{ip}/24" for ip in SERVER_V4) + tuple(f"{ip}/64" for ip in SERVER_V6))
        the_cluster = ClientNodeServer(node, client, server)
        specs = [f"{proto}:[{ip}]:{ENDPOINT_PORT}" for ip in (*SERVER_V4, *SERVER_V6)
                 for proto in ("tcp", "udp")]
        echo = start_ready(the_cluster.python(server, "lab.peer_server", *specs), "peer_server",
                           cwd=REPO)
        stack.callback(_stop, echo)
        yield the_cluster


class SetupRefused(Exception):
    """The backend refused to set up; the message is its error."""


class NodeBackend:
    """The backend process (`node_driver`) in the node namespace, or in any
    namespace of the test's."""

    def __init__(self, where: ClientNodeServer | NetNS, *flags: str) -> None:
        node = where.node if isinstance(where, ClientNodeServer) else where
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            node.exec_args(sys.executable, "-m", "lab.node_driver", *flags),
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        assert self._proc.stdin is not None and self._proc.stdout is not None  # piped
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        line = self._stdout.readline().decode().strip()
        if line != "ready":
            self.close()
            if line.startswith("setup-error: "):
                raise SetupRefused(line.removeprefix("setup-error: "))
            raise RuntimeError(f"node_driver did not start (said {line!r}): {self.log()}")

    def send(self, request: ServicePortChanges | str) -> str:
        """One request (see node_driver); its answer."""
        data = pickle.dumps(request)
        self._stdin.write(struct.pack(">I", len(data)) + data)
        self._stdin.flush()
        return self._stdout.readline().decode().strip()

    def apply(self, changes: ServicePortChanges) -> None:
        answer = self.send(changes)
        if answer != "applied":
            raise RuntimeError(f"the backend failed to apply {changes}: {answer!r}; "
                               f"log: {self.log()[-5:]}")

    def counts(self) -> dict[str, float]:
        """The backend's counters: {"name:label,...": value}."""
        return json.loads(self.send("counts"))

    def log(self) -> list[dict]:
        """The backend's log records so far."""
        self._log.seek(0)
        return [json.loads(line) for line in self._log.read().splitlines()
                if line.startswith(b"{")]

    def close(self) -> None:
        """EOF on stdin: the backend closes (as at shutdown) and exits."""
        if self._proc.poll() is None:
            self._stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


@contextmanager
def node_starter(where: ClientNodeServer | NetNS) -> Iterator[Callable[..., NodeBackend]]:
    """A function that starts the backend in `where` with the given flags;
    every backend it started is closed on exit."""
    started: list[NodeBackend] = []

    def start(*flags: str) -> NodeBackend:
        started.append(NodeBackend(where, *flags))
        return started[-1]

    try:
        yield start
    finally:
        for node in started:
            node.close()


def addresses(ns: NetNS, device: str) -> set[str]:
    """The addresses on `device` in `ns`, as "ip/prefixlen"."""
    shown = json.loads(ns.ip("-j", "addr", "show", "dev", device).stdout)
    return {f"{a['local']}/{a['prefixlen']}" for link in shown for a in link["addr_info"]}


class ClientAgent:
    """`lab.agent` in the client namespace."""

    def __init__(self, cluster: ClientNodeServer) -> None:
        self._proc = _start(cluster.python(cluster.client, "lab.agent"), stdin=subprocess.PIPE)
        assert self._proc.stdin is not None and self._proc.stdout is not None  # piped
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout

    def __call__(self, op: str, **args):
        """The agent's answer: its `results` list, or its other fields, or
        {"error": "ECONNREFUSED"} (the errno's name)."""
        self._stdin.write(json.dumps({"op": op, **args}) + "\n")
        self._stdin.flush()
        line = self._stdout.readline()
        if not line:
            raise RuntimeError(f"the agent exited (code {self._proc.wait()}) on {op} {args}")
        return agent_answer(json.loads(line))

    def close(self) -> None:
        _stop(self._proc)


def agent_answer(reply: dict):
    """What a test checks of a lab.agent reply (see ClientAgent)."""
    if not reply.pop("ok"):
        return {"error": reply["error"]}
    return reply["results"] if "results" in reply else reply


def service_port(name: str, protocol: Protocol, cluster_ips: tuple[str, ...], port: int,
                 endpoints: tuple[str | tuple[str, int], ...] = (),
                 affinity_timeout_seconds: int = 0, port_name: str = "p") -> ServicePort:
    """A ServicePort `default/NAME:PORT_NAME` as the state model would build it;
    endpoints are "ip" (on ENDPOINT_PORT) or ("ip", port)."""
    pairs = [(e, ENDPOINT_PORT) if isinstance(e, str) else e for e in endpoints]
    return ServicePort(
        name=ServicePortName("default", name, port_name, protocol),
        type="ClusterIP",
        cluster_ips=tuple(ipaddress.ip_address(ip) for ip in cluster_ips),
        port=port,
        affinity_timeout_seconds=affinity_timeout_seconds,
        endpoints=Endpoints.of(Endpoint(ipaddress.ip_address(ip), port) for ip, port in pairs),
    )
