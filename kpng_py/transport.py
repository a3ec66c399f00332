"""Addresses and TLS for both ends of the localv1 stream.

Listen specs follow KPNG's brain (`unix:///path`, `tcp://host:port`); dial
targets follow KPNG's client (a gRPC target such as `unix:///k8s/proxy.sock`
or `127.0.0.1:12090`; `tcp://host:port` is accepted too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


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
                raise AddressError(f"listen address {spec!r}: use unix:///absolute/path")
            return cls(unix_path=Path(path))
        if spec.startswith("tcp://"):
            host_port = spec[len("tcp://"):]
            host, sep, port = host_port.rpartition(":")
            if not sep or not port.isdigit():
                raise AddressError(f"listen address {spec!r}: use tcp://host:port (e.g. tcp://:12090)")
            return cls(host_port=f"{host or '[::]'}:{port}")
        raise AddressError(
            f"listen address {spec!r}: use unix:///path/to.sock or tcp://host:port")

    def grpc_address(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else str(self.host_port)

    def __str__(self) -> str:
        return f"unix://{self.unix_path}" if self.unix_path else f"tcp://{self.host_port}"


def dial_target(api: str) -> str:
    """A gRPC target for `--api`."""
    if api.startswith("tcp://"):
        return api[len("tcp://"):]
    if api.startswith("unix://") and not api.startswith("unix:///"):
        raise AddressError(f"--api {api!r}: use unix:///absolute/path")
    if not api:
        raise AddressError("--api is empty: give unix:///path or host:port")
    return api


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
                return path.read_bytes()
            except OSError as err:
                raise AddressError(f"{flag} {path}: {err.strerror}") from err

        return read(self.key, "--tls-key"), read(self.cert, "--tls-crt"), read(self.ca, "--tls-ca")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        key, cert, ca = self._read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                            certificate_chain=cert)

    def server_credentials(self) -> grpc.ServerCredentials:
        key, cert, ca = self._read()
        if key is None or cert is None:
            raise AddressError("a TLS server needs --tls-key and --tls-crt")
        # With a CA, clients must present a certificate signed by it.
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                           require_client_auth=ca is not None)
