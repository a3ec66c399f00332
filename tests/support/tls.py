"""Certificates for the TLS tests, made with openssl: a CA, and leaves it
signs for 127.0.0.1 and localhost."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kpng_py.transport import TLSFiles


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            f"/CN={name}", "-keyout", str(key), "-out", str(cert))
    return key, cert


def make_leaf(directory: Path, name: str, ca: tuple[Path, Path]) -> TLSFiles:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext = directory / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
            "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert))
    return TLSFiles(key, cert, ca[1])
