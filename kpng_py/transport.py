"""Addresses and TLS for both ends of the localv1 stream.

Both ends take the same forms (ADDRESS_FORMS): `unix:///path/to.sock`,
`tcp://host:port` (as KPNG's brain listens) and `host:port` (as KPNG's client
dials, a gRPC target), `[v6]:port` for IPv6. A listen address may leave the
host out (`:12090`, `tcp://:12090`: every address); a dial target may also be
any other gRPC target KPNG's client takes (`dns:///host:port`, `unix:path`).
"""

from __future__ import annotations

import os
import socket
import ssl
import stat
from dataclasses import dataclass
from pathlib import Path

from kpng_py.model import MAX_PORT

# sun_path holds 108 bytes, the last one a NUL.
MAX_UNIX_PATH = 107
# What --api and --listen both take, for their help and their errors.
ADDRESS_FORMS = "unix:///path/to.sock, tcp://host:port or host:port ([v6]:port for IPv6)"


class AddressError(ValueError):
    pass


@dataclass(frozen=True)
class ListenAddress:
    """Where a server listens: a unix socket path, or host:port."""

    unix_path: Path | None = None
    host_port: str | None = None

    @classmethod
    def parse(cls, spec: str) -> ListenAddress:
        if spec.startswith("unix://"):
            path = spec[len("unix://"):]
            if not path.startswith("/"):
                raise AddressError(f"--listen {spec!r}: use unix:///absolute/path")
            if path.endswith("/") or "\0" in path:
                raise AddressError(f"--listen {spec!r}: give the path of a socket file to create")
            if len(os.fsencode(path)) > MAX_UNIX_PATH:
                raise AddressError(f"--listen {spec!r}: a unix socket path has at most "
                                   f"{MAX_UNIX_PATH} bytes; pick a shorter one")
            return cls(unix_path=Path(path))
        scheme, sep, rest = spec.partition("://")
        if sep and scheme != "tcp":
            raise AddressError(f"--listen {spec!r}: use {ADDRESS_FORMS}")
        host, port = _host_port(rest if sep else spec)
        if port is None:
            raise AddressError(f"--listen {spec!r}: use {ADDRESS_FORMS}, with a port in "
                               f"0..{MAX_PORT} (e.g. 127.0.0.1:12090; :12090 for every address)")
        return cls(host_port=f"{host or '[::]'}:{port}")

    def check(self) -> None:
        """Fail early, naming the flag and the cause, if a TCP address cannot
        be bound (in use, not an address of this host, not permitted). A
        unix socket's path is checked by the server (a live socket is not
        stolen, a stale one is replaced)."""
        if self.host_port is None:
            return
        host, port = self.tcp_host_port()
        try:
            candidates = socket.getaddrinfo(host or None, port,
                                            type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as err:
            raise AddressError(
                f"--listen {self}: cannot resolve {host!r} ({err.strerror})") from err
        failure = "it resolves to no address"
        for family, kind, proto, _, address in candidates:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc's own
                try:
                    probe.bind(address)
                    return
                except OSError as err:
                    failure = err.strerror or str(err)
        raise AddressError(f"--listen {self}: {failure}; pick another address or port")

    def tcp_host_port(self) -> tuple[str, int]:
        """The host (an address without brackets, a name, or "" for any) and
        port of a tcp:// address."""
        if self.host_port is None:
            raise AddressError(f"--listen {self} is not a TCP address; use tcp://host:port")
        host, _, port = self.host_port.rpartition(":")
        return host.strip("[]"), int(port)

    def __str__(self) -> str:
        return f"unix://{self.unix_path}" if self.unix_path else f"tcp://{self.host_port}"


# The schemes `--api` takes (KPNG's: grpc-go's unix and dns, and tcp://).
DIAL_SCHEMES = ("unix", "dns", "tcp")


def dial_target(api: str) -> str:
    """A gRPC target for `--api`, checked by `DialTarget.parse`."""
    if not api:
        raise AddressError(f"--api is empty: give {ADDRESS_FORMS}")
    if not api.isprintable() or any(c.isspace() for c in api):
        raise AddressError(f"--api {api!r}: a gRPC target has no spaces or control characters")
    scheme, sep, _ = api.partition("://")
    if sep and scheme not in DIAL_SCHEMES:
        raise AddressError(f"--api {api!r}: unknown scheme {scheme}://; use {ADDRESS_FORMS} "
                           "(or dns:///host:port)")
    if api.startswith("tcp://"):
        host, port = _host_port(api[len("tcp://"):])
        if not host or port is None:
            raise AddressError(f"--api {api!r}: use tcp://host:port with a port in 1..{MAX_PORT}")
        api = f"{host}:{port}"
    if api.startswith("unix://") and not api.startswith("unix:///"):
        raise AddressError(f"--api {api!r}: use unix:///absolute/path")
    DialTarget.parse(api)
    return api


_DEFAULT_PORT = 443


@dataclass(frozen=True)
class DialTarget:
    """Where the watch client connects: a unix socket path, or host and port.
    Parsed from the gRPC target forms KPNG's client takes: `unix:///path`,
    `unix:path`, `dns:///host:port`, `host:port`, `[v6]:port`."""

    unix_path: str | None = None
    host: str | None = None
    port: int = _DEFAULT_PORT

    @classmethod
    def parse(cls, target: str) -> DialTarget:
        if target.startswith("unix:"):
            path = target[len("unix:"):]
            if path.startswith("//"):
                path = path[len("//"):]
            if not path:
                raise AddressError(f"--api {target!r}: use unix:///absolute/path")
            return cls(unix_path=path)
        authority = target.removeprefix("dns:")
        if authority.startswith("//"):  # dns://[dns-server]/host:port
            authority = authority[len("//"):].partition("/")[2]
        port: int | None = _DEFAULT_PORT  # when none is given, as grpc's resolver
        host = authority
        if ":" in authority and not authority.endswith("]"):
            host, port = _host_port(authority)
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port:
            raise AddressError(f"--api {target!r}: use unix:///path or host:port with a port "
                               f"in 1..{MAX_PORT}")
        return cls(host=host, port=port)

    @property
    def tls_server_name(self) -> str:
        """The name a TLS server's certificate is checked against (for a
        unix socket, `localhost`, as grpc's)."""
        return self.host or "localhost"


def _host_port(text: str) -> tuple[str, int | None]:
    """`host:port` split; the port is None unless it is a number in 0..MAX_PORT."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > MAX_PORT:
        return host, None
    return host, int(port)


@dataclass(frozen=True)
class TLSFiles:
    """KPNG's TLS flags: --tls-key, --tls-crt, --tls-ca (all optional)."""

    key: Path | None = None
    cert: Path | None = None
    ca: Path | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.key or self.cert or self.ca)

    def check(self) -> None:
        """Fail early, naming the flag, if the files are missing or unpaired."""
        self._read()

    def _read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        if bool(self.key) != bool(self.cert):
            raise AddressError("--tls-key and --tls-crt go together: give both or neither")

        def read(path: Path | None, flag: str) -> bytes | None:
            if path is None:
                return None
            try:
                if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block, /dev/zero never end
                    raise AddressError(f"{flag} {path}: not a regular file; give a PEM file")
                content = path.read_bytes()
            except OSError as err:
                raise AddressError(f"{flag} {path}: {err.strerror}") from err
            if b"-----BEGIN " not in content:
                raise AddressError(f"{flag} {path}: not a PEM file (no -----BEGIN line)")
            return content

        return read(self.key, "--tls-key"), read(self.cert, "--tls-crt"), read(self.ca, "--tls-ca")

    def client_context(self) -> ssl.SSLContext:
        """The watch client's TLS: the server's certificate checked against
        --tls-ca (or the system's CAs), and --tls-crt/--tls-key presented
        when given; HTTP/2 negotiated with ALPN, as gRPC requires."""
        _, _, ca = self._read()
        try:
            context = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH, cadata=ca.decode("ascii", "replace") if ca else None)
        except ssl.SSLError as err:
            raise AddressError(f"--tls-ca {self.ca}: not a CA certificate ({err})") from err
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["h2"])
        if self.cert is not None and self.key is not None:
            try:
                context.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as err:
                raise AddressError(f"--tls-crt {self.cert} / --tls-key {self.key}: not a "
                                   f"certificate and its key ({err})") from err
        return context

    def server_context(self) -> ssl.SSLContext:
        """The server's TLS: TLS 1.2 or later, ALPN h2 (gRPC clients insist on
        it); with a CA, clients must present a certificate signed by it."""
        _, _, ca = self._read()  # every file checked: regular, PEM, key and cert paired
        if self.key is None or self.cert is None:
            raise AddressError("a TLS server needs --tls-key and --tls-crt")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["h2"])
        try:
            context.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as err:
            raise AddressError(f"--tls-crt {self.cert} and --tls-key {self.key}: not a "
                               f"certificate and its key ({err})") from err
        if ca is not None:
            try:
                context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
            except ssl.SSLError as err:
                raise AddressError(f"--tls-ca {self.ca}: no CA certificate in it ({err})") from err
            context.verify_mode = ssl.CERT_REQUIRED
        return context
