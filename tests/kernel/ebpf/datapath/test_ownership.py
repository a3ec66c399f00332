"""One process owns a datapath (backends/ebpf/datapath/ownership.py), and the owner
keeps it whole: a second backend on the same bpffs directory is refused, a
cleanup waits for the owner or is refused, and while the owner cannot put
back what another process removed, /healthz, /livez and the metrics say so."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest

from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath import loader
from backends.ebpf.datapath.loader import Datapath, cleanup
from backends.ebpf.datapath.ownership import DatapathInUse, DatapathLock, holder
from kpng_py.healthcheck.proxier_health import SyncHealth
from kpng_py.metrics.metrics import Metrics
from kpng_py.state.skips import Skips
from lab.socket_lab import Lab, unique_bpffs_dir
from tests.support.ebpf import datapath_config
from tests.support.ebpf_datapath import added, follower_in, service_port
from tests.support.process import KPNG_PY, wait_until

pytestmark = pytest.mark.kernel

VIP = "10.96.22.1"
# Holds the lock of the directory it is given until its stdin closes.
_HOLDER = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY); "
           "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()")


@pytest.fixture
def directory() -> Iterator[Path]:
    path = unique_bpffs_dir()
    path.mkdir(mode=0o700)
    yield path
    cleanup(path)


@pytest.fixture
def other_owner(directory: Path) -> Iterator[subprocess.Popen]:
    """Another process holding the directory's lock, ended by closing its stdin."""
    owner = subprocess.Popen([sys.executable, "-c", _HOLDER, str(directory)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None and owner.stdout.readline() == "locked\n"
    yield owner
    if owner.poll() is None:
        owner.kill()
        owner.wait()


def _release(owner: subprocess.Popen) -> None:
    assert owner.stdin is not None
    owner.stdin.close()
    owner.wait(10)


def test_the_holder_is_named_by_its_pid(directory: Path, other_owner: subprocess.Popen) -> None:
    assert DatapathLock.take(directory) is None
    assert holder(directory) == f"pid {other_owner.pid}"
    _release(other_owner)
    lock = DatapathLock.take(directory)
    assert lock is not None
    lock.release()


def test_a_second_backend_on_an_owned_datapath_is_refused(
        the_lab: Lab, directory: Path, other_owner: subprocess.Popen,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a second instance adopted the maps the first one was writing
    (and only failed to bind /healthz). It waits for a stopping owner, then
    gives up with the owner's pid, before it builds or touches anything."""
    monkeypatch.setattr(loader, "START_WAIT_SECONDS", 0.3)
    config = datapath_config(the_lab)
    started = time.monotonic()
    with pytest.raises(DatapathInUse, match=(
            rf"the datapath under {directory} is owned by a running kpng-py \(pid "
            rf"{other_owner.pid}\), still after 0.3 s: two processes would overwrite each "
            r"other's maps. Stop that one first, or give this one another --bpffs-dir")):
        Datapath.load(replace(config, bpffs_dir=directory))
    assert time.monotonic() - started < 5  # no build: refused before it
    assert sorted(p.name for p in directory.iterdir()) == []


def test_a_start_waits_for_a_stopping_owner(the_lab: Lab, directory: Path,
                                           other_owner: subprocess.Popen) -> None:
    """A restart whose predecessor is still exiting: the start waits, then loads."""
    config = datapath_config(the_lab)
    stopping = threading.Timer(0.5, _release, (other_owner,))
    stopping.start()
    try:
        datapath = Datapath.load(replace(config, bpffs_dir=directory))
    finally:
        stopping.join()
    try:
        assert DatapathLock.take(directory) is None  # held by this datapath now
    finally:
        datapath.close()
    lock = DatapathLock.take(directory)  # released with it
    assert lock is not None
    lock.release()


def test_cleanup_waits_for_the_owner_when_asked(directory: Path,
                                              other_owner: subprocess.Popen) -> None:
    refused = subprocess.run([KPNG_PY, "ebpf", "cleanup", "--bpffs-dir", str(directory)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert f"owned by a running kpng-py (pid {other_owner.pid})" in refused.stderr
    assert "pass --wait DURATION to wait for it, or --force" in refused.stderr
    waiting = subprocess.Popen([KPNG_PY, "ebpf", "cleanup", "--bpffs-dir", str(directory),
                                "--wait", "30s"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    assert waiting.poll() is None  # still waiting for the owner
    _release(other_owner)
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 0
    assert f"removed {directory}" in out
    assert not directory.exists()


def test_while_the_datapath_cannot_be_put_back_health_and_metrics_say_so(
        the_lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The datapath taken away (`cleanup` forced) and the restore failing:
    /healthz and /livez answer 503 naming what is missing, the gauge stays
    at 1 and the restore errors count, until a check succeeds."""
    metrics = Metrics()
    health = SyncHealth(timeout=60)
    config = datapath_config(the_lab)
    ebpf = EbpfBackend(config, metrics, Skips(metrics), follower=follower_in(the_lab),
                       check_seconds=0.05)
    ebpf.use_health(health)
    ebpf.setup()
    client = the_lab.agent()
    try:
        ebpf.apply(added(service_port("owned", [VIP], 80, endpoints=[1], families=(4,)),
                         full=True))
        health.changeset_applied()
        assert client.call("tcp", host=VIP, port=80, family=4)["ok"]
        real_restore = Datapath.restore

        def refused(self: Datapath) -> None:
            raise PermissionError(1, "pin BPF object: Operation not permitted")

        monkeypatch.setattr(Datapath, "restore", refused)
        cleanup(config.bpffs_dir, config.cgroup)  # what `ebpf cleanup --force` does
        wait_until(lambda: metrics.dataplane_errors.labels("datapath-restore")._value.get() >= 2,
                   "a failed restore")
        ok, body = health.status()
        alive, _ = health.liveness()
        assert not ok and not alive
        assert "links: connect4" in body["dataplaneMissing"]
        assert metrics.datapath_missing.labels("links")._value.get() == 1
        assert client.call("tcp", host=VIP, port=80, family=4)["errno"] == 101  # ENETUNREACH

        monkeypatch.setattr(Datapath, "restore", real_restore)
        wait_until(lambda: metrics.datapath_missing.labels("links")._value.get() == 0,
                   "the datapath put back")
        assert health.status()[0] and health.liveness()[0]
        assert metrics.datapath_restored.labels("links")._value.get() == 1
        assert client.call("tcp", host=VIP, port=80, family=4)["ok"]
    finally:
        client.close()
        ebpf.close()
        cleanup(config.bpffs_dir, config.cgroup)


def test_the_lock_follows_a_directory_made_again(directory: Path) -> None:
    lock = DatapathLock.take(directory)
    assert lock is not None
    try:
        directory.rmdir()
        directory.mkdir(mode=0o700)
        assert not lock.held()
        lock.renew()
        assert lock.held() and DatapathLock.take(directory) is None
    finally:
        lock.release()

