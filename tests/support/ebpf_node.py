"""The node as users run it, in the lab: the brain (`kpng-py file -i STATE
to-api`) and the eBPF backend (`kpng-py local --api ... to-ebpf`) as separate
processes, serving services whose endpoints are the lab's servers."""

from __future__ import annotations

import ipaddress
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from backends.ebpf.datapath.loader import cleanup
from backends.ebpf.maps.layout import SIZED_SPECS
from backends.ebpf.tools.dump import read_dump
from lab.socket_lab import Lab, backend_ip, target
from tests.support.ebpf import TEST_MAP_SIZES
from tests.support.process import LOOPBACK_PROBES, START_SECONDS, Process, Processes
from tests.support.state_files import TCP, UDP, StateFile, endpoint, port, service, state

NODE_NAME = "node-a"
WEB_VIPS = ("10.96.30.1", "fd00:96::30:1")
DNS_VIP = "10.96.30.2"
# A TCP connect to web over each family and a DNS-like UDP query.
TARGETS = [target("tcp", WEB_VIPS[0], 80), target("tcp", WEB_VIPS[1], 80),
           target("udp", DNS_VIP, 53)]


def lab_service(name: str, vips: Sequence[str], protocol: int, number: int, target_port: int,
                endpoints: Sequence[int]) -> dict:
    """A service of the state file whose endpoints are the lab's servers of
    these numbers (lab.socket_lab.backend_ip), with an address in each family
    of its ClusterIPs."""
    families = sorted({ipaddress.ip_address(vip).version for vip in vips})
    return service(name, tuple(vips), [port(name, protocol, number, targetport=target_port)],
                   [endpoint(*(str(backend_ip(i, f)) for f in families), pod=f"{name}-{i}")
                    for i in endpoints])


def web_and_dns(web: Sequence[int], dns: Sequence[int], web_vips: Sequence[str] = WEB_VIPS,
                more: Sequence[dict] = ()) -> dict:
    """web (TCP 80 -> 8080) and dns (UDP 53 -> 5353) with these lab servers
    as endpoints, and `more` services."""
    return state(lab_service("web", web_vips, TCP, 80, 8080, web),
                 lab_service("dns", (DNS_VIP,), UDP, 53, 5353, dns), *more)


class Node:
    """Starts the brain and the backend of one node; the state file is `state`."""

    def __init__(self, lab: Lab, processes: Processes, work: Path, socket_dir: Path) -> None:
        self.lab = lab
        self.state = StateFile(work / "state.yaml")
        self.api = f"unix://{socket_dir / 'brain.sock'}"
        self._processes = processes

    def start_brain(self) -> Process:
        brain = self._processes.start("file", "-i", str(self.state.path), "to-api",
                                      "--listen", self.api)
        brain.wait_for_log("serving localv1")
        return brain

    def start_backend(self, *flags: str, syncs: int = 1) -> Process:
        """`to-ebpf` on the lab's cgroup and bpffs directory, retrying the brain
        after 0.1 s, doubling up to 1 s; returns once it applied `syncs`
        change sets."""
        sizes = [arg for spec in SIZED_SPECS
                 for arg in (spec.size_flag, str(TEST_MAP_SIZES[spec.pin]))]
        backend = self._processes.start(
            "local", "--api", self.api, "--node-name", NODE_NAME, "--error-delay", "0.1",
            "--max-error-delay", "1", *LOOPBACK_PROBES, "to-ebpf",
            "--cgroup", str(self.lab.group.path), "--bpffs-dir", str(self.lab.bpffs_dir),
            # It runs in the test's own network namespace (the machine's):
            # no nftables table there (tests/ebpf/netfilter/ and
            # tests/kernel/ebpf/netfilter/ test it).
            "--no-nodeport-netfilter", *sizes, *flags)
        if syncs:
            backend.wait_for_log("sync applied", syncs, seconds=START_SECONDS)
        return backend

    def dump(self) -> dict:
        return read_dump(self.lab.bpffs_dir)


@contextmanager
def node(lab: Lab, work: Path) -> Iterator[Node]:
    """A node in the lab; its processes are killed and the datapath removed
    afterwards, also when the test fails."""
    socket_dir = Path(tempfile.mkdtemp(prefix="kpng-node-"))  # unix paths are short
    try:
        with Processes(work) as processes:
            yield Node(lab, processes, work, socket_dir)
    finally:
        cleanup(lab.bpffs_dir, lab.group.path)
        shutil.rmtree(socket_dir, ignore_errors=True)
