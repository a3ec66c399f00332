"""The flags of `to-ebpf` and `kpng-py ebpf cleanup|dump|trace`
(backends/ebpf/cli.py) as parsed, no root: map sizes, the --service and
--vip filters and the --wait duration; a bad value exits 2 with one line
naming it and the form wanted. The path checks: tests/kernel/ebpf/test_cli.py."""

from __future__ import annotations

import argparse
import ipaddress

import pytest

from backends.ebpf.cli import BACKEND
from backends.ebpf.maps.layout import SIZED_SPECS


def backend_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kpng-py to-ebpf")
    BACKEND.add_arguments(parser)
    return parser.parse_args(argv)


def tool_args(*argv: str) -> argparse.Namespace:
    assert BACKEND.tool is not None
    parser = argparse.ArgumentParser(prog="kpng-py ebpf")
    BACKEND.tool.add_arguments(parser)
    return parser.parse_args(argv)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The error line of `kpng-py ebpf ARGV`, which must exit 2."""
    with pytest.raises(SystemExit) as exited:
        tool_args(*argv)
    assert exited.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    return line


def test_every_map_has_its_size_flag_with_its_default() -> None:
    args = backend_args("--map-size-services", "20")
    assert args.map_size_services == 20
    for spec in SIZED_SPECS:
        if spec.pin != "services":
            assert getattr(args, f"map_size_{spec.pin}") == spec.default_size


@pytest.mark.parametrize("entries", ["0", "4294967296", "-1", "1e3", "ten"])
def test_a_map_size_out_of_range_is_refused(capsys: pytest.CaptureFixture[str],
                                            entries: str) -> None:
    with pytest.raises(SystemExit):
        backend_args("--map-size-services", entries)
    assert (f"argument --map-size-services: {entries!r} is not a number of map entries "
            "(1 to 4294967295)") in capsys.readouterr().err


@pytest.mark.parametrize("given, wanted", [
    ("10.96.0.10", (ipaddress.ip_address("10.96.0.10"), None)),
    ("10.96.0.10:80", (ipaddress.ip_address("10.96.0.10"), 80)),
    ("fd00::10", (ipaddress.ip_address("fd00::10"), None)),
    ("[fd00::10]", (ipaddress.ip_address("fd00::10"), None)),
    ("[fd00::10]:53", (ipaddress.ip_address("fd00::10"), 53)),
])
def test_a_vip_filter_is_an_address_and_maybe_a_port(
        given: str, wanted: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int | None],
) -> None:
    assert tool_args("dump", "--vip", given).vip == wanted
    assert tool_args("trace", "--vip", given).vip == wanted


@pytest.mark.parametrize("given", ["10.96.0.10:0", "10.96.0.10:65536", "10.96.0.10:http",
                                   "[fd00::10]:", "[fd00::10]53", "[fd00::10", "web",
                                   "10.96.0.10:80:1", "[10.96.0.10]:80"])
def test_a_bad_vip_filter_is_refused(capsys: pytest.CaptureFixture[str], given: str) -> None:
    assert refusal(capsys, "dump", "--vip", given).endswith(
        f"argument --vip: {given!r} is not IP, IP:PORT or [IPV6]:PORT (e.g. 10.96.0.10:80)")


@pytest.mark.parametrize("given", ["default/web", "default/web:http", "kube-system/dns:53"])
def test_a_service_filter_is_namespace_name_and_maybe_a_port(given: str) -> None:
    assert tool_args("dump", "--service", given).service == given


@pytest.mark.parametrize("given", ["web", "Default/web", "default/web:", "default/-web",
                                   "default/web:http:1"])
def test_a_bad_service_filter_is_refused(capsys: pytest.CaptureFixture[str], given: str) -> None:
    assert refusal(capsys, "trace", "--service", given).endswith(
        f"argument --service: {given!r} is not NAMESPACE/NAME or NAMESPACE/NAME:PORT "
        "(e.g. default/web:http)")


@pytest.mark.parametrize("given, seconds", [("0", 0.0), ("30s", 30.0), ("1m30s", 90.0),
                                            ("2.5", 2.5)])
def test_cleanup_waits_a_duration_in_seconds_or_go_form(given: str, seconds: float) -> None:
    assert tool_args("cleanup", "--wait", given).wait == seconds


def test_a_negative_wait_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(capsys, "cleanup", "--wait=-2s").endswith(
        "argument --wait: '-2s' is below 0 seconds")
