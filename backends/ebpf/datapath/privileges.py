"""The capabilities `to-ebpf` needs, checked before anything is touched.

Without them the backend would fail half-way: after creating its bpffs
directory (no CAP_BPF), after loading but at attach time (no CAP_NET_ADMIN),
or, worse, much later and only for UDP clean-up (no CAP_SYS_ADMIN to enter a
pod's network namespace). So `setup` reads the effective set from
/proc/self/status first and refuses to start, naming each missing capability
and what it is for.

CAP_SYS_ADMIN includes what CAP_BPF and CAP_PERFMON grant for BPF (the
kernel's bpf_capable() and perfmon_capable()), so they are not listed
separately.
"""

from __future__ import annotations

import errno
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from kpng_py.dataplane.contract import BackendSetupError

PROC_STATUS = Path("/proc/self/status")
# Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK instead of the memory cgroup.
MEMCG_ACCOUNTING = (5, 11)


@dataclass(frozen=True)
class Capability:
    name: str
    bit: int           # its number in <linux/capability.h>
    needed_for: str


CAP_NET_ADMIN = Capability("CAP_NET_ADMIN", 12,
                           "cgroup sock_addr programs and destroying stale UDP sockets")
CAP_SYS_PTRACE = Capability("CAP_SYS_PTRACE", 19,
                            "reading the network namespace of other users' processes")
CAP_SYS_ADMIN = Capability("CAP_SYS_ADMIN", 21,
                           "BPF programs and maps, and entering pods' network namespaces")
CAP_SYS_RESOURCE = Capability("CAP_SYS_RESOURCE", 24,
                              "raising RLIMIT_MEMLOCK for BPF maps on kernels before 5.11")


def required(kernel: tuple[int, int]) -> tuple[Capability, ...]:
    needed = (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_SYS_PTRACE)
    return needed + ((CAP_SYS_RESOURCE,) if kernel < MEMCG_ACCOUNTING else ())


def effective_capabilities(status: str) -> int:
    """The CapEff bit mask of a /proc/PID/status text."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status, re.MULTILINE)
    if match is None:
        raise BackendSetupError("cannot read the effective capabilities (no CapEff line in "
                                f"{PROC_STATUS})")
    return int(match.group(1), 16)


def kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a `uname -r` string such as 6.1.0-18-amd64."""
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def missing(effective: int, kernel: tuple[int, int]) -> list[Capability]:
    return [cap for cap in required(kernel) if not effective >> cap.bit & 1]


def check_privileges(status: str | None = None, release: str | None = None) -> None:
    """Refuse to start without every capability the datapath needs."""
    kernel = kernel_version(release or platform.release())
    lacking = missing(effective_capabilities(status or PROC_STATUS.read_text()), kernel)
    if not lacking:
        return
    reasons = "; ".join(f"{cap.name} ({cap.needed_for})" for cap in lacking)
    raise BackendSetupError(
        f"to-ebpf lacks capabilities it needs: {reasons}. It needs "
        f"{', '.join(cap.name for cap in required(kernel))}: run it as root, or grant them "
        "(securityContext.capabilities.add, docs/deploy.md)")


def privilege_hint(err: OSError) -> str:
    """What to add to the message of a failed system call: " (needs root)"
    when permission was refused, nothing otherwise (the error says it all)."""
    return " (needs root)" if err.errno in (errno.EPERM, errno.EACCES) else ""
