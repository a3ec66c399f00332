"""Outages of the node's processes while a client loops on TCP connects and
UDP queries through ClusterIPs: the brain killed and restarted with a changed
state, the backend killed (also while it starts), maps too small for the
state. The brain and the backend are the real commands, as separate
processes; the client runs in the lab's namespace and cgroup, where an
untranslated ClusterIP fails with ENETUNREACH."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from backends.ebpf.datapath.loader import pinned_links
from backends.ebpf.maps import layout as maps
from kpng_py.runtime.backoff import JITTER
from lab.socket_lab import Agent, Lab, backend_ip, target
from tests.support.ebpf_node import TARGETS, WEB_VIPS, lab_service, node, web_and_dns
from tests.support.process import KPNG_PY, START_SECONDS, Process
from tests.support.state_files import TCP

pytestmark = pytest.mark.kernel

OUTAGE_SECONDS = 3.0
WRITTEN_MAPS = (maps.SERVICES.pin, maps.ENDPOINTS.pin)


def map_writes(backend: Process) -> dict[str, float]:
    """Entries the backend process wrote so far, by map (from its /metrics)."""
    return {pin: backend.metric("kpng_py_map_writes_total", map=pin) for pin in WRITTEN_MAPS}


def assert_no_failure(result: dict) -> None:
    assert result["errors"] == {} and result["wrong_peer"] == 0, result
    assert result["connects"] > 0 and result["queries"] > 0, result


def programmed(dump: dict) -> list[dict]:
    """The dump's services without their counters, which the traffic moves."""
    return [{key: value for key, value in svc.items() if key not in ("connections", "rejections")}
            for svc in dump["services"]]


def served_by(result: dict, index: int, port: int) -> bool:
    return f"{backend_ip(index)}:{port}" in result["served"]


def test_brain_outage_leaves_the_dataplane_alone_and_resyncs_only_differences(
        the_lab: Lab, agent: Agent, tmp_path: Path) -> None:
    v4_only = (WEB_VIPS[0],)
    targets = [t for t in TARGETS if t["host"] != WEB_VIPS[1]]
    with node(the_lab, tmp_path) as n:
        n.state.write(web_and_dns(web=[1, 2, 3], dns=[1, 2], web_vips=v4_only))
        brain = n.start_brain()
        backend = n.start_backend()
        before, written = programmed(n.dump()), map_writes(backend)

        agent.call("loop_start", targets=targets)
        try:
            time.sleep(0.3)
            brain.kill()  # SIGKILL, mid-stream: the backend waits for its next change set
            backend.wait_for_log("watch stream to the brain failed")
            time.sleep(OUTAGE_SECONDS)
        finally:
            outage = agent.call("loop_stop")
        assert backend.popen.poll() is None, "the backend outlives its brain"
        assert map_writes(backend) == written and programmed(n.dump()) == before
        assert_no_failure(outage)

        # Back with one real difference: web's endpoint 3 is replaced by 4.
        n.state.write(web_and_dns(web=[1, 2, 4], dns=[1, 2], web_vips=v4_only))
        agent.call("loop_start", targets=targets)
        try:
            n.start_brain()
            resync = backend.wait_for_log("sync applied", 2)[-1]
            backend_log = backend.stderr()
            time.sleep(0.3)
        finally:
            back = agent.call("loop_stop")
        (web,) = [svc for svc in n.dump()["services"] if svc["port"] == 80]
        resynced = map_writes(backend)
    assert_no_failure(back)
    assert sorted(slot["address"] for slot in web["backends"]) == [
        f"{backend_ip(i)}:8080" for i in (1, 2, 4)]
    assert served_by(back, 4, 8080), back["served"]
    print(f"brain outage: {outage['connects']} connects and {outage['queries']} queries "
          f"while the brain was down, {back['connects']} + {back['queries']} after; entries "
          f"written before: {written}, after the resync: {resynced}")

    # Retries while the brain was gone: 0.1 s, doubling, up to --max-error-delay 1 s,
    # each stretched by the client's upward jitter (logged to the millisecond).
    delays = [float(d) for d in re.findall(r"reconnecting to the brain .*retry_in_s=([\d.]+)",
                                           backend_log)]
    assert len(delays) >= 4, delays
    bases = [min(0.1 * 2 ** i, 1.0) for i in range(len(delays))]
    assert all(base - 0.001 <= delay <= base * (1 + JITTER) + 0.001
               for base, delay in zip(bases, delays)), (delays, bases)
    # The new stream's full state became one incremental update of web, and
    # only what differs was written: endpoint 4 added and 3 deleted (`backends`),
    # 4 in 3's slot (`services`); web's master (3 endpoints) and dns untouched.
    assert "full=False" in resync and "updated=1" in resync and "added=0" in resync, resync
    assert {pin: resynced[pin] - written[pin] for pin in WRITTEN_MAPS} == {
        maps.SERVICES.pin: 1, maps.ENDPOINTS.pin: 2}


def test_backend_killed_while_serving_and_while_starting_fails_nothing_and_adopts_the_maps(
        the_lab: Lab, agent: Agent, tmp_path: Path) -> None:
    with node(the_lab, tmp_path) as n:
        n.state.write(web_and_dns(web=[1, 2, 3], dns=[1, 2]))
        n.start_brain()
        backend = n.start_backend()
        before, links = n.dump(), {link.hook: link for link in pinned_links(the_lab.bpffs_dir)}

        agent.call("loop_start", targets=TARGETS)
        try:
            time.sleep(0.3)
            backend.kill()  # kill -9 while serving
            time.sleep(1.0)  # no process at all: the pinned programs and maps serve on
            starting = n.start_backend(syncs=0)
            starting.wait_for_log("eBPF datapath loaded", seconds=START_SECONDS)
            starting.kill()  # kill -9 while starting (programs loaded, maybe not yet swapped in)
            restarted = n.start_backend()
            time.sleep(0.3)
        finally:
            result = agent.call("loop_stop")
        after = n.dump()
        writes = map_writes(restarted)
        relinked = {link.hook: link for link in pinned_links(the_lab.bpffs_dir)}
    assert_no_failure(result)
    print(f"backend crashes: {result['connects']} connects, {result['queries']} queries, "
          f"none failed; the restart wrote {writes} entries")
    # Adopted without a flush: the same entries and ids, nothing written.
    assert programmed(after) == programmed(before)
    assert {pin: after["maps"][pin] for pin in WRITTEN_MAPS} == {
        pin: before["maps"][pin] for pin in WRITTEN_MAPS}
    assert writes == {maps.SERVICES.pin: 0, maps.ENDPOINTS.pin: 0}
    assert "frontends=3" in restarted.log_lines("recovered the programmed services")[0]
    # The same links, running the same programs: the restarts adopted the
    # pinned build and compiled nothing.
    assert {h: link.link_id for h, link in relinked.items()} == {
        h: link.link_id for h, link in links.items()}
    assert all(relinked[h].prog_id == links[h].prog_id for h in links)
    assert restarted.log_lines("adopted the pinned eBPF programs; nothing compiled")


def extra_service(index: int) -> dict:
    """x<index>: TCP 9090 on three of the lab's servers; needs 4 services entries."""
    return lab_service(f"x{index}", (f"10.96.31.{index + 1}",), TCP, 9090, 9090, [1, 2, 3])


def test_full_maps_skip_the_overflow_and_a_larger_flag_fixes_it_under_traffic(
        the_lab: Lab, agent: Agent, tmp_path: Path) -> None:
    # In name order: dns (1 + 2 entries), web (2 x (1 + 3)), x0 and x1 (4 each)
    # fill 19 of 20 services entries; x2 and x3 do not fit.
    extras = [extra_service(i) for i in range(4)]
    x_targets = [target("tcp", f"10.96.31.{i + 1}", 9090) for i in range(4)]
    with node(the_lab, tmp_path) as n:
        n.state.write(web_and_dns(web=[1, 2, 3], dns=[1, 2], more=extras))
        n.start_brain()
        small = n.start_backend("--map-size-services", "20")
        full = small.log_lines("skipped service port")
        assert small.metric("kpng_py_skipped_total", reason="capacity") == 2
        assert small.metric("kpng_py_map_entries", map=maps.SERVICES.pin) == 19
        # What is not programmed stays in view as long as it lasts (issue 31).
        assert small.metric("kpng_py_service_ports_not_programmed", reason="capacity") == 2
        assert small.metric("kpng_py_service_ports") == 4
        reachable = [agent.call("tcp", host=t["host"], port=t["port"], family=4)["ok"]
                     for t in x_targets]

        agent.call("loop_start", targets=TARGETS + x_targets[:2])
        try:
            time.sleep(0.3)
            small.terminate()
            large = n.start_backend("--map-size-services", "64")
            time.sleep(0.3)
        finally:
            result = agent.call("loop_stop")
        now_reachable = [agent.call("tcp", host=t["host"], port=t["port"], family=4)["ok"]
                         for t in x_targets]
        assert large.metric("kpng_py_skipped_total", reason="capacity") == 0
        assert large.metric("kpng_py_service_ports") == 6
        assert large.metric("kpng_py_service_ports_not_programmed", reason="capacity") == 0
        assert large.metric("kpng_py_map_entries", map=maps.SERVICES.pin) == 27
        assert n.dump()["maps"][maps.SERVICES.pin] == {"entries": 27, "capacity": 64}
        # the datapath's own maps are counted when /metrics is read
        assert large.metric("kpng_py_map_entries", map=maps.REVERSE_NAT.pin) == \
            n.dump()["maps"][maps.REVERSE_NAT.pin]["entries"] > 0
        assert large.log_lines("pinned map does not match; replacing it")

    assert len(full) == 2 and all(
        f"skipped service port default/x{i}:x{i}: map services is full (19 of 20 entries used, "
        "4 more needed); raise --map-size-services" in line for i, line in zip((2, 3), full)), full
    assert reachable == [True, True, False, False]
    assert now_reachable == [True] * 4
    assert_no_failure(result)
    print(f"full maps: 2 service ports skipped at 20 entries; {result['connects']} connects and "
          f"{result['queries']} queries through the resize to 64, none failed")


def test_a_resize_below_what_the_maps_hold_is_refused_and_the_datapath_stays_whole(
        the_lab: Lab, agent: Agent, tmp_path: Path) -> None:
    """Issue 31: a restart with maps smaller than their entries copied them
    in part and swapped the programs in over them (slots pointing at missing
    endpoints, services untranslated). Such a start is refused now, naming
    the sizes needed, and the datapath in force is not touched."""
    with node(the_lab, tmp_path) as n:
        n.state.write(web_and_dns(web=[1, 2, 3], dns=[1, 2]))
        n.start_brain()
        backend = n.start_backend()
        before, links = n.dump(), {link.hook: link for link in pinned_links(the_lab.bpffs_dir)}
        services, endpoints = (before["maps"][pin]["entries"] for pin in WRITTEN_MAPS)
        backend.terminate()

        agent.call("loop_start", targets=TARGETS)
        try:
            time.sleep(0.3)
            refused = n.start_backend("--map-size-services", "8", "--map-size-backends", "4",
                                      syncs=0)
            code = refused.popen.wait(START_SECONDS)
            time.sleep(0.3)
        finally:
            result = agent.call("loop_stop")
        assert code == 2
        assert (f"--map-size-services 8 is below the {services} entries map services holds "
                f"(give at least {services}); --map-size-backends 4 is below the {endpoints} "
                f"entries map backends holds (give at least {endpoints})") in refused.stderr()
        assert "The datapath in force stays as it is" in refused.stderr()
        assert_no_failure(result)
        now = n.dump()
        assert programmed(now) == programmed(before)
        assert {pin: now["maps"][pin] for pin in WRITTEN_MAPS} == {
            pin: before["maps"][pin] for pin in WRITTEN_MAPS}
        after = {link.hook: link for link in pinned_links(the_lab.bpffs_dir)}
        assert after == links  # nothing swapped in

        # The sizes it asked for are enough: that start goes ahead.
        enough = n.start_backend("--map-size-services", str(services),
                                 "--map-size-backends", str(endpoints))
        assert enough.metric("kpng_py_service_ports_not_programmed", reason="capacity") == 0
        assert programmed(n.dump()) == programmed(before)


def test_cleanup_refuses_a_running_backends_datapath_and_a_forced_one_is_put_back(
        the_lab: Lab, agent: Agent, tmp_path: Path) -> None:
    """Issue 31: `ebpf cleanup` while a backend ran removed every link and
    pin, and the backend went on logging `sync applied` with /healthz,
    /livez and every metric green. Now the cleanup is refused while a live
    process owns the datapath; forced, the backend finds what is gone,
    says so, and puts it back with the same contents."""
    with node(the_lab, tmp_path) as n:
        n.state.write(web_and_dns(web=[1, 2, 3], dns=[1, 2]))
        n.start_brain()
        backend = n.start_backend()
        before = programmed(n.dump())
        cleanup = ["ebpf", "cleanup", "--bpffs-dir", str(the_lab.bpffs_dir), "--cgroup",
                   str(the_lab.group.path)]

        agent.call("loop_start", targets=TARGETS)
        try:
            time.sleep(0.3)
            refused = subprocess.run([KPNG_PY, *cleanup], capture_output=True, text=True,
                                     timeout=60)
            time.sleep(0.3)
        finally:
            untouched = agent.call("loop_stop")
        assert refused.returncode == 2
        assert (f"kpng-py: error: the datapath under {the_lab.bpffs_dir} is owned by a running "
                f"kpng-py (pid {backend.pid})") in refused.stderr
        # Another --bpffs-dir with the same --cgroup would detach the running
        # one's links by the cgroup: refused too.
        elsewhere = the_lab.bpffs_dir.with_name(the_lab.bpffs_dir.name + "elsewhere")
        by_cgroup = subprocess.run(
            [KPNG_PY, "ebpf", "cleanup", "--bpffs-dir", str(elsewhere), "--cgroup",
             str(the_lab.group.path)], capture_output=True, text=True, timeout=60)
        assert by_cgroup.returncode == 2
        assert (f"the datapath under {the_lab.bpffs_dir} (attached to --cgroup "
                f"{the_lab.group.path}) is owned by a running kpng-py (pid {backend.pid})"
                ) in by_cgroup.stderr
        assert_no_failure(untouched)

        agent.call("loop_start", targets=TARGETS)
        try:
            forced = subprocess.run([KPNG_PY, *cleanup, "--force"], capture_output=True,
                                    text=True, timeout=60, check=True)
            backend.wait_for_log("the eBPF datapath is whole again")
            time.sleep(0.3)
            healed = agent.call("loop_stop")
            agent.call("loop_start", targets=TARGETS)
            time.sleep(0.5)
        finally:
            after = agent.call("loop_stop")
        (gone,) = backend.log_lines("parts of the eBPF datapath are gone")
        assert f"removed {the_lab.bpffs_dir / 'links' / 'connect4'}" in forced.stdout
        assert_no_failure(after)
        assert programmed(n.dump()) == before
        for part in ("maps", "programs", "links"):
            assert backend.metric("kpng_py_datapath_restored_total", object=part) == 1, part
            assert backend.metric("kpng_py_datapath_missing", object=part) == 0, part
        assert backend.metric("kpng_py_dataplane_errors_total", kind="datapath-restore") == 0
    print(f"forced cleanup under a running backend: {healed['connects']} connects, "
          f"failed until it was put back: {healed['errors']}")
