"""Pieces of the bench's end-to-end part that need no brain: the one-endpoint
edit of the state file, and following a process's JSON log as it runs."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from bench.e2e_sync import StateFile, moved_state_file_text, state_file_text
from bench.env import Watched
from bench.scenario import Scenario


def endpoint_ips(text: str) -> dict[tuple[str, str], list[str]]:
    body = yaml.safe_load(text)
    return {(entry["service"]["name"], ep["podname"]): ep["endpoint"]["ips"]["v4"]
            for entry in body["services"] for ep in entry["endpoints"]}


def test_the_edit_moves_one_endpoint_of_one_service_under_its_pod_name() -> None:
    scenario = Scenario(40, 3)
    text = state_file_text(scenario)
    before, moved = endpoint_ips(text), endpoint_ips(moved_state_file_text(scenario, text))
    assert before.keys() == moved.keys()
    changed = {key: (before[key], moved[key]) for key in before if before[key] != moved[key]}
    old_port, new_port = scenario.endpoint_moves()
    new_ip = next(str(ep.ip) for ep in new_port.endpoints if ep not in old_port.endpoints)
    assert changed == {(old_port.name.name, "pod-0"): ([str(old_port.endpoints[0].ip)],
                                                       [new_ip])}


def test_the_state_file_is_replaced_on_each_edit_and_moves_back(tmp_path: Path) -> None:
    scenario = Scenario(10, 2)
    state = StateFile(tmp_path / "state.yaml", scenario)
    first = state.path.read_text()
    inode = state.path.stat().st_ino
    state.edit()
    assert state.path.read_text() == moved_state_file_text(scenario, first)
    assert state.path.stat().st_ino != inode  # renamed over, not rewritten in place
    state.edit()
    assert state.path.read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.yaml"]


def test_log_records_are_seen_while_the_process_runs(tmp_path: Path) -> None:
    script = ("import sys, time\n"
              "print('not json', file=sys.stderr, flush=True)\n"
              "print('{\"msg\": \"sync applied\", \"sync\": 1}', file=sys.stderr, flush=True)\n"
              "time.sleep(0.3)\n"
              "print('{\"msg\": \"sync applied\", \"sync\": 2}', file=sys.stderr, flush=True)\n")
    watched = Watched([sys.executable, "-c", script], tmp_path, "proc")
    try:
        first = watched.wait_for(lambda r: r.get("msg") == "sync applied", 30)
        second = watched.wait_for(lambda r: r.get("msg") == "sync applied", 30, skip=1)
        missing = watched.wait_for(lambda r: r.get("sync") == 3, 30)
        done = watched.finish(30)
    finally:
        watched.kill()
    assert first is not None and first[1]["sync"] == 1 and first[0] >= watched.started
    assert second is not None and second[1]["sync"] == 2 and second[0] >= first[0]
    assert missing is None  # the process exited without it
    assert done.returncode == 0 and not done.timed_out and done.peak_rss_mib > 0
    assert [r["sync"] for _, r in watched.records] == [1, 2]
