"""The stale-UDP clean-up reports a namespace it cannot check once, and counts
every failure (no root needed: the namespaces are this process's own)."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from pathlib import Path

import pytest

from backends.ebpf.maps.contents import HostPort
from backends.ebpf.maps.layout import RevNatKey, RevNatValue
from backends.ebpf.stale_udp import NETLINK_SOCK_DIAG, StaleUdpTerminator
from tests.support.fake_maps import FakeMap

REMOVED = [(7, HostPort(ipaddress.ip_address("10.1.0.1"), 53))]


class Count:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


class FlakyNamespaces:
    """Refuses to enter a namespace while `refusing` is set (as a pod going
    away does); otherwise opens a real sock_diag socket in this process's own
    namespace (dumping needs no privilege)."""

    def __init__(self) -> None:
        self.refusing = True

    def __call__(self, netns: Path) -> socket.socket:
        if self.refusing:
            raise OSError(errno.ENOENT, f"setns {netns}: No such file or directory")
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)


def a_cgroup_of_this_process(tmp_path: Path) -> Path:
    (tmp_path / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return tmp_path


def terminator(tmp_path: Path, failures: Count, opener: FlakyNamespaces) -> StaleUdpTerminator:
    reverse_nat = FakeMap(RevNatKey, RevNatValue, 16, "kpng_revnat")
    return StaleUdpTerminator(a_cgroup_of_this_process(tmp_path), reverse_nat, failures, opener)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_namespace_that_keeps_failing_is_warned_about_once_and_counted_each_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    failures, opener = Count(), FlakyNamespaces()
    stale = terminator(tmp_path, failures, opener)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert stale.terminate(REMOVED) == 0
    assert failures.value == 3
    assert len(warnings_of(caplog)) == 1
    assert "udp-socket-termination" in warnings_of(caplog)[0]


def test_a_namespace_is_warned_about_again_after_a_check_of_it_succeeded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    failures, opener = Count(), FlakyNamespaces()
    stale = terminator(tmp_path, failures, opener)
    with caplog.at_level(logging.WARNING):
        stale.terminate(REMOVED)
        opener.refusing = False
        assert stale.terminate(REMOVED) == 0  # checked: no socket of ours reached 10.1.0.1
        opener.refusing = True
        stale.terminate(REMOVED)
    assert failures.value == 2
    assert len(warnings_of(caplog)) == 2
