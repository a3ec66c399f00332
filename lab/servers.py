"""The real servers in each server pod, each able to say which pod answered.

| container port | server  | answer |
|---|---|---|
| http  8080+i/TCP | nginx   | `<pod> <server port> <server address>` |
| alt   9080+i/TCP | nginx   | same (a second named port, numbered per pod) |
| dns   53/UDP+TCP | dnsmasq | TXT `whoami.e2e` = `<pod>` |
| echo-tcp 7000/TCP | socat  | echoes the bytes |
| echo-udp 7001/UDP | socat  | echoes each datagram (any size up to 8 KiB) |

The http and alt numbers differ per pod, like named targetPorts that resolve
to different numbers in different pods. Each pod's configuration lives in the
run's work directory; no system configuration or service is used.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Protocol, Sequence

from lab.cluster import Pod
from lab.procs import Proc, in_namespace, run, wait_until

WHOAMI_NAME = "whoami.e2e"
PEER_SERVER = str(Path(__file__).with_name("peer_server.py"))


def peer_server_command(pod: str, port: int) -> list[str]:
    """lab/peer_server.py answering as `pod` on TCP and UDP `port`, both
    families (the NodePort topology's "whoami" servers)."""
    return [sys.executable, PEER_SERVER, "--name", pod, f"tcp:[::]:{port}", f"udp:[::]:{port}"]


class ContainerPort(str, enum.Enum):
    HTTP = "http"
    ALT = "alt"
    DNS = "dns"
    ECHO_TCP = "echo-tcp"
    ECHO_UDP = "echo-udp"

    def number(self, pod: Pod) -> int:
        per_pod = {ContainerPort.HTTP: 8080, ContainerPort.ALT: 9080}
        if self in per_pod:
            return per_pod[self] + pod.index
        return {ContainerPort.DNS: 53, ContainerPort.ECHO_TCP: 7000,
                ContainerPort.ECHO_UDP: 7001}[self]


def nginx_conf(prefix: Path, servers: str, worker_connections: int = 1024) -> str:
    """A single-process nginx that keeps everything under `prefix` (no
    system configuration, no root-owned paths), serving the `server` blocks
    in `servers`."""
    temp = "".join(f"    {kind}_temp_path {prefix}/{kind};\n"
                   for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (
        "daemon off;\nmaster_process off;\nworker_processes 1;\n"
        f"pid {prefix}/nginx.pid;\nerror_log stderr notice;\n"
        f"events {{ worker_connections {worker_connections}; }}\n"
        "http {\n    access_log off;\n    default_type text/plain;\n"
        f"{temp}{servers}}}\n")


def _nginx_conf(pod: Pod, prefix: Path) -> str:
    answer = f'"{pod.name} $server_port $server_addr\\n"'
    listens = "".join(
        f"    server {{ listen 0.0.0.0:{port}; listen [::]:{port} ipv6only=on;\n"
        f"             location / {{ return 200 {answer}; }} }}\n"
        for port in (ContainerPort.HTTP.number(pod), ContainerPort.ALT.number(pod)))
    return nginx_conf(prefix, listens)


def _server_commands(pod: Pod, prefix: Path) -> dict[str, list[str]]:
    return {
        "nginx": ["nginx", "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", "stderr"],
        "dnsmasq": ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
                    "--no-hosts", "--pid-file=", "--log-facility=-", "--user=root",
                    f"--port={ContainerPort.DNS.number(pod)}",
                    f"--txt-record={WHOAMI_NAME},{pod.name}"],
        # IPv6 sockets with ipv6only=0 serve both families.
        "echo-tcp": ["socat", f"TCP6-LISTEN:{ContainerPort.ECHO_TCP.number(pod)},"
                     "ipv6only=0,reuseaddr,fork", "PIPE"],
        "echo-udp": ["socat", f"UDP6-RECVFROM:{ContainerPort.ECHO_UDP.number(pod)},"
                     "ipv6only=0,fork", "PIPE"],
    }


class PodHost(Protocol):
    """Where pods' processes start: lab.cluster.Cluster, lab.multinode.MultiNodeCluster."""

    @property
    def workdir(self) -> Path: ...

    def spawn_in_pod(self, pod: Pod, name: str, argv: Sequence[str]) -> Proc: ...


def start_servers(cluster: PodHost, pod: Pod) -> list[Proc]:
    prefix = cluster.workdir / pod.name
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(_nginx_conf(pod, prefix))
    return [cluster.spawn_in_pod(pod, name, argv)
            for name, argv in _server_commands(pod, prefix).items()]


def _expected_sockets(pod: Pod) -> set[tuple[str, int]]:
    tcp = (ContainerPort.HTTP, ContainerPort.ALT, ContainerPort.DNS, ContainerPort.ECHO_TCP)
    udp = (ContainerPort.DNS, ContainerPort.ECHO_UDP)
    return ({("tcp", p.number(pod)) for p in tcp} | {("udp", p.number(pod)) for p in udp})


def _open_sockets(pod: Pod) -> set[tuple[str, int]]:
    out = run(in_namespace(pod.netns, ["ss", "-Hlntu"])).stdout
    sockets = set()
    for line in out.splitlines():
        cols = line.split()
        sockets.add((cols[0], int(cols[4].rsplit(":", 1)[1])))
    return sockets


def wait_listening(pod: Pod, servers: list[Proc], timeout: float = 10.0) -> None:
    def ready() -> bool:
        dead = [p for p in servers if not p.running()]
        if dead:
            raise RuntimeError(dead[0].describe_exit())
        return _expected_sockets(pod) <= _open_sockets(pod)

    wait_until(f"servers of pod {pod.name} listening", ready, timeout)
