"""The BCC build in a child process (backends/ebpf/datapath/build.py) and the pinned
builds under programs/: the backend process never maps LLVM, the child is
reaped, a build is adopted only over the maps its programs use, and BCC's
own message reaches the error. Real BCC, real kernel, a bpffs directory and
a cgroup of the test's own."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backends.ebpf.datapath import loader
from backends.ebpf.datapath.loader import PROGRAMS_DIR, Datapath, DatapathConfig, cleanup
from backends.ebpf.maps import layout as maps
from kpng_py.dataplane.contract import BackendSetupError
from kpng_py.runtime.logs import record_fields
from lab.cgroups import cgroup
from lab.socket_lab import unique_bpffs_dir
from tests.support.ebpf import TEST_MAP_SIZES
from tests.support.ebpf_datapath import loaded
from tests.support.kernel import require_root_bpf

pytestmark = pytest.mark.kernel

BUILT = "eBPF programs built in a child process"
REPOSITORY = Path(__file__).resolve().parents[4]

# Sets up the backend (a fresh build), then reports what its process maps
# and which children it has left.
SETUP_AND_LOOK = """
import json, logging, sys
from pathlib import Path
from backends.ebpf.backend import EbpfBackend
from backends.ebpf.datapath.loader import DatapathConfig
from kpng_py.metrics.metrics import Metrics
from kpng_py.state.skips import Skips

logging.basicConfig(level=logging.INFO)
metrics = Metrics()
backend = EbpfBackend(DatapathConfig(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])),
                      metrics, Skips(metrics))
backend.setup()
mapped = {line.split()[-1] for line in open("/proc/self/maps") if len(line.split()) == 6}
children = [pid for task in Path("/proc/self/task").iterdir()
            for pid in (task / "children").read_text().split()]
print(json.dumps({"llvm": sorted(p for p in mapped
                                 if any(n in p for n in ("libbcc", "libLLVM", "libclang"))),
                  "bcc_imported": "bcc" in sys.modules, "children": children}))
backend.close()
"""


@pytest.fixture(autouse=True)
def _root() -> None:
    require_root_bpf()


def test_the_backend_process_maps_no_llvm_and_leaves_no_child() -> None:
    bpffs_dir = unique_bpffs_dir()
    with cgroup() as group:
        try:
            ran = subprocess.run([sys.executable, "-c", SETUP_AND_LOOK, str(bpffs_dir),
                                  str(group.path), json.dumps(TEST_MAP_SIZES)],
                                 capture_output=True, text=True, timeout=120, cwd=REPOSITORY)
        finally:
            cleanup(bpffs_dir)
    assert ran.returncode == 0, ran.stderr
    assert BUILT in ran.stderr  # it did compile, in its child
    assert json.loads(ran.stdout) == {"llvm": [], "bcc_imported": False, "children": []}


def broken_source_dir(tmp_path: Path) -> Path:
    source = tmp_path / "bpf"
    shutil.copytree(loader.BPF_SOURCE_DIR, source)
    with (source / "sock_lb.c").open("a") as out:
        out.write("\nthis is not C;\n")
    return source


def test_a_source_that_does_not_compile_is_reported_with_bccs_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "BPF_SOURCE_DIR", broken_source_dir(tmp_path))
    bpffs_dir = unique_bpffs_dir()
    with cgroup() as group:
        try:
            with pytest.raises(BackendSetupError) as refused:
                Datapath.load(DatapathConfig(bpffs_dir, group.path, TEST_MAP_SIZES))
            assert list((bpffs_dir / PROGRAMS_DIR).iterdir()) == []  # no half build
        finally:
            cleanup(bpffs_dir)
    message = str(refused.value)
    assert message.startswith(f"cannot load the eBPF programs of {tmp_path}/bpf/sock_lb.c: "
                              "Failed to compile BPF module")
    assert "linux-headers-" in message and "needs root" not in message


def test_a_variant_that_does_not_load_falls_back_to_the_next(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """How kernels before 5.18 get the EPERM build: here the first variant's
    header does not exist, so BCC fails on it for real."""
    variants = loader._variants

    def missing_header_first(config: DatapathConfig) -> tuple[tuple[str, ...], ...]:
        good = variants(config)[0]
        return ('-DKPNG_MAPS_HEADER="/nonexistent/lb_maps.h"', *good[1:]), good

    monkeypatch.setattr(loader, "_variants", missing_header_first)
    with caplog.at_level(logging.INFO), loaded(**TEST_MAP_SIZES) as datapath:
        assert len(list((datapath.config.bpffs_dir / PROGRAMS_DIR / datapath.build
                         ).iterdir())) == 8
    (warning,) = [r for r in caplog.records if r.message.startswith("loading failed")]
    assert "Failed to compile BPF module" in record_fields(warning)["error"]


def load_messages(config: DatapathConfig, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Loads and closes a datapath; the loader's messages."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="backends.ebpf.datapath.loader"):
        Datapath.load(config).close()
    return [r.message for r in caplog.records]


def test_a_build_is_adopted_only_over_the_maps_its_programs_use(
        caplog: pytest.LogCaptureFixture) -> None:
    bpffs_dir = unique_bpffs_dir()
    affinity, aside = bpffs_dir / maps.AFFINITY.pin, bpffs_dir / "affinity_aside"
    with cgroup() as group:
        config = DatapathConfig(bpffs_dir, group.path, TEST_MAP_SIZES)
        try:
            assert BUILT in load_messages(config, caplog)
            assert BUILT not in load_messages(config, caplog)
            affinity.rename(aside)  # a map gone: rebuilt (BCC makes a new map)
            assert BUILT in load_messages(config, caplog)
            aside.rename(affinity)  # a map pinned that the programs do not use
            messages = load_messages(config, caplog)
            assert "pinned programs use maps that are no longer pinned; rebuilding" in messages
            assert BUILT in messages
            assert BUILT not in load_messages(config, caplog)
            assert [d.name for d in (bpffs_dir / PROGRAMS_DIR).iterdir()] == [
                loader.build_identity(config.checked())]
        finally:
            aside.unlink(missing_ok=True)
            cleanup(bpffs_dir)
    assert not bpffs_dir.exists()
