"""Addresses and TLS files of both ends of the localv1 stream: what `--api`
dials and `--listen` serves, written the same, and what either refuses
early, naming the flag and the forms it takes."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from kpng_py.transport import AddressError, DialTarget, ListenAddress, TLSFiles, dial_target


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


@pytest.mark.parametrize("listen, cause", [
    ("unix://run/kpng.sock", "use unix:///absolute/path"),
    ("unix:///run/", "give the path of a socket file to create"),
    ("unix:///" + "x" * 107, "a unix socket path has at most 107 bytes"),
])
def test_unix_listen_paths_that_cannot_be_bound_are_refused(listen: str, cause: str) -> None:
    with pytest.raises(AddressError, match=re.escape(f"--listen {listen!r}: {cause}")):
        ListenAddress.parse(listen)


def test_a_tcp_port_in_use_is_refused_before_the_server_starts() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = ListenAddress.parse(f"127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(AddressError, match=f"--listen {re.escape(str(listen))}: .*in use"):
            listen.check()
    listen.check()  # free again


def test_a_unix_listen_address_has_no_tcp_host_and_port() -> None:
    with pytest.raises(AddressError, match="is not a TCP address"):
        ListenAddress.parse("unix:///run/kpng.sock").tcp_host_port()


def test_tls_key_and_certificate_go_together(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(AddressError, match="--tls-key and --tls-crt go together"):
        TLSFiles(key=key).check()


@pytest.mark.parametrize("content, cause", [
    (None, "No such file or directory"),
    ("", "not a PEM file"),
    ("a certificate, in words\n", "not a PEM file"),
])
def test_tls_files_that_are_no_pem_are_refused_naming_the_flag(
        tmp_path: Path, content: str | None, cause: str) -> None:
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_text(content)
    with pytest.raises(AddressError, match=f"--tls-ca {re.escape(str(ca))}: {cause}"):
        TLSFiles(ca=ca).check()


def test_a_tls_file_that_is_no_regular_file_is_refused_unread(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(AddressError, match="--tls-crt /dev/zero: not a regular file"):
        TLSFiles(key=key, cert=Path("/dev/zero")).check()


def test_a_tls_server_needs_its_own_key_and_certificate(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(AddressError, match="a TLS server needs --tls-key and --tls-crt"):
        TLSFiles(ca=ca).server_context()
