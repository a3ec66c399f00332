"""The capability check of `to-ebpf`, on /proc/PID/status texts, and the
deployment granting what it checks for."""

from __future__ import annotations

import pytest

from backends.ebpf.datapath.privileges import (
    CAP_NET_ADMIN,
    CAP_SYS_ADMIN,
    CAP_SYS_PTRACE,
    CAP_SYS_RESOURCE,
    check_privileges,
    kernel_version,
    missing,
    required,
)
from kpng_py.dataplane.contract import BackendSetupError
from tests.support.deploy import daemonset_containers

ROOT_CAPS = 0x000001FFFFFFFFFF


def status(cap_eff: int) -> str:
    return f"Name:\tkpng-py\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff:016x}\n"


def test_root_has_everything_on_any_kernel() -> None:
    check_privileges(status(ROOT_CAPS), "6.1.0-18-amd64")
    check_privileges(status(ROOT_CAPS), "5.4.0")


def test_each_missing_capability_is_named_with_its_use() -> None:
    without = ROOT_CAPS & ~(1 << CAP_SYS_PTRACE.bit) & ~(1 << CAP_NET_ADMIN.bit)
    with pytest.raises(BackendSetupError) as refused:
        check_privileges(status(without), "6.18.0")
    message = str(refused.value)
    assert "CAP_NET_ADMIN (cgroup sock_addr programs" in message
    assert "CAP_SYS_PTRACE (reading the network namespace" in message
    assert "CAP_SYS_ADMIN (" not in message
    assert "It needs CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_SYS_PTRACE" in message


def test_old_kernels_also_need_sys_resource_for_memlock() -> None:
    assert CAP_SYS_RESOURCE not in required((6, 1))
    assert missing(1 << CAP_SYS_ADMIN.bit | 1 << CAP_NET_ADMIN.bit | 1 << CAP_SYS_PTRACE.bit,
                   (5, 10)) == [CAP_SYS_RESOURCE]


def test_kernel_versions_and_unreadable_status() -> None:
    assert kernel_version("6.18.0-rc1+") == (6, 18)
    assert kernel_version("weird") == (0, 0)
    with pytest.raises(BackendSetupError, match="no CapEff line"):
        check_privileges("Name:\tx\n", "6.1.0")


def test_the_daemonset_grants_every_capability_checked_for() -> None:
    granted = set(daemonset_containers()["kpng-py"]["securityContext"]["capabilities"]["add"])
    assert {cap.name.removeprefix("CAP_") for cap in required((5, 4))} <= granted
