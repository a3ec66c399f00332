"""Addresses and TLS files of both ends of the localv1 stream: what `--api`
dials and `--listen` serves, written the same, and what either refuses
early, naming the flag and the forms it takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kpng_py.transport import AddressError, DialTarget, ListenAddress, dial_target


@pytest.mark.parametrize("target, expected", [
    ("unix:///run/kpng.sock", DialTarget(unix_path="/run/kpng.sock")),
    ("unix:relative.sock", DialTarget(unix_path="relative.sock")),
    ("127.0.0.1:12090", DialTarget(host="127.0.0.1", port=12090)),
    ("[::1]:12090", DialTarget(host="::1", port=12090)),
    ("dns:///brain.kube-system:12090", DialTarget(host="brain.kube-system", port=12090)),
    ("dns://10.0.0.10/brain:1", DialTarget(host="brain", port=1)),
    ("brain", DialTarget(host="brain", port=443)),
])
def test_dial_targets_as_grpc_reads_them(target: str, expected: DialTarget) -> None:
    assert DialTarget.parse(target) == expected


@pytest.mark.parametrize("api", ["x:0", "x:65536", ":12090", "unix:", "dns:///:1"])
def test_dial_targets_that_cannot_be_dialled_are_refused_early(api: str) -> None:
    with pytest.raises(AddressError, match=f"--api '{api}'"):
        dial_target(api)


@pytest.mark.parametrize("address, host, port", [
    ("127.0.0.1:12090", "127.0.0.1", 12090),
    ("tcp://127.0.0.1:12090", "127.0.0.1", 12090),
    ("[::1]:12090", "::1", 12090),
    ("tcp://[::1]:12090", "::1", 12090),
    ("localhost:1", "localhost", 1),
])
def test_api_and_listen_take_the_same_tcp_addresses(address: str, host: str, port: int) -> None:
    """What `--api` dials is what `--listen` serves, written the same."""
    assert DialTarget.parse(dial_target(address)) == DialTarget(host=host, port=port)
    assert ListenAddress.parse(address).tcp_host_port() == (host, port)


def test_api_and_listen_take_the_same_unix_sockets() -> None:
    assert DialTarget.parse(dial_target("unix:///run/kpng.sock")).unix_path == "/run/kpng.sock"
    assert ListenAddress.parse("unix:///run/kpng.sock").unix_path == Path("/run/kpng.sock")


@pytest.mark.parametrize("listen", [":12090", "tcp://:12090"])
def test_a_listen_address_without_a_host_is_every_address(listen: str) -> None:
    assert ListenAddress.parse(listen).tcp_host_port() == ("::", 12090)


@pytest.mark.parametrize("listen", ["x", "x:", "x:65536", "http://x:1", "12090", "unix:/x"])
def test_listen_addresses_that_cannot_be_served_are_refused_with_the_forms(listen: str) -> None:
    with pytest.raises(AddressError, match=re.escape(
            f"--listen {listen!r}: use unix:///path/to.sock, tcp://host:port or host:port")):
        ListenAddress.parse(listen)
