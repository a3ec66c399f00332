"""A big file's services read by two processes (kpng_py/brain/processes.py):
the same values in the same order as one process reads them, what the read
raises there raised here, and a second process that fails read around."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from kpng_py.brain.plainload import Unchecked
from kpng_py.brain.processes import ReadProcesses, usable_cpus
from kpng_py.runtime.logs import record_fields

TWO = ReadProcesses(2, min_share=2)


def doubled(number: int) -> int:
    return number * 2


def fails_on(item: tuple[str, int]) -> int:
    text, number = item
    if text == "bad":
        raise Unchecked("a bad item")
    return number


def dies_away_from(item: tuple[int, int]) -> int:
    """Ends any process but the test's own (a second process that dies)."""
    first_pid, number = item
    if os.getpid() != first_pid:
        os._exit(3)
    return number


def hangs_away_from(item: tuple[int, str]) -> str:
    """Raises in the test's own process; sleeps anywhere else."""
    first_pid, text = item
    if os.getpid() == first_pid:
        raise Unchecked("this process's share failed")
    time.sleep(60)
    return text


def _share_processes() -> list[str]:
    """This process's children that run processes.py."""
    found = []
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"kpng_py.brain.processes" in cmdline:
                found.append(pid)
    return found


def test_two_processes_read_the_values_one_reads_in_order():
    inputs = list(range(10))
    assert TWO.read_each(doubled, inputs) == [n * 2 for n in range(10)]
    assert inputs == []  # emptied as read


def test_a_share_below_the_minimum_is_read_here_alone(monkeypatch):
    monkeypatch.setattr("kpng_py.brain.processes._SecondProcess", None)  # would fail if used
    assert ReadProcesses(2, min_share=6).read_each(doubled, list(range(10))) == [
        n * 2 for n in range(10)]
    assert ReadProcesses(1, min_share=1).read_each(doubled, [1, 2]) == [2, 4]


def test_what_the_second_process_raises_is_raised_here():
    inputs = [("good", 1), ("good", 2), ("good", 3), ("bad", 4)]
    with pytest.raises(Unchecked, match="a bad item"):
        TWO.read_each(fails_on, inputs)
    assert _share_processes() == []


def test_a_second_process_that_dies_is_read_around(caplog):
    me = os.getpid()
    with caplog.at_level(logging.WARNING, logger="kpng_py.brain.processes"):
        values = TWO.read_each(dies_away_from, [(me, n) for n in range(6)])
    assert values == list(range(6))
    [warning] = caplog.records
    assert "reading them here" in warning.getMessage()
    assert record_fields(warning)["services"] == 3  # 45 % of 6, rounded


def test_the_second_process_is_ended_when_this_ones_share_fails():
    me = os.getpid()
    with pytest.raises(Unchecked, match="this process's share failed"):
        TWO.read_each(hangs_away_from, [(me, str(n)) for n in range(4)])
    assert _share_processes() == []


@pytest.mark.parametrize("cpu_max, limit", [
    ("max 100000\n", None),
    ("150000 100000\n", 2),  # one and a half CPUs: two may run
    ("50000 100000\n", 1),
    ("garbage\n", None),
])
def test_a_cpu_quota_bounds_the_cpus_used(tmp_path, cpu_max, limit):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(path) == (affinity if limit is None else min(affinity, limit))
    assert usable_cpus(tmp_path / "none") == affinity


def test_without_a_second_process_all_is_read_here(monkeypatch, caplog):
    monkeypatch.setattr("sys.executable", "/nonexistent/python")
    with caplog.at_level(logging.WARNING, logger="kpng_py.brain.processes"):
        assert TWO.read_each(doubled, list(range(6))) == [n * 2 for n in range(6)]
    [warning] = caplog.records
    assert "reading them all here" in warning.getMessage()
