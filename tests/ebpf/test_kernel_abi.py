"""Every kernel number and layout the eBPF backend copies by hand is what the
kernel's uapi headers say (linux-libc-dev, from hack/setup.sh): the bpf_*_info
prefixes, link, map and attach types, map flags, the sock_diag netlink
messages and the capability bits. Needs gcc, not root.

The Python definitions stay the only ones the backend uses; this test names
the C member or constant each of them copies."""

from __future__ import annotations

import ctypes as ct
from pathlib import Path

import pytest

from backends.ebpf import stale_udp
from backends.ebpf.datapath import privileges
from backends.ebpf.datapath.loader import HOOKS, AttachType
from backends.ebpf.maps import layout as maps
from backends.ebpf.maps import libbpf
from kpng_py.node import netns
from tests.support.c_layout import (
    Check,
    assert_matches_c,
    constants,
    ctypes_members,
    packed_members,
)

BPF_HEADERS = ["<linux/bpf.h>"]
DIAG_HEADERS = ["<sys/socket.h>", "<netinet/tcp.h>", "<linux/netlink.h>", "<linux/sock_diag.h>",
                "<linux/inet_diag.h>", "<linux/sched.h>"]


def test_bpf_info_structs_are_prefixes_of_the_kernels(tmp_path: Path) -> None:
    assert_matches_c(tmp_path, BPF_HEADERS, [
        *ctypes_members("struct bpf_map_info", libbpf.MapInfo, exact=False),
        *ctypes_members("struct bpf_link_info", libbpf.LinkInfo, exact=False),
        *ctypes_members("struct bpf_prog_info", libbpf.ProgInfo, exact=False),
    ])


def test_bpf_numbers_are_the_kernels(tmp_path: Path) -> None:
    assert_matches_c(tmp_path, BPF_HEADERS, constants({
        "BPF_LINK_TYPE_CGROUP": libbpf.BPF_LINK_TYPE_CGROUP,
        "BPF_MAP_TYPE_HASH": maps.BPF_MAP_TYPE_HASH,
        "BPF_MAP_TYPE_PERCPU_HASH": maps.BPF_MAP_TYPE_PERCPU_HASH,
        "BPF_MAP_TYPE_LRU_HASH": maps.BPF_MAP_TYPE_LRU_HASH,
        "BPF_MAP_TYPE_ARRAY": maps.BPF_MAP_TYPE_ARRAY,
        "BPF_MAP_TYPE_RINGBUF": maps.BPF_MAP_TYPE_RINGBUF,
        "BPF_F_NO_PREALLOC": maps.BPF_F_NO_PREALLOC,
        **{member.name: member.value for member in AttachType},
    }))


def test_every_hook_attaches_with_a_checked_attach_type() -> None:
    assert all(isinstance(hook.attach_type, AttachType) for hook in HOOKS)
    assert len({hook.attach_type for hook in HOOKS}) == len(HOOKS)


def test_sock_diag_messages_are_packed_as_the_kernel_lays_them_out(tmp_path: Path) -> None:
    sockid, cookie_at = "struct inet_diag_sockid", stale_udp._SOCKID_SIZE - stale_udp._COOKIE.size
    assert_matches_c(tmp_path, DIAG_HEADERS, [
        *packed_members("struct nlmsghdr", stale_udp._NLMSGHDR,
                        ["nlmsg_len", "nlmsg_type", "nlmsg_flags", "nlmsg_seq", "nlmsg_pid"]),
        Check("struct nlmsghdr size", "sizeof(struct nlmsghdr)", stale_udp._NLMSGHDR.size),
        *packed_members("struct inet_diag_req_v2", stale_udp._REQ_HEAD,
                        ["sdiag_family", "sdiag_protocol", "idiag_ext", "idiag_states"]),
        Check("struct inet_diag_req_v2 id offset", "offsetof(struct inet_diag_req_v2, id)",
              stale_udp._REQ_HEAD.size),
        Check("struct inet_diag_req_v2 size", "sizeof(struct inet_diag_req_v2)",
              stale_udp._REQ_HEAD.size + stale_udp._SOCKID_SIZE),
        *packed_members(sockid, stale_udp._SOCKID,
                        ["idiag_sport", "idiag_dport", "idiag_src", "idiag_dst"]),
        *packed_members(sockid, stale_udp._COOKIE, ["idiag_cookie[0]", "idiag_cookie[1]"],
                        base=cookie_at),
        Check(f"{sockid} size", f"sizeof({sockid})", stale_udp._SOCKID_SIZE),
        *packed_members("struct inet_diag_msg", stale_udp._MSG_HEAD,
                        ["idiag_family", "idiag_state", "idiag_timer", "idiag_retrans"]),
        Check("struct inet_diag_msg id offset", "offsetof(struct inet_diag_msg, id)",
              stale_udp._MSG_HEAD.size),
    ])


def test_sock_diag_numbers_are_the_kernels(tmp_path: Path) -> None:
    assert_matches_c(tmp_path, DIAG_HEADERS, constants({
        name: getattr(stale_udp, name)
        for name in ("NETLINK_SOCK_DIAG", "SOCK_DIAG_BY_FAMILY", "SOCK_DESTROY", "NLM_F_REQUEST",
                     "NLM_F_ACK", "NLM_F_DUMP", "NLMSG_ERROR", "NLMSG_DONE", "TCP_ESTABLISHED")
    } | {"CLONE_NEWNET": netns.CLONE_NEWNET}))


def test_capability_bits_are_the_kernels(tmp_path: Path) -> None:
    checked = (privileges.CAP_NET_ADMIN, privileges.CAP_SYS_PTRACE, privileges.CAP_SYS_ADMIN,
               privileges.CAP_SYS_RESOURCE)
    assert {cap for kernel in ((5, 10), (6, 1)) for cap in privileges.required(kernel)} <= set(
        checked)
    assert_matches_c(tmp_path, ["<linux/capability.h>"],
                     constants({cap.name: cap.bit for cap in checked}))


def test_a_wrong_copy_fails_the_comparison(tmp_path: Path) -> None:
    """The comparison itself can fail: a mirror with two fields swapped."""

    class Swapped(ct.Structure):
        _fields_ = [("id", ct.c_uint32), ("type", ct.c_uint32)]

    checks = ctypes_members("struct bpf_map_info", Swapped, exact=False)
    with pytest.raises(AssertionError, match="struct bpf_map_info id offset"):
        assert_matches_c(tmp_path, BPF_HEADERS, checks)
