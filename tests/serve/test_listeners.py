"""The sockets a localv1 server listens on: a unix socket bound owner-only at
a staging name and published in one step, removed only while it is still
ours; TCP bound as grpcio binds it."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from kpng_py.serve.listeners import bind_tcp, bind_unix, publish_socket, remove_if_same
from kpng_py.transport import AddressError, ListenAddress


def test_a_unix_socket_is_bound_owner_only_beside_its_path_in_a_new_directory(
        socket_dir: Path) -> None:
    path = socket_dir / "run" / "brain.sock"
    sock, staging = bind_unix(path)
    with sock:
        assert staging.parent == path.parent and staging != path and not path.exists()
        assert stat.S_IMODE(os.lstat(staging).st_mode) == 0o600
        published = publish_socket(staging, path)
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and not staging.exists()
        remove_if_same(published)
    assert not path.exists()


def test_a_stale_socket_is_replaced_when_the_new_one_is_published(socket_dir: Path) -> None:
    path = socket_dir / "brain.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))  # bound, never listening: nobody answers there
    stale_inode = os.lstat(path).st_ino
    sock, staging = bind_unix(path)
    with sock:
        published = publish_socket(staging, path)
    assert published.inode != stale_inode
    assert os.lstat(path).st_ino == published.inode


@pytest.mark.parametrize("occupant, error", [
    ("listening", "is in use by a running server; stop it or pick another path"),
    ("file", "exists and is not a socket; remove it or pick another path"),
])
def test_a_live_socket_or_another_file_is_left_alone(socket_dir: Path, occupant: str,
                                                     error: str) -> None:
    path = socket_dir / "brain.sock"
    with socket.socket(socket.AF_UNIX) as live:
        if occupant == "listening":
            live.bind(str(path))
            live.listen()
        else:
            path.write_text("not a socket")
        with pytest.raises(AddressError, match=f"{path} {error}"):
            bind_unix(path)
    assert list(socket_dir.iterdir()) == [path]  # no staging socket left behind


def test_a_successors_socket_is_not_removed(socket_dir: Path) -> None:
    path = socket_dir / "brain.sock"
    old_sock, old_staging = bind_unix(path)
    new_sock, new_staging = bind_unix(path)
    with old_sock, new_sock:
        old = publish_socket(old_staging, path)
        new = publish_socket(new_staging, path)
        remove_if_same(old)
        assert os.lstat(path).st_ino == new.inode
        remove_if_same(new)
    assert not path.exists()


def test_every_address_is_one_dual_stack_socket() -> None:
    (sock,) = bind_tcp(ListenAddress.parse(":0"))
    with sock:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1


def test_a_name_is_bound_at_each_of_its_addresses_on_the_first_ones_port() -> None:
    sockets = bind_tcp(ListenAddress.parse("localhost:0"))
    try:
        ports = {sock.getsockname()[1] for sock in sockets}
        assert len(ports) == 1 and ports != {0}
    finally:
        for sock in sockets:
            sock.close()


def test_a_tcp_port_in_use_or_a_name_that_does_not_resolve_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = ListenAddress.parse(f"127.0.0.1:{taken.getsockname()[1]}")
        with pytest.raises(AddressError, match=f"cannot listen on {busy}: .*pick another"):
            bind_tcp(busy)
    with pytest.raises(AddressError, match="cannot resolve 'nowhere.invalid'"):
        bind_tcp(ListenAddress.parse("nowhere.invalid:1"))
