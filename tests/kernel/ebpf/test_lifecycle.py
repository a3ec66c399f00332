"""The datapath across process lifetimes, through the real command line:
`kpng-py local ... to-ebpf` against `kpng-py replay`, restarts under a connect
loop, `kpng-py ebpf dump` and `kpng-py ebpf cleanup`."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import (
    PROGRAMS_DIR,
    DatapathConfig,
    build_identity,
    default_cgroup,
    pinned_links,
)
from kpng_py.api import localv1
from kpng_py.metrics.metrics import Metrics
from kpng_py.serve.recording import RecordingWriter
from kpng_py.state.skips import Skips
from lab.cgroups import cgroup
from lab.socket_lab import Agent, Lab, backend_ip, target
from tests.support.deploy import backend_args, cleanup_args
from tests.support.ebpf import TEST_MAP_SIZES
from tests.support.ebpf_datapath import added, brain_ops, follower_in, service_port

pytestmark = pytest.mark.kernel

KPNG_PY = str(Path(sys.executable).parent / "kpng-py")
VIP = "10.96.20.1"
BUILT = "eBPF programs built in a child process"
ADOPTED = "adopted the pinned eBPF programs; nothing compiled"


def kpng_py(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([KPNG_PY, *args], capture_output=True, text=True, timeout=60,
                          check=check)


@pytest.fixture(scope="module")
def brain(the_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`kpng-py replay` serving one service with three endpoints."""
    work = tmp_path_factory.mktemp("brain")
    service = localv1.Service(
        Namespace="default", Name="web", Type="ClusterIP",
        IPs=localv1.ServiceIPs(ClusterIPs=localv1.IPSet(V4=[VIP])),
        Ports=[localv1.PortMapping(Name="http", Protocol=localv1.TCP, Port=80,
                                   TargetPort=8080)])
    endpoints = [localv1.Endpoint(IPs=localv1.IPSet(V4=[str(backend_ip(i))]), Local=True)
                 for i in (1, 2, 3)]
    recording = work / "web.jsonl"
    with recording.open("w") as out:
        writer = RecordingWriter(out)
        for op in [localv1.OpItem(Reset=localv1.EmptyOp()), *brain_ops(service, endpoints)]:
            writer.op(op)
    sock = work / "brain.sock"
    replay = subprocess.Popen([KPNG_PY, "replay", "-i", str(recording), "to-api", "--listen",
                               f"unix://{sock}"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        replay.terminate()
        replay.wait(timeout=10)


def run_backend(the_lab: Lab, brain: str, node: str, *flags: str) -> str:
    """One kpng-py process: apply the brain's first change set, then exit.
    Each run watches as a new node, so the replay serves it from the start.
    Returns its log."""
    return kpng_py("local", "--api", brain, "--node-name", node, "--exit-after", "1", "to-ebpf",
            "--cgroup", str(the_lab.group.path), "--bpffs-dir", str(the_lab.bpffs_dir),
            # The machine's network namespace: no nftables table there.
            "--no-nodeport-netfilter",
            "--map-size-reverse-nat", "4096", "--map-size-affinity", "1024", *flags).stderr


def test_restarts_under_a_connect_loop_fail_no_connect(the_lab: Lab, brain: str,
                                                       agent: Agent) -> None:
    assert BUILT in run_backend(the_lab, brain, "first")
    links = {link.hook: link for link in pinned_links(the_lab.bpffs_dir)}
    assert agent.call("tcp", host=VIP, port=80, family=4)["ok"]

    agent.call("loop_start", targets=[target("tcp", VIP, 80)])
    try:
        time.sleep(0.3)
        # A new size for the services map: its entries move to a new map.
        resized = run_backend(the_lab, brain, "second", "--map-size-services", "2048")
        time.sleep(0.3)
        unchanged = run_backend(the_lab, brain, "third", "--map-size-services", "2048")
        time.sleep(0.3)
    finally:
        result = agent.call("loop_stop")
    assert "pinned map does not match; replacing it" in resized
    assert "replacing" not in unchanged
    # New cflags (a map size) are a new build; the same ones compile nothing:
    # no build child is started.
    assert BUILT in resized and ADOPTED not in resized
    assert ADOPTED in unchanged and BUILT not in unchanged
    # Only the build the links run is left pinned.
    assert [d.name for d in (the_lab.bpffs_dir / PROGRAMS_DIR).iterdir()] == [
        build_identity(DatapathConfig(the_lab.bpffs_dir, the_lab.group.path, {
            "services": 2048, "reverse_nat": 4096, "affinity": 1024}))]
    print(f"restarts: {result['connects']} connects, served {sorted(result['served'])}")
    assert result["errors"] == {} and result["wrong_peer"] == 0, result
    assert set(result["served"]) == {"10.244.0.2:8080", "10.244.0.3:8080", "10.244.0.4:8080"}
    # The same links, each now running the last process's program.
    after = {link.hook: link for link in pinned_links(the_lab.bpffs_dir)}
    assert {h: link.link_id for h, link in after.items()} == {
        h: link.link_id for h, link in links.items()}
    assert all(after[h].prog_id != links[h].prog_id for h in links)


def test_dump_shows_the_programmed_services(the_lab: Lab, brain: str) -> None:
    log = run_backend(the_lab, brain, "dump")
    assert ("the eBPF programs stay attached and keep translating with the last state "
            "programmed; `kpng-py ebpf cleanup --cgroup "
            f"{the_lab.group.path} --bpffs-dir {the_lab.bpffs_dir}` removes them") in log
    dump = json.loads(kpng_py("ebpf", "dump", "--bpffs-dir", str(the_lab.bpffs_dir),
                              "--json").stdout)
    (web,) = [s for s in dump["services"] if s["vip"] == VIP]
    assert (web["port"], web["protocol"], web["count"]) == (80, "TCP", 3)
    assert sorted(b["address"] for b in web["backends"]) == [
        "10.244.0.2:8080", "10.244.0.3:8080", "10.244.0.4:8080"]
    # Without --endpoint-counters, connections per backend are not counted.
    assert dump["endpointCounters"] is False
    assert {b["connections"] for b in web["backends"]} == {None}
    assert {link["hook"] for link in dump["links"]} == {
        "connect4", "connect6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6",
        "getpeername4", "getpeername6"}
    cgroup = "/" + str(the_lab.group.path.relative_to(default_cgroup()))
    assert {link["cgroup"] for link in dump["links"]} == {cgroup}  # by path, not id
    text = kpng_py("ebpf", "dump", "--bpffs-dir", str(the_lab.bpffs_dir)).stdout
    assert f"{VIP}:80/TCP" in text and "slot 3: backend" in text
    (connect4,) = [link for link in dump["links"] if link["hook"] == "connect4"]
    assert (f"hook connect4: link {connect4['linkId']} program {connect4['progId']} "
            f"cgroup {cgroup} (id {connect4['cgroupId']})") in text


def attached_programs(group: Path) -> list[dict]:
    """What bpftool says is attached to a cgroup."""
    shown = subprocess.run(["bpftool", "-j", "cgroup", "show", str(group)], check=True,
                           capture_output=True, text=True).stdout
    return json.loads(shown.strip() or "[]")


def test_cleanup_leaves_nothing_behind(the_lab: Lab, brain: str, agent: Agent) -> None:
    run_backend(the_lab, brain, "cleanup")
    assert agent.call("tcp", host=VIP, port=80, family=4)["ok"]
    assert len(attached_programs(the_lab.group.path)) == 8
    kpng_py("ebpf", "cleanup", "--bpffs-dir", str(the_lab.bpffs_dir), "--cgroup",
            str(the_lab.group.path))
    assert attached_programs(the_lab.group.path) == []
    assert not the_lab.bpffs_dir.exists()
    assert agent.call("tcp", host=VIP, port=80, family=4)["errno"] == errno.ENETUNREACH
    again = kpng_py("ebpf", "cleanup", "--bpffs-dir", str(the_lab.bpffs_dir))
    assert "nothing installed" in again.stdout


def _in_the_lab(args: list[str], the_lab: Lab) -> list[str]:
    """A manifest's arguments with the node's cgroup and bpffs directory
    replaced by the lab's (never the machine's own)."""
    places = {"--cgroup": the_lab.group.path, "--bpffs-dir": the_lab.bpffs_dir}
    flags = [arg.split("=", 1)[0] for arg in args]
    # Without both, the product's defaults (the node's root cgroup) would be used.
    assert set(places) <= set(flags), f"the manifest's {args} must name {sorted(places)}"
    return [f"{flag}={places[flag]}" if flag in places else arg
            for flag, arg in zip(flags, args)]


def test_the_uninstall_manifest_removes_what_the_install_manifest_made(
        the_lab: Lab, brain: str, agent: Agent) -> None:
    """deploy/kpng-py.yaml's backend flags, then deploy/kpng-py-cleanup.yaml's
    cleanup, both pointed at the lab: no program, pin or link is left."""
    install = _in_the_lab(backend_args(), the_lab)
    kpng_py("local", "--api", brain, "--node-name", "uninstall", "--exit-after", "1", "to-ebpf",
            *install, "--map-size-reverse-nat", "4096", "--map-size-affinity", "1024")
    assert len(attached_programs(the_lab.group.path)) == 8
    assert agent.call("tcp", host=VIP, port=80, family=4)["ok"]
    kpng_py(*_in_the_lab(cleanup_args(), the_lab))
    assert attached_programs(the_lab.group.path) == []
    assert not the_lab.bpffs_dir.exists()
    assert agent.call("tcp", host=VIP, port=80, family=4)["errno"] == errno.ENETUNREACH


def test_cleanup_of_a_cgroup_detaches_installations_pinned_elsewhere(
        the_lab: Lab, brain: str) -> None:
    run_backend(the_lab, brain, "elsewhere")
    other_dir = the_lab.bpffs_dir.with_name(the_lab.bpffs_dir.name + "other")
    swept = kpng_py("ebpf", "cleanup", "--bpffs-dir", str(other_dir), "--cgroup",
                    str(the_lab.group.path)).stdout
    assert swept.count("removed link") == 8
    assert attached_programs(the_lab.group.path) == []
    # The next start finds its pinned links detached and attaches anew.
    run_backend(the_lab, brain, "reattach")
    assert len(attached_programs(the_lab.group.path)) == 8
    kpng_py("ebpf", "cleanup", "--bpffs-dir", str(the_lab.bpffs_dir))


def test_bad_locations_are_named_with_their_fix(tmp_path: Path) -> None:
    result = kpng_py("local", "--api", "unix:///nonexistent", "to-ebpf", "--bpffs-dir",
                     str(tmp_path), "--cgroup", str(tmp_path), check=False)
    assert result.returncode == 2
    assert f"--bpffs-dir {tmp_path} is not on a bpf filesystem" in result.stderr


def test_without_set_retval_no_endpoints_fails_with_eperm(the_lab: Lab) -> None:
    """The fallback for kernels before 5.18, forced here."""
    with cgroup() as group:
        config = DatapathConfig(the_lab.bpffs_dir.with_name(the_lab.bpffs_dir.name + "eperm"),
                                group.path, TEST_MAP_SIZES, reject_with_eperm=True)
        metrics = Metrics()
        ebpf = EbpfBackend(config, metrics, Skips(metrics), follower=follower_in(the_lab))
        ebpf.setup()
        try:
            ebpf.apply(added(service_port("eperm", ["10.96.21.1"], 80, families=(4,)),
                             full=True))
            client = Agent(the_lab.node, group)
            try:
                assert client.call("tcp", host="10.96.21.1", port=80, family=4)["errno"] == (
                    errno.EPERM)
            finally:
                client.close()
        finally:
            ebpf.close()
            kpng_py("ebpf", "cleanup", "--bpffs-dir", str(config.bpffs_dir))
