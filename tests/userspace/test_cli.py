"""`to-userspace` flags (no root needed)."""

from __future__ import annotations

import ipaddress

import pytest

from backends.userspace.context import ProxyConfig
from kpng_py.cmd.cli import build_parser


def _parse(*flags: str):
    return build_parser().parse_args(["local", "--api", "unix:///x.sock", "to-userspace", *flags])


def test_defaults():
    args = _parse()
    assert args.backend == "to-userspace"
    assert (args.interface, args.udp_idle_timeout) == ("kpng-py0", 40.0)
    assert args.tcp_pipe_size == ProxyConfig().pipe_size


def test_flags_reach_the_config():
    from backends.userspace import cli
    from kpng_py.metrics.metrics import Metrics

    args = _parse("--interface", "kp-test0", "--udp-idle-timeout", "5", "--tcp-connect-timeout",
                  "0.5", "--tcp-connect-attempts", "2", "--tcp-pipe-size", "256K",
                  "--cluster-cidr", "10.244.0.0/16, fd00:10:244::/56")
    backend = cli.create(args, Metrics())
    backend.close()  # never set up: nothing to undo but its event loop
    assert backend.config == ProxyConfig(
        interface="kp-test0", udp_idle_timeout=5.0, tcp_connect_timeout=0.5,
        tcp_connect_attempts=2, pipe_size=256 << 10,
        cluster_cidrs=(ipaddress.ip_network("10.244.0.0/16"),
                       ipaddress.ip_network("fd00:10:244::/56")))


@pytest.mark.parametrize("flags, message", [
    (("--interface", "a-name-much-too-long"), "not an interface name"),
    (("--interface", "a/b"), "not an interface name"),
    (("--udp-idle-timeout", "0"), "must be more than 0 seconds"),
    (("--tcp-connect-attempts", "0"), "number of attempts from 1 to 16"),
    (("--tcp-pipe-size", "1K"), "pipe size from 4K to 64M"),
    (("--cluster-cidr", "10.244.0.0/16,pods"), "'pods' is not a CIDR"),
])
def test_bad_values_name_the_flag_and_the_fix(capsys, flags, message):
    with pytest.raises(SystemExit):
        _parse(*flags)
    err = capsys.readouterr().err
    assert flags[0] in err and message in err
