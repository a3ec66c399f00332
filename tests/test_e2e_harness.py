"""The lab's logic without a kernel (lab/): addressing, names and the
recognition of leftovers, the DNS codec of its probe, the sync detection in
backend logs; and, in a pytest of its own in hack/, the e2e harness's own
tests (hack/e2e/test_harness.py, test_kube.py)."""

from __future__ import annotations

import ipaddress
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from lab import probe
from lab.cluster import ADDRESSING, Family
from lab.names import RunNames, owner_pid, process_exists, unique_name
from lab.procs import JsonLog

HACK = Path(__file__).resolve().parents[1] / "hack"


def test_addressing_stays_inside_the_cluster_ranges():
    for family in Family:
        plan = ADDRESSING[family]
        cluster = plan.cluster_pod_cidr  # the node's range is one of its subnets
        assert plan.node_pod_cidr.supernet(new_prefix=cluster.prefixlen) == cluster
        assert plan.pod_ip(0) in plan.node_pod_cidr and plan.gateway in plan.node_pod_cidr
        assert plan.service_ip(14) in plan.service_cidr
    assert ADDRESSING[Family.IPV6].service_ip(0) == ipaddress.ip_address("fd00:10:96::a")


def test_names_carry_the_pid_and_fit_interface_names():
    names = RunNames(4194304)  # the largest pid Linux hands out
    assert owner_pid(names.netns("srv-0")) == 4194304
    assert owner_pid(names.cgroup.name) == owner_pid(names.bpffs_dir.name) == 4194304
    assert owner_pid(names.workdir_prefix + "abc") == 4194304
    assert max(len(n) for n in (names.bridge, names.veth(99), names.service_interface)) <= 15
    assert owner_pid("kpe2e-x") is None and owner_pid("other-123") is None
    assert owner_pid("kpe2e-123") == 123


def test_process_exists():
    assert process_exists(os.getpid())
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    assert not process_exists(child)


def _dns_reply(query_id: int, text: str) -> bytes:
    question = probe.dns_query("whoami.e2e", query_id)[12:]
    header = struct.pack("!HHHHHH", query_id, 0x8180, 1, 1, 0, 0)
    rdata = bytes([len(text)]) + text.encode()
    answer = b"\xc0\x0c" + struct.pack("!HHIH", 16, 1, 0, len(rdata)) + rdata
    return header + question + answer


def test_dns_codec():
    query = probe.dns_query("whoami.e2e.", 7)
    assert query[12:] == b"\x06whoami\x03e2e\x00\x00\x10\x00\x01"
    assert probe.dns_txt_answer(_dns_reply(7, "srv-1"), 7) == "srv-1"
    assert probe.dns_txt_answer(_dns_reply(7, "srv-1"), 8) is None  # another query's


def test_json_log_counts_sync_lines_as_they_complete(tmp_path):
    path = tmp_path / "backend.log"
    watch = JsonLog(path)
    watch.poll()
    assert watch.syncs == 0
    path.write_text('{"msg": "sync applied", "sync": 1}\nTraceback (not JSON)\n'
                    '{"msg": "other"}\n{"msg": "sync app')
    watch.poll()
    assert watch.syncs == 1
    with open(path, "a") as f:
        f.write('lied", "sync": 2}\n')
    watch.poll()
    assert watch.syncs == 2


def test_unique_names_carry_the_pid_and_are_swept_by_the_same_pattern():
    name = unique_name("kpng-py-test-")
    assert owner_pid(name) == os.getpid()
    assert owner_pid(unique_name("kpc")) == owner_pid(unique_name("vn")) == os.getpid()
    assert len(unique_name("kpbn")) <= 15  # an interface name
    assert name != unique_name("kpng-py-test-")
    # Names of others' that merely look alike are not ours.
    assert owner_pid("kpng-py-test-12") is None and owner_pid("vnet0") is None
    assert owner_pid("kpe2e-12x3") is None and owner_pid("kpe12br") is None


def test_unique_name_refuses_a_prefix_the_sweep_would_not_find():
    with pytest.raises(ValueError, match="sweep"):
        unique_name("test-")


def test_run_objects_and_process_objects():
    names = RunNames(123)
    assert names.in_run("kpe2e-123-node") and names.in_run("kpe2e-123")
    assert not names.in_run("kpe2e-1234-node") and not names.in_run("kpc123x0")
    assert names.of_process("kpc123x0") and names.of_process("kpe2e-123-node")
    assert not names.of_process("kpc1234x0")


def test_the_harness_own_tests_pass():
    """hack/e2e's own logic, tested from hack/ (where the harness runs), so
    that tests/ never imports the harness."""
    # Without the plugins this suite's other tests need, it starts in a second.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
         "e2e/test_harness.py", "e2e/test_kube.py"],
        cwd=HACK, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout
