"""The e2e cluster itself, before any proxy: servers answer on pod IPs, a
packet to a ClusterIP dies in the node namespace (and is counted), teardown
leaves nothing, and the leftovers of a killed run are cleared without
touching a live one."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lab import clients, teardown
from lab.cluster import ADDRESSING, Cluster, families_of_mode
from lab.names import RunNames, cgroup2_mount
from lab.pods import build_cluster
from tests.support.kernel import require_root_bpf

pytestmark = pytest.mark.kernel


def _require_tools() -> None:
    require_root_bpf()
    for tool in ("nginx", "dnsmasq", "socat", "curl", "dig", "nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (hack/setup.sh installs it)")


def test_pods_reach_each_other_and_cluster_ips_die_in_the_node():
    _require_tools()
    names = RunNames.for_this_process()
    cluster = Cluster(names, families_of_mode("dual"), names.make_workdir())
    try:
        _servers, client = build_cluster(cluster)  # raises unless every server answers
        for family in cluster.families:
            vip = str(ADDRESSING[family].service_ip(0))
            answer = clients.probe(client, "connect", vip, "80")
            assert not answer["ok"]
            # The node's `prohibit` route answers with an ICMP error.
            assert answer["errno"] in (errno.errorcode[errno.EHOSTUNREACH],
                                       errno.errorcode[errno.EACCES])
            assert cluster.escaped_packets(family) >= 1
    finally:
        problems = teardown.remove_run(names)
    assert problems == []
    assert teardown.leftovers(names) == []


def test_stale_run_is_cleared_and_live_run_left_alone():
    _require_tools()
    live = RunNames.for_this_process()
    cluster = Cluster(live, families_of_mode("ipv4"), live.make_workdir())
    dead_child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from lab.cgroups import Cgroup
            from lab.cluster import Cluster, families_of_mode
            from lab.names import BPFFS_ROOT, CGROUP2_ROOT, RunNames, unique_name
            from lab.netns import NetNS
            from lab.pods import build_cluster
            names = RunNames.for_this_process()
            build_cluster(Cluster(names, families_of_mode("ipv6"), names.make_workdir()))
            # What a kernel test makes: one object at a time, each named uniquely.
            NetNS(unique_name("kpt")).create()
            Cgroup(CGROUP2_ROOT / unique_name("kpng-py-test-")).create()
            (BPFFS_ROOT / unique_name("kpng-py-test-")).mkdir()
            print("up", flush=True)
            time.sleep(600)
            """)],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        stdout=subprocess.PIPE, text=True)
    dead = RunNames(dead_child.pid)
    try:
        cluster.build(["client"])
        assert dead_child.stdout is not None and dead_child.stdout.readline() == "up\n"
        dead_child.kill()
        dead_child.wait()
        unique = [found for found in teardown.leftovers(dead) if not dead.in_run(Path(found).name)]
        assert len(unique) == 3, unique  # the netns, cgroup and bpffs directory
        assert f"removed leftovers of run {dead.tag}" in teardown.remove_stale_runs()
        assert teardown.leftovers(dead) == []
        assert teardown.leftovers(live)  # a run whose process lives is not stale
    finally:
        dead_child.kill()
        dead_child.wait()
        teardown.remove_run(dead)
        teardown.remove_run(live)
    assert teardown.leftovers(live) == []


def test_the_cgroup2_mount_is_found_in_either_layout(tmp_path: Path) -> None:
    """This project's machines mount cgroup v2 at /sys/fs/cgroup/unified
    (hybrid); others at /sys/fs/cgroup (unified): the lab uses whichever."""
    hybrid, unified = tmp_path / "hybrid", tmp_path / "unified"
    hybrid.write_text("tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
                      "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
                      "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    unified.write_text("cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n")
    assert cgroup2_mount(str(hybrid)) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_mount(str(unified)) == Path("/sys/fs/cgroup")
